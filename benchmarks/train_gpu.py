"""Drafter training throughput on one GPU: eagleflow's TTT step against speculators' on the same input.

    python3 benchmarks/train_gpu.py --trainer both --seq-len 2048 --batch 8 [--json-out r.json]
    python3 benchmarks/train_gpu.py --tiny --device cpu --trainer eagleflow     # a CPU smoke check (the suite's)

A drafter of Llama-3.1-8B shape (hidden 4096, 32 heads, 8 KV heads, head dim 128, MLP 14336,
target vocabulary 128,256, draft vocabulary 32,000) trained with a TTT unroll of 7 on synthetic
target states: random bf16 aux [B, T, 3, H] and final [B, T, H] states, random token ids, a loss
mask that is all ones. Both trainers see the same tensors.

eagleflow: `eagleflow.drafter.step.train_step` (the public one-step entry point: `ttt_loss` under the
trainer's autocast, zero_grad, backward, grad clip, AdamW step, exactly what `Trainer` runs for a
one-micro-batch step) on an `Eagle3Drafter` with `make_optimizer`. fp32 master weights, bf16
autocast, frozen lm_head (the trainer's defaults), the batch as `collate` hands it over (fp32 states).

speculators 0.9.0: `Eagle3DraftModel.forward` (its own `torch.compile`, flex attention with a
block mask, `kl_div` loss) driven the way `speculators.train.trainer.Trainer` does:
bf16 autocast, zero_grad, backward, clip 1.0, optimizer step (AdamW by default here, as eagleflow;
`--spec-optimizer muon` for its CLI default, `--optimizer muon` for eagleflow's `train.optimizer: muon`). Sequences are
packed into one row with document ids,
as its collate does, after its `shift_batch` (so each document is T-1 long and the row B*T).
Its default loss implementation, "fused" (a Triton kernel), fails to trace under torch 2.11's
dynamo inside the compiled forward ("ListVariable ... is already tracked for mutation"), so the
default here is its "eager" one (`--spec-loss fused` to try). It imports `datasets` and `openai`
only for its data pipeline; where they are absent, empty stand-ins are put in sys.modules.

Timing: after `--warmup` steps (compilation included there), each of `--iters` steps is timed with
a host clock between two `torch.cuda.synchronize()` calls; the median is reported. Data loading
and host-to-device copies are outside the timed region for both. tokens/s counts input tokens:
B * T per step.

FLOPs, counted analytically per input token (the same count for both trainers; K = unroll steps,
H = hidden, A = heads * head_dim = 4096, G = KV heads * head_dim = 1024, I = MLP width,
Vd = draft vocabulary, T = sequence length):

    fc                        2 * 3H * H                                   once (step 0)
    per unroll step i = 0..K-1:
      q, k, v projections     2 * 2H * (A + 2G)
      o projection            2 * A * H
      attention scores+values 4 * A * (keys seen)   keys seen = (t+1) causal step-0 keys + i
                                                    diagonal keys; mean over t: (T+1)/2 + i
      MLP                     2 * 3 * H * I
      lm_head                 2 * H * Vd
    model FLOPs/token = 3 * (fc + sum_i step_i)     forward + backward (backward = 2 * forward)
    + 2 * H * Vd                                    the target's logits over the draft vocabulary
                                                    (forward only, no grad)

The attention term counts causal work only (masked-out scores are not useful work), as MFU
conventions do. The exact executed count is lower than 3x forward in two places: the frozen
lm_head needs no weight gradient, and fc needs no input gradient (2x instead of 3x each);
`flops_per_token` returns that count too. MFU is against 989 TFLOP/s (H200/H100 dense bf16 spec).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import statistics
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # a PYTHONPATH copy of eagleflow (a pinned snapshot) wins

PEAK_BF16_TFLOPS = 989.0  # H200 SXM dense bf16, vendor datasheet


# ------------------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_vocab: int
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5

    def target_config(self) -> dict:
        """The target's config.json fields that `arch_for_target` / speculators read."""
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": self.hidden,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": 131072,
            "num_hidden_layers": 32,
        }


LLAMA_8B = Shape(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256, draft_vocab=32000)
# Kimi-K2.5's public EAGLE-3 drafter (a one-layer Llama block at the target's width, MHA: 64 heads of 128,
# MLP 12,288) with its target's 163,840-token vocabulary and a 32,000-token draft vocabulary.
KIMI_K25 = Shape(
    hidden=7168,
    heads=64,
    kv_heads=64,
    head_dim=128,
    intermediate=12288,
    vocab=163840,
    draft_vocab=32000,
    rope_theta=50000.0,
    rms_norm_eps=1e-6,
)
SHAPES = {"llama-8b": LLAMA_8B, "kimi-k25": KIMI_K25}
TINY = Shape(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512, draft_vocab=128)


