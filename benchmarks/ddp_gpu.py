"""Data-parallel training on GPUs: does the train stage follow the same curve at 1 and 2 ranks?

    python3 benchmarks/ddp_gpu.py --work /tmp/ddp --json-out ddp.json           # 2 GPUs, nccl, bf16
    python3 benchmarks/ddp_gpu.py --tiny --device cpu --work /tmp/ddp_tiny      # CPU smoke check, gloo, fp32
    python3 benchmarks/ddp_gpu.py --runs r1a1 r1a2_again --concurrent --reference ddp.json --json-out ddp2.json
        # two more 1-rank runs at once (one per GPU), compared with an earlier call's runs; the data is
        # regenerated bit for bit from the seed, so runs of different machines are comparable

On the H200 (2 GPUs, one process a GPU) a run takes 130-150 s, about 70 s of it torch.compile in the
first epoch; pass --deadline-s to fit a lease.

Builds a synthetic target and extract-stage shards, then runs the real stage
(`python -m eagleflow.stages.train request.json`; `train.nproc` 2 relaunches it under torchrun) on
the same data with the same global batch (`batch_tokens`):

    r1a2         1 rank, grad_accum_steps 2   the reference: two micro-batches, one optimizer step
    r2a1         2 ranks, grad_accum_steps 1  the same two micro-batches, one per rank (DDP)
    r1a1         1 rank, grad_accum_steps 1   the whole batch in one pass (other shapes, other rounding)
    r2a1_again   r2a1 repeated                run-to-run nondeterminism of the 2-rank setup
    r1a2_seed1   r1a2 with seed 1             another init and data order
    r1a2_again   r1a2 repeated                run-to-run nondeterminism of the 1-rank setup

and prints per-epoch train/holdout loss, per-position accuracy and simulated acceptance length
(from each run's manifest), tokens/s per epoch, each run's wall time, and the differences between
the pairs below: max |per-step loss difference| over all logged steps (the loss is logged with 4
decimals, so 1e-4 is the resolution), the relative L2 distance of the final weights, and the
difference of the last epoch's holdout loss and acceptance length.

"Within noise" (the claim: the same curves at 1 and N ranks) means here:
  * dp     r1a2 vs r2a1        must be no larger than
  * split  r1a1 vs r1a2        the same global batch cut differently on one GPU: the same math with
                               other kernel shapes, i.e. the bf16 rounding noise of the recipe; and
  * seed   r1a2 vs r1a2_seed1  far larger at the epoch level (per-step losses of different data
                               orders are not comparable step by step; only epoch figures are).
  * repeat r2a1 vs r2a1_again  shows whether the GPU run itself is deterministic (the floor);
    repeat1 r1a2 vs r1a2_again the same for one rank.

The data: a first-order Markov "language" over `n_lang` token ids of a Llama-3.2-1B-shaped target
(hidden 2048, 32 heads, 8 KV heads, head dim 64, MLP 8192, vocabulary 128,256). Each token type has
4 successors with probabilities 0.6/0.2/0.1/0.05 (and 0.05 spread over the rest of the language);
the target's final state at position t is built so that its next-token distribution is that row
of the transition table (lm_head(norm(final_t)) puts logits log p on the successors and about
N(0, 1) on the rest), and the three aux states are per-token-type features plus noise. So the
drafter can learn every TTT step from the token it is fed, the loss falls from about ln(32000)
toward the transition entropy, and the curves are sensitive to any difference between runs.
The sequences' first 16-64 tokens are prompt (loss mask 0).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STEP_LOSS = re.compile(r"INFO eagleflow\.train: epoch (\d+) step (\d+)/\d+ lr \S+ loss (\S+) .* grad_norm (\S+)")


# --------------------------------------------------------------------------------- the data


@dataclass(frozen=True)
class Setup:
    """Target shape, data size and the train config shared by every run."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    n_lang: int  # token ids the synthetic language uses
    n_train: int  # sequences
    n_hold: int
    min_len: int
    max_len: int
    shard_seqs: int  # sequences per shard file
    train: dict  # the train section of the config (without nproc, grad_accum_steps, seed)


