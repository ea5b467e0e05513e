"""Hidden states from the serving engine itself: vLLM's extract_hidden_states method.

The target is served as production serves it (engine.*: tensor parallel size, quantization, the same
checkpoint), so the drafter learns from the states the engine will feed it, computed by the kernels
that will compute them. Each conversation is one `/v1/completions` request of its token ids with
`max_tokens: 1` (the engine saves prompt tokens only, so the whole conversation is the prompt);
the engine's connector (`eagleflow.engines.hidden_states_connector`) writes the request's states,
[T, n_layers, H], to a file in the spool directory; this side waits on the file's lock, checks its
token ids are the ones sent, hands the states to the shard writer and deletes the file.

Sequences enter a shard in plan order whatever order the requests finish in, so the same inputs give
the same file. At most `2 x concurrency` finished requests wait in the spool for their turn: with
the spool on /dev/shm (the default) the states touch the disk once, in the shard.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import torch
from safetensors import safe_open

from eagleflow.config import RunConfig
from eagleflow.contracts.request import StageError
from eagleflow.drafter.shards import ShardWriter
from eagleflow.engines import make_server
from eagleflow.engines.chat import RETRYABLE
from eagleflow.engines.launch import LaunchSpec, StateCapture, target_launch
from eagleflow.extraction.plan import PlannedShard

log = logging.getLogger("eagleflow.extract")


def spool_bytes(cfg: RunConfig, hidden_size: int) -> int:
    """The most the spool can hold: 2 x concurrency requests of max_seq_len tokens, 4 bf16 states each."""
    return 2 * cfg.extract.concurrency * cfg.extract.max_seq_len * 4 * hidden_size * 2


def spool_root(cfg: RunConfig, stage_dir: Path, hidden_size: int) -> Path:
    """extract.spool_dir, else /dev/shm when it has room (tmpfs: spooled states never reach the disk;
    a container's /dev/shm is often 64 MB), else the stage directory."""
    if cfg.extract.spool_dir:
        return Path(cfg.extract.spool_dir)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 * spool_bytes(cfg, hidden_size):
        return shm
    log.info(
        "/dev/shm is missing or too small for %.1f GB of spooled states: spooling under %s",
        spool_bytes(cfg, hidden_size) / 1e9,
        stage_dir,
    )
    return stage_dir


@contextmanager
def capture_spool(cfg: RunConfig, stage_dir: Path, hidden_size: int) -> Iterator[Path]:
    """The spool directory of a capturing engine of the stage's: made fresh (an earlier attempt killed before it
    could remove it leaves files there, in /dev/shm memory) and removed on the way out."""
    spool = spool_root(cfg, stage_dir, hidden_size) / f"eagleflow-spool-{stage_dir.name}"
    shutil.rmtree(spool, ignore_errors=True)
    spool.mkdir(parents=True)
    try:
        yield spool
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def capture_launch(cfg: RunConfig) -> LaunchSpec:
    """The target's launch for a capturing engine: production's, with room for the longest conversation."""
    spec = target_launch(cfg)
    # A conversation of max_seq_len tokens plus the one token the request generates must fit.
    spec.engine = spec.engine.model_copy(
        update={"max_model_len": max(spec.engine.max_model_len, cfg.extract.max_seq_len + 1)}
    )
    return spec


@contextmanager
def serving_for_capture(
    cfg: RunConfig, stage_dir: Path, hidden_size: int, env: dict[str, str] | None = None, name: str = "target-capture"
) -> Iterator[EngineStates]:
    """The target served with capture on, its spool made fresh and removed on the way out. `env`: more
    environment for the engine (the production guardian's token, when the caller stopped production)."""
    with capture_spool(cfg, stage_dir, hidden_size) as spool:
        spec = capture_launch(cfg)
        spec.capture = StateCapture(
            layer_ids=[*cfg.target.aux_layer_ids, cfg.target.final_layer_id], spool_dir=str(spool)
        )
        with make_server(spec, stage_dir / "engine.log", env=env, name=name) as server:
            yield EngineStates(
                server.base_url, spec.served_model_name, cfg.engine.request_timeout_s, cfg.extract.concurrency
            )


class EngineStates:
    """Requests to a capturing engine, and the files it writes back."""

    where = "engine"

    def __init__(self, base_url: str, model: str, timeout_s: float, concurrency: int) -> None:
        self.model = model
        self.concurrency = concurrency
        self.client = httpx.Client(
            base_url=base_url, timeout=timeout_s, limits=httpx.Limits(max_connections=concurrency, keepalive_expiry=2.0)
        )

    def request(self, ids: Sequence[int]) -> str:
        """Send one conversation; the path of the file its states go to."""
        body = {"model": self.model, "prompt": [int(t) for t in ids], "max_tokens": 1, "temperature": 0.0}
        r = self.post(body)
        if r.status_code != 200:
            raise StageError(
                f"the capturing engine refused a {len(ids)}-token request: HTTP {r.status_code} {r.text[:300]}"
            )
        payload = r.json()
        params = payload.get("kv_transfer_params") or {}
        path = params.get("hidden_states_path")
        if not path:
            raise StageError(
                "the engine answered without kv_transfer_params.hidden_states_path: is the "
                "extract_hidden_states method and its connector active? (see the engine log)"
            )
        return str(path)

    def post(self, body: dict) -> httpx.Response:
        """One completions request, sent again (twice at most) when the connection dropped."""
        for attempt in range(3):
            try:
                return self.client.post("/v1/completions", json=body)
            except RETRYABLE:
                if attempt == 2:
                    raise
                self.before_retry()
        raise AssertionError("unreachable")

    def before_retry(self) -> None:
        """What to do before asking again (the capture engine is ours: nothing)."""

    def collect(self, path: str, ids: Sequence[int]) -> torch.Tensor:
        """Wait until the engine has written `path` (its companion lock is held while writing), read
        and delete it; the states [T, n_layers, H] of the tokens sent."""
        lock = path + ".lock"
        try:
            with open(lock) as lf:
                fcntl.flock(lf, fcntl.LOCK_SH)  # sleeps until the writer releases its exclusive lock
                if not os.path.exists(path):
                    raise StageError(f"{path}: the engine released it unwritten (its log says why: 'not written')")
                with safe_open(path, "pt", device="cpu") as f:
                    self.check_file(path, f.metadata() or {})
                    states, saved = f.get_tensor("hidden_states"), f.get_tensor("token_ids")
        finally:
            for p in (path, lock):
                Path(p).unlink(missing_ok=True)
        if saved.tolist() != [int(t) for t in ids]:
            raise StageError(
                f"{path}: the engine saved states for {saved.numel()} tokens that are not the "
                f"{len(ids)} sent (prefix caching on? a request mixed up?)"
            )
        return states

    def check_file(self, path: str, metadata: dict[str, str]) -> None:
        """A refusal of a written file by what its metadata says (our own engine's connector: nothing to check)."""

    def extract(self, shard: PlannedShard, writer: ShardWriter) -> None:
        extract_vllm(self, shard, writer)

    def close(self) -> None:
        self.client.close()


def open_vllm(cfg: RunConfig, stage_dir: Path, stack: ExitStack, hidden_size: int) -> EngineStates:
    """The `vllm` backend opened (eagleflow.extraction.backends): the target served with capture on, until
    `stack` closes."""
    engine = stack.enter_context(serving_for_capture(cfg, stage_dir, hidden_size))
    stack.callback(engine.close)
    return engine


def extract_vllm(engine: EngineStates, shard: PlannedShard, writer: ShardWriter) -> None:
    """Every sequence of `shard` into `writer`, in plan order, `concurrency` requests in flight."""
    window = 2 * engine.concurrency
    pending: deque[tuple[int, Future[str]]] = deque()
    with ThreadPoolExecutor(engine.concurrency, thread_name_prefix="extract-req") as pool:
        nxt = 0
        try:
            while nxt < len(shard.ids) or pending:
                while nxt < len(shard.ids) and len(pending) < window:
                    pending.append((nxt, pool.submit(engine.request, shard.ids[nxt])))
                    nxt += 1
                i, fut = pending.popleft()
                states = engine.collect(fut.result(), shard.ids[i])  # [T, 4, H]
                if states.shape[1] != 4:
                    raise StageError(
                        f"the engine saved {states.shape[1]} layers per token, expected 4 "
                        "(three aux layers and the final one)"
                    )
                writer.add(shard.ids[i], shard.masks[i], states)
        finally:
            for _, fut in pending:  # a failed shard leaves no spooled file behind
                fut.cancel()
            for _, fut in pending:
                if not fut.cancelled() and fut.exception() is None:
                    for p in (fut.result(), fut.result() + ".lock"):
                        Path(p).unlink(missing_ok=True)