def measured_bf16_peak(device: torch.device, n: int = 8192, iters: int = 20) -> float:
    """TFLOP/s of one large bf16 matmul on this device, the best of three timings: the floor's rate,
    measured rather than read from a datasheet (an H200's 989 is a spec; clocks and power decide)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        sync(device)
        best = min(best, (time.perf_counter() - t0) / iters)
    del a, b
    return 2 * n**3 / best / 1e12


def flops_per_token(s: Shape, seq_len: int, steps: int) -> dict[str, float]:
    """Model FLOPs per input token of one TTT step (see the module docstring for the formula)."""
    h, a, g = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    fc = 2 * 3 * h * h
    proj = 2 * 2 * h * (a + 2 * g) + 2 * a * h
    mlp = 2 * 3 * h * s.intermediate
    lm_head = 2 * h * s.draft_vocab
    attn = sum(4 * a * ((seq_len + 1) / 2 + i) for i in range(steps))
    forward = fc + steps * (proj + mlp + lm_head) + attn
    target_logits = 2 * h * s.draft_vocab
    model = 3 * forward + target_logits
    executed = model - steps * lm_head - fc  # no wgrad for the frozen lm_head, no dgrad for fc
    return {"forward": forward, "model": model, "executed": executed, "attention_share": 3 * attn / model}


# ----------------------------------------------------------------------------------- the input


@dataclass
class SyntheticData:
    """What the target would have handed over for B sequences of T tokens (bf16, as extracted)."""

    input_ids: torch.Tensor  # shape: [B, T] int64
    aux: torch.Tensor  # shape: [B, T, 3, H] bf16
    final: torch.Tensor  # shape: [B, T, H] bf16
    embed: torch.Tensor  # shape: [V, H] fp32, the target's embedding
    lm_head: torch.Tensor  # shape: [V, H] fp32, the target's lm_head
    norm_weight: torch.Tensor  # shape: [H]
    draft_to_target: torch.Tensor  # shape: [Vd] int64, sorted target ids of the draft vocabulary


def synthetic_data(s: Shape, batch: int, seq_len: int, device: torch.device, seed: int = 0) -> SyntheticData:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    d2t = torch.randperm(s.vocab, generator=gen)[: s.draft_vocab].sort().values
    torch.manual_seed(seed)
    h = s.hidden
    return SyntheticData(
        input_ids=torch.randint(0, s.vocab, (batch, seq_len), device=device),
        aux=torch.randn(batch, seq_len, 3, h, device=device).to(torch.bfloat16),
        final=torch.randn(batch, seq_len, h, device=device).to(torch.bfloat16),
        embed=torch.randn(s.vocab, h, device=device) * 0.02,
        lm_head=torch.randn(s.vocab, h, device=device) * 0.02,
        norm_weight=torch.ones(h, device=device),
        draft_to_target=d2t.to(device),
    )


# ------------------------------------------------------------------------------------ eagleflow


def eagleflow_step(
    s: Shape, data: SyntheticData, steps: int, device: torch.device, optimizer: str = "adamw", loss: str = "soft_ce"
):
    """(a zero-argument training step, the model): eagleflow's public one-step entry point."""
    from eagleflow.config.train import TrainConfig
    from eagleflow.drafter.data import Batch
    from eagleflow.drafter.model import Eagle3Drafter, TargetHead
    from eagleflow.drafter.objective import TTTObjective
    from eagleflow.drafter.step import make_optimizer, train_step
    from eagleflow.drafter.target import arch_for_target

    cfg = TrainConfig(
        ttt_steps=steps,
        draft_vocab_size=s.draft_vocab,
        device=device.type,
        optimizer=optimizer,
        loss=loss,
        dtype="bfloat16" if device.type == "cuda" else "float32",
    )
    target = TargetHead(
        embed_tokens=data.embed,
        norm_weight=data.norm_weight,
        rms_norm_eps=s.rms_norm_eps,
        lm_head=data.lm_head,
        config=s.target_config(),
    )
    model = Eagle3Drafter(arch_for_target(target, cfg, s.draft_vocab), target.embed_tokens)
    model.init_from_target(target, data.draft_to_target)
    model.lm_head.weight.requires_grad_(not cfg.freeze_lm_head)
    model.to(device)
    optimizer = make_optimizer(model, cfg)
    objective = TTTObjective(model, target, data.draft_to_target, cfg)
    b, t = data.input_ids.shape
    batch = Batch(  # what collate(...).to(device) hands the step: fp32 states
        input_ids=data.input_ids,
        loss_mask=torch.ones(b, t, dtype=torch.bool, device=device),
        lengths=torch.full((b,), t, dtype=torch.int64, device=device),
        aux=data.aux.reshape(b, t, 3 * s.hidden).float(),
        final=data.final.float(),
    )

    def step() -> torch.Tensor:
        loss, _, _ = train_step(objective, optimizer, batch, cfg)
        return loss

    return step, model


