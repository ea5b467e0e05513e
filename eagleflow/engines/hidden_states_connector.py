"""Device-agnostic hidden-states KV connector for vLLM's `extract_hidden_states`.

vLLM's `ExampleHiddenStatesConnector` copies the captured hidden states out of
the KV cache on a `torch.cuda.Stream`, marks completion with a
`torch.cuda.Event` and stages them in `pin_memory=True` host buffers. All three
need a CUDA device, so the connector crashes on vLLM's CPU build (and any other
non-CUDA platform). This subclass keeps the upstream asynchronous path on CUDA
and, elsewhere, extracts synchronously and hands the disk write to the same
thread pool, so the file/lock protocol (`load_hidden_states`) is unchanged.

vLLM loads it inside its worker processes through
`--kv-transfer-config '{"kv_connector": "EagleflowHiddenStatesConnector",
"kv_connector_module_path": "eagleflow.engines.hidden_states_connector", ...}'`,
so it must not import anything from eagleflow.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1 import (
    example_hidden_states_connector as _upstream,
)

__all__ = ["EagleflowHiddenStatesConnector"]


class _DoneEvent:
    """Stand-in for a `torch.cuda.Event` whose work has already completed.

    The upstream writer thread calls `synchronize()` and `get_finished` polls
    `query()`; a synchronous copy is finished by the time either is called.
    """

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class EagleflowHiddenStatesConnector(_upstream.ExampleHiddenStatesConnector):
    """`ExampleHiddenStatesConnector` that also works without CUDA."""

    def _submit_async_write(self, pending: _upstream.PendingSave) -> None:
        if self._kv_cache is None or self._kv_cache.device.type == "cuda":
            # CUDA (incl. ROCm): the upstream stream/event/pinned path is faster.
            super()._submit_async_write(pending)
            return
        if not self._is_tp_rank_zero:
            return

        # Same slot arithmetic as upstream: every slot of the request's blocks,
        # truncated to the saved token count by extract_from_kv_cache.
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slot_mapping = (block_ids[:, None] * self._block_size + offsets).flatten()
        slot_mapping = slot_mapping.to(self._kv_cache.device)

        # Looked up on the upstream module at call time: the KV-cache layout
        # (and so the indexing) differs between vLLM releases (0.26 indexes
        # shape[1], 0.32 shape[2]); each release's helper matches its own cache.
        extract = _upstream.extract_from_kv_cache
        hidden_states = extract(self._kv_cache, slot_mapping, pending.token_ids.shape[0])
        # Own the data: the blocks are freed (and reused) once get_finished
        # reports this request, possibly before the writer thread runs.
        tensors = {
            "hidden_states": hidden_states.to("cpu").clone(),
            "token_ids": pending.token_ids.clone(),
        }

        assert pending.req_id not in self._req_futures, "Found another KV transfer request with same req_id!"
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        # Lock fd pre-created (LOCK_EX held) by wait_for_save; the fallback
        # mirrors upstream for the case where none was created.
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)

        done = _DoneEvent()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
