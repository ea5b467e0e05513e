"""Hidden states from a transformers forward of the target (small targets, CPU, one host's GPUs).

Layer ids follow vLLM's convention: aux id k is the input to decoder layer k, which is HF's
`hidden_states[k]` (`hidden_states[0]` is the embedding output). The final state (id L) is the last
layer's output *before* the final norm: transformers' `hidden_states[-1]` is already normed, so a
hook on the final norm's input captures it. Nothing here assumes Llama: any decoder that exposes
`get_decoder().norm`, `.layers` and `output_hidden_states` works (DeepSeek-V3 included).

When the weights do not fit one GPU the decoder layers are spread over the host's GPUs (a pipeline
of one request at a time: each layer runs where it lives, its inputs follow it). That is for targets
of tens of GB; a target like Kimi-K2.5 (1T parameters, INT4 kernels) is extracted through the
serving engine (`eagleflow.extraction.vllm`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from eagleflow.config import RunConfig
from eagleflow.contracts.request import StageError
from eagleflow.drafter.devices import pick_device
from eagleflow.drafter.shards import ShardWriter
from eagleflow.extraction.plan import PlannedShard

log = logging.getLogger("eagleflow.extract")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
PAD_TO = 64
FREE_MEMORY_SHARE = 0.8  # of a GPU's free memory the weights may take: the rest is for activations


def _weight_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, tuple):
        return tuple(_to(v, device) for v in x)
    if isinstance(x, list):
        return [_to(v, device) for v in x]
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def _follow(module: torch.nn.Module, device: torch.device) -> None:
    """Move `module` to `device` and its inputs with it on every call."""
    module.to(device)
    module.register_forward_pre_hook(lambda m, args, kwargs: (_to(args, device), _to(kwargs, device)), with_kwargs=True)


def spread_layers(decoder: torch.nn.Module, devices: list[torch.device]) -> list[torch.device]:
    """Contiguous runs of decoder layers on each device, balanced by weight bytes; the embedding on the
    first, the final norm on the last. Returns each layer's device."""
    layers = list(decoder.layers)
    sizes = [_weight_bytes(layer) for layer in layers]
    per_device = sum(sizes) / len(devices)
    placed, seen = [], 0.0
    for layer, size in zip(layers, sizes):
        device = devices[min(len(devices) - 1, int((seen + size / 2) // per_device))]
        _follow(layer, device)
        placed.append(device)
        seen += size
    for child in decoder.children():  # what is left: embeddings, rotary tables
        if child is not decoder.layers and child is not decoder.norm:
            child.to(devices[0])
    _follow(decoder.norm, devices[-1])
    return placed


class HfCapture:
    """The target plus a hook on its final norm: forward() returns [B, T, 4, H] states."""

    def __init__(self, cfg: RunConfig, device: torch.device):
        from transformers import AutoConfig, AutoModelForCausalLM

        path = cfg.target.model_path
        hf_config = AutoConfig.from_pretrained(path)
        layers = hf_config.get_text_config().num_hidden_layers
        if cfg.target.final_layer_id != layers:
            raise StageError(
                f"target.final_layer_id is {cfg.target.final_layer_id} but {path} has {layers} "
                f"decoder layers; set final_layer_id to {layers}"
            )
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[cfg.target.dtype]).eval()
        self.decoder = self.model.get_decoder()
        norm = getattr(self.decoder, "norm", None)
        if norm is None or not hasattr(self.decoder, "layers"):
            raise StageError(
                f"cannot find the decoder layers and final norm of {type(self.model).__name__} "
                "(get_decoder().layers / .norm); this architecture needs an adapter in "
                "eagleflow/extraction/hf.py, or extract.backend 'vllm'"
            )
        self.device = self._place(cfg, device)
        self.where = str(self.device)
        self.batch_tokens = cfg.extract.batch_tokens
        self.aux_ids = cfg.target.aux_layer_ids
        self._final: torch.Tensor | None = None
        norm.register_forward_pre_hook(self._grab_final)

    def _place(self, cfg: RunConfig, device: torch.device) -> torch.device:
        """One device, or the decoder spread over every GPU (extract.spread); the device states end on."""
        n_gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        spread = cfg.extract.spread == "always" and n_gpus > 1
        if cfg.extract.spread == "auto" and n_gpus > 1:
            free = torch.cuda.mem_get_info(device)[0]
            spread = _weight_bytes(self.model) > FREE_MEMORY_SHARE * free
        if not spread:
            self.model.to(device)
            return device
        devices = [torch.device("cuda", i) for i in range(n_gpus)]
        placed = spread_layers(self.decoder, devices)
        log.info(
            "target spread over %d GPUs: layers per GPU %s",
            n_gpus,
            [sum(1 for d in placed if d == dev) for dev in devices],
        )
        return devices[0]

    def _grab_final(self, module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self._final = args[0]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # input_ids, attention_mask: [B, T]
        # The decoder alone: the lm_head over a 160k vocabulary would be wasted work here.
        out = self.decoder(
            input_ids=input_ids.to(self.device, non_blocking=True),
            attention_mask=attention_mask.to(self.device, non_blocking=True),
            output_hidden_states=True,
            use_cache=False,
        )
        hs = out.hidden_states  # L+1 tensors of [B, T, H], each on its layer's device
        assert self._final is not None, "the final-norm hook did not fire"
        states = [hs[k].to(self.device) for k in self.aux_ids] + [self._final.to(self.device)]
        self._final = None
        return torch.stack(states, dim=2)  # [B, T, 4, H]

    def extract(self, shard: PlannedShard, writer: ShardWriter) -> None:
        extract_hf(self, shard, writer, self.batch_tokens)


def open_hf(cfg: RunConfig) -> HfCapture:
    """The `hf` backend opened (eagleflow.extraction.backends): the target on `extract.device`."""
    try:
        device = pick_device(cfg.extract.device, "extract.device")
    except ValueError as exc:
        raise StageError(str(exc)) from None
    return HfCapture(cfg, device)


def batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Group sequence indices (longest first) so that padded batch size * max length <= batch_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lengths[cur[0]] > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def extract_hf(capture: HfCapture, shard: PlannedShard, writer: ShardWriter, batch_tokens: int) -> None:
    """Every sequence of `shard` into `writer`, longest first (a fixed order: the same inputs give the
    same file). The writer copies and writes batch i while the GPU computes batch i+1."""
    for group in batches([len(x) for x in shard.ids], batch_tokens):
        # Lengths rounded up to a multiple of 64: a few shapes instead of hundreds, so the allocator
        # and the kernels' caches stop growing with the data (CPU RSS crept 1.7x over 28 shards).
        t = -(-max(len(shard.ids[i]) for i in group) // PAD_TO) * PAD_TO
        # Right padding under a causal mask: the pad id never reaches a kept position, so any id works.
        input_ids = torch.zeros((len(group), t), dtype=torch.long)
        attn = torch.zeros((len(group), t), dtype=torch.long)
        for row, i in enumerate(group):
            input_ids[row, : len(shard.ids[i])] = torch.from_numpy(shard.ids[i])
            attn[row, : len(shard.ids[i])] = 1
        if capture.device.type == "cuda":
            input_ids, attn = input_ids.pin_memory(), attn.pin_memory()
        hs = capture.forward(input_ids, attn)  # [B, T, 4, H] on capture.device
        for row, i in enumerate(group):
            writer.add(shard.ids[i], shard.masks[i], hs[row, : len(shard.ids[i])])