# ---------------------------------------------------------------------------------- speculators


def _dummy_attr(attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)  # tools that probe modules (dynamo, inspect) must see a plain module
    return type(attr, (), {})


def _stub_missing(names: list[str]) -> list[str]:
    """Empty modules for packages speculators imports only for its data pipeline (not used here)."""
    stubbed = []
    for name in names:
        top = sys.modules.get(name.split(".")[0])
        if top is None and importlib.util.find_spec(name.split(".")[0]) is not None:
            continue  # the real package is installed
        if top is not None and not getattr(top, "_bench_stub", False):
            continue
        for part in [".".join(name.split(".")[: i + 1]) for i in range(name.count(".") + 1)]:
            if part not in sys.modules:
                mod = types.ModuleType(part)
                mod.__spec__ = importlib.machinery.ModuleSpec(part, None, is_package=True)
                mod.__path__ = []  # a package, so submodules resolve to further stubs
                mod.__getattr__ = _dummy_attr  # any imported name is a dummy class
                mod.__file__ = f"<stub {part}>"
                mod._bench_stub = True
                sys.modules[part] = mod
                if "." in part:
                    parent, _, child = part.rpartition(".")
                    setattr(sys.modules[parent], child, mod)
        stubbed.append(name)
    return stubbed


def speculators_step(
    s: Shape,
    data: SyntheticData,
    steps: int,
    device: torch.device,
    optimizer_name: str,
    loss_impl: str,
    attn_impl: str,
    loss_fn: str = "kl_div",
):
    """(a zero-argument training step, the model) driven the way speculators' Trainer drives it."""
    from transformers import LlamaConfig  # before the stubs: transformers probes for `datasets`

    stubbed = _stub_missing(["datasets", "openai.types.chat", "openai.types.completion"])
    if stubbed:
        print(f"speculators: stubbed data-pipeline imports absent here: {stubbed}", flush=True)

    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig, shift_batch
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.optimizers import build_optimizers

    tl_config = LlamaConfig(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=1,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        head_dim=s.head_dim,
        hidden_act="silu",
        max_position_embeddings=131072,
        rms_norm_eps=s.rms_norm_eps,
        tie_word_embeddings=False,
        layer_types=["full_attention"],  # `--full-attention-indices 0`; T <= its 2048 window anyway
        rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta},
    )
    tl_config._attn_implementation = attn_impl
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=tl_config,
        draft_vocab_size=s.draft_vocab,
        norm_before_residual=True,
        norm_before_fc=True,
        eagle_aux_hidden_state_layer_ids=[2, 16, 29],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
        ),
    )
    model = Eagle3DraftModel(config)
    t2d = torch.zeros(s.vocab, dtype=torch.bool)
    t2d[data.draft_to_target.cpu()] = True
    d2t = data.draft_to_target.cpu() - torch.arange(s.draft_vocab)  # offsets, as its vocab files hold
    model.load_vocab_mappings(t2d, d2t)
    with torch.no_grad():  # what load_verifier_weights does, from the synthetic target instead of a file
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight, std=0.02)
        model.embed_tokens.weight.copy_(data.embed)
        model.lm_head.weight.copy_(data.lm_head[data.draft_to_target])
        model.verifier_lm_head.weight.copy_(data.lm_head[data.draft_to_target])
        model.verifier_norm.weight.copy_(data.norm_weight)
    model.to(device)
    opt_cfg = types.SimpleNamespace(
        optimizer=optimizer_name,
        lr=1e-3,
        weight_decay=0.01,
        muon_lr=1e-3,
        muon_momentum=0.95,
        muon_weight_decay=0.1,
        muon_ns_steps=5,
        muon_adjust_lr_fn="match_rms_adamw",
    )
    optimizers = build_optimizers(model, opt_cfg)
    loss_config = resolve_loss_config(loss_fn, loss_impl)

    # Its collate: shift each document (x[1:], g[:-1], y[1:]), pack them into one row, pad with doc id -1.
    b, t = data.input_ids.shape
    docs = [
        shift_batch(
            {
                "input_ids": data.input_ids[i],
                "hidden_states": data.aux[i].reshape(t, -1),
                "verifier_last_hidden_states": data.final[i],
                "loss_mask": torch.ones(t, dtype=torch.long, device=device),
                "lengths": torch.tensor([t]),
                "position_ids": torch.arange(t, device=device),
            }
        )
        for i in range(b)
    ]
    pad = b * t - sum(d["input_ids"].shape[0] for d in docs)

    def packed(key: str, fill=0) -> torch.Tensor:
        parts = [d[key] for d in docs]
        tail = parts[0].new_full((pad, *parts[0].shape[1:]), fill)
        return torch.cat([*parts, tail]).unsqueeze(0)  # shape: [1, B*T, ...]

    batch = {
        "input_ids": packed("input_ids"),
        "hidden_states": packed("hidden_states"),
        "verifier_last_hidden_states": packed("verifier_last_hidden_states"),
        "loss_mask": packed("loss_mask"),
        "position_ids": packed("position_ids"),
        "document_ids": torch.cat(
            [torch.full((t - 1,), i, device=device) for i in range(b)] + [torch.full((pad,), -1, device=device)]
        ).unsqueeze(0),
    }
    call_kwargs = {"ttt_steps": steps, "ttt_step_loss_decay": 0.8, "loss_config": loss_config}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step() -> float:
        with autocast:
            _draft_tokens, loss, _metrics = model(**batch, **call_kwargs)
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for opt in optimizers:
            opt.step()
        return loss.detach()

    return step, model


