"""eagleflow's capture plugin: production's own hidden states, for the requests that ask for them (issue 41).

A vLLM general plugin (entry point `eagleflow_capture`, group `vllm.general_plugins`; vLLM calls `register()` in
every process it starts). It does nothing unless the engine is launched with

    EAGLEFLOW_CAPTURE_DIR=<a directory>            where the states go (the extract stage reads them there)
    EAGLEFLOW_CAPTURE_LAYERS=1,2,3,4               the aux layer ids and the final one (target.aux_layer_ids +
                                                   target.final_layer_id), as the `vllm` extract backend captures

Then the model returns those layers' states (vLLM's EAGLE-3 interface: id k is the input of layer k, the last id
the final layer's output before its norm), and after each forward the rows of the *capture requests* only are
copied out: a request is one when its sampling parameters carry `extra_args["eagleflow_capture"]` (the OpenAI
server's `vllm_xargs`), whose value names its file. A prompt prefilled in several chunks, or recomputed after a
preemption, fills its rows by position; once every prompt position is in, the file `<dir>/<name>.safetensors`
holds `hidden_states` [T, n_layers, H] and `token_ids` [T] (its metadata names the layers), written under an
exclusive lock on `<file>.lock` as the `vllm` backend's connector writes (eagleflow.engines.hidden_states_connector),
so one reader serves both. From a GPU the rows go to pinned memory without a wait; a writer thread waits for the
copies and writes the file, so production's steps never wait on them or on the disk.
Other requests are not touched: nothing is copied or written for them.

Production serving an EAGLE-3 drafter computes the drafter's aux layers already; the final layer's id is added to
the model's list and its state taken off again before the drafter reads them, so the drafter sees what it always
did. A drafter whose aux layers are not the capture's leaves capture off (the engine log says why): its states
would not be the ones it was trained on.

The capture requests must be computed, not served from the prefix cache: the extract stage gives each its own
`cache_salt`. Only the engine rank that holds whole states writes (tensor parallel rank 0 of the last pipeline
stage: the states after the layers' all-reduce are whole on every TP rank).
"""

from __future__ import annotations

import fcntl
import importlib.abc
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("vllm.eagleflow_capture")  # under "vllm.": the lines land in the engine log

DIR_ENV = "EAGLEFLOW_CAPTURE_DIR"
LAYERS_ENV = "EAGLEFLOW_CAPTURE_LAYERS"
LAYERS_META = "eagleflow_capture_layers"  # the file's metadata key: the layer ids of its states, comma-separated
XARG = "eagleflow_capture"  # the key of a capture request's SamplingParams.extra_args (vllm_xargs)
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"  # vLLM's V1 model runner (MoE and MLA targets: Kimi-K2.5's)
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"  # vLLM's V2 runner, the default for dense targets from 0.26


def capture_file(directory: str | Path, name: str) -> Path:
    """Where the states of the capture request `name` are written."""
    return Path(directory) / f"{name}.safetensors"


def valid_name(name: str) -> bool:
    """A capture name is a file name: no separators, nothing hidden."""
    return bool(name) and len(name) <= 200 and not name.startswith(".") and all(c.isalnum() or c in "-_." for c in name)


