"""Stage train: the extract stage's shards -> an EAGLE-3 drafter, one checkpoint per epoch.

    python -m eagleflow.stages.train <stage_dir>/request.json
    torchrun --nproc-per-node N -m eagleflow.stages.train <stage_dir>/request.json   (by hand)

Writes `checkpoints/epoch-<n>/` (model.safetensors in vLLM names, drafter.json, trainer_state.pt),
`checkpoints/step-<n>/` every `train.checkpoint_every_steps` (the newest only), and records the best
epoch (highest simulated acceptance length on the holdout split) in the manifest. A rerun resumes
from the newest checkpoint, mid-epoch included. Per-epoch metrics go to stdout (EPOCH_METRICS lines)
and into the manifest.

With `train.nproc` > 1 the stage runs itself under torchrun (`python -m torch.distributed.run`):
every rank trains, rank 0 writes the checkpoints and the manifest, and this process waits, passes
the ranks' output through and returns rank 0's manifest.

Across hosts (`train_nodes`), the control side starts this stage on every node with NODE_ENV set
(`{"rank": i, "count": n, "master": "addr:port"}`): each runs torchrun with a static rendezvous, node 0's
launch returns rank 0's manifest, the others' end with their ranks and write nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import traceback
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from eagleflow.contracts.failure import stage_ending
from eagleflow.contracts.manifest import Manifest, read_manifest, sha256_file
from eagleflow.contracts.request import NODE_ENV, StageError, StageRequest
from eagleflow.contracts.stage_records import (
    BestEpoch,
    EpochMetrics,
    EvalSummary,
    ExtractOutputs,
    TrainMetrics,
    TrainOutputs,
)
from eagleflow.stages.common import setup_logging, stage_main
from eagleflow.util.procs import die_with_parent

if TYPE_CHECKING:
    from eagleflow.drafter.trainer import TrainResult

log = logging.getLogger("eagleflow.train")


def _under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def _node() -> dict | None:
    """This node's place in a training across hosts ({"rank", "count", "master"}), or None on one host."""
    import json

    raw = os.environ.get(NODE_ENV)
    return json.loads(raw) if raw else None


def run(request: StageRequest) -> Manifest:
    if (request.config.train.nproc > 1 or _node()) and not _under_torchrun():
        manifest = _launch_torchrun(request)
        assert manifest is not None  # node 0's launch (nodes other than 0 run `_node_main`)
        return manifest
    result, index_aux = _train(request)
    return _manifest(request, result, index_aux)


def _train(request: StageRequest) -> tuple[TrainResult, list[int]]:
    from eagleflow.drafter.data import read_index
    from eagleflow.drafter.errors import DataError, FormatError, TrainError
    from eagleflow.drafter.target import read_target_head
    from eagleflow.drafter.trainer import Trainer

    config = request.config
    trainer = None
    extract = request.upstream.get("extract")
    if extract is None:
        raise StageError("the train stage needs the extract stage's manifest (request.upstream['extract'])")
    index_rel = ExtractOutputs.of(extract).index
    pinned = extract.hashes.get(index_rel)
    if pinned and Path(extract.path(index_rel)).is_file() and sha256_file(extract.path(index_rel)) != pinned:
        raise StageError(
            f"{extract.path(index_rel)} is not the index the extract stage wrote (its sha256 differs "
            "from the manifest's); delete the extract stage's manifest.json and rerun it"
        )
    try:
        # Checks every shard's size and sampled hash against the index before anything is read.
        index = read_index(extract.path(index_rel), stage_dir=extract.dir)
        if index.aux_layer_ids != list(config.target.aux_layer_ids):
            raise StageError(
                f"extracted aux layers {index.aux_layer_ids} differ from target.aux_layer_ids "
                f"{config.target.aux_layer_ids}: rerun extract with the current config"
            )
        target = read_target_head(config.target.model_path)
        trainer = Trainer(config.train, target, index, request.path, index.aux_layer_ids).setup()
        return trainer.train(), index.aux_layer_ids
    except (DataError, FormatError, TrainError) as exc:
        raise StageError(str(exc)) from None
    finally:
        import torch.distributed as dist

        if trainer is not None:
            # Its DDP wrapper freed after destroy_process_group (when this frame ends) hung a gloo rank for
            # good after the last step, 1 run in 12 on 2 loaded cores (0 in 30 since; pytorch#190489).
            trainer.close()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _manifest(request: StageRequest, result: TrainResult, aux_layer_ids: list[int]) -> Manifest:
    from eagleflow.drafter.checkpoint import CHECKPOINT_WEIGHTS

    best = result.best
    epochs = [
        EpochMetrics(
            epoch=e.epoch,
            complete=e.complete,
            step=e.step,
            lr=e.lr,
            tokens_per_s=e.tokens_per_s,
            seconds=e.seconds,
            train=EvalSummary(**e.train),
            validation=EvalSummary(**e.validation) if e.validation else None,
        )
        for e in result.epochs
    ]
    train_tokens = sum(e.train["tokens"] for e in result.epochs)
    metrics = TrainMetrics(
        best_epoch=best.epoch,
        best=BestEpoch(epoch=best.epoch, **(best.validation or best.train)),
        epochs=epochs,
        tokens_per_s=round(train_tokens / max(1e-9, sum(e.seconds for e in result.epochs)), 1),
        steps=result.steps,
        bounded_by=result.bounded_by,
        draft_vocab_size=result.vocab_size,
        nproc=int(os.environ.get("WORLD_SIZE", request.config.train.nproc)),
    )
    from eagleflow.reporting import plots

    drawn = plots.draw({"curves.png": lambda path: plots.training_curves(epochs, path)}, request.path)
    outputs = TrainOutputs(
        checkpoints=[e.checkpoint for e in result.epochs],
        best=best.checkpoint,
        best_epoch=best.epoch,
        aux_layer_ids=aux_layer_ids,
        arch=result.arch,
        plots=drawn,
    )
    weights = f"{best.checkpoint}/{CHECKPOINT_WEIGHTS}"
    return request.manifest(outputs=outputs, metrics=metrics, hashes={weights: sha256_file(request.path / weights)})


