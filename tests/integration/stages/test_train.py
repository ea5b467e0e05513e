"""The train stage (eagleflow.stages.train) as real processes: a run killed mid-epoch resumes to the
uninterrupted run's checkpoint, and two torchrun ranks (gloo, CPU) follow the one-rank curve. Host
environment (torch). The recipe itself, in process, is tests/unit/drafter/test_trainer.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file  # noqa: E402

from tests.helpers.drafter import extract_manifest, stage_request, write_synthetic  # noqa: E402

pytestmark = pytest.mark.integration


def _stage(tmp_path: Path, root: Path, name: str, train: dict) -> Path:
    """A train-stage request.json over the synthetic extract data; returns the stage directory."""
    (tmp_path / name).mkdir()
    req = stage_request(tmp_path / name, root, "train", {"extract": extract_manifest(root)}, train)
    (Path(req.dir) / "request.json").write_text(req.model_dump_json())
    return Path(req.dir)


def _cmd(stage_dir: Path) -> list[str]:
    return [sys.executable, "-m", "eagleflow.stages.train", str(stage_dir / "request.json")]


def _final_state(stage_dir: Path, epoch: int) -> tuple[dict, dict]:
    ckpt = stage_dir / "checkpoints" / f"epoch-{epoch}"
    return (
        load_file(str(ckpt / "model.safetensors")),
        torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False),
    )


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


def test_sigkill_mid_epoch_then_resume_reaches_the_uninterrupted_checkpoint(tmp_path):
    """Kill the real stage process (SIGKILL) right after its first mid-epoch checkpoint, rerun it,
    and compare its last checkpoint with an uninterrupted run of the same seed: weights and Adam's
    moments agree to 1e-6 (bit-identical here). Restarting the epoch, dropping the optimizer state or
    the data position would each show up as a different step count or different weights."""
    root = write_synthetic(tmp_path / "syn", n_train=300, n_hold=6)
    train = {
        "epochs": 2,
        "batch_tokens": 64,
        "draft_vocab_size": 24,
        "warmup_steps": 2,
        "max_seq_len": 32,
        "num_threads": 1,
        "checkpoint_every_steps": 10,
        "log_every_steps": 1000,
    }
    whole, killed = _stage(tmp_path, root, "whole", train), _stage(tmp_path, root, "killed", train)
    subprocess.run(_cmd(whole), check=True, capture_output=True, text=True, timeout=900)

    ckpts = killed / "checkpoints"
    proc = subprocess.Popen(_cmd(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (ckpts.is_dir() and any(d.name.startswith("step-") for d in ckpts.iterdir())):
            assert proc.poll() is None and time.monotonic() < deadline, "no mid-epoch checkpoint appeared"
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    # Killed inside epoch 1: its newest step checkpoint is all there is. Usually step-10, but on a loaded machine the
    # trainer can reach step-20 (and drop step-10) before the kill lands: any one step checkpoint of epoch 1 will do.
    left = sorted(d.name for d in ckpts.iterdir() if not d.name.startswith("."))
    assert len(left) == 1 and (m := re.fullmatch(r"step-(\d+)", left[0])), left
    step = int(m.group(1))
    epoch_1_steps = json.loads((whole / "manifest.json").read_text())["metrics"]["epochs"][0]["step"]
    assert step % 10 == 0 and step < epoch_1_steps, (left, epoch_1_steps)

    resumed = subprocess.run(_cmd(killed), capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"resuming mid-epoch from step-{step}: epoch 1 at batch {step} (step {step})" in resumed.stdout

    (w_whole, s_whole), (w_res, s_res) = _final_state(whole, 2), _final_state(killed, 2)
    assert s_res["step"] == s_whole["step"]
    assert _max_diff(w_whole, w_res) <= 1e-6
    opt_whole, opt_res = s_whole["optimizer"]["state"], s_res["optimizer"]["state"]
    assert set(opt_whole) == set(opt_res)
    for k in opt_whole:
        assert _max_diff(opt_whole[k], opt_res[k]) <= 1e-6
    m_whole = json.loads((whole / "manifest.json").read_text())["metrics"]["epochs"]
    m_res = json.loads((killed / "manifest.json").read_text())["metrics"]["epochs"]
    for a, b in zip(m_whole, m_res, strict=True):  # epoch 1's statistics include the steps before the kill
        assert (a["train"]["tokens"], a["step"]) == (b["train"]["tokens"], b["step"])
        assert a["train"]["loss"] == pytest.approx(b["train"]["loss"], rel=1e-6)
        assert a["validation"]["acceptance_length"] == pytest.approx(b["validation"]["acceptance_length"], rel=1e-6)


STEP_LOSS = re.compile(r"INFO eagleflow\.train: epoch \d+ step \d+/\d+ lr \S+ loss (\S+)")


def test_two_ranks_follow_the_one_rank_curve(tmp_path):
    """train.nproc 2: the stage launches torchrun, DDP over gloo. The same global batch at one rank
    with 2 accumulation micro-batches gives the same per-step losses and final weights."""
    root = write_synthetic(tmp_path / "syn", n_train=120, n_hold=6)
    train = {
        "epochs": 2,
        "batch_tokens": 128,
        "draft_vocab_size": 24,
        "warmup_steps": 2,
        "max_seq_len": 32,
        "num_threads": 1,
        "log_every_steps": 1,
    }
    runs = {"one": {"nproc": 1, "grad_accum_steps": 2}, "two": {"nproc": 2, "grad_accum_steps": 1}}
    curves, weights, metrics = {}, {}, {}
    for name, kw in runs.items():
        d = _stage(tmp_path, root, name, {**train, **kw})
        out = subprocess.run(_cmd(d), capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stdout[-3000:]
        curves[name] = [float(x) for x in STEP_LOSS.findall(out.stdout)]
        weights[name] = _final_state(d, 2)[0]
        metrics[name] = json.loads((d / "manifest.json").read_text())["metrics"]
    assert "launching 2 ranks" in out.stdout and metrics["two"]["nproc"] == 2
    assert len(curves["one"]) == len(curves["two"]) == metrics["one"]["epochs"][-1]["step"] > 20
    assert max(abs(a - b) for a, b in zip(curves["one"], curves["two"])) <= 1e-3  # logged with 4 decimals
    assert _max_diff(weights["one"], weights["two"]) <= 1e-5
    for a, b in zip(metrics["one"]["epochs"], metrics["two"]["epochs"], strict=True):
        assert a["train"]["tokens"] == b["train"]["tokens"]  # all ranks' tokens are counted
        assert a["train"]["loss"] == pytest.approx(b["train"]["loss"], rel=1e-5)


def _processes_naming(text: str) -> dict[int, str]:
    """Live (not zombie) processes whose command line holds `text`: pid -> command line."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found[int(proc.name)] = cmdline
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["cancel", "sigkill"])
def test_ending_the_stage_ends_both_ranks(tmp_path, sig):
    """torchrun starts each rank in a session of its own, so ending the stage's process group reaches
    torchrun only. A cancel (SIGTERM) has torchrun end its ranks; after a SIGKILL no one does, and the
    ranks must still end (a training rank dies of its broken output pipe; a stuck, silent one of the
    parent-death signal the stage sets): no rank trains on, unseen, holding its device."""
    root = write_synthetic(tmp_path / "syn", n_train=120, n_hold=6)
    d = _stage(
        tmp_path,
        root,
        "two",
        {
            "epochs": 500,
            "batch_tokens": 128,
            "draft_vocab_size": 24,
            "max_seq_len": 32,
            "num_threads": 1,
            "log_every_steps": 1,
            "nproc": 2,
        },
    )
    request = str(d / "request.json")
    log_path = tmp_path / "stage.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(_cmd(d), stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 600  # a safety cap: the ranks start in ~10 s alone
        while not STEP_LOSS.search(log_path.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        seen = _processes_naming(request)
        ranks = [pid for pid, cmd in seen.items() if " -u -m eagleflow.stages.train " in cmd]
        assert len(ranks) == 2 and proc.pid in seen, seen  # the stage, torchrun and its two ranks
        os.killpg(proc.pid, sig)
        proc.wait(timeout=120)
        left = lambda: set(_processes_naming(request)) & set(seen)  # noqa: E731
        gone_by = time.monotonic() + 60  # torchrun's own grace for its ranks is 30 s
        while left() and time.monotonic() < gone_by:
            time.sleep(0.2)
        assert not left(), {pid: seen[pid] for pid in left()}
        assert not (d / "manifest.json").exists()
    finally:
        for pid in set(_processes_naming(request)) & (set(seen) | {proc.pid}):  # only what this test started
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
