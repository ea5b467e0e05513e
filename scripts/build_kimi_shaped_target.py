#!/usr/bin/env python
"""Build a target of Kimi-K2.5's text-model architecture at a small width, with random weights.

For GPU runs of the production path (scripts/gpu_nightly.sh): what production serves there must have Kimi's
attention and expert layout, because that is what the engine's kernels, the sleep mode and the drafter swap
see; its weights need not mean anything. ``DeepseekV3ForCausalLM`` (Kimi-K2's text model) with Kimi-K2's
attention shape: multi-head latent attention with a query LoRA (q_lora_rank 1536), kv_lora_rank 512, head dims
(qk_nope, qk_rope, v) = (128, 64, 128), YaRN rotary (factor 32 over 4,096 positions); a dense first layer, then
mixture-of-experts layers with one shared expert and sigmoid-scored top-k routing (``noaux_tc``). Kimi-K2 has
64 heads, hidden size 7168, 61 layers and 384 routed experts (top 8); here the width, depth and expert count
are small (flags), so the model fits anywhere and loads in seconds.

Random weights give near-uniform next-token distributions, under which no drafter can be right; the output
head is scaled (``--head-scale``) so the target is as sure of its next token as a trained model is (the
script prints the mean top-1 probability at temperature 1). Its answers are then deterministic at
temperature 0 and predictable from its hidden states, which is what an EAGLE-3 drafter learns.

The tokenizer files and chat template are copied from ``demo/target``; the target has no thinking markers
(random weights never close a thinking block), so a config serving it sets no reasoning parser.

Usage::

    python scripts/build_kimi_shaped_target.py --out /tmp/kimi-shaped          # ~85M parameters, bf16
    python scripts/build_kimi_shaped_target.py --out /tmp/k --hidden 256 --heads 2 --experts 4   # a CPU rehearsal
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def kimi_shaped_config(args: argparse.Namespace, vocab_size: int, end_id: int, pad_id: int) -> dict:
    """DeepseekV3Config's fields: Kimi-K2's attention and routing, `args`' width, depth and experts."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,  # the dense first layer's MLP
        num_hidden_layers=args.layers,
        first_k_dense_replace=1,
        moe_layer_freq=1,  # as Kimi-K2's own config: SGLang 0.5.15 reads it without a default
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        # Kimi-K2's MLA: vLLM's FLASH_ATTN MLA prefill on Hopper takes this (128, 64, 128) triple
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        rope_theta=50000.0,
        rope_scaling={
            "type": "yarn",
            "rope_type": "yarn",
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        max_position_embeddings=131072,
        # Kimi-K2's routing at a smaller expert count
        n_routed_experts=args.experts,
        num_experts_per_tok=args.top_k,
        n_shared_experts=1,
        moe_intermediate_size=args.moe_intermediate,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.827,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        num_mtp_layers=0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        hidden_act="silu",
        attention_bias=False,
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=end_id,
        pad_token_id=pad_id,
        torch_dtype="bfloat16",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory to write (replaced only once the build is complete)")
    ap.add_argument("--tokenizer-from", default="demo/target", help="the directory whose tokenizer files are copied")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--moe-intermediate", type=int, default=256)
    ap.add_argument("--head-scale", type=float, default=12.0, help="the output head's weights times this")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM

    final = Path(args.out)
    staged = final.parent / f".{final.name}.building"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(Path(args.tokenizer_from) / name, staged / name)
    tk = AutoTokenizer.from_pretrained(staged)
    torch.manual_seed(args.seed)
    cfg = DeepseekV3Config(**kimi_shaped_config(args, len(tk), tk.eos_token_id, tk.pad_token_id or tk.eos_token_id))
    model = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(args.head_scale)
        # noaux_tc routing reads a per-expert bias; small random values so the experts' choice is not a tie
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.01)
        ids = torch.randint(0, len(tk), (4, 64))
        probs = model(ids).logits.float().softmax(-1)  # [4, 64, vocab]
        top1 = probs.max(-1).values.mean().item()
    model.save_pretrained(staged, safe_serialization=True)
    written = json.loads((staged / "config.json").read_text())
    for key in ("topk_method", "scoring_func", "q_lora_rank", "kv_lora_rank"):  # vLLM reads these
        assert written.get(key) is not None, f"config.json lacks {key}"
    params = sum(p.numel() for p in model.parameters())
    if final.exists():
        shutil.rmtree(final)
    staged.rename(final)
    print(
        f"wrote {final}: DeepseekV3ForCausalLM, {params / 1e6:.1f}M parameters, hidden {args.hidden}, "
        f"{args.heads} heads, {args.layers} layers, {args.experts} experts top-{args.top_k}; "
        f"mean top-1 probability at temperature 1: {top1:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