class Pending:
    """One capture request's prompt, filled by position.

    Kept layer-major, [n_layers, T, H], so each layer's chunk lands in one contiguous block: from a GPU the copy
    is then an asynchronous DMA into pinned memory (a strided destination would be staged and synchronous), and
    production's next step is not held up by it. The writer thread waits for the copies (`copied`) and writes the
    file's [T, n_layers, H]."""

    def __init__(self, name: str, token_ids: list[int], n_layers: int, hidden: int, dtype: Any, pin: bool) -> None:
        import torch

        self.name = name
        self.token_ids = torch.tensor(token_ids, dtype=torch.int64)
        self.states = torch.empty(n_layers, len(token_ids), hidden, dtype=dtype, pin_memory=pin)  # [n_layers, T, H]
        self.filled = torch.zeros(len(token_ids), dtype=torch.bool)
        self.copied: Any = None  # a CUDA event recorded after the last copies (None: the copies were synchronous)

    def take(self, start: int, rows: Any) -> bool:
        """rows: one [n, H] tensor a layer, at positions start.. (those past the prompt are the generated token's:
        dropped); copied without waiting when they are on a GPU. Whether every prompt position is in."""
        n = max(0, min(rows[0].shape[0], self.states.shape[1] - start))
        if n:
            for layer, r in enumerate(rows):
                self.states[layer, start : start + n].copy_(r[:n], non_blocking=True)
            self.filled[start : start + n] = True
        return bool(self.filled.all())

    def hidden_states(self) -> Any:
        """[T, n_layers, H], once the copies are done (on the writer thread: it may wait)."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.states.transpose(0, 1).contiguous()


class CaptureFiles:
    """Whole prompts' states into `<directory>/<name>.safetensors`, on a thread of their own, so production's next step
    does not wait on the disk (eagleflow's vLLM and SGLang plugins both write through it)."""

    def __init__(self, directory: str, layers: tuple[int, ...]) -> None:
        self.directory = directory
        self.layers = layers
        self.writer: Any = None  # a thread that writes the files, made on first use

    def write(self, p: Pending, from_gpu: bool) -> None:
        """`p`'s file, once its copies are done: from a GPU an event recorded here, on the stream that computed the
        states, marks them, and the writer thread waits on it. The file's lock is taken here, before the request's
        answer can reach the client, which then waits on it."""
        from concurrent.futures import ThreadPoolExecutor

        import torch

        if from_gpu:
            p.copied = torch.cuda.Event()
            p.copied.record()
        path = capture_file(self.directory, p.name)
        lock = open(str(path) + ".lock", "w")  # noqa: SIM115 - closed by the writer thread
        fcntl.flock(lock, fcntl.LOCK_EX)
        if self.writer is None:
            self.writer = ThreadPoolExecutor(1, thread_name_prefix="eagleflow-capture")
        self.writer.submit(_save, p, path, lock, self.layers)


class Capture:
    """The capture state of one model runner."""

    def __init__(self, directory: str, layers: tuple[int, ...], strip: int) -> None:
        self.files = CaptureFiles(directory, layers)
        self.strip = strip  # the model's aux states past the drafter's: ours, taken off before the drafter reads
        self.names: dict[str, str | None] = {}  # request id -> capture name (None: not a capture request)
        self.pending: dict[str, Pending] = {}
        self.done: set[str] = set()  # written; its later steps (a generated token) are not the prompt

    def name_of(self, runner: Any, req_id: str) -> str | None:
        if req_id not in self.names:
            state = runner.requests.get(req_id)
            params = getattr(state, "sampling_params", None)
            name = ((getattr(params, "extra_args", None) or {}).get(XARG)) if params is not None else None
            if name is not None and not valid_name(str(name)):
                log.warning("eagleflow_capture: request %s names %r, not a file name: not captured", req_id, name)
                name = None
            self.names[req_id] = None if name is None else str(name)
        return self.names[req_id]

    def after_forward(self, runner: Any) -> None:
        """Copy the capture requests' rows of the forward just run; write each prompt once whole."""
        state = runner.execute_model_state
        if state is None or state.aux_hidden_states is None:
            return
        aux = state.aux_hidden_states  # n_layers tensors, each shape: [T_batch, H]
        if self.strip:
            runner.execute_model_state = state._replace(aux_hidden_states=aux[: len(aux) - self.strip])
        sched = state.scheduler_output
        for req_id in sched.finished_req_ids:
            self.names.pop(req_id, None)
            self.pending.pop(req_id, None)
            self.done.discard(req_id)
        batch = runner.input_batch
        starts = runner.query_start_loc.np
        for i, req_id in enumerate(batch.req_ids[: batch.num_reqs]):
            if req_id is None or sched.num_scheduled_tokens.get(req_id, 0) == 0:
                continue
            name = self.name_of(runner, req_id)
            if name is None or req_id in self.done:
                continue
            p = self.pending.get(req_id)
            if p is None:
                prompt = runner.requests[req_id].prompt_token_ids or []
                shape = (len(aux), aux[0].shape[-1], aux[0].dtype)
                p = self.pending[req_id] = Pending(name, list(prompt), *shape, pin=aux[0].is_cuda)
            lo, hi = int(starts[i]), int(starts[i + 1])
            # Queued on the stream that computed the states, so they are copied before the next step reuses their
            # buffers (CUDA graphs' outputs are static), and nothing here waits for the GPU.
            if p.take(int(batch.num_computed_tokens_cpu[i]), [h[lo:hi] for h in aux]):
                self.files.write(p, aux[0].is_cuda)
                del self.pending[req_id]
                self.done.add(req_id)


def _save(p: Pending, path: Path, lock: Any, layers: tuple[int, ...]) -> None:
    from safetensors.torch import save_file

    try:
        tmp = path.with_name(path.name + ".tmp")
        tensors = {"hidden_states": p.hidden_states(), "token_ids": p.token_ids}
        # which layers these are: the reader refuses states of other layers than its run's (production launched
        # with another EAGLEFLOW_CAPTURE_LAYERS), which no shape would show
        save_file(tensors, str(tmp), metadata={LAYERS_META: ",".join(str(i) for i in layers)})
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001 - the reader finds no file and says so; the engine serves on
        log.exception("eagleflow_capture: %s not written", path)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def _writes_here() -> bool:
    """The rank whose states are whole and written: TP rank 0 of the last pipeline stage."""
    try:
        from vllm.distributed import get_pp_group, get_tp_group

        return get_tp_group().rank_in_group == 0 and get_pp_group().is_last_rank
    except Exception:  # noqa: BLE001 - no distributed state (a single process): this rank writes
        return True


def _pipeline_stages() -> int:
    try:
        from vllm.distributed import get_pp_group

        return int(get_pp_group().world_size)
    except Exception:  # noqa: BLE001 - no distributed state (a single process): one stage
        return 1


def patch_runner(module: Any) -> None:
    """Wrap the model runner class of `module` (vLLM's V1 GPU model runner; the CPU runner inherits from it)."""
    runner_cls = module.GPUModelRunner
    if getattr(runner_cls, "_eagleflow_capture_patched", False):
        return
    directory = os.environ[DIR_ENV]
    layers = tuple(int(x) for x in os.environ[LAYERS_ENV].split(","))
    setup = runner_cls._setup_eagle3_aux_hidden_state_outputs
    execute = runner_cls.execute_model

    def setup_with_capture(self: Any) -> None:
        setup(self)
        self._eagleflow_capture = None
        if not _writes_here():
            return
        if _pipeline_stages() > 1:  # an aux layer's state stays on the stage that computes it
            log.warning("eagleflow_capture: production runs %d pipeline stages: capture off", _pipeline_stages())
            return
        model = self.get_model()
        if not hasattr(model, "set_aux_hidden_state_layers"):
            log.warning("eagleflow_capture: %s has no EAGLE-3 aux interface: capture off", type(model).__name__)
            return
        strip = 0
        if self.use_aux_hidden_state_outputs:  # a drafter reads aux states: its layers first, ours after
            drafter = tuple(int(x) for x in getattr(getattr(model, "model", None), "aux_hidden_state_layers", ()))
            if drafter != layers[: len(drafter)]:
                log.warning(
                    "eagleflow_capture: the drafter reads aux layers %s, capture wants %s: capture off", drafter, layers
                )
                return
            strip = len(layers) - len(drafter)
        self.use_aux_hidden_state_outputs = True
        model.set_aux_hidden_state_layers(layers)
        Path(directory).mkdir(parents=True, exist_ok=True)
        self._eagleflow_capture = Capture(directory, layers, strip)
        log.info("eagleflow_capture: layers %s of capture requests to %s", layers, directory)

    def execute_with_capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = execute(self, *args, **kwargs)
        capture = getattr(self, "_eagleflow_capture", None)
        if capture is not None:
            capture.after_forward(self)
        return out

    runner_cls._setup_eagle3_aux_hidden_state_outputs = setup_with_capture
    runner_cls.execute_model = execute_with_capture
    runner_cls._eagleflow_capture_patched = True


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches the runner module when it is first imported: the API server process never imports it (nor pays for
    it), the engine core and its workers do."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in (RUNNER_MODULE, V2_RUNNER_MODULE) or getattr(self, "_finding", False):
            return None
        self._finding = True  # the lookup below asks every finder, this one too
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        if module.__name__ == RUNNER_MODULE:
            patch_runner(module)
        else:
            warn_on_load(module)


def warn_on_load(module: Any) -> None:
    """vLLM's V2 model runner (imported by the V1 one too): a warning if an engine loads its model through it."""
    runner_cls = module.GPUModelRunner
    load = runner_cls.load_model

    def load_and_warn(self: Any, *args: Any, **kwargs: Any) -> Any:
        log.warning(
            "eagleflow_capture: this engine runs vLLM's V2 model runner, which the plugin does not cover: capture "
            "off; launch production with VLLM_USE_V2_MODEL_RUNNER=0 to capture"
        )
        return load(self, *args, **kwargs)

    runner_cls.load_model = load_and_warn


def _hash_the_capture(layers: tuple[int, ...]) -> None:
    """The model's forward returns the capture's layers: a compiled graph cached by an engine without them (same
    config, same code) must not be loaded by one with them, nor the other way round. The capture enters the
    config's hash, which keys vLLM's compile cache."""
    import hashlib

    from vllm.config import VllmConfig

    if getattr(VllmConfig.compute_hash, "eagleflow_capture", False):
        return
    plain = VllmConfig.compute_hash

    def compute_hash(self: Any) -> str:
        h = plain(self)
        return hashlib.sha256(f"{h}|eagleflow_capture:{layers}".encode()).hexdigest()[: len(h)]

    compute_hash.eagleflow_capture = True  # type: ignore[attr-defined]
    VllmConfig.compute_hash = compute_hash


def register() -> None:
    if not os.environ.get(DIR_ENV):
        return
    try:
        layers = tuple(int(x) for x in os.environ[LAYERS_ENV].split(","))
    except (KeyError, ValueError):
        log.warning("eagleflow_capture: %s is set but %s is not a list of layer ids: capture off", DIR_ENV, LAYERS_ENV)
        return
    _hash_the_capture(layers)
    if RUNNER_MODULE in sys.modules:
        patch_runner(sys.modules[RUNNER_MODULE])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
