"""The extract stage's shard format, written as a stream and checked without reading it all.

A shard is a plain safetensors file (any safetensors reader opens it):

    hidden_states  [T, 4, H]  bf16, or float8_e4m3fn with `hidden_scales`
    hidden_scales  [T, 4]     f32, only for fp8: state = fp8 value * scale (per token and layer)
    input_ids      [T]        int64
    seq_lens       [n_seq]    int64
    loss_mask      [T]        int8

The token and sequence counts of a shard are known before its first state is computed (the
generate stage wrote the token ids), so the header, with every offset, is written first and the
states follow in the order they come: nothing of a shard is held in memory but the chunk being
written. A shard is cut by bytes (`extract.shard_bytes`), not by samples: at Kimi-K2.5's hidden
size a 500-sample shard was 57 GB.

Writing goes through a small pool of (pinned, on a GPU host) chunks: the caller's thread only
queues copies (asynchronous from the GPU), a copier thread moves states into chunks, a writer thread
writes them in order, and a pool of hashing threads hashes each 64 MiB block of the file as soon as
it is written (from the page cache), so the forward, the copy, the write and the full hash overlap.
The file is written under a temporary name and renamed when complete and fsynced.

Integrity without re-reading hundreds of GB: the index records each shard's size, its full hash
(`blocks_sha256`: sha256 over the sha256 of every 64 MiB block, computed while writing: one core
hashes ~1.2 GB/s on the H200 host, slower than the stage writes bf16 states of an 8B target, so the
blocks are hashed in parallel) and a sampled sha256 (size and 16 blocks of 64 KiB spread over the
file). `check_shard` (size + sampled hash, ~1 MiB read) runs before training reads a shard and
catches a truncated, extended or swapped file; `verify_full` re-hashes everything for an audit
(`python -m eagleflow.drafter.shards verify <index.json>`).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagleflow import EagleflowError

STORAGE_DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "bfloat16": (torch.bfloat16, "BF16"),
    "float8_e4m3fn": (torch.float8_e4m3fn, "F8_E4M3"),
}
FP8_MAX = 448.0  # largest finite float8_e4m3fn
NUM_STATES = 4  # three aux layers and the final layer
SAMPLE_BLOCKS, SAMPLE_BLOCK_BYTES = 16, 64 << 10
HASH_BLOCK_BYTES = 64 << 20


class ShardError(EagleflowError):
    """A shard that is missing, cut short, changed or swapped; the message names the file."""


@dataclass(frozen=True)
class ShardPlan:
    """A shard's shape, fixed before writing: where every tensor lives in the file."""

    num_tokens: int
    num_seqs: int
    hidden_size: int
    storage_dtype: str = "bfloat16"

    @property
    def fp8(self) -> bool:
        return self.storage_dtype == "float8_e4m3fn"

    @property
    def state_bytes_per_token(self) -> int:
        return NUM_STATES * self.hidden_size * STORAGE_DTYPES[self.storage_dtype][0].itemsize

    def tensors(self) -> list[tuple[str, str, list[int], int]]:
        """(name, safetensors dtype, shape, bytes) in file order; 8-byte types before 1-byte ones."""
        t, n, h = self.num_tokens, self.num_seqs, self.hidden_size
        out = [
            ("hidden_states", STORAGE_DTYPES[self.storage_dtype][1], [t, NUM_STATES, h], t * self.state_bytes_per_token)
        ]
        if self.fp8:
            out.append(("hidden_scales", "F32", [t, NUM_STATES], t * NUM_STATES * 4))
        return out + [("input_ids", "I64", [t], 8 * t), ("seq_lens", "I64", [n], 8 * n), ("loss_mask", "I8", [t], t)]

    def header(self, metadata: dict[str, str]) -> bytes:
        """The safetensors prefix: u64 length, then JSON padded with spaces to a multiple of 8."""
        entries: dict[str, Any] = {"__metadata__": metadata}
        offset = 0
        for name, dtype, shape, size in self.tensors():
            entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        blob = json.dumps(entries, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        return struct.pack("<Q", len(blob)) + blob

    def file_bytes(self, metadata: dict[str, str]) -> int:
        return len(self.header(metadata)) + sum(size for *_, size in self.tensors())


def quantize_fp8(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 4, H] float -> ([N, 4, H] float8_e4m3fn, [N, 4] f32 scales): one scale per token and layer,
    so a token whose residual stream is large (attention sinks) costs no precision elsewhere."""
    x = states.float()
    # times the reciprocal, not divided: CUDA divides a tensor by a scalar that way, and a CPU that divides
    # would round some scales one ulp apart, then their fp8 values (seen on an H200: tests/gpu)
    scales = (x.abs().amax(dim=-1) * (1.0 / FP8_MAX)).clamp_min(1e-12)  # [N, 4]
    return (x / scales.unsqueeze(-1)).to(torch.float8_e4m3fn), scales


def dequantize_fp8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of quantize_fp8: [N, 4, H] fp8 and [N, 4] -> [N, 4, H] f32."""
    return q.float() * scales.float().unsqueeze(-1)


@dataclass(frozen=True)
class ShardRecord:
    """What the index says of a written shard."""

    bytes: int
    blocks_sha256: str
    sample_sha256: str


class _Chunk:
    """A reusable byte buffer (page-locked when states come from a GPU, so copies are asynchronous)."""

    def __init__(self, nbytes: int, pinned: bool) -> None:
        self.buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)  # [nbytes]
        self.used = 0
        self.event: torch.cuda.Event | None = None
        self.source: torch.Tensor | None = None  # the GPU part, alive until its copy is done


