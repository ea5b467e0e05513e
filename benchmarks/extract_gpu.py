"""The extract stage against its bounds, in one run: forward alone, disk alone, the stage.

    python benchmarks/extract_gpu.py --out DIR [--runs hf-bf16 hf-fp8 hf-spread vllm-tp2]   (GPU host)
    .hostenv/bin/python benchmarks/extract_gpu.py --tiny --out DIR --runs hf-bf16 hf-fp8          (CPU check)

Builds an 8B-shape Llama (hidden 4096, 32 layers, random bf16 weights; `--tiny`: a 4-layer toy)
and a generate stage of random conversations (`--seqs` x `--seq-len` tokens), then measures, side by
side on the same machine:

    forward    HfCapture.forward over the stage's own batches, nothing copied (the compute bound)
    disk       the bytes the stage writes, written from a page-locked buffer and fsynced (the disk bound)
    hf-bf16    the real stage (`python -m eagleflow.stages.extract`), backend hf, bf16 shards
    hf-fp8     the same, float8_e4m3fn shards with per-token scales (half the bytes)
    hf-spread  the same as hf-bf16 with the layers spread over every GPU (extract.spread always)
    vllm-tp2   backend vllm: the serving engine at tensor parallel 2 (needs vLLM and 2 GPUs)

The stage's rate is its own metric (tokens over the time spent on shards, model load excluded).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, Path(__file__).parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from extract_backends import run_extract  # noqa: E402

from eagleflow.config import parse_config  # noqa: E402
from eagleflow.contracts.manifest import Manifest  # noqa: E402
from eagleflow.contracts.stage_records import ExtractMetrics, ExtractOutputs, GenerateOutputs  # noqa: E402

SHAPES = {
    "8b": dict(
        hidden_size=4096,
        num_hidden_layers=32,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
    "tiny": dict(
        hidden_size=256,
        num_hidden_layers=4,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4096,
    ),
}


def build_target(path: Path, shape: dict, device: torch.device) -> None:
    """A Llama with random bf16 weights (std 0.02, norms 1), saved as an HF checkpoint."""
    if (path / "config.json").is_file():
        return
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        **shape, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False, dtype="bfloat16"
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to_empty(device=device).to(torch.bfloat16)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    model.save_pretrained(path)
    del model


def build_generate(out: Path, n: int, length: int, vocab: int) -> Manifest:
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (n, length), generator=g).tolist()
    table = pa.table({"split": ["train"] * n, "input_ids": ids, "loss_mask": [[1] * length] * n})
    pq.write_table(table, out / "shard-00000.parquet")
    outputs = GenerateOutputs(shards=["shard-00000.parquet"], num_train=n, num_holdout=0, num_tokens=n * length)
    return Manifest(stage="generate", key="random", dir=str(out), outputs=outputs.model_dump())


def config_for(out: Path, target: Path, batch_tokens: int, seq_len: int, **extract) -> dict:
    (out / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    return {
        "name": "extract-gpu",
        "host": {"work_root": str(out / "work"), "python": sys.executable},
        "target": {
            "model_path": str(target),
            "aux_layer_ids": [2, 16, 29] if "8b" in target.name else [1, 2, 3],
            "final_layer_id": json.loads((target / "config.json").read_text())["num_hidden_layers"],
        },
        "engine": {
            "max_model_len": seq_len + 64,
            "enforce_eager": True,
            "extra_args": ["--skip-tokenizer-init"],
            "gpu_memory_utilization": 0.85,
            "startup_timeout_s": 900,
        },
        "generate": {"prompts_path": str(out / "prompts.jsonl"), "num_samples": 40, "holdout": 32},
        "extract": {"max_seq_len": seq_len, "batch_tokens": batch_tokens, "shard_bytes": 4 << 30, **extract},
        "train": {"max_seq_len": seq_len},
    }


def forward_rate(config: dict, gen: Manifest) -> float:
    """Tokens/s of the stage's own forward over its own batches, states left on the device."""
    from eagleflow.drafter.devices import pick_device
    from eagleflow.extraction.hf import HfCapture, batches
    from eagleflow.extraction.plan import plan_shards

    cfg = parse_config(config)
    capture = HfCapture(cfg, pick_device("auto", "extract.device"))
    shard = next(
        plan_shards([gen.path(r) for r in GenerateOutputs.of(gen).shards], cfg.extract.max_seq_len, 1, 1 << 62)
    )
    groups = batches([len(x) for x in shard.ids], cfg.extract.batch_tokens)

    def one(group: list[int]) -> None:
        ids = torch.from_numpy(np.stack([shard.ids[i] for i in group]))
        capture.forward(ids, torch.ones_like(ids))  # noqa: F821 - deleted only after its last call

    one(groups[0])  # warm-up: kernels chosen, memory pooled
    _sync()
    t = time.perf_counter()
    for group in groups:
        one(group)
    _sync()
    rate = shard.num_tokens / (time.perf_counter() - t)
    del capture  # the target's weights go before the next measurement loads its own
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return rate


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def disk_rate(path: Path, nbytes: int, chunk: int = 64 << 20) -> float:
    """Bytes/s writing nbytes from a page-locked buffer, fsync included."""
    buf = torch.empty(chunk, dtype=torch.uint8, pin_memory=torch.cuda.is_available()).fill_(7)
    view = memoryview(buf.numpy())
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            left -= f.write(view[: min(chunk, left)])
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t
    path.unlink()
    return nbytes / dt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--seqs", type=int, default=192)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-tokens", type=int, default=65536)
    p.add_argument(
        "--runs", nargs="+", default=["hf-bf16", "hf-fp8"], choices=["hf-bf16", "hf-fp8", "hf-spread", "vllm-tp2"]
    )
    p.add_argument("--results", type=Path, default=None, help="also write the figures here (JSON)")
    args = p.parse_args()
    out = args.out.resolve()
    shape = SHAPES["tiny" if args.tiny else "8b"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    target = out / ("target-tiny" if args.tiny else "target-8b")
    t = time.perf_counter()
    build_target(target, shape, device)
    gen = build_generate(out / "generate", args.seqs, args.seq_len, shape["vocab_size"])
    print(
        f"target and data ready in {time.perf_counter() - t:.0f} s: {args.seqs} x {args.seq_len} tokens, "
        f"hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers, {device}"
    )
    base = config_for(out, target, args.batch_tokens, args.seq_len)
    tokens = args.seqs * args.seq_len
    bytes_per_token = 4 * shape["hidden_size"] * 2
    fig: dict = {
        "tokens": tokens,
        "bytes_per_token_bf16": bytes_per_token,
        "gpus": torch.cuda.device_count(),
        "runs": {},
    }
    fig["forward_tok_s"] = forward_rate(base, gen)
    fig["disk_bytes_s"] = disk_rate(out / "disk-probe.bin", tokens * bytes_per_token)
    fig["disk_tok_s_bf16"] = fig["disk_bytes_s"] / bytes_per_token
    blob = os.urandom(1 << 28)
    t = time.perf_counter()
    for _ in range(4):
        hashlib.sha256(blob)
    fig["sha256_bytes_s"] = 4 * len(blob) / (time.perf_counter() - t)
    print(f"sha256 on one core: {fig['sha256_bytes_s'] / 1e9:.2f} GB/s")
    print(
        f"forward alone {fig['forward_tok_s']:,.0f} tok/s; disk {fig['disk_bytes_s'] / 1e9:.2f} GB/s with fsync "
        f"= {fig['disk_tok_s_bf16']:,.0f} tok/s of bf16 states ({fig['disk_tok_s_bf16'] * 2:,.0f} of fp8)"
    )
    settings = {
        "hf-bf16": {"backend": "hf"},
        "hf-fp8": {"backend": "hf", "storage_dtype": "float8_e4m3fn"},
        "hf-spread": {"backend": "hf", "spread": "always"},
        "vllm-tp2": {"backend": "vllm", "concurrency": 32},
    }
    for name in args.runs:
        config = config_for(out, target, args.batch_tokens, args.seq_len, **settings[name])
        if name == "vllm-tp2":
            config["engine"]["tensor_parallel_size"] = 2
        m, wall = run_extract(config, gen, out / name)
        metrics = ExtractMetrics.of(m)
        bound = min(fig["forward_tok_s"], fig["disk_tok_s_bf16"] * (2 if name == "hf-fp8" else 1))
        fig["runs"][name] = {
            "tok_s": metrics.tok_s,
            "wall_s": round(wall, 1),
            "bytes": ExtractOutputs.of(m).num_bytes,
            "peak_rss_mib": metrics.peak_rss_mib,
            "of_bound": metrics.tok_s / bound,
        }
        print(
            f"{name:10} {metrics.tok_s:>10,.0f} tok/s = {100 * metrics.tok_s / bound:5.1f}% of min(forward, disk) "
            f"{bound:,.0f}; {ExtractOutputs.of(m).num_bytes / 1e9:.2f} GB; peak RSS {metrics.peak_rss_mib:.0f} MiB; "
            f"stage wall {wall:.0f} s"
        )
        for f in (out / name).glob("data/*.safetensors"):
            f.unlink()  # keep the disk for the next run
    if args.results:
        args.results.write_text(json.dumps(fig, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