def _launch_torchrun(request: StageRequest) -> Manifest | None:
    """Run this stage under torchrun with train.nproc ranks (on each node, across hosts); rank 0 writes the
    manifest, which node 0 returns. Other nodes return None once their ranks have ended well."""
    nproc, node = request.config.train.nproc, _node()
    first = node is None or node["rank"] == 0
    request_file = request.path / "request.json"
    if first and not request_file.is_file():
        request_file.write_text(request.model_dump_json(indent=2))
    manifest_path = request.path / "manifest.json"
    if first:
        manifest_path.unlink(missing_ok=True)  # only this launch's rank 0 may leave one
    if node is None:
        rendezvous = ["--standalone"]
    else:
        # Static: node ranks fixed, so rank 0 (checkpoints, manifest) is on node 0, whose launch returns the manifest
        # (c10d's dynamic rendezvous orders nodes by host name and pid).
        addr, port = node["master"].rsplit(":", 1)
        rendezvous = [
            f"--nnodes={node['count']}",
            f"--node-rank={node['rank']}",
            f"--master-addr={addr}",
            f"--master-port={port}",
        ]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *rendezvous,
        f"--nproc-per-node={nproc}",
        "-m",
        "eagleflow.stages.train",
        str(request_file),
    ]
    env = dict(os.environ)
    gpus = _cuda_devices() if request.config.train.device != "cpu" else 0
    if gpus and nproc > gpus:
        raise StageError(
            f"train.nproc is {nproc} but this host has {gpus} CUDA device(s): one rank per GPU; "
            f"set train.nproc <= {gpus} (or device: cpu)"
        )
    if not gpus:
        # One share of the cores per rank (torchrun would otherwise set 1 and print a banner about it).
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    where = f" on node {node['rank']} of {node['count']}" if node else ""
    log.info("launching %d ranks%s: %s", nproc, where, " ".join(cmd))
    tail: deque[str] = deque(maxlen=40)
    # torchrun shares our process group; its ranks run in sessions of their own (torch 2.13). A cancel
    # (SIGTERM to our group) reaches torchrun, which ends them. Should we die alone (SIGKILL, OOM), torchrun
    # gets SIGTERM; should torchrun die, each rank gets SIGKILL (__main__ below). A training rank would
    # also die of the broken pipe at its next line of output, but not one that is stuck and silent.
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env, preexec_fn=die_with_parent
    ) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                tail.append(line.rstrip("\n"))
        except BaseException:  # SIGTERM (SystemExit) or Ctrl-C here: torchrun ends its ranks
            proc.terminate()
            proc.wait()
            raise
        rc = proc.wait()
    if rc != 0 or (first and not manifest_path.is_file()):
        cause = next((ln for ln in reversed(tail) if ln.startswith("error:")), None) or (tail[-1] if tail else "")
        raise StageError(f"torchrun with {nproc} ranks{where} exited {rc}: {cause} (the ranks' output is above)")
    return read_manifest(manifest_path) if first else None


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _node_main(argv: list[str]) -> int:
    """A node other than 0 of a training across hosts: its ranks train; node 0's rank 0 writes everything."""
    setup_logging()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds into torchrun's terminate below
    try:
        request = StageRequest.model_validate_json(Path(argv[0]).read_text())
        _launch_torchrun(request)
        log.info("node %s done (node 0 writes the checkpoints and the manifest)", _node()["rank"])
        return 0
    except StageError as exc:
        print("\n".join(stage_ending(str(exc))), flush=True)
        return 1


def _rank_main(argv: list[str]) -> int:
    """A torchrun rank other than 0: train, write nothing but what the trainer writes (nothing)."""
    setup_logging()
    logging.getLogger("eagleflow").setLevel(logging.WARNING)
    try:
        request = StageRequest.model_validate_json(Path(argv[0]).read_text())
        _train(request)
        return 0
    except StageError as exc:
        print("\n".join(stage_ending(f"rank {os.environ.get('RANK')}: {exc}")), flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - the launcher reports the last `error:` line
        traceback.print_exc(file=sys.stdout)
        print("\n".join(stage_ending(f"rank {os.environ.get('RANK')}: {type(exc).__name__}: {exc}")), flush=True)
        return 1


if __name__ == "__main__":
    if _under_torchrun():
        # A rank outlives a killed torchrun otherwise (its own session): nobody would wait for it, and it
        # would hold its GPU. SIGKILL, as a rank blocked in a collective never runs a Python handler;
        # what it writes is renamed into place whole, so nothing half-written stays.
        die_with_parent(signal.SIGKILL)
        if int(os.environ.get("RANK", "0")) != 0:
            sys.exit(_rank_main(sys.argv[1:]))
    elif (_node() or {}).get("rank", 0) != 0:
        sys.exit(_node_main(sys.argv[1:]))
    sys.exit(stage_main("train", run))
