"""One stage spread over several hosts whose jobs live and end together: training across hosts.

Node 0 is the run's host; its job is the stage's own job dir. Every other node runs the same command as a
detached job of its own, its state (job.json, pid, lock, log) under that node's work_root, never on the
filesystem the nodes share: a pid means something on one machine only. What the stage reads and writes
(the request, the extract stage's states, the checkpoints) must be at the same path on every node: checked
before anything starts, so a node that cannot see them is named instead of hanging the rendezvous.

The first job to fail ends the others, through each host's job control (their process groups, and only
them): a torchrun node whose peer died would otherwise wait in a collective until gloo's or NCCL's
timeout. A cancel of the caller ends them all. A dropped link is not a failure: the jobs go on, and the
caller's retry re-attaches to each.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from eagleflow.contracts.request import NODE_ENV
from eagleflow.hosts.base import ConnectionLost, Host, HostSetupError, LogFn

STOP_AGAIN_S = 2.0  # after a failure, the jobs still followed are stopped again this often until they end


@dataclass
class NodeJob:
    """One node's job: where it runs, its job dir and its python there, what its environment adds."""

    host: Host
    job_dir: str
    python: str
    env: dict[str, str] = field(default_factory=dict)


def node_jobs(
    host: Host, nodes: list[Host], stage_dir: str, master: str, python: str, env: dict[str, str] | None = None
) -> list[NodeJob]:
    """The jobs of one stage over `host` (node 0, in stage_dir, run by `python`) and `nodes` (1, 2, ..., each by its
    own host.python), each told its node rank, the node count and the rendezvous address `master` ("addr:port" on
    node 0). `env`: node 0's more (a production window's token: that window is node 0's)."""
    count = 1 + len(nodes)
    key = posixpath.basename(stage_dir.rstrip("/"))
    stage = posixpath.basename(posixpath.dirname(stage_dir.rstrip("/")))

    def node_env(rank: int) -> dict[str, str]:
        return {NODE_ENV: json.dumps({"rank": rank, "count": count, "master": master})}

    jobs = [NodeJob(host, stage_dir, python, {**(env or {}), **node_env(0)})]
    for rank, node in enumerate(nodes, 1):
        root = getattr(node, "work_root", "").rstrip("/")
        jobs.append(NodeJob(node, f"{root}/{stage}/{key}/node-{rank}", getattr(node, "python", python), node_env(rank)))
    return jobs


def check_shared(host: Host, nodes: list[Host], paths: list[str]) -> None:
    """Each node sees every one of `paths` (written or read on node 0), or a HostSetupError naming the node."""
    for node in nodes:
        for path in paths:
            if not node.exists(path):
                raise HostSetupError(
                    node.label,
                    f"{path}, which {host.name} has, does not exist on {node.name}: training across hosts reads the "
                    f"extract stage's states and writes checkpoints at the same paths on every node. Fix: mount "
                    f"{host.name}'s host.work_root and target.model_path at the same paths on {node.name} (a shared "
                    "filesystem), or train on one host (remove train_nodes)",
                )


def run_together(
    jobs: list[NodeJob],
    args: list[str],
    *,
    log: LogFn,
    owner: str = "",
    attempt: str = "",
    stop: Callable[[NodeJob], object] | None = None,
) -> None:
    """Run `<its python> args` as one job on each node at once and wait for all. Node 0's lines go to `log` as they
    are, the others' prefixed with their host's name. The first job to fail ends the others (`stop`, by default the
    host's `stop_job`) and its error is raised: the cause, not the stop it caused. A ConnectionLost is raised
    as it is, ending nothing. Interrupted (a cancel), it ends every job before re-raising."""
    stop = stop or (lambda job: job.host.stop_job(job.job_dir))  # type: ignore[attr-defined]
    ended: queue.Queue[tuple[int, BaseException | None]] = queue.Queue()

    def follow(i: int) -> None:
        job = jobs[i]
        say = log if i == 0 else (lambda line, name=job.host.name: log(f"[{name}] {line}"))
        try:
            job.host.run_job(job.job_dir, [job.python, *args], log=say, env=job.env, owner=owner, attempt=attempt)
            ended.put((i, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            ended.put((i, exc))

    for i in range(len(jobs)):
        threading.Thread(target=follow, args=(i,), name=f"node-{i}", daemon=True).start()
    running, first_error = set(range(len(jobs))), None
    try:
        while running:
            try:
                i, exc = ended.get(timeout=STOP_AGAIN_S)
            except queue.Empty:
                # A job whose start was under way when the first failed was not there to stop: stop again until
                # every follower has ended (a node 0 left alone would wait out the rendezvous's timeout).
                if first_error is not None:
                    for j in sorted(running):
                        with contextlib.suppress(Exception):
                            stop(jobs[j])
                continue
            running.discard(i)
            if exc is None or first_error is not None:
                continue
            if isinstance(exc, ConnectionLost):
                raise exc  # the jobs go on; the retry re-attaches to each
            first_error = exc
            for j in sorted(running):
                log(f"{jobs[i].host.name} failed: ending the job on {jobs[j].host.name}")
                with contextlib.suppress(Exception):
                    stop(jobs[j])
    except BaseException as exc:
        if not isinstance(exc, ConnectionLost):
            for j in sorted(running):
                with contextlib.suppress(Exception):
                    stop(jobs[j])
        raise
    if first_error is not None:
        raise first_error
