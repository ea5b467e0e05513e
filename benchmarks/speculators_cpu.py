"""vLLM's `speculators` 0.9.0 on a CPU: hand it eagleflow's extracted hidden states, train with a
wall-clock budget. Runs in the `.specenv` virtualenv (not the host environment):

    .specenv/bin/python benchmarks/speculators_cpu.py prepare --index runs/demo/extract/<key>/data/index.json --out DIR
    .specenv/bin/python benchmarks/speculators_cpu.py train --budget-s 300 --report R.json -- <speculators train flags>

`prepare` writes speculators' own data layout (what `speculators prepare-data` and
`generate-offline-data` would produce from a vLLM server): a `datasets` dataset saved to disk with
`input_ids`, `loss_mask`, `seq_len` per row, `hidden_states/hs_<row>.safetensors` holding
`hidden_states` [seq, 4, H] (the three aux states, then the final layer's output before the final
norm, the same tensors eagleflow trains on) and `token_ids`, and `token_freq.pt` counted over the
train rows with speculators' own counter. Train rows come first and the holdout rows last, so
`--train-data-ratio` (printed) makes speculators' validation split exactly eagleflow's holdout split.

`train` applies the CPU workarounds from outside the package (nothing in site-packages is edited),
then calls the same entry point as `speculators train`:
  1. the trainer moves the model and each batch to `local_rank` (0, i.e. cuda:0): it gets the CPU
     device instead (`speculators.train.trainer.get_local_rank`);
  2. it autocasts on "cuda" when no accelerator is found: its `device_type` is set to "cpu" (with
     `--hidden-states-dtype float32` autocast is then off: fp32 compute, as eagleflow on CPU);
  3. its step timer calls `torch.accelerator.synchronize()`, which fails without an accelerator:
     a no-op when none is present;
  4. `torch.optim.Muon` runs Newton-Schulz in bfloat16 (2.6 s a step on these AVX2 cores): the same
     iteration in float32 (~50 ms);
  5. the budget: `Trainer.train_epoch` is timed and stops once the summed step time reaches
     `--budget-s` (validation and checkpoints are not counted, as in eagleflow's
     `train.time_limit_s` with `on_time_limit: stop`), or once it has trained on `--budget-tokens`
     tokens (a budget that does not depend on how busy the machine is: benchmarks/recipes.py); the
     last, partial epoch is then checkpointed and validated as usual;
  6. its LR schedule (by default linear: warm-up over the first 1% of epochs x steps, then decay to 0)
     keeps its shape but follows the budget: progress = max(step / total_steps, share of the budget
     spent), eagleflow's rule under a budget, so both schedules end when the budget does.
Not needed here: its resume loads onto "cuda:0", but every run writes a fresh --save-path.
Flags (not patches) cover the rest: `--loss-implementation eager` (the default is a Triton kernel),
`--draft-attn-impl sdpa` (flex attention needs a GPU), `--full-attention-indices 0`,
`--train-data-ratio` < 1, `--num-workers`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

# ----------------------------------------------------------------------------------- prepare


def prepare(index_path: Path, out: Path) -> dict:
    """eagleflow's extract shards -> speculators' data layout under `out`. Returns a summary."""
    import torch
    from datasets import Dataset
    from safetensors import safe_open
    from safetensors.torch import save_file
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    index = json.loads(index_path.read_text())
    base = index_path.parent.parent  # shard "file" entries are relative to the extract stage dir
    hs_dir = out / "hidden_states"
    hs_dir.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    counts = {"train": 0, "holdout": 0}
    tokens = {"train": 0, "holdout": 0}
    row = 0
    for split in ("train", "holdout"):  # train rows first: the split boundary is one ratio
        for shard in (s for s in index["shards"] if s["split"] == split):
            path = base / shard["file"]
            if not path.is_file():
                path = index_path.parent / Path(shard["file"]).name
            with safe_open(str(path), framework="pt") as h:
                ids, mask, lens = h.get_tensor("input_ids"), h.get_tensor("loss_mask"), h.get_tensor("seq_lens")
                hidden = h.get_slice("hidden_states")
                start = 0
                for n in lens.tolist():
                    n = int(n)
                    seq_ids = ids[start : start + n].to(torch.int64)
                    seq_mask = mask[start : start + n].to(torch.int64)
                    # eagleflow skips sequences shorter than 3 (no next token and label); so do we.
                    if n >= 3 and int(seq_mask.sum()) > 0:
                        states = hidden[start : start + n]  # shape: [n, 4, H] bf16
                        save_file(
                            {"hidden_states": states.contiguous(), "token_ids": seq_ids.contiguous()},
                            str(hs_dir / f"hs_{row}.safetensors"),
                        )
                        rows["input_ids"].append(seq_ids.tolist())
                        rows["loss_mask"].append(seq_mask.tolist())
                        rows["seq_len"].append(n)
                        counts[split] += 1
                        tokens[split] += n
                        row += 1
                    start += n
    ds = Dataset.from_dict(rows)
    ds.set_format(type="torch")
    ds.save_to_disk(str(out))
    # speculators' own counter over the train rows only (eagleflow counts its train split too).
    freq = out / "token_freq.pt"
    freq.unlink(missing_ok=True)
    save_token_frequency_distribution(ds.select(range(counts["train"])), output_path=freq)
    total = counts["train"] + counts["holdout"]
    ratio = (counts["train"] + 0.5) / total
    assert int(total * ratio) == counts["train"], (total, ratio)
    summary = {
        "rows": total,
        "train_rows": counts["train"],
        "holdout_rows": counts["holdout"],
        "train_tokens": tokens["train"],
        "holdout_tokens": tokens["holdout"],
        "train_data_ratio": ratio,
        "hidden_size": int(index["hidden_size"]),
        "aux_layer_ids": index["aux_layer_ids"],
    }
    (out / "eagleflow_prepare.json").write_text(json.dumps(summary, indent=2))
    return summary


# ----------------------------------------------------------------------------------- train


class BudgetReached(Exception):
    """Raised from the step callback when the summed step time reaches the budget."""


class BudgetExhausted(Exception):
    """Raised at the start of an epoch once the budget is spent: ends run_training."""


def _ns_fp32(grad, ns_coefficients, ns_steps, eps):
    """torch.optim._muon._zeropower_via_newtonschulz, computed in float32 instead of bfloat16."""
    import torch

    a, b, c = ns_coefficients
    x = grad.float()
    if grad.size(0) > grad.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(ns_steps):
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, update, x, beta=a)
    if grad.size(0) > grad.size(1):
        x = x.T
    return x


def patch_for_cpu(budget_s: float, clock: dict, budget_tokens: float = math.inf) -> None:
    """The workarounds listed in the module docstring; `clock` collects what was measured."""
    import speculators.train.trainer as trainer_mod
    import torch
    import torch.optim._muon as muon

    cpu = torch.device("cpu")
    if torch.accelerator.current_accelerator() is None:
        torch.accelerator.synchronize = lambda *a, **k: None  # (3)
        trainer_mod.get_local_rank = lambda: cpu  # (1)
    muon._zeropower_via_newtonschulz = _ns_fp32  # (4)

    def spent() -> float:
        """The share of the budget used: seconds of training steps, or tokens trained on, whichever is further."""
        return max(clock["train_s"] / budget_s, clock["tokens"] / budget_tokens)

    Trainer = trainer_mod.Trainer
    orig_init, orig_epoch, orig_run = Trainer.__init__, Trainer.train_epoch, Trainer.run_training

    def init(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        if torch.accelerator.current_accelerator() is None:
            self.device_type = "cpu"  # (2)

        def count_tokens(module, args, kwargs):
            if module.training and "document_ids" in kwargs:
                doc = kwargs["document_ids"]
                # shift_batch dropped one token per sequence; count it back, as eagleflow counts whole sequences
                clock["tokens"] += int((doc != -1).sum()) + int(doc.max().item()) + 1
                clock["steps"] += 1

        self.model.register_forward_pre_hook(count_tokens, with_kwargs=True)

    def train_epoch(self, epoch, *, step_callback=None):
        if spent() >= 1.0:
            raise BudgetExhausted()
        t0 = time.perf_counter()
        before = clock["train_s"]

        def check():
            clock["train_s"] = before + time.perf_counter() - t0
            if step_callback is not None:
                step_callback()
            if spent() >= 1.0:
                raise BudgetReached()

        try:
            orig_epoch(self, epoch, step_callback=check)
            clock["epochs_complete"] += 1
        except BudgetReached:
            clock["partial_epoch"] = epoch
        clock["train_s"] = before + time.perf_counter() - t0
        clock["epochs"] = epoch + 1

    def run_training(self):
        try:
            orig_run(self)
        except BudgetExhausted:
            pass

    Trainer.__init__, Trainer.train_epoch, Trainer.run_training = init, train_epoch, run_training  # (5)

    def linear_by_wall_time(optimizer, num_warmup_steps, num_training_steps, last_epoch=-1):  # (6)
        from torch.optim.lr_scheduler import LambdaLR

        # Its shape (linear warm-up over the first 1% by default, then linear decay to 0), laid over
        # progress = max(step / total, train_s / budget) instead of step / total.
        warm = num_warmup_steps / max(1, num_training_steps)

        def factor(step: int) -> float:
            progress = min(1.0, max(step / max(1, num_training_steps), spent()))
            if progress < warm:
                return progress / warm
            return max(0.0, (1.0 - progress) / max(1e-9, 1.0 - warm))

        return LambdaLR(optimizer, factor, last_epoch)

    trainer_mod.get_linear_schedule_with_warmup = linear_by_wall_time


def train(budget_s: float, report: Path, argv: list[str], budget_tokens: float = math.inf) -> dict:
    import torch
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    clock = {"train_s": 0.0, "tokens": 0, "steps": 0, "epochs": 0, "epochs_complete": 0, "partial_epoch": None}
    patch_for_cpu(budget_s, clock, budget_tokens)
    wall0 = time.perf_counter()
    cfg = TrainConfig.resolve(argv)
    main(cfg)
    wall = time.perf_counter() - wall0
    save = Path(cfg.flatten()["save_path"])
    best = save / "checkpoint_best"
    chosen = (
        best.resolve()
        if best.exists()
        else max((p for p in save.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    )
    val = {}
    metrics_file = chosen / "val_metrics.json"
    if metrics_file.is_file():
        val = json.loads(metrics_file.read_text())
    out = {
        "train_seconds": round(clock["train_s"], 2),
        "budget_s": budget_s if math.isfinite(budget_s) else None,
        "budget_tokens": budget_tokens if math.isfinite(budget_tokens) else None,
        "wall_seconds": round(wall, 2),
        "steps": clock["steps"],
        "tokens": clock["tokens"],
        "tokens_per_s": round(clock["tokens"] / max(clock["train_s"], 1e-9), 1),
        "epochs_started": clock["epochs"],
        "epochs_complete": clock["epochs_complete"],
        "partial_epoch": clock["partial_epoch"],
        "checkpoint": str(chosen),
        "chosen_by": "speculators' checkpoint_best (lowest validation loss)" if best.exists() else "last epoch",
        "val_metrics": val,
        "torch_threads": torch.get_num_threads(),
        "argv": argv,
    }
    report.write_text(json.dumps(out, indent=2))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare")
    pp.add_argument("--index", type=Path, required=True, help="eagleflow extract stage's data/index.json")
    pp.add_argument("--out", type=Path, required=True, help="speculators data dir to write")
    pt = sub.add_parser("train")
    pt.add_argument("--budget-s", type=float, default=math.inf, help="seconds of training steps (default: none)")
    pt.add_argument(
        "--budget-tokens",
        type=float,
        default=math.inf,
        help="tokens trained on (default: none); with neither budget, --epochs ends training",
    )
    pt.add_argument("--report", type=Path, required=True, help="JSON written at the end")
    pt.add_argument("rest", nargs=argparse.REMAINDER, help="-- then `speculators train` flags")
    a = p.parse_args()
    if a.cmd == "prepare":
        print(json.dumps(prepare(a.index, a.out)))
    else:
        rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
        print(json.dumps(train(a.budget_s, a.report, rest, a.budget_tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