class ShardWriter:
    """Streams one shard to `path` (via a temporary name); `add` per sequence, then `close`.

    `add` returns once the sequence is queued: with states on a GPU the caller goes on to the next
    forward while a copier thread moves this one into page-locked chunks (a stream of its own, so the
    copy overlaps the next forward), a writer thread writes them, and hashing threads hash each 64 MiB
    block of the file from the page cache once it is written.
    Memory: `pool` chunks of `chunk_bytes` on the host (default 8 x 64 MiB) whatever the shard's size,
    at most `inflight_bytes` of states waiting on the device, and at most `sync_bytes` of dirty pages
    (the writer flushes as it goes, so closing a shard does not wait for gigabytes to reach the disk).
    """

    def __init__(
        self,
        path: str | Path,
        plan: ShardPlan,
        metadata: dict[str, str],
        *,
        chunk_bytes: int = 64 << 20,
        pool: int = 8,
        inflight_bytes: int = 4 << 30,
        sync_bytes: int = 512 << 20,
        hash_threads: int = 4,
        pinned: bool | None = None,
        on_add: Callable[[int], None] | None = None,
    ) -> None:
        self.on_add = on_add  # called with each sequence's token count once it is queued (progress)
        self.path, self.plan, self.metadata = Path(path), plan, dict(metadata, storage_dtype=plan.storage_dtype)
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        chunk_bytes = max(chunk_bytes, plan.state_bytes_per_token)
        self._chunk_tokens = chunk_bytes // plan.state_bytes_per_token
        pinned = torch.cuda.is_available() if pinned is None else pinned
        self._free: queue.Queue[_Chunk] = queue.Queue()
        for _ in range(pool):
            self._free.put(_Chunk(self._chunk_tokens * plan.state_bytes_per_token, pinned))
        # Parts (<= one chunk each) waiting for the copier: bounded, so a fast forward waits for the disk.
        self._to_copy: queue.Queue[tuple[torch.Tensor, torch.cuda.Event | None] | None] = queue.Queue(
            maxsize=max(1, inflight_bytes // chunk_bytes)
        )
        self._to_write: queue.Queue[_Chunk | None] = queue.Queue()
        self._hashers = ThreadPoolExecutor(hash_threads, thread_name_prefix=f"shard-hash-{self.path.name}")
        self._block_hashes: list[Future[bytes]] = []
        self._written = 0
        self._error: BaseException | None = None
        self._copy_stream: torch.cuda.Stream | None = None
        self._ids: list[torch.Tensor] = []  # [n] int64 per sequence, in write order
        self._masks: list[torch.Tensor] = []
        self._scales: list[torch.Tensor] = []  # [n, 4] f32 per sequence (fp8)
        self._lens: list[int] = []
        self._tokens = 0
        self._sync_bytes, self._unsynced = sync_bytes, 0
        self._file = open(self.tmp, "wb", buffering=0)  # unbuffered: what write() returns is in the page cache
        self._reader = os.open(self.tmp, os.O_RDONLY)  # the hashers' own descriptor
        self._write_all(plan.header(self.metadata))
        self._threads = [
            threading.Thread(target=loop, name=f"shard-{what}-{self.path.name}", daemon=True)
            for what, loop in (("copy", self._copy_loop), ("write", self._write_loop))
        ]
        for t in self._threads:
            t.start()

    # -- caller side ------------------------------------------------------------------------------

    def add(
        self, input_ids: Sequence[int] | torch.Tensor, loss_mask: Sequence[int] | torch.Tensor, states: torch.Tensor
    ) -> None:
        """One sequence: ids and mask [n], states [n, 4, H] (any float dtype, CPU or GPU)."""
        self._raise_if_failed()
        n = int(states.shape[0])
        ids = torch.as_tensor(input_ids, dtype=torch.int64).reshape(-1)
        mask = torch.as_tensor(loss_mask).to(torch.int8).reshape(-1)
        if ids.numel() != n or mask.numel() != n or tuple(states.shape[1:]) != (NUM_STATES, self.plan.hidden_size):
            raise ValueError(
                f"{self.path.name}: states {tuple(states.shape)} for {ids.numel()} ids and "
                f"{mask.numel()} mask values; expected [n, {NUM_STATES}, {self.plan.hidden_size}] "
                "for n ids"
            )
        if self._tokens + n > self.plan.num_tokens or len(self._lens) == self.plan.num_seqs:
            raise ValueError(f"{self.path.name}: more tokens or sequences than planned ({self.plan})")
        self._ids.append(ids)
        self._masks.append(mask)
        self._lens.append(n)
        self._tokens += n
        if self.plan.fp8:
            q, scales = quantize_fp8(states)  # on the states' device: the GPU does it
            self._scales.append(scales)  # kept where made (16 bytes a token): a copy now would wait for the GPU
            states = q
        else:
            states = states.to(torch.bfloat16)
        # The copy must wait for the work that made these states, and only for that (not the next forward).
        ready = None
        if states.is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(states.device))
        for start in range(0, n, self._chunk_tokens):
            self._put(self._to_copy, (states[start : start + self._chunk_tokens], ready))
        if self.on_add is not None:
            self.on_add(n)

    def _put(self, q: queue.Queue, item: Any) -> None:
        while True:  # a bounded queue whose consumer died must not hang the caller
            self._raise_if_failed()
            try:
                q.put(item, timeout=1.0)
                return
            except queue.Full:
                continue

    def close(self) -> ShardRecord:
        """Write the token arrays, fsync, rename into place; the record for the index."""
        try:
            if self._tokens != self.plan.num_tokens or len(self._lens) != self.plan.num_seqs:
                raise ValueError(
                    f"{self.path.name}: {self._tokens} tokens / {len(self._lens)} sequences written, "
                    f"{self.plan.num_tokens} / {self.plan.num_seqs} planned"
                )
            self._put(self._to_copy, None)
            self._threads[0].join()
            self._to_write.put(None)
            self._threads[1].join()
            self._raise_if_failed()
            tails = ([torch.cat([s.cpu() for s in self._scales]).float()] if self.plan.fp8 else []) + [
                torch.cat(self._ids),
                torch.tensor(self._lens, dtype=torch.int64),
                torch.cat(self._masks),
            ]
            for t in tails:
                self._write_all(memoryview(t.contiguous().view(torch.uint8).numpy()))
            self._hash_blocks(final=True)
            os.fsync(self._file.fileno())
            self._file.close()
            size = self.tmp.stat().st_size
            expected = self.plan.file_bytes(self.metadata)
            if size != expected:
                raise ShardError(f"{self.tmp}: wrote {size} bytes, the plan says {expected}")
            digest = hashlib.sha256(b"".join(f.result() for f in self._block_hashes)).hexdigest()
            os.close(self._reader)
            self._hashers.shutdown()
            record = ShardRecord(bytes=size, blocks_sha256=digest, sample_sha256=sample_sha256(self.tmp))
            os.replace(self.tmp, self.path)
            return record
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Stop the threads and remove the temporary file: nothing half-written stays behind."""
        self._error = self._error or RuntimeError("aborted")
        for q in (self._to_copy, self._to_write):
            try:
                q.put_nowait(None)
            except queue.Full:
                pass  # the copier sees _error at its next item
        for t in self._threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(timeout=60)
        self._hashers.shutdown(cancel_futures=True)
        if not self._file.closed:
            self._file.close()
        try:
            os.close(self._reader)
        except OSError:
            pass  # closed already
        self.tmp.unlink(missing_ok=True)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"writing {self.path} failed: {self._error!r}") from self._error

    # -- threads ----------------------------------------------------------------------------------

    def _copy_loop(self) -> None:
        try:
            while (item := self._to_copy.get()) is not None:
                part, ready = item
                if self._error is not None:
                    continue  # drain: the caller is told by add/close
                chunk = self._free_chunk()
                if chunk is None:
                    continue
                nbytes = part.numel() * part.element_size()
                dst = chunk.buf[:nbytes].view(part.dtype).view(part.shape)
                if part.is_cuda:
                    if self._copy_stream is None:
                        self._copy_stream = torch.cuda.Stream(part.device)
                    with torch.cuda.stream(self._copy_stream):
                        if ready is not None:
                            self._copy_stream.wait_event(ready)
                        dst.copy_(part, non_blocking=True)
                        chunk.event = torch.cuda.Event()
                        chunk.event.record(self._copy_stream)
                    chunk.source = part
                else:
                    dst.copy_(part)
                    chunk.event = None
                chunk.used = nbytes
                self._to_write.put(chunk)
        except BaseException as exc:
            self._error = exc

    def _free_chunk(self) -> _Chunk | None:
        """A free chunk, or None once writing has failed (the writer may never give chunks back)."""
        while self._error is None:
            try:
                return self._free.get(timeout=1.0)
            except queue.Empty:
                continue
        return None

    def _write_loop(self) -> None:
        try:
            while (chunk := self._to_write.get()) is not None:
                if self._error is not None:
                    self._free.put(chunk)
                    continue
                if chunk.event is not None:
                    chunk.event.synchronize()
                chunk.source = None  # the GPU part may be freed now
                self._write_all(memoryview(chunk.buf.numpy())[: chunk.used])  # releases the GIL
                self._free.put(chunk)
                self._hash_blocks()
                self._unsynced += chunk.used
                if self._unsynced >= self._sync_bytes:
                    # Flush as we go, on this thread: otherwise gigabytes of dirty pages wait for the
                    # fsync at close, and the forward waits for that.
                    os.fdatasync(self._file.fileno())
                    self._unsynced = 0
        except BaseException as exc:  # surfaced to the caller by add/close
            self._error = exc

    def _write_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        self._written += len(view)
        while view:
            view = view[self._file.write(view) :]

    def _hash_blocks(self, final: bool = False) -> None:
        """Queue every 64 MiB block written so far (and the last, partial one when `final`)."""
        while True:
            start = len(self._block_hashes) * HASH_BLOCK_BYTES
            if self._written - start >= HASH_BLOCK_BYTES or (final and self._written > start):
                size = min(HASH_BLOCK_BYTES, self._written - start)
                self._block_hashes.append(self._hashers.submit(_hash_block, self._reader, start, size))
            else:
                return


def _hash_block(fd: int, start: int, size: int) -> bytes:
    return hashlib.sha256(os.pread(fd, size, start)).digest()  # both release the GIL


def blocks_sha256(path: str | Path, threads: int = 8) -> str:
    """The full hash the writer records: sha256 over the sha256 of each 64 MiB block, in order."""
    size = Path(path).stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(threads) as pool:
            digests = pool.map(
                lambda k: _hash_block(fd, k, min(HASH_BLOCK_BYTES, size - k)), range(0, size, HASH_BLOCK_BYTES)
            )
            return hashlib.sha256(b"".join(digests)).hexdigest()
    finally:
        os.close(fd)


# -- integrity ------------------------------------------------------------------------------------


def sample_sha256(path: str | Path) -> str:
    """sha256 of (size, the first and last 64 KiB and 14 blocks evenly between): ~1 MiB read."""
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        last = max(0, size - SAMPLE_BLOCK_BYTES)
        for k in range(SAMPLE_BLOCKS):
            f.seek(last * k // (SAMPLE_BLOCKS - 1))
            h.update(f.read(SAMPLE_BLOCK_BYTES))
    return h.hexdigest()


def check_shard(path: str | Path, record: dict[str, Any]) -> None:
    """Size and sampled hash against the index's record; a ShardError naming the file and the fix."""
    path = Path(path)
    fix = "delete the extract stage's manifest.json and rerun it: it extracts again every shard that fails this check"
    if not path.is_file():
        raise ShardError(f"shard {path} is missing; {fix}")
    size = path.stat().st_size
    if "bytes" not in record:
        return  # an index written before sizes were recorded
    if size != int(record["bytes"]):
        what = "truncated" if size < int(record["bytes"]) else "longer than written"
        raise ShardError(f"shard {path} is {what}: {size} bytes on disk, {record['bytes']} written; {fix}")
    if record.get("sample_sha256") and sample_sha256(path) != record["sample_sha256"]:
        raise ShardError(
            f"shard {path} is not the file extract wrote (sampled sha256 differs: changed or swapped "
            f"with another shard); {fix}"
        )


def verify_full(index_path: str | Path) -> list[str]:
    """Full sha256 of every shard of an index against the recorded one; the problems found."""
    index_path = Path(index_path)
    raw = json.loads(index_path.read_text())
    problems = []
    for entry in raw["shards"]:
        path = index_path.parent.parent / entry["file"]
        try:
            check_shard(path, entry)
        except ShardError as exc:
            problems.append(str(exc))
            continue
        if entry.get("blocks_sha256") and blocks_sha256(path) != entry["blocks_sha256"]:
            problems.append(f"shard {path}: its full hash differs from the one recorded while writing")
    return problems


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "verify":
        sys.exit("usage: python -m eagleflow.drafter.shards verify <extract stage dir>/data/index.json")
    found = verify_full(sys.argv[2])
    print("\n".join(found) or "every shard matches its full hash")
    sys.exit(1 if found else 0)
