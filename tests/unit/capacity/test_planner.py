"""The capacity plan (eagleflow.capacity) and the facts it reads (eagleflow.capacity.facts): the bytes of a
token in bf16 and fp8, Kimi-K2.5's plan on the stated 8 x H200 host against the reference run (14-15 M tokens,
828 GB in bf16), the disk refusal naming both numbers, and rates that earlier runs on the host measured
(real manifests written by the outputs models) preferred over the stated defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagleflow.capacity.costs import extract_bytes, muon_flops_per_step, state_bytes_per_token, train_flops_per_token
from eagleflow.capacity.facts import progress, run_history, target_facts
from eagleflow.capacity.planner import plan, states_refusal
from eagleflow.capacity.rates import H200_MUON_NS_TFLOPS, H200_TRAIN_TFLOPS, LK_STEP_COST
from eagleflow.capacity.render import render_plan
from eagleflow.config import load_config
from eagleflow.contracts.manifest import Manifest, stage_dir, stage_key, write_manifest
from eagleflow.contracts.plan import FinishedStages, HostFacts, MeasuredRun
from eagleflow.contracts.stage_records import CheckMetrics, ExtractMetrics, GenerateMetrics, GenerateOutputs
from eagleflow.extraction.backends import BACKENDS
from eagleflow.reporting.report import build_report, render_markdown, render_text
from tests.conftest import ROOT
from tests.helpers.records import benchmark_manifest

KIMI = ROOT / "configs" / "kimi-k25.yaml"
H200X8 = ROOT / "configs" / "hosts" / "gpu-8xh200.json"
REFERENCE_TOKENS = 14_500_000


def kimi(**overrides):
    return load_config(KIMI, overrides)


def facts(**changes) -> HostFacts:
    data = json.loads(H200X8.read_text())
    data.update(changes)
    return HostFacts.model_validate(data)


def stage(p, name: str):
    return next(s for s in p.stages if s.stage == name)


def test_a_token_of_kimi_is_56_kib_in_bf16_and_half_plus_scales_in_fp8():
    assert state_bytes_per_token(7168, "bfloat16") == 56 * 1024 == 4 * 7168 * 2
    assert state_bytes_per_token(7168, "float8_e4m3fn") == 4 * 7168 * 1 + 4 * 4  # one f32 scale per state
    # A shard also holds input_ids (int64) and loss_mask (int8) per token and seq_lens (int64) per sequence.
    assert extract_bytes(1000, 3, 7168, "bfloat16") == 1000 * (57344 + 9) + 3 * 8


def test_the_bytes_are_the_shard_writers():
    """The torch-free arithmetic agrees with the shard format itself (host environment only)."""
    shards = pytest.importorskip("eagleflow.drafter.shards")
    for dtype in ("bfloat16", "float8_e4m3fn"):
        shard = shards.ShardPlan(num_tokens=1234, num_seqs=7, hidden_size=7168, storage_dtype=dtype)
        assert sum(size for *_, size in shard.tensors()) == extract_bytes(1234, 7, 7168, dtype)


def test_kimi_on_the_stated_h200_host_reads_true_against_the_reference_run():
    bf16 = plan(kimi(**{"extract.storage_dtype": "bfloat16"}), facts())
    # Before generate: 10,000 samples at the reference run's ~1,444 tokens each.
    assert 14e6 <= bf16.tokens.tokens <= 15e6 and not bf16.tokens.exact
    assert stage(bf16, "extract").disk_bytes == pytest.approx(828e9, rel=0.05)
    assert bf16.refusal is None and bf16.disk_free_bytes == 3_500_000_000_000
    # The reference run's token count, exact (as after generate): 828 GB within 5%.
    exact = plan(
        kimi(**{"extract.storage_dtype": "bfloat16"}),
        facts(),
        FinishedStages(done=["generate"], generate_tokens=REFERENCE_TOKENS, generate_samples=10_000),
    )
    assert exact.tokens.exact and exact.tokens.tokens == REFERENCE_TOKENS
    assert stage(exact, "extract").disk_bytes == pytest.approx(828e9, rel=0.05)
    assert stage(exact, "generate").status == "done" and stage(exact, "generate").disk_bytes == 0
    # kimi-k25.yaml stores fp8: about half. (The states from an engine of our own, extract.fallback's path: its GPUs
    # and its load; from production, below.)
    done = FinishedStages(done=["generate"], generate_tokens=REFERENCE_TOKENS, generate_samples=10_000)
    fp8 = plan(kimi(**{"extract.backend": "vllm"}), facts(), done)
    assert fp8.storage_dtype == "float8_e4m3fn"
    assert stage(fp8, "extract").disk_bytes == pytest.approx(828e9 / 2, rel=0.05)
    # GPU memory: INT4 weights over TP 8 for the engine stages.
    assert stage(fp8, "extract").gpu_bytes == pytest.approx(595e9 / 8, rel=0.01) and stage(fp8, "extract").gpus == 8
    assert fp8.gpu_budget_bytes == int(143771 * 2**20 * 0.9)
    # Time: the reference run's defaults and the H200's measured load, each stage saying so; the whole retrain in hours.
    load = 60 + 595 * 0.666  # the engine's load: measured rates (cold), scaled to the 595 GB of weights
    assert stage(fp8, "extract").seconds == pytest.approx(
        REFERENCE_TOKENS / BACKENDS["vllm"].default_tok_s + load, rel=0.01
    )
    # As kimi-k25.yaml extracts: production captures while it serves, no GPU of ours, no load.
    captured = stage(plan(kimi(), facts(), done), "extract")
    assert captured.gpus == 0 and captured.gpu_bytes is None and "capture requests in flight" in captured.source
    assert captured.seconds == pytest.approx(REFERENCE_TOKENS / BACKENDS["production"].default_tok_s, rel=0.01)
    assert stage(bf16, "generate").seconds >= 5.3 * 3600
    # Training on the 8 GPUs: the H200's measured rate at this drafter's FLOPs, scaled to 8 (and saying so)
    train = stage(bf16, "train")
    cfg = kimi(**{"extract.storage_dtype": "bfloat16"})
    assert cfg.train.loss == "lk"  # its acceptance term's share of the step, measured at that shape
    one = H200_TRAIN_TFLOPS * 1e12 / train_flops_per_token(facts().target, cfg) * 0.94 / LK_STEP_COST
    assert cfg.train.optimizer == "muon"  # plus Newton-Schulz's fixed seconds a step on each rank
    rank_tokens = cfg.train.batch_tokens / 8
    one = rank_tokens / (rank_tokens / one + muon_flops_per_step(facts().target, cfg) / (H200_MUON_NS_TFLOPS * 1e12))
    tok_s = one * 8 * 0.64
    trained = cfg.train.epochs * bf16.tokens.tokens * (1 - cfg.generate.holdout / cfg.generate.num_samples)
    assert train.seconds == pytest.approx(trained / tok_s, rel=0.01)
    assert train.source.startswith("scaled: an H200 trained at") and "x 8 GPUs x 0.64" in train.source
    assert 30 * 60 > train.seconds > 10 * 60  # against the reference run's 2.6 h on their host
    # The reference run's own host: no rate of ours was measured on its GPUs, so the reference run's 2.6 h stands, and
    # says why
    reference_host = facts(
        gpus=[
            {**g, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}
            for g in json.loads(H200X8.read_text())["gpus"]
        ]
    )
    theirs = stage(plan(cfg, reference_host), "train")
    assert theirs.seconds == pytest.approx(2.6 * 3600, rel=0.05)
    assert theirs.source.startswith("default: the reference run trained") and "are no H200s" in theirs.source
    assert all(s.source.startswith("default") for s in fp8.stages if s.status == "to run" and s.stage != "train")
    assert "measured: an H200's NVMe with vLLM 0.26" in stage(fp8, "extract").source
    # ~8 h: generate 5h 18m, extract 1h 23m, the benchmark at production's traffic (8 in flight) 1h 09m
    assert 7 * 3600 < bf16.total_seconds < 30 * 3600
    text = render_plan(bf16)
    assert "828.2 GB" in text and "default: as the vllm backend's, the reference run's 3,165 tok/s" in text
    assert "at most 32 capture requests in flight (extract.concurrency)" in text


def test_a_run_that_will_not_fit_is_refused_naming_both_numbers_and_the_fixes():
    small = facts(disk={"path": "/data", "free_bytes": 500_000_000_000})
    p = plan(kimi(**{"extract.storage_dtype": "bfloat16"}), small)
    assert p.refusal is not None
    assert f"{p.disk_needed_bytes:,} bytes" in p.refusal and "500,000,000,000 bytes" in p.refusal
    assert p.disk_needed_bytes > 828e9 * 0.95
    assert "extract.storage_dtype: float8_e4m3fn" in p.refusal and "generate.num_samples" in p.refusal
    assert "bigger disk" in p.refusal
    # In fp8 the same run fits the same disk.
    assert plan(kimi(), small).refusal is None
    # The extract stage's own check: exact tokens, less what finished shards hold.
    msg = states_refusal(REFERENCE_TOKENS, 10_000, 7168, "bfloat16", 0, 500_000_000_000, "/data/x", 2**30)
    assert (
        msg
        and "500,000,000,000 bytes" in msg
        and f"{extract_bytes(REFERENCE_TOKENS, 10_000, 7168, 'bfloat16') + 2**30:,}" in msg
    )
    assert states_refusal(REFERENCE_TOKENS, 10_000, 7168, "bfloat16", 400e9, 500_000_000_000, "/d", 0) is None


def test_measured_rates_of_the_same_target_win_over_the_defaults():
    cfg = kimi(**{"extract.backend": "vllm"})  # measured on the backend the plan is for: the vllm one here
    history = [
        MeasuredRun(
            stage="extract", run="extract/aaa", created=2.0, target=cfg.target.model_path, backend="vllm", tok_s=5000.0
        ),
        MeasuredRun(
            stage="extract", run="extract/old", created=1.0, target=cfg.target.model_path, backend="vllm", tok_s=100.0
        ),
        MeasuredRun(
            stage="extract", run="extract/other", created=3.0, target="/models/other", backend="vllm", tok_s=9.0
        ),
        MeasuredRun(
            stage="generate",
            run="generate/g1",
            created=1.0,
            target=cfg.target.model_path,
            tok_s=1000.0,
            answer_tokens=2000.0,
        ),
    ]
    p = plan(cfg, facts(history=[h.model_dump() for h in history]))
    x = stage(p, "extract")
    assert x.source.startswith("measured (run extract/aaa)") and "5,000 tok/s" in x.rate
    assert p.tokens.answer_tokens == 2000 and p.tokens.answer_source.startswith("measured")
    assert p.tokens.tokens == 10_000 * (250 + 2000)
    assert stage(p, "generate").source.startswith("measured (run generate/g1)")
    assert stage(p, "train").source.startswith("scaled")  # no train run measured on this host


def _stage_run(root: Path, stage: str, key: str, cfg, outputs=None, metrics=None, seconds=10.0) -> Manifest:
    d = root / stage / key
    d.mkdir(parents=True)
    (d / "request.json").write_text(json.dumps({"config": cfg.model_dump(mode="json")}))
    m = Manifest(
        stage=stage,
        key=key,
        dir=str(d),
        outputs=outputs.model_dump() if outputs else {},
        metrics=metrics.model_dump() if metrics else {},
        seconds=seconds,
    )
    write_manifest(m)
    return m


def test_history_is_read_from_the_manifests_under_work_root(tmp_path):
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"host.work_root": str(tmp_path)})
    _stage_run(tmp_path, "extract", "e1", cfg, metrics=ExtractMetrics(tok_s=1234.5, device="cpu", backend="hf"))
    _stage_run(
        tmp_path,
        "generate",
        "g1",
        cfg,
        outputs=GenerateOutputs(shards=["data/shard-00000.parquet"], num_train=90, num_holdout=10, num_tokens=30_000),
        metrics=GenerateMetrics(failed=0, output_tok_s=77.0, completion_tokens=15_000),
    )
    (tmp_path / "train" / "broken").mkdir(parents=True)
    (tmp_path / "train" / "broken" / "manifest.json").write_text("{not json")
    runs = {r.run: r for r in run_history(str(tmp_path))}
    assert set(runs) == {"extract/e1", "generate/g1"}
    assert runs["extract/e1"].tok_s == 1234.5 and runs["extract/e1"].target == cfg.target.model_path
    assert runs["generate/g1"].answer_tokens == 150.0
    target = target_facts(cfg.target.model_path)
    assert target.hidden_size == 192 and target.weights_bytes > 0
    p = plan(cfg, HostFacts(target=target, history=list(runs.values())))
    assert stage(p, "extract").source == "measured (run extract/e1)"
    assert p.tokens.answer_tokens == 150.0


def test_after_generate_the_token_count_is_exact(tmp_path):
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"host.work_root": str(tmp_path)})
    key = stage_key("generate", cfg, {})
    d = Path(stage_dir(cfg, "generate", key))
    d.mkdir(parents=True)
    write_manifest(
        Manifest(
            stage="generate",
            key=key,
            dir=str(d),
            outputs=GenerateOutputs(shards=[], num_train=1102, num_holdout=48, num_tokens=345_678).model_dump(),
        )
    )
    prog = progress(cfg, lambda p: Path(p).exists(), lambda p: Path(p).read_text())
    assert prog.done == ["generate"] and prog.generate_tokens == 345_678
    p = plan(cfg, HostFacts(target=target_facts(cfg.target.model_path)), prog)
    assert p.tokens.exact and p.tokens.tokens == 345_678
    assert stage(p, "extract").disk_bytes == extract_bytes(345_678, 1150, 192, "bfloat16")


def test_the_plan_is_in_the_check_manifest_and_the_report():
    p = plan(kimi(), facts())
    check = Manifest(stage="check", key="c", dir="/w/check/c", metrics=CheckMetrics(plan=p).model_dump(mode="json"))
    assert CheckMetrics.of(check).plan == p
    report = build_report("kimi", {"check": check, "benchmark": benchmark_manifest("/w/benchmark/b")}, {})
    assert report.capacity == p
    assert "capacity plan: /models/Kimi-K2.5" in render_text(report)
    assert "**Capacity plan**" in render_markdown(report) and "414.4 GB" in render_markdown(report)


def test_muon_adds_its_measured_newton_schulz_to_every_step_of_every_rank():
    """optimizer 'muon': the plan's train time grows by Newton-Schulz's seconds a step (a fixed cost on each rank,
    at the rate measured at Kimi-K2.5's drafter shape), so fewer tokens a rank a step pay more of it."""
    # The count at the measured shape (hidden 7168, 64 x 128 heads, 64 KV heads, MLP 12,288) is the 1.61e14 that
    # the measured 246 ms was divided by.
    bench = facts().target.model_copy(update={"head_dim": 128})
    assert muon_flops_per_step(bench, kimi(**{"train.intermediate_size": 12288})) == pytest.approx(1.61e14, rel=0.01)
    adamw, muon = (stage(plan(kimi(**{"train.optimizer": o}), facts()), "train") for o in ("adamw", "muon"))
    ns_s = muon_flops_per_step(facts().target, kimi()) / (H200_MUON_NS_TFLOPS * 1e12)
    rank_tokens = kimi().train.batch_tokens / 8
    per_token_s = LK_STEP_COST / (H200_TRAIN_TFLOPS * 1e12 / train_flops_per_token(facts().target, kimi()) * 0.94)
    assert muon.seconds / adamw.seconds == pytest.approx(
        (rank_tokens * per_token_s + ns_s) / (rank_tokens * per_token_s), rel=1e-3
    )
    assert 1.2 < muon.seconds / adamw.seconds < 1.6 and "Muon's Newton-Schulz" in muon.source
    fewer = stage(plan(kimi(**{"train.optimizer": "muon", "train.batch_tokens": 16384}), facts()), "train")
    assert fewer.seconds > muon.seconds * 1.5  # a quarter of the tokens a step: the same cost a step, 4x the steps


def test_the_lk_loss_costs_its_measured_share_of_every_step():
    """loss 'lk': the acceptance term's softmax at each unroll step, 1.8% of a step at Kimi-K2.5's drafter shape
    (measured); soft_ce and kl are the plain rate."""
    soft, kl, lk = (
        stage(plan(kimi(**{"train.optimizer": "adamw", "train.loss": x}), facts()), "train")
        for x in ("soft_ce", "kl", "lk")
    )
    assert lk.seconds / soft.seconds == pytest.approx(LK_STEP_COST, rel=1e-6) and kl.seconds == soft.seconds
    assert "the LK loss's 1.8% a step" in lk.source and "LK" not in soft.source


def test_training_across_hosts_is_planned_at_one_hosts_rate_and_says_so():
    """train_nodes: the plan counts the run's host's GPUs only (no rate across hosts was measured), and says so."""
    node = {
        "kind": "ssh",
        "name": "gpu-b",
        "address": "10.0.0.3",
        "work_root": "/local/ef",
        "python": "/opt/ef/bin/python",
    }
    one, two = (stage(plan(kimi(**over), facts()), "train") for over in ({}, {"train_nodes.hosts": [node]}))
    assert two.seconds == one.seconds and "train_nodes" not in one.source
    assert "host's GPUs only, not train_nodes' other 1: unmeasured across hosts" in two.source


def test_generate_over_production_replicas_is_planned_at_one_servers_rate_each():
    """generate.server production with replicas: the reference run's one-server rate on each replica (said so); a rate
    this host
    measured is its own, replicas included, and stays as it is."""
    over = {"generate.server": "production", "production.replicas": ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]}
    one, two = (
        stage(
            plan(kimi(**{"generate.server": "production", "production.url": "http://10.0.0.2:8000"}), facts()),
            "generate",
        ),
        stage(plan(kimi(**over), facts()), "generate"),
    )
    assert two.seconds == pytest.approx(one.seconds / 2) and "x 2 production replicas" in two.source


