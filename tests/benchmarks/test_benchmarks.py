"""Each script in benchmarks/ runs once on a tiny budget, so a rename in the library breaks a test here,
not a result months later. What they measure is not asserted (figures live in docs/benchmarks.md);
that they run to the end, exit 0 and print their result is.

dispatch.py runs in the control environment (.venv, paramiko) against a real sshd on loopback; the
others in the host environment; compare_speculators.py --smoke starts real vLLM engines (generate,
then the benchmark stage's two variants), serving_client.py --quick one (the demo target, about a minute).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

BENCH = ROOT / "benchmarks"
CONTROL_PY = ROOT / ".venv" / "bin" / "python"


def run(argv: list, timeout: float) -> str:
    proc = subprocess.run([str(a) for a in argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.skipif(
    not CONTROL_PY.exists() or not (shutil.which("sshd") or Path("/usr/sbin/sshd").exists()),
    reason="needs the control environment (.venv) and an sshd binary",
)
def test_dispatch_overhead_runs():
    out = run([CONTROL_PY, BENCH / "dispatch.py", "--rounds", "1"], timeout=120)
    assert "dispatch overhead, per task (cold):" in out


@pytest.mark.parametrize("optimizer, losses", [("adamw", ["soft_ce", "lk"]), ("muon", ["soft_ce"])])
def test_train_gpu_runs_the_public_train_step_on_cpu(optimizer, losses):
    out = run(
        [
            sys.executable,
            BENCH / "train_gpu.py",
            "--tiny",
            "--device",
            "cpu",
            "--trainer",
            "eagleflow",
            "--optimizer",
            optimizer,
            "--loss",
            *losses,
            "--seq-len",
            "64",
            "--batch",
            "2",
            "--warmup",
            "1",
            "--iters",
            "2",
        ],
        timeout=300,
    )
    assert all(f"| eagleflow | {loss} | 2 x 64 |" in out for loss in losses), out[-2000:]


def test_omp_wait_runs_copies_under_both_policies():
    out = run([sys.executable, BENCH / "omp_wait.py", "--copies", "2", "--steps", "1", "--seq-len", "64"], timeout=300)
    assert "2 at once, OMP_WAIT_POLICY=PASSIVE: wall" in out and "slowest copy, default over PASSIVE:" in out


def test_ddp_runs_the_train_stage_at_one_and_two_ranks(tmp_path):
    out_json = tmp_path / "ddp.json"
    run(
        [
            sys.executable,
            BENCH / "ddp_gpu.py",
            "--tiny",
            "--device",
            "cpu",
            "--work",
            tmp_path / "work",
            "--runs",
            "r1a2",
            "r2a1",
            "--json-out",
            out_json,
        ],
        timeout=600,
    )
    result = json.loads(out_json.read_text())
    assert set(result["runs"]) == {"r1a2", "r2a1"} and all(r["rc"] == 0 for r in result["runs"].values())
    assert "dp" in result["pairs"]


def test_train_under_load_trains_the_same_drafter(tmp_path):
    out = run([sys.executable, BENCH / "train_under_load.py", "--synthetic", "--out", tmp_path], timeout=600)
    assert "final weights identical: True" in out
    result = json.loads((tmp_path / "under_load.json").read_text())
    assert result["idle"]["steps"] == result["loaded"]["steps"] > 0


def test_compare_speculators_smoke_runs_every_stage_and_serves(tmp_path):
    out = run(
        [sys.executable, BENCH / "compare_speculators.py", "--smoke", "--out", tmp_path, "--port", str(free_port())],
        timeout=1500,
    )
    result = json.loads((tmp_path / "compare.json").read_text())
    assert set(result["serving"]) == {"baseline", "eagleflow"}
    assert result["serving"]["eagleflow"]["mean_acceptance_length"] >= 1.0
    assert "| eagleflow |" in out


def test_extract_backends_compares_runs_per_layer(tmp_path):
    """hf at bf16 and fp8 on a tiny generate stage of the demo target (the vllm backend against hf is
    tests/integration/stages/test_extract.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eagleflow.contracts.manifest import Manifest
    from eagleflow.contracts.stage_records import GenerateOutputs

    gen_dir = tmp_path / "generate"
    gen_dir.mkdir()
    ids = [[(7 * i + j) % 300 for j in range(40 + 9 * i)] for i in range(6)]
    pq.write_table(
        pa.table(
            {"split": ["train"] * 4 + ["holdout"] * 2, "input_ids": ids, "loss_mask": [[1] * len(x) for x in ids]}
        ),
        gen_dir / "shard-00000.parquet",
    )
    outputs = GenerateOutputs(shards=["shard-00000.parquet"], num_train=4, num_holdout=2, num_tokens=sum(map(len, ids)))
    manifest = Manifest(stage="generate", key="g", dir=str(gen_dir), outputs=outputs.model_dump())
    (gen_dir / "manifest.json").write_text(manifest.model_dump_json())
    out = run(
        [
            sys.executable,
            BENCH / "extract_backends.py",
            "--generate",
            gen_dir / "manifest.json",
            "--backends",
            "hf",
            "--storage",
            "bfloat16",
            "float8_e4m3fn",
            "--out",
            tmp_path / "out",
        ],
        timeout=300,
    )
    assert "hf-float8_e4m3fn against hf-bfloat16" in out and "final 4 (pre-norm)" in out


def test_extract_gpu_measures_bounds_and_the_stage_on_cpu(tmp_path):
    out = run(
        [
            sys.executable,
            BENCH / "extract_gpu.py",
            "--tiny",
            "--out",
            tmp_path,
            "--seqs",
            "8",
            "--seq-len",
            "64",
            "--batch-tokens",
            "256",
            "--runs",
            "hf-bf16",
            "hf-fp8",
        ],
        timeout=300,
    )
    assert "forward alone" in out and "hf-fp8" in out and "% of min(forward, disk)" in out


def test_extract_memory_runs_at_two_sizes(tmp_path):
    out = run([sys.executable, BENCH / "extract_memory.py", "--tiny", "--out", tmp_path, "--samples", "8"], timeout=300)
    assert "4x the samples:" in out


def test_serving_client_puts_the_stage_client_beside_a_plain_one(tmp_path):
    """--quick: the demo target served by vLLM (CPU) through eagleflow's launch path, the stage's client
    (one chat_all per request, as the stage drives it), the same in one call, and a plain streaming
    client, each over 3 held-out prompts x 16 tokens with the engine's own TPOT beside them."""
    out = run(
        [
            sys.executable,
            BENCH / "serving_client.py",
            "--quick",
            "--out",
            tmp_path,
            "--set",
            f"engine.port={free_port()}",
            "--clients",
            "stage",
            "stage-1call",
            "plain",
            "--interleave",
        ],
        timeout=600,
    )
    result = json.loads((tmp_path / "serving_client.json").read_text())
    (engine,) = result["engines"]
    assert engine["name"] == "baseline-eager_config" and engine["cuda_graphs"] is False
    assert set(engine["clients"]) == {"stage", "stage-1call", "plain"}
    assert all(row["tokens"] > 0 and row["tpot_ms"] > 0 for row in engine["clients"].values())
    assert engine["clients"]["stage"]["tokens"] == 3 * 16  # ignore_eos: every answer runs to max_tokens
    # --interleave: each client's round is the sum of its turns, one per prompt
    assert result["interleave"] is True and [p["client"] for p in engine["passes"]] == ["stage", "stage-1call", "plain"]
    assert "| baseline-eager_config | no | plain |" in out


def test_stopping_rule_compares_fixed_replayed_and_sequential_windows(tmp_path):
    """A fresh drafter (tests/make_drafter.py) against no speculation, 6 prompts x 16 tokens at one setting: the
    fixed run, the rule replayed on its rounds, and the sequential run reusing its baseline."""
    import yaml

    from tests.make_drafter import make_drafter

    drafter = make_drafter(tmp_path / "drafter")
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["engine"]["port"] = free_port()
    data["benchmark"].update(max_tokens=16, temperatures=[0.0], concurrencies=[1], warmup_requests=1)
    for section, key in (("host", "python"), ("target", "model_path"), ("generate", "prompts_path")):
        data[section][key] = os.path.normpath(ROOT / "configs" / data[section][key])  # a venv's python stays a link
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(data))
    out = run(
        [
            sys.executable,
            BENCH / "stopping_rule.py",
            config,
            drafter,
            "--out",
            tmp_path / "out",
            "--num-prompts",
            "6",
            "--precision",
            "0.5",
            "--min-requests",
            "2",
        ],
        timeout=900,
    )
    result = json.loads((tmp_path / "out" / "stopping_rule.json").read_text())
    (row,) = result["rows"]
    assert row["fixed"]["requests"] == 6 and 2 <= row["replayed"]["requests"] <= 6
    assert "same verdict:" in out and "| 0 | 1 |" in out


def test_engine_load_writes_its_checkpoint(tmp_path):
    """The checkpoint writer of engine_load.py (the starts need a GPU build of vLLM: docs/benchmarks.md)."""
    run(
        [
            sys.executable,
            BENCH / "engine_load.py",
            "--work",
            tmp_path / "el",
            "--out",
            tmp_path / "out",
            "--size-gb",
            "0.05",
            "--runs",
            "write",
        ],
        timeout=300,
    )
    shards = list((tmp_path / "el" / "ckpt").glob("*.safetensors"))
    assert shards and (tmp_path / "el" / "ckpt" / "config.json").exists()