GPU = Setup(
    hidden=2048,
    heads=32,
    kv_heads=8,
    head_dim=64,
    intermediate=8192,
    vocab=128256,
    n_lang=4096,
    n_train=200,
    n_hold=16,
    min_len=512,
    max_len=1024,
    shard_seqs=64,
    train={
        "epochs": 3,
        "batch_tokens": 8192,
        "draft_vocab_size": 32000,
        "ttt_steps": 7,
        "learning_rate": 1e-3,
        "warmup_steps": 5,
        "max_seq_len": 1024,
        "log_every_steps": 1,
        "checkpoint_every_steps": 0,
        "device": "cuda",
        "dtype": "bfloat16",
    },
)
TINY = Setup(
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=16,
    intermediate=128,
    vocab=512,
    n_lang=96,
    n_train=48,
    n_hold=4,
    min_len=24,
    max_len=48,
    shard_seqs=32,
    train={
        "epochs": 2,
        "batch_tokens": 256,
        "draft_vocab_size": 128,
        "ttt_steps": 3,
        "learning_rate": 2e-3,
        "warmup_steps": 2,
        "max_seq_len": 48,
        "log_every_steps": 1,
        "checkpoint_every_steps": 0,
        "device": "cpu",
        "dtype": "float32",
        "num_threads": 1,
    },
)

SUCCESSOR_P = (0.6, 0.2, 0.1, 0.05)  # the rest (0.05) is spread over the whole language


def write_target(root: Path, s: Setup, device: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """target/config.json + model.safetensors (embedding, final norm, lm_head in bf16); returns embed, lm_head."""
    (root / "target").mkdir(parents=True, exist_ok=True)
    (root / "target" / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": s.hidden,
                "vocab_size": s.vocab,
                "rms_norm_eps": 1e-5,
                "num_attention_heads": s.heads,
                "num_key_value_heads": s.kv_heads,
                "head_dim": s.head_dim,
                "intermediate_size": s.intermediate,
                "num_hidden_layers": 16,
                "tie_word_embeddings": False,
                "max_position_embeddings": 131072,
                "rope_theta": 500000.0,
            }
        )
    )
    embed = (torch.randn(s.vocab, s.hidden, device=device, generator=gen) * 0.02).to(torch.bfloat16)
    # Rows of norm about 1: a unit-RMS final state gives N(0, 1) logits on unrelated ids.
    lm_head = (torch.randn(s.vocab, s.hidden, device=device, generator=gen) / math.sqrt(s.hidden)).to(torch.bfloat16)
    save_file(
        {
            "model.embed_tokens.weight": embed.cpu(),
            "model.norm.weight": torch.ones(s.hidden, dtype=torch.bfloat16),
            "lm_head.weight": lm_head.cpu(),
        },
        str(root / "target" / "model.safetensors"),
    )
    return embed, lm_head


@dataclass
class Language:
    ids: torch.Tensor  # shape: [n_lang] target ids of the token types
    succ: torch.Tensor  # shape: [n_lang, 4] successor types
    final_mean: torch.Tensor  # shape: [n_lang, H] the final state's structured part per current type
    noise_std: float  # per-component std of the final state's noise
    aux_feat: torch.Tensor  # shape: [3, n_lang, H] per-layer features of each type


def make_language(
    s: Setup, lm_head: torch.Tensor, draft_vocab: int, device: torch.device, gen: torch.Generator
) -> Language:
    ids = torch.randperm(s.vocab, device=device, generator=gen)[: s.n_lang]
    succ = torch.stack([torch.randperm(s.n_lang, device=device, generator=gen)[:4] for _ in range(s.n_lang)])
    # Logits z on the successors so that softmax over the draft vocabulary (successors + ~draft_vocab
    # ids at N(0, 1), whose exp sums to about draft_vocab * e^0.5) gives SUCCESSOR_P.
    rest = 1.0 - sum(SUCCESSOR_P)
    z = torch.tensor(
        [math.log(p / rest) + math.log(min(draft_vocab, s.vocab) * math.exp(0.5)) for p in SUCCESSOR_P], device=device
    )
    # Fit in a unit-RMS state (tiny shapes cannot hold the full logits: scale them down there).
    z = z * min(1.0, math.sqrt(0.7 * s.hidden / float((z**2).sum())))
    rows = lm_head.float()[ids[succ]]  # shape: [n_lang, 4, H]
    final_mean = (z[None, :, None] * rows / rows.pow(2).sum(-1, keepdim=True)).sum(1)  # l_s . mean = z_s
    noise_std = math.sqrt(max(0.05, 1.0 - float((z**2).sum()) / s.hidden))
    scales = torch.tensor([1.0, 2.0, 4.0], device=device)[:, None, None]  # later layers carry larger states
    aux_feat = torch.randn(3, s.n_lang, s.hidden, device=device, generator=gen) * scales
    return Language(ids, succ, final_mean, noise_std, aux_feat)