def test_the_plan_counts_prompt_tokens_as_the_check_stage_does(capsys):
    # issue 43: the plan said 120 prompt tokens (characters / 4), the check stage 160 (the tokenizer)
    from transformers import AutoTokenizer

    from eagleflow.capacity.facts import chat_token_counter, main, prompt_facts
    from eagleflow.config import load_config

    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert main([cfg.model_dump_json()]) == 0
    planned = json.loads(capsys.readouterr().out)["prompts"]
    checked = prompt_facts(
        cfg.generate.prompts_path, chat_token_counter(AutoTokenizer.from_pretrained(cfg.target.model_path))
    )
    assert planned["method"] == "tokenizer" and planned["mean_tokens"] == checked.mean_tokens, (planned, checked)


def test_a_cpu_host_is_planned_from_the_demos_measured_cpu_rates_not_a_gpu_hosts():
    # issue 43: the demo's plan on a 2-core CPU host promised GPU and Kimi rates (an H200's extract, Kimi's 82.5 tok/s
    # a request, the reference run's training)
    from eagleflow.capacity.rates import CPU_REFERENCE

    cfg = load_config(ROOT / "configs" / "demo.yaml")
    target = target_facts(cfg.target.model_path)
    cpu = HostFacts(hostname="laptop", cpus=2, target=target)
    p = plan(cfg, cpu)
    by = {s.stage: s for s in p.stages}
    for stage in ("generate", "extract", "train", "export", "benchmark"):
        assert by[stage].source.startswith("measured: make demo on a 2-core CPU host"), (stage, by[stage].source)
        assert "Kimi" not in by[stage].source and "reference run" not in by[stage].source, by[stage].source
    assert by["export"].seconds == CPU_REFERENCE["export_s"]
    assert f"{CPU_REFERENCE['decode_tok_s']:,.1f} tok/s a request" in by["benchmark"].rate
    # four times the cores, a target a hundred times the demo's weights: rates scaled, and the plan says by what
    big = target.model_copy(update={"weights_bytes": target.weights_bytes * 100})
    scaled = {s.stage: s for s in plan(cfg, HostFacts(hostname="box", cpus=8, target=big)).stages}
    assert "x 0.04 (the demo target's" in scaled["generate"].source
    assert scaled["train"].seconds == pytest.approx(by["train"].seconds * 25, rel=0.01)
    # a GPU host keeps the GPU figures
    assert "Kimi-K2.5 serves 82.5 tok/s" in {s.stage: s for s in plan(kimi(), facts()).stages}["benchmark"].source


