"""extract: token ids -> target forward -> aux-layer and final hidden states -> safetensors shards.

Layer ids follow vLLM's convention: aux id k is the input to decoder layer k, which is HF's
`hidden_states[k]` (`hidden_states[0]` is the embedding output). The final state (id L) is the last
layer's output *before* the final norm: transformers' `hidden_states[-1]` is already normed, so a
hook on the final norm's input captures it. Nothing here assumes Llama: any decoder that exposes
`get_decoder().norm` and `output_hidden_states` works (DeepSeek-V3 included).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
from safetensors.torch import save_file

from eagleflow.config import RunConfig
from eagleflow.devices import pick_device
from eagleflow.files import write_json_atomic, writing
from eagleflow.manifest import Manifest, sha256_file
from eagleflow.outputs import ExtractMetrics, ExtractOutputs, GenerateOutputs
from eagleflow.request import StageError, StageRequest
from eagleflow.stages.common import stage_main

log = logging.getLogger("eagleflow.extract")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class HiddenStateCapture:
    """The target plus a hook on its final norm: forward() returns [B, T, 4, H] states."""

    def __init__(self, cfg: RunConfig, device: torch.device):
        from transformers import AutoConfig, AutoModelForCausalLM

        path = cfg.target.model_path
        if not (Path(path) / "config.json").is_file():
            raise StageError(f"target.model_path {path} has no config.json; point it at an HF checkpoint directory")
        hf_config = AutoConfig.from_pretrained(path)
        layers = hf_config.num_hidden_layers
        if cfg.target.final_layer_id != layers:
            raise StageError(f"target.final_layer_id is {cfg.target.final_layer_id} but {path} has {layers} "
                             f"decoder layers; set final_layer_id to {layers}")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[cfg.target.dtype]).to(device).eval()
        self.decoder = self.model.get_decoder()
        norm = getattr(self.decoder, "norm", None)
        if norm is None:
            raise StageError(f"cannot find the final norm of {type(self.model).__name__} (get_decoder().norm); "
                             "this architecture needs an adapter in eagleflow/stages/extract.py")
        self.aux_ids = cfg.target.aux_layer_ids
        self.device = device
        self._final: torch.Tensor | None = None
        norm.register_forward_pre_hook(self._grab_final)

    def _grab_final(self, module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self._final = args[0]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # input_ids, attention_mask: [B, T]
        # The decoder alone: the lm_head over a 160k vocabulary would be wasted work here.
        out = self.decoder(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device),
                           output_hidden_states=True, use_cache=False)
        hs = out.hidden_states  # L+1 tensors of [B, T, H]
        assert self._final is not None, "the final-norm hook did not fire"
        states = [hs[k] for k in self.aux_ids] + [self._final]
        return torch.stack(states, dim=2)  # [B, T, 4, H]


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


def extract_shard(capture: HiddenStateCapture, ids: list[list[int]], masks: list[list[int]],
                  batch_tokens: int, pad_id: int) -> dict[str, torch.Tensor]:
    states: list[torch.Tensor | None] = [None] * len(ids)
    for group in batches([len(x) for x in ids], batch_tokens):
        t = max(len(ids[i]) for i in group)
        input_ids = torch.full((len(group), t), pad_id, dtype=torch.long)
        attn = torch.zeros((len(group), t), dtype=torch.long)
        for row, i in enumerate(group):
            input_ids[row, : len(ids[i])] = torch.tensor(ids[i])
            attn[row, : len(ids[i])] = 1
        hs = capture.forward(input_ids, attn).to("cpu", torch.bfloat16)  # [B, T, 4, H]
        for row, i in enumerate(group):
            states[i] = hs[row, : len(ids[i])]
    return {
        "input_ids": torch.tensor([t for x in ids for t in x], dtype=torch.long),  # [T_total]
        "loss_mask": torch.tensor([m for x in masks for m in x], dtype=torch.int8),  # [T_total]
        "seq_lens": torch.tensor([len(x) for x in ids], dtype=torch.long),  # [n_seq]
        "hidden_states": torch.cat(states, dim=0).contiguous(),  # [T_total, 4, H]
    }


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    gen = request.upstream["generate"]
    shards = GenerateOutputs.of(gen).shards
    try:
        device = pick_device(cfg.extract.device, "extract.device")
    except ValueError as exc:
        raise StageError(str(exc)) from None
    data_dir = request.path / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    capture: HiddenStateCapture | None = None
    index: list[dict] = []
    tokens_done, seconds = 0, 0.0
    for shard_no, rel in enumerate(shards):
        table = pq.read_table(gen.path(rel), columns=["split", "input_ids", "loss_mask"])
        cols = {c: table.column(c).to_pylist() for c in ("split", "input_ids", "loss_mask")}
        for split in ("train", "holdout"):
            keep = [i for i, s in enumerate(cols["split"]) if s == split]
            if not keep:
                continue
            name = f"shard-{shard_no:05d}-{split}.safetensors"
            ids = [cols["input_ids"][i][: cfg.extract.max_seq_len] for i in keep]
            masks = [cols["loss_mask"][i][: cfg.extract.max_seq_len] for i in keep]
            n_tok = sum(len(x) for x in ids)
            index.append({"file": f"data/{name}", "split": split, "num_seqs": len(ids), "num_tokens": n_tok})
            if (data_dir / name).exists():
                continue  # finished unit from an earlier attempt
            if capture is None:
                capture = HiddenStateCapture(cfg, device)
            start = time.perf_counter()
            # Right padding under a causal mask: the pad id never reaches a kept position, so any id works.
            tensors = extract_shard(capture, ids, masks, cfg.extract.batch_tokens, pad_id=0)
            with writing(data_dir / name) as tmp:
                save_file(tensors, str(tmp), metadata={"split": split})
            dt = time.perf_counter() - start
            tokens_done, seconds = tokens_done + n_tok, seconds + dt
            log.info("%s: %d sequences, %d tokens, %.0f tok/s", name, len(ids), n_tok, n_tok / dt)
    hidden = None
    if index:
        from safetensors import safe_open

        with safe_open(str(request.path / index[0]["file"]), "pt") as f:
            hidden = f.get_slice("hidden_states").get_shape()[-1]
    write_json_atomic(data_dir / "index.json", {
        "shards": index, "aux_layer_ids": cfg.target.aux_layer_ids, "final_layer_id": cfg.target.final_layer_id,
        "hidden_size": hidden, "dtype": "bfloat16",
    })
    rels = [e["file"] for e in index]
    return request.manifest(
        outputs=ExtractOutputs(index="data/index.json", shards=rels, hidden_size=hidden, num_tokens={
            s: sum(e["num_tokens"] for e in index if e["split"] == s) for s in ("train", "holdout")}),
        hashes={r: sha256_file(request.path / r) for r in rels},
        metrics=ExtractMetrics(tok_s=tokens_done / seconds if seconds else None, device=str(device)),
    )


if __name__ == "__main__":
    sys.exit(stage_main("extract", run))
