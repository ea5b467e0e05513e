"""eagleflow's capture plugin for SGLang: production's own hidden states, for the requests that ask for them.

The counterpart of eagleflow.engines.capture_plugin (vLLM's), for a production served by SGLang 0.5.15: a general
plugin (entry point `eagleflow_capture`, group `sglang.srt.plugins`; SGLang's `load_plugins()` runs `register()` in
every scheduler process and applies the hooks it registers). It does nothing unless the server is launched with the
same two variables as vLLM's:

    EAGLEFLOW_CAPTURE_DIR=<a directory>            where the states go (the extract stage reads them there)
    EAGLEFLOW_CAPTURE_LAYERS=2,30,58,61            the aux layer ids and the final one (target.aux_layer_ids +
                                                   target.final_layer_id), in vLLM's convention

and, for now, with `--disable-prefill-cuda-graph`: the final layer's state before its norm is taken by a hook on the
norm's call, which a captured prefill graph would not run again (the plugin says so in the log and stays off).

A capture request is a completion whose `custom_params` carry `{"eagleflow_capture": NAME}` (SGLang's counterpart of
vLLM's `vllm_xargs`; eagleflow.extraction.production sends it with a `cache_salt` of its own, so nothing of it comes
from the prefix cache). Its prompt's rows are copied out by position, chunk by chunk, and once every position is in,
`<dir>/<NAME>.safetensors` holds `hidden_states` [T, n_layers, H] and `token_ids` [T], written exactly as the vLLM
plugin writes (its `Pending` and file writer), so one reader serves both. Other requests are not touched.

Where the states come from (read from SGLang 0.5.15's source):
- aux layers: a decoder captures `hidden_states + residual` at the input of each layer in `layers_to_capture` and
  returns them beside its output (the model's `capture_aux_hidden_states`); layer ids are set here as given (vLLM's
  convention: the input of layer k), not through `set_eagle3_layers_to_capture`, which adds 1 for some families.
  Production serving an EAGLE-3 drafter captures the drafter's layers already: they must be the capture's aux layers
  (else capture stays off, as vLLM's plugin does); without a drafter the plugin turns the capture on.
- the final layer before its norm: `x + residual` at the call of the decoder's final norm (its fused add is in place).
- which rows are whose: `ForwardBatch.init_new(batch, model_runner)` sees the batch's requests (their custom_params
  and prompts); the model runner's forward then has the batch's per-request extend lengths and starts.
Only the target's runner (not the drafter's) and only extend forwards (a prefill, or its chunk) are looked at; only
tensor-parallel rank 0 of the last pipeline stage writes (the residual stream is whole on every TP rank). Under
data-parallel attention (--enable-dp-attention) each DP rank holds its own requests' states: capture stays off.
"""

from __future__ import annotations

import contextvars
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagleflow.engines.capture_plugin import DIR_ENV, LAYERS_ENV, XARG, CaptureFiles, Pending, valid_name

log = logging.getLogger("sglang.eagleflow_capture")

RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
FORWARD_BATCH = "sglang.srt.model_executor.forward_batch_info.ForwardBatch"
LOGITS = "sglang.srt.layers.logits_processor.LogitsProcessor"


@dataclass
class CaptureRow:
    """One capture request in one forward: its name, its whole prompt, and where its rows of this forward go."""

    rid: str
    name: str
    prompt: list[int]


@dataclass
class Forward:
    """What one target forward leaves for the capture: the requests of the batch that are capture requests (set at
    the forward batch's making), then the model's aux states and the final pre-norm state (set during the forward)."""

    rows: list[CaptureRow]
    aux: list[Any] | None = None  # n_aux tensors, each shape: [T_batch, H]
    final: Any = None  # shape: [T_batch, H]


_current: contextvars.ContextVar[Forward | None] = contextvars.ContextVar("eagleflow_capture_forward", default=None)


def spans(extend_lens: list[int], extend_starts: list[int]) -> list[tuple[int, int, int]]:
    """Per request of a batch: (its first row in the batch's tensors, its row count, the prompt position of its
    first row), from the batch's extend lengths and prefix lengths (a chunked prompt's chunk starts past its prefix)."""
    out, row = [], 0
    for n, start in zip(extend_lens, extend_starts, strict=True):
        out.append((row, int(n), int(start)))
        row += int(n)
    return out