def sample_types(lang: Language, lengths: list[int], device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """Markov chains of token types, shape [n, max(lengths)] (beyond a length: garbage, cut later)."""
    n, t = len(lengths), max(lengths)
    cum = torch.tensor(SUCCESSOR_P, device=device).cumsum(0)
    out = torch.empty(n, t, dtype=torch.int64, device=device)
    out[:, 0] = torch.randint(0, len(lang.ids), (n,), device=device, generator=gen)
    for k in range(1, t):
        u = torch.rand(n, device=device, generator=gen)
        j = torch.searchsorted(cum, u)  # 0..3 a successor, 4 the rest
        nxt = lang.succ[out[:, k - 1], j.clamp(max=3)]
        anywhere = torch.randint(0, len(lang.ids), (n,), device=device, generator=gen)
        out[:, k] = torch.where(j < 4, nxt, anywhere)
    return out


def write_shard(
    path: Path, lang: Language, lengths: list[int], s: Setup, device: torch.device, gen: torch.Generator
) -> int:
    types = sample_types(lang, lengths, device, gen)
    flat = torch.cat([types[i, :n] for i, n in enumerate(lengths)])  # shape: [T]
    total = flat.numel()
    hidden = torch.empty(total, 4, s.hidden, dtype=torch.bfloat16, device=device)
    for k in range(3):
        noise = torch.randn(total, s.hidden, device=device, generator=gen)
        hidden[:, k] = (lang.aux_feat[k][flat] + noise * 0.3 * (k + 1)).to(torch.bfloat16)
    noise = torch.randn(total, s.hidden, device=device, generator=gen)
    hidden[:, 3] = (lang.final_mean[flat] + noise * lang.noise_std).to(torch.bfloat16)
    mask = torch.ones(total, dtype=torch.int8)
    start = 0
    prompt = torch.randint(16, 65, (len(lengths),), generator=torch.Generator().manual_seed(total)).tolist()
    for n, p in zip(lengths, prompt):
        mask[start : start + min(p, n // 4)] = 0
        start += n
    save_file(
        {
            "input_ids": lang.ids[flat].cpu(),
            "loss_mask": mask,
            "seq_lens": torch.tensor(lengths),
            "hidden_states": hidden.cpu(),
        },
        str(path),
    )
    return total


def write_extract(root: Path, s: Setup, device: torch.device, seed: int = 0) -> dict:
    """A target and an extract stage's data/index.json + shards under `root`; returns a summary."""
    t0 = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(seed)
    _, lm_head = write_target(root, s, device, gen)
    lang = make_language(s, lm_head, s.train["draft_vocab_size"], device, gen)
    (root / "data").mkdir(exist_ok=True)
    len_gen = torch.Generator().manual_seed(seed + 1)
    shards, tokens = [], {}
    for split, n in (("train", s.n_train), ("holdout", s.n_hold)):
        lens = torch.randint(s.min_len, s.max_len + 1, (n,), generator=len_gen).tolist()
        tokens[split] = sum(lens)
        for k in range(0, n, s.shard_seqs):
            part = lens[k : k + s.shard_seqs]
            name = f"data/shard-{len(shards):05d}-{split}.safetensors"
            write_shard(root / name, lang, part, s, device, gen)
            shards.append({"file": name, "split": split, "num_seqs": len(part), "num_tokens": sum(part)})
    index = {
        "shards": shards,
        "aux_layer_ids": [1, 2, 3],
        "final_layer_id": 4,
        "hidden_size": s.hidden,
        "dtype": "bfloat16",
    }
    (root / "data" / "index.json").write_text(json.dumps(index))
    # How peaked the target is: its top-1 probability over the draft-vocabulary-sized support, sampled.
    probe = (
        lang.final_mean[:256] + torch.randn(min(256, s.n_lang), s.hidden, device=device, generator=gen) * lang.noise_std
    )
    normed = probe * torch.rsqrt(probe.pow(2).mean(-1, keepdim=True) + 1e-5)
    top1 = torch.softmax(normed @ lm_head.float().T, -1).max(-1).values.mean().item()
    return {
        "seconds": round(time.perf_counter() - t0, 1),
        "train_tokens": tokens["train"],
        "holdout_tokens": tokens["holdout"],
        "shards": len(shards),
        "target_top1_prob_full_vocab": round(top1, 3),
        "bytes": sum((root / sh["file"]).stat().st_size for sh in shards),
    }


# --------------------------------------------------------------------------------- the runs

RUNS = {  # name: (nproc, grad_accum_steps, seed); in the order they run (a deadline drops the last)
    "r1a2": (1, 2, 0),
    "r2a1": (2, 1, 0),
    "r1a1": (1, 1, 0),
    "r2a1_again": (2, 1, 0),
    "r1a2_seed1": (1, 2, 1),
    "r1a2_again": (1, 2, 0),
}
PAIRS = {  # name: (a, b, what it measures)
    "dp": ("r1a2", "r2a1", "the claim: the same 2 micro-batches, accumulated on 1 GPU vs one per rank (DDP)"),
    "split": ("r1a1", "r1a2", "rounding noise: the same global batch in 1 vs 2 micro-batches on 1 GPU"),
    "repeat": ("r2a1", "r2a1_again", "nondeterminism: the 2-rank run twice"),
    "repeat1": ("r1a2", "r1a2_again", "nondeterminism: the 1-rank run twice"),
    "split_again": ("r1a1", "r1a2_again", "rounding noise again (split), with the repeated 1 x 2 run"),
    "seed": ("r1a2", "r1a2_seed1", "seed spread: another init and data order (epoch figures only)"),
}


def stage_dir_for(work: Path, data_root: Path, name: str, train: dict) -> Path:
    """A train-stage request.json over the synthetic extract data (as the control side writes it)."""
    from eagleflow.config import parse_config
    from eagleflow.contracts.manifest import Manifest
    from eagleflow.contracts.request import StageRequest
    from eagleflow.contracts.stage_records import ExtractOutputs

    (work / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    cfg = parse_config(
        {
            "name": "ddp-bench",
            "host": {"work_root": str(work / "runs"), "python": sys.executable},
            "target": {"model_path": str(data_root / "target"), "aux_layer_ids": [1, 2, 3], "final_layer_id": 4},
            "generate": {"prompts_path": str(work / "prompts.jsonl"), "num_samples": 40, "holdout": 32},
            "train": train,
        }
    )
    index = json.loads((data_root / "data" / "index.json").read_text())
    outputs = ExtractOutputs(
        index="data/index.json",
        shards=[e["file"] for e in index["shards"]],
        hidden_size=index["hidden_size"],
        num_tokens={s: sum(e["num_tokens"] for e in index["shards"] if e["split"] == s) for s in ("train", "holdout")},
    )
    extract = Manifest(stage="extract", key="e", dir=str(data_root), outputs=outputs.model_dump())
    stage_dir = work / "runs" / "train" / name
    stage_dir.mkdir(parents=True, exist_ok=True)
    req = StageRequest(stage="train", key=name, dir=str(stage_dir), config=cfg, upstream={"extract": extract})
    (stage_dir / "request.json").write_text(req.model_dump_json(indent=1))
    return stage_dir


def run_stage(stage_dir: Path, timeout_s: float, log_file, env: dict | None = None) -> dict:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "eagleflow.stages.train", str(stage_dir / "request.json")]
    try:
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout_s, cwd=ROOT, env=env
        )
        out, rc = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc = "timeout"
    wall = time.perf_counter() - t0
    log_file.write(f"===== {stage_dir.name} rc {rc} wall {wall:.1f} s\n{out}\n")  # one write: runs may overlap
    log_file.flush()
    result = {"rc": rc, "wall_s": round(wall, 1), "dir": str(stage_dir)}
    steps = [(int(e), int(i), float(loss), float(gn)) for e, i, loss, gn in STEP_LOSS.findall(out)]
    result["step_loss"] = [x[2] for x in steps]
    result["step_grad_norm"] = [x[3] for x in steps]
    manifest = stage_dir / "manifest.json"
    if rc == 0 and manifest.is_file():
        m = json.loads(manifest.read_text())["metrics"]
        result["tokens_per_s"] = m["tokens_per_s"]
        result["nproc"] = m.get("nproc")
        result["epochs"] = [
            {
                "epoch": e["epoch"],
                "step": e["step"],
                "seconds": e["seconds"],
                "tokens_per_s": e["tokens_per_s"],
                "train_tokens": e["train"]["tokens"],
                "train_loss": e["train"]["loss"],
                "train_acc": e["train"]["acc"],
                "val_loss": (e["validation"] or {}).get("loss"),
                "val_acc": (e["validation"] or {}).get("acc"),
                "val_accept_pos": (e["validation"] or {}).get("accept_pos"),
                "val_acceptance_length": (e["validation"] or {}).get("acceptance_length"),
            }
            for e in m["epochs"]
        ]
    else:
        result["tail"] = out[-3000:]
    return result


def final_weights(stage_dir: Path, epoch: int) -> dict[str, torch.Tensor]:
    return load_file(str(stage_dir / "checkpoints" / f"epoch-{epoch}" / "model.safetensors"))


def compare(a: dict, b: dict, epochs: int) -> dict:
    out = {}
    la, lb = a["step_loss"], b["step_loss"]
    if la and lb:
        d = [abs(x - y) for x, y in zip(la, lb)]
        out.update(
            steps=(len(la), len(lb)),
            max_step_loss_diff=max(d),
            mean_step_loss_diff=sum(d) / len(d),
            first_step_diff=next((i for i, x in enumerate(d) if x > 0), None),
        )
    ea, eb = a.get("epochs"), b.get("epochs")
    ckpt = f"checkpoints/epoch-{epochs}/model.safetensors"
    if ea and eb:
        out["train_loss_diff"] = [round(abs(x["train_loss"] - y["train_loss"]), 6) for x, y in zip(ea, eb)]
        if ea[-1]["val_loss"] is not None and eb[-1]["val_loss"] is not None:
            out["val_loss_diff_last"] = abs(ea[-1]["val_loss"] - eb[-1]["val_loss"])
            out["val_al_diff_last"] = abs(ea[-1]["val_acceptance_length"] - eb[-1]["val_acceptance_length"])
    if ea and eb and (Path(a["dir"]) / ckpt).is_file() and (Path(b["dir"]) / ckpt).is_file():
        wa, wb = final_weights(Path(a["dir"]), epochs), final_weights(Path(b["dir"]), epochs)
        num = sum(float((wa[k].double() - wb[k].double()).pow(2).sum()) for k in wa if wa[k].is_floating_point())
        den = sum(float(wa[k].double().pow(2).sum()) for k in wa if wa[k].is_floating_point())
        out["weight_rel_l2"] = math.sqrt(num / max(den, 1e-30))
        out["weight_max_abs"] = max(
            float((wa[k].double() - wb[k].double()).abs().max()) for k in wa if wa[k].is_floating_point()
        )
    return out


def run_concurrent(args, data_root: Path, train: dict, log_file, device: torch.device) -> dict[str, dict]:
    """The 1-rank runs in args.runs at once, run i alone on GPU i (throughput then shares the host's CPUs)."""
    from concurrent.futures import ThreadPoolExecutor

    names = list(args.runs)
    if any(RUNS[n][0] != 1 for n in names):
        sys.exit("--concurrent takes 1-rank runs only")
    gpus = torch.cuda.device_count() if device.type == "cuda" else len(names)
    if len(names) > gpus:
        sys.exit(f"--concurrent: {len(names)} runs but {gpus} GPUs")

    def one(i: int, name: str) -> dict:
        _, accum, seed = RUNS[name]
        stage = stage_dir_for(
            args.work, data_root, name, {**train, "nproc": 1, "grad_accum_steps": accum, "seed": seed}
        )
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i)) if device.type == "cuda" else None
        r = run_stage(stage, args.run_timeout_s, log_file, env)
        r.update(nproc_accum=f"1 x {accum}", concurrent=True)
        return r

    with ThreadPoolExecutor(len(names)) as pool:
        results = dict(zip(names, pool.map(one, range(len(names)), names)))
    for name, r in results.items():
        last = r["epochs"][-1] if r.get("epochs") else {}
        print(
            f"{name}: rc {r['rc']} wall {r['wall_s']} s, {len(r['step_loss'])} steps, "
            f"{r.get('tokens_per_s', 0):.0f} tok/s, last epoch val loss {last.get('val_loss')} "
            f"AL {last.get('val_acceptance_length')}",
            flush=True,
        )
        if r["rc"] != 0:
            print(r.get("tail", ""), flush=True)
    return results