def test_the_plan_counts_each_swept_k_and_a_second_baseline_as_a_variant():
    """benchmark.k_sweep: the new drafter at each other k is one more engine load and its windows; so is
    benchmark.remeasure_baseline's second baseline."""

    def benchmark_seconds(sweep: list[int], again: bool = False) -> float:
        cfg = load_config(
            ROOT / "configs" / "demo.yaml", {"benchmark.k_sweep": sweep, "benchmark.remeasure_baseline": again}
        )
        facts = HostFacts(target=target_facts(cfg.target.model_path))
        return next(s for s in plan(cfg, facts).stages if s.stage == "benchmark").seconds

    one, three = benchmark_seconds([]), benchmark_seconds([2, 3, 4])  # 3 is the configured k: two more variants
    assert three == pytest.approx(one * 4 / 2)
    # benchmark.remeasure_baseline: no speculation once more, one variant more
    assert benchmark_seconds([], again=True) == pytest.approx(one * 3 / 2)


def test_on_sglang_the_triage_costs_no_engine_load():
    # its probes are vLLM's machinery; on SGLang the triage is the lossless check of answers the benchmark has
    vllm = plan(kimi(), facts())
    sglang = plan(load_config(ROOT / "configs" / "kimi-k25-sglang.yaml"), facts())
    assert any("should the triage run" in f for f in vllm.findings)
    assert not any("triage" in f for f in sglang.findings)