class SglangCapture:
    """The capture state of the target's model runner on the writing rank."""

    def __init__(self, directory: str, layers: tuple[int, ...]) -> None:
        self.files = CaptureFiles(directory, layers)
        self.pending: dict[str, Pending] = {}  # request id -> its prompt, filled by position

    def rows_of(self, batch: Any) -> list[CaptureRow]:
        """The capture requests of a scheduler batch (their names checked as file names)."""
        rows = []
        for req in getattr(batch, "reqs", None) or []:
            params = getattr(getattr(req, "sampling_params", None), "custom_params", None) or {}
            name = params.get(XARG) if isinstance(params, dict) else None
            if name is None:
                continue
            if not valid_name(str(name)):
                log.warning("eagleflow_capture: request %s names %r, not a file name: not captured", req.rid, name)
                continue
            rows.append(CaptureRow(str(req.rid), str(name), list(req.origin_input_ids)))
        return rows

    def take(self, fwd: Forward, extend_lens: list[int], extend_starts: list[int], rids: list[str]) -> None:
        """Copy each capture request's rows of this forward; write each prompt once whole."""
        if fwd.aux is None or fwd.final is None:
            log.warning("eagleflow_capture: a forward of capture requests returned no aux or final states")
            return
        states = [*fwd.aux, fwd.final]
        wanted = {r.rid: r for r in fwd.rows}
        for rid, (lo, n, start) in zip(rids, spans(extend_lens, extend_starts), strict=True):
            row = wanted.get(rid)
            if row is None or n == 0:
                continue
            p = self.pending.get(rid)
            if p is None:
                shape = (len(states), states[0].shape[-1], states[0].dtype)
                p = self.pending[rid] = Pending(row.name, row.prompt, *shape, pin=states[0].is_cuda)
            if p.take(start, [s[lo : lo + n] for s in states]):
                self.files.write(p, states[0].is_cuda)
                del self.pending[rid]


def _decoder(model: Any) -> tuple[Any, Any] | None:
    """(the causal LM that owns `capture_aux_hidden_states`, its decoder that owns `layers_to_capture` and `norm`):
    the model itself, or a multimodal wrapper's language model (Kimi-K2.5)."""
    for causal in (model, getattr(model, "language_model", None)):
        decoder = getattr(causal, "model", None)
        if causal is not None and hasattr(decoder, "layers_to_capture") and hasattr(decoder, "norm"):
            return causal, decoder
    return None


def _writes_here(runner: Any) -> bool:
    try:
        from sglang.srt.distributed import get_pp_group, get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0 and get_pp_group().is_last_rank
    except Exception:  # noqa: BLE001 - no distributed state: this rank writes
        return int(getattr(runner, "tp_rank", 0)) == 0


def prefill_graphs_off(args: Any) -> bool:
    """Whether prefill runs without CUDA graphs, as SGLang resolved its flags: `cuda_graph_config.prefill.backend`
    ('disabled'), which an explicit --cuda-graph-backend-prefill or --cuda-graph-config sets over
    --disable-prefill-cuda-graph (server_args.py); the flag itself where no resolved config is there."""
    backend = getattr(getattr(getattr(args, "cuda_graph_config", None), "prefill", None), "backend", None)
    if backend is not None:
        return str(backend) == "disabled"
    return bool(getattr(args, "disable_prefill_cuda_graph", False))


