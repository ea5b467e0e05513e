"""Another target for the triage's tests: demo/target re-parameterised so that it computes the same text
through other hidden states (host environment: torch).

    .hostenv/bin/python -m tests.helpers.other_target OUT_DIR [--seed N]

The residual stream is rotated by a random orthogonal Q (x -> x Q): each RMSNorm's weight is folded into the
linear layers it feeds (then RMSNorm commutes with Q), those layers read rotated input (W -> W diag(g) Q),
the ones that write the residual write it rotated (W -> Q^T W), the embedding is rotated and the lm_head,
untied, reads the rotated final state. The logits are the demo target's up to bf16 rounding; every hidden
state a drafter learns from is another one. A drafter trained on it is a drafter trained for another
checkpoint of the same model, as a Kimi-K2 drafter beside Kimi-K2.5 would be: it serves at no acceptance
beside demo/target while the engine is sound.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
READS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
WRITES = ("o_proj", "down_proj")


def rotated_target(out: Path, seed: int = 0, source: Path = ROOT / "demo" / "target") -> Path:
    cfg = json.loads((source / "config.json").read_text())
    w = {k: v.float() for k, v in load_file(str(source / "model.safetensors")).items()}
    h = cfg["hidden_size"]
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(h, h, generator=g, dtype=torch.float64))
    q = q.float()  # [H, H] orthogonal
    new: dict[str, torch.Tensor] = {}
    embed = w["model.embed_tokens.weight"]  # [V, H]
    lm_head = w.get("lm_head.weight", embed)
    new["model.embed_tokens.weight"] = embed @ q
    new["lm_head.weight"] = (lm_head * w["model.norm.weight"]) @ q
    new["model.norm.weight"] = torch.ones(h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for norm, names in (
            ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
            ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
        ):
            gain = w[p + norm + ".weight"]
            for n in names:
                new[p + n + ".weight"] = (w[p + n + ".weight"] * gain) @ q  # [out, H]: reads x Q
            new[p + norm + ".weight"] = torch.ones(h)
        for n in ("self_attn.o_proj", "mlp.down_proj"):
            new[p + n + ".weight"] = q.T @ w[p + n + ".weight"]  # [H, in]: writes (y) Q
    missing = set(w) - set(new) - {"lm_head.weight"}
    if missing:
        raise SystemExit(f"tensors not carried over: {sorted(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copyfile(f, out / f.name)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in new.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}, indent=2))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(rotated_target(args.out, args.seed))