# --------------------------------------------------------------------------------------- main


def fmt_list(xs) -> str:
    return "[" + " ".join(f"{x:.3f}" for x in xs) + "]" if xs else "-"


def print_report(runs: dict, pairs: dict, verdict: dict) -> None:
    print("\n## per epoch (holdout: loss, per-position accuracy, simulated acceptance length)")
    print("| run | nproc x accum | epoch | steps | train loss | holdout loss | holdout acc | AL | tok/s |")
    print("|---|---|---:|---:|---:|---:|---|---:|---:|")
    for name, r in runs.items():
        for e in r.get("epochs", []):
            al = e["val_acceptance_length"]
            print(
                f"| {name} | {r['nproc_accum']} | {e['epoch']} | {e['step']} | {e['train_loss']:.4f} | "
                f"{(e['val_loss'] or float('nan')):.4f} | {fmt_list(e['val_acc'])} | "
                f"{al if al is not None else '-'} | {e['tokens_per_s']:.0f} |"
            )
    print("\n## throughput and wall time")
    print("| run | rc | wall s | tok/s (all epochs) | tok/s (last epoch) |")
    print("|---|---|---:|---:|---:|")
    for name, r in runs.items():
        last = r["epochs"][-1]["tokens_per_s"] if r.get("epochs") else float("nan")
        print(f"| {name} | {r['rc']} | {r['wall_s']} | {r.get('tokens_per_s', float('nan')):.0f} | {last:.0f} |")
    print("\n## pairs")
    print(
        "| pair | runs | max step-loss diff | mean | 1st differing step | last holdout loss diff | "
        "last AL diff | weights rel L2 | what |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for name, p in pairs.items():
        c = p["cmp"]

        def g(k, f="{:.2e}", c=c):
            return f.format(c[k]) if c.get(k) is not None else "-"

        print(
            f"| {name} | {p['a']} vs {p['b']} | {g('max_step_loss_diff', '{:.4f}')} | "
            f"{g('mean_step_loss_diff', '{:.5f}')} | {c.get('first_step_diff', '-')} | {g('val_loss_diff_last')} | "
            f"{g('val_al_diff_last')} | {g('weight_rel_l2')} | {p['what']} |"
        )
    print("\nverdict:", json.dumps(verdict))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--work", type=Path, default=Path("/tmp/ddp_bench"), help="scratch directory (data, stage dirs)"
    )
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--log-out", type=Path, help="every run's full stdout (default: <work>/runs.log)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU smoke check)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--deadline-s", type=float, default=540, help="start no run after this many seconds")
    parser.add_argument("--run-timeout-s", type=float, default=180)
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="start the (1-rank) runs at once, run i on GPU i (CUDA_VISIBLE_DEVICES)",
    )
    parser.add_argument(
        "--reference",
        type=Path,
        help="a JSON this script wrote earlier: its runs join the comparisons (losses and epoch "
        "figures; weights only where its stage directories still exist)",
    )
    args = parser.parse_args()
    t_start = time.perf_counter()

    s = TINY if args.tiny else GPU
    train = dict(s.train, device=args.device)
    if args.device == "cpu":
        train["dtype"] = "float32"
    device = torch.device(args.device)
    if device.type == "cuda":
        n = torch.cuda.device_count()
        print(
            f"{n} x {torch.cuda.get_device_name()} | torch {torch.__version__} | "
            f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}",
            flush=True,
        )
        if n < max(RUNS[r][0] for r in args.runs):
            sys.exit("the runs asked for need 2 GPUs (one per rank)")
    args.work.mkdir(parents=True, exist_ok=True)
    data_root = args.work / "data_root"
    if not (data_root / "data" / "index.json").is_file():
        data = write_extract(data_root, s, device)
        print(f"data: {json.dumps(data)}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    else:
        data = {"reused": str(data_root)}

    runs: dict[str, dict] = {}
    if args.reference:
        ref = json.loads(args.reference.read_text())
        for name, r in ref["runs"].items():
            if name not in args.runs:
                runs[name] = {**r, "reference": str(args.reference)}
    log_path = args.log_out or args.work / "runs.log"
    with open(log_path, "w") as log_file:
        if args.concurrent:
            runs.update(run_concurrent(args, data_root, train, log_file, device))
        for name in [] if args.concurrent else args.runs:
            elapsed = time.perf_counter() - t_start
            if elapsed > args.deadline_s:
                print(f"{name}: skipped, {elapsed:.0f} s past the start (deadline {args.deadline_s:.0f} s)", flush=True)
                continue
            nproc, accum, seed = RUNS[name]
            stage = stage_dir_for(
                args.work, data_root, name, {**train, "nproc": nproc, "grad_accum_steps": accum, "seed": seed}
            )
            timeout = min(args.run_timeout_s, max(30.0, args.deadline_s + 60 - elapsed))
            r = run_stage(stage, timeout, log_file)
            r["nproc_accum"] = f"{nproc} x {accum}"
            runs[name] = r
            last = r["epochs"][-1] if r.get("epochs") else {}
            print(
                f"{name}: rc {r['rc']} wall {r['wall_s']} s, {len(r['step_loss'])} steps, "
                f"{r.get('tokens_per_s', 0):.0f} tok/s, last epoch val loss {last.get('val_loss')} "
                f"AL {last.get('val_acceptance_length')}",
                flush=True,
            )
            if r["rc"] != 0:
                print(r.get("tail", ""), flush=True)

    ok = {n for n, r in runs.items() if r.get("epochs")}
    runs = {n: runs[n] for n in [*RUNS, *runs] if n in runs}  # report in RUNS order
    pairs = {}
    for name, (a, b, what) in PAIRS.items():
        if a in ok and b in ok:
            pairs[name] = {"a": a, "b": b, "what": what, "cmp": compare(runs[a], runs[b], train["epochs"])}
    verdict = {}
    if "dp" in pairs:
        dp = pairs["dp"]["cmp"]
        ref = [
            pairs[k]["cmp"].get("max_step_loss_diff", 0.0)
            for k in ("split", "repeat", "repeat1", "split_again")
            if k in pairs
        ]
        verdict["dp_max_step_loss_diff"] = dp.get("max_step_loss_diff")
        verdict["noise_max_step_loss_diff"] = max(ref) if ref else None
        # 1e-4: the logged loss has 4 decimals, so a difference below it is invisible either way.
        verdict["within_noise_steps"] = bool(ref) and dp.get("max_step_loss_diff", 1e9) <= max(ref + [1e-4])
        wref = [
            pairs[k]["cmp"]["weight_rel_l2"]
            for k in ("split", "repeat", "repeat1", "split_again")
            if k in pairs and "weight_rel_l2" in pairs[k]["cmp"]
        ]
        if wref and "weight_rel_l2" in dp:
            verdict["dp_weight_rel_l2"], verdict["noise_weight_rel_l2"] = dp["weight_rel_l2"], max(wref)
            verdict["within_noise_weights"] = dp["weight_rel_l2"] <= max(wref) or dp["weight_rel_l2"] == 0.0
        if "seed" in pairs and "val_loss_diff_last" in dp:
            sd = pairs["seed"]["cmp"]
            verdict["dp_vs_seed_val_loss_diff"] = (dp["val_loss_diff_last"], sd.get("val_loss_diff_last"))
            verdict["dp_vs_seed_al_diff"] = (dp["val_al_diff_last"], sd.get("val_al_diff_last"))
    verdict["last_epoch_diffs"] = {
        k: {
            "val_loss": p["cmp"].get("val_loss_diff_last"),
            "al": p["cmp"].get("val_al_diff_last"),
            "train_loss": p["cmp"].get("train_loss_diff"),
        }
        for k, p in pairs.items()
    }
    if "r2a1" in ok and "r1a2" in ok:
        verdict["speedup_2_ranks_last_epoch"] = round(
            runs["r2a1"]["epochs"][-1]["tokens_per_s"] / runs["r1a2"]["epochs"][-1]["tokens_per_s"], 3
        )
    if "r2a1" in ok and "r1a1" in ok:
        verdict["speedup_vs_r1a1_last_epoch"] = round(
            runs["r2a1"]["epochs"][-1]["tokens_per_s"] / runs["r1a1"]["epochs"][-1]["tokens_per_s"], 3
        )
    print_report(runs, pairs, verdict)
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {
                    "setup": {k: v for k, v in vars(s).items()},
                    "train": train,
                    "data": data,
                    "runs": runs,
                    "pairs": pairs,
                    "verdict": verdict,
                    "seconds": round(time.perf_counter() - t_start, 1),
                },
                indent=1,
            )
        )
    print(f"total {time.perf_counter() - t_start:.0f} s", flush=True)
    failed = [n for n, r in runs.items() if "reference" not in r and r.get("rc") != 0]
    if failed:
        print(f"failed runs: {failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