def after_aux_init(result: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    """ModelRunner.init_aux_hidden_state_capture, AFTER: the target's aux layers and the final norm's hook."""
    runner._eagleflow_capture = None
    if getattr(runner, "is_draft_worker", False):
        return result
    directory, layers = os.environ[DIR_ENV], tuple(int(x) for x in os.environ[LAYERS_ENV].split(","))
    if not prefill_graphs_off(runner.server_args):
        log.warning(
            "eagleflow_capture: prefill CUDA graphs are on, and the final layer's state is taken at the norm's call, "
            "which a replayed graph does not make: capture off; launch with --disable-prefill-cuda-graph to capture"
        )
        return result
    if int(getattr(runner, "pp_size", 1) or 1) > 1:
        log.warning("eagleflow_capture: production runs pipeline stages: capture off")
        return result
    if getattr(runner.server_args, "enable_dp_attention", False):
        # each data-parallel attention rank schedules and holds its own requests' states; writing on TP rank 0 alone
        # would leave the others' capture requests unanswered, and their states are not checked against a reference
        log.warning(
            "eagleflow_capture: production runs data-parallel attention (--enable-dp-attention), whose ranks hold "
            "their own requests' states: capture off; the night takes extract.fallback (an engine of our own)"
        )
        return result
    found = _decoder(runner.model)
    if found is None:
        log.warning("eagleflow_capture: %s has no EAGLE-3 aux capture: capture off", type(runner.model).__name__)
        return result
    causal, decoder = found
    aux = list(layers[:-1])
    if getattr(runner, "eagle_use_aux_hidden_state", False):  # a drafter reads the aux states: they must be ours
        serving = [int(i) for i in decoder.layers_to_capture]
        if serving != aux:
            log.warning("eagleflow_capture: the drafter reads layers %s, capture wants %s: capture off", serving, aux)
            return result
    else:
        causal.capture_aux_hidden_states = True
        decoder.layers_to_capture = aux

    def grab_final(module: Any, args: tuple, kwargs: dict) -> None:
        fwd = _current.get()
        if fwd is None:
            return
        x = args[0]
        residual = args[1] if len(args) > 1 else kwargs.get("residual")
        extra = kwargs.get("post_residual_addition")
        if residual is not None and extra is not None:
            residual = residual + extra
        fwd.final = x + residual if residual is not None else x.clone()  # the fused add runs in place after this

    decoder.norm.register_forward_pre_hook(grab_final, with_kwargs=True)
    if _writes_here(runner):
        Path(directory).mkdir(parents=True, exist_ok=True)
        runner._eagleflow_capture = SglangCapture(directory, layers)
        log.info("eagleflow_capture: layers %s of capture requests to %s", layers, directory)
    return result


def after_forward_batch(result: Any, *args: Any, **kwargs: Any) -> Any:
    """ForwardBatch.init_new(batch, model_runner), a classmethod, AFTER: which of the batch's requests are capture
    requests (the scheduler batch is only seen here; the forward has the rids)."""
    batch = kwargs.get("batch", args[1] if len(args) > 1 else None)
    model_runner = kwargs.get("model_runner", args[2] if len(args) > 2 else None)
    capture = getattr(model_runner, "_eagleflow_capture", None)
    if capture is not None and result.forward_mode.is_extend() and not result.forward_mode.is_target_verify():
        result._eagleflow_rows = capture.rows_of(batch) or None
    return result


def _cpu_list(values: Any) -> list[int]:
    return [int(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


def around_forward(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    """ModelRunner.forward(forward_batch, ...), AROUND: the capture requests' rows of an extend forward, once it has
    run."""
    forward_batch = kwargs.get("forward_batch", args[0] if args else None)
    rows = getattr(forward_batch, "_eagleflow_rows", None)
    capture = getattr(runner, "_eagleflow_capture", None)
    if not rows or capture is None:
        return original(runner, *args, **kwargs)
    fwd = Forward(rows)
    token = _current.set(fwd)
    try:
        out = original(runner, *args, **kwargs)
    finally:
        _current.reset(token)
    b = forward_batch
    lens = b.extend_seq_lens_cpu if b.extend_seq_lens_cpu is not None else _cpu_list(b.extend_seq_lens)
    starts = b.extend_prefix_lens_cpu if b.extend_prefix_lens_cpu is not None else _cpu_list(b.extend_prefix_lens)
    capture.take(fwd, _cpu_list(lens), _cpu_list(starts), list(b.rids))
    return out


def around_logits(original: Any, processor: Any, *args: Any, **kwargs: Any) -> Any:
    """LogitsProcessor.forward, AROUND: the aux states of the target's forward, before the processor prunes them."""
    fwd = _current.get()
    if fwd is not None:
        aux = kwargs.get("aux_hidden_states", args[4] if len(args) > 4 else None)
        if aux is not None:
            fwd.aux = list(aux)
    return original(processor, *args, **kwargs)


def register() -> None:
    if not os.environ.get(DIR_ENV):
        return
    try:
        tuple(int(x) for x in os.environ[LAYERS_ENV].split(","))
    except (KeyError, ValueError):
        log.warning("eagleflow_capture: %s is set but %s is not a list of layer ids: capture off", DIR_ENV, LAYERS_ENV)
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{RUNNER}.init_aux_hidden_state_capture", after_aux_init, HookType.AFTER)
    HookRegistry.register(f"{FORWARD_BATCH}.init_new", after_forward_batch, HookType.AFTER)
    HookRegistry.register(f"{RUNNER}.forward", around_forward, HookType.AROUND)
    HookRegistry.register(f"{LOGITS}.forward", around_logits, HookType.AROUND)