# --------------------------------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(step, device: torch.device, warmup: int, iters: int) -> dict:
    t0 = time.perf_counter()
    loss = step()
    sync(device)
    first_s = time.perf_counter() - t0  # compilation, allocator growth, cuBLAS handles
    print(f"  first step {first_s:.1f} s", flush=True)
    for _ in range(max(warmup - 1, 0)):
        t1 = time.perf_counter()
        step()
        sync(device)
        print(f"  warm-up step {time.perf_counter() - t1:.2f} s", flush=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        loss = step()
        sync(device)  # honest step timing, as Trainer.train does
        times.append(time.perf_counter() - t0)
    out = {"first_step_s": first_s, "step_s": times, "median_s": statistics.median(times), "loss": float(loss)}
    if device.type == "cuda":
        out["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def profile_step(step, device: torch.device, rows: int) -> str:
    """CUDA time by operator over one step (after warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def run_one(trainer: str, s: Shape, batch: int, seq_len: int, args, device: torch.device, loss_fn: str) -> dict:
    data = synthetic_data(s, batch, seq_len, device, seed=args.seed)
    if trainer == "eagleflow":
        step, model = eagleflow_step(s, data, args.ttt_steps, device, args.optimizer, loss_fn)
    else:
        step, model = speculators_step(
            s,
            data,
            args.ttt_steps,
            device,
            args.spec_optimizer,
            "eager" if device.type == "cpu" else args.spec_loss,
            args.spec_attn,
            loss_fn,
        )
    result = time_steps(step, device, args.warmup, args.iters)
    tokens = batch * seq_len
    fl = flops_per_token(s, seq_len, args.ttt_steps)
    result.update(
        trainer=trainer,
        loss_fn=loss_fn,
        batch=batch,
        seq_len=seq_len,
        tokens_per_step=tokens,
        tokens_per_s=tokens / result["median_s"],
        tflops=fl["model"] * tokens / result["median_s"] / 1e12,
        tflops_executed=fl["executed"] * tokens / result["median_s"] / 1e12,
        spread=(max(result["step_s"]) - min(result["step_s"])) / result["median_s"],
    )
    result["mfu"] = result["tflops"] / PEAK_BF16_TFLOPS
    if args.peak_tflops:  # the matmul floor: the step's FLOPs at the measured matmul rate, over its time
        result["floor_fraction"] = result["tflops"] / args.peak_tflops
    if args.profile:
        result["profile"] = profile_step(step, device, args.profile)
    del step, model, data
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", choices=["eagleflow", "speculators", "both"], default="both")
    parser.add_argument("--seq-len", type=int, nargs="+", default=[2048])
    parser.add_argument("--batch", type=int, nargs="+", default=[8], help="sequences per step")
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (the first compiles)")
    parser.add_argument("--iters", type=int, default=8, help="timed steps; the median is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw", help="eagleflow's train.optimizer")
    parser.add_argument("--spec-optimizer", choices=["adamw", "muon"], default="adamw")
    parser.add_argument(
        "--loss",
        nargs="+",
        choices=["soft_ce", "kl", "lk"],
        default=["soft_ce"],
        help="eagleflow's train.loss, each timed in turn",
    )
    parser.add_argument(
        "--spec-loss-fn",
        nargs="+",
        default=["kl_div"],
        help="speculators' --loss-fn, each timed in turn (kl_div, lk_hybrid)",
    )
    parser.add_argument(
        "--spec-loss",
        choices=["fused", "eager"],
        default="eager",
        help="speculators' loss implementation (fused fails under torch 2.11's dynamo)",
    )
    parser.add_argument(
        "--spec-attn", choices=["simple_flex_attention", "sdpa", "eager"], default="simple_flex_attention"
    )
    parser.add_argument("--profile", type=int, default=0, help="print this many rows of a one-step CUDA profile")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b", help="the drafter's shape")
    parser.add_argument("--tiny", action="store_true", help="a tiny shape (CPU smoke check)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    s = TINY if args.tiny else SHAPES[args.shape]
    trainers = ["eagleflow", "speculators"] if args.trainer == "both" else [args.trainer]
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__}", flush=True)
        peak = measured_bf16_peak(device)
        print(f"measured bf16 matmul peak: {peak:.1f} TFLOP/s (8192^3)", flush=True)
    else:
        peak = 0.0
    args.peak_tflops = peak
    results = []
    for seq_len in args.seq_len:
        fl = flops_per_token(s, seq_len, args.ttt_steps)
        print(
            f"T={seq_len}: {fl['model'] / 1e9:.2f} GFLOP/token model ({fl['executed'] / 1e9:.2f} executed), "
            f"attention {100 * fl['attention_share']:.1f}%",
            flush=True,
        )
        for batch in args.batch:
            for trainer, loss_fn in [
                (t, f) for t in trainers for f in (args.loss if t == "eagleflow" else args.spec_loss_fn)
            ]:
                try:
                    r = run_one(trainer, s, batch, seq_len, args, device, loss_fn)
                except torch.OutOfMemoryError as exc:
                    r = {"trainer": trainer, "batch": batch, "seq_len": seq_len, "error": f"OOM: {exc}"[:300]}
                    torch.cuda.empty_cache()
                except Exception as exc:  # report and go on to the next configuration
                    r = {
                        "trainer": trainer,
                        "batch": batch,
                        "seq_len": seq_len,
                        "error": f"{type(exc).__name__}: {exc}"[:2000],
                    }
                results.append(r)
                if "error" in r:
                    print(f"{trainer:12s} {loss_fn} B={batch} T={seq_len}: {r['error']}", flush=True)
                    continue
                if "profile" in r:
                    print(r["profile"], flush=True)
                print(
                    f"{trainer:12s} {loss_fn} B={batch} T={seq_len}: {r['median_s'] * 1e3:8.1f} ms/step "
                    f"(spread {100 * r['spread']:.1f}%, first {r['first_step_s']:.1f} s) "
                    f"{r['tokens_per_s']:9.0f} tok/s {r['tflops']:6.1f} TFLOP/s MFU {100 * r['mfu']:.1f}% "
                    f"floor {100 * r.get('floor_fraction', 0):.1f}% peak {r.get('peak_mem_gib', 0):.1f} GiB loss "
                    f"{r['loss']:.3f}",
                    flush=True,
                )
    if args.json_out:
        args.json_out.write_text(
            json.dumps([{k: v for k, v in r.items() if k != "profile"} for r in results], indent=1)
        )
    print("\n| trainer | loss | B x T | ms/step | tokens/s | TFLOP/s | MFU | peak GiB |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" not in r:
            print(
                f"| {r['trainer']} | {r['loss_fn']} | {r['batch']} x {r['seq_len']} | {r['median_s'] * 1e3:.1f} | "
                f"{r['tokens_per_s']:.0f} | {r['tflops']:.1f} | {100 * r['mfu']:.1f}% | "
                f"{r.get('peak_mem_gib', 0):.1f} |"
            )
    failed = [r for r in results if "error" in r and not r["error"].startswith("OOM")]
    ours = [r for r in results if "error" not in r and r["trainer"] == "eagleflow"]
    theirs = [r for r in results if "error" not in r and r["trainer"] == "speculators"]
    for r in ours:
        for other in (o for o in theirs if (o["batch"], o["seq_len"]) == (r["batch"], r["seq_len"])):
            print(
                f"eagleflow {r['loss_fn']} / speculators {other['loss_fn']} at B={r['batch']} T={r['seq_len']}: "
                f"{r['tokens_per_s'] / other['tokens_per_s']:.2f}x"
            )
    # An out-of-memory configuration is a result; any other error means the benchmark no longer runs.
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
