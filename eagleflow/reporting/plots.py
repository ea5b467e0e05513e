"""The pictures of a run, drawn on the host beside the figures they show (matplotlib, PNG).

- train: `curves.png`, loss (training and holdout) and simulated acceptance length per epoch;
- benchmark: `acceptance.png`, per-position acceptance by variant at each temperature, and
  `speedup.png`, each drafter's output tok/s over no speculation by temperature x concurrency;
- the nightly: `al-by-night.png`, holdout and served AL night by night (`python -m eagleflow.reporting.plots nights`).

The stage lists them in its outputs (`plots`); the control side copies them next to report.md and
inlines them in the Prefect artifacts. Drawing is never the stage's end: a plot that fails is a
warning, the figures stand.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("eagleflow.reporting.plots")

DPI = 110
COLORS = {"drafter": "#1f77b4", "current": "#ff7f0e", "baseline": "#7f7f7f"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display on a GPU host
    import matplotlib.pyplot as plt

    return plt


def training_curves(epochs: Sequence[Any], path: Path) -> Path:
    """Loss and simulated AL per epoch, from the train stage's `EpochMetrics` (or dicts of that shape)."""
    plt = _pyplot()
    rows = [e if isinstance(e, dict) else e.model_dump() for e in epochs]
    x = [r["epoch"] for r in rows]
    fig, (ax_loss, ax_al) = plt.subplots(1, 2, figsize=(9, 3.4))
    ax_loss.plot(x, [r["train"]["loss"] for r in rows], "o-", label="training")
    held = [(r["epoch"], r["validation"]["loss"]) for r in rows if r.get("validation")]
    if held:
        ax_loss.plot(*zip(*held), "s--", label="holdout")
    ax_loss.set(title="loss by epoch", xlabel="epoch", ylabel="loss (decay-weighted TTT)")
    ax_loss.legend()
    sim = [(r["epoch"], (r.get("validation") or r["train"]).get("acceptance_length")) for r in rows]
    sim = [(e, al) for e, al in sim if al is not None]
    if sim:
        ax_al.plot(*zip(*sim), "o-", color="#2ca02c")
        for e, al in sim:
            ax_al.annotate(f"{al:.2f}", (e, al), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax_al.set(title="simulated acceptance length by epoch", xlabel="epoch", ylabel="AL (holdout)")
    for ax in (ax_loss, ax_al):
        ax.set_xticks(x)
        ax.grid(alpha=0.3)
    return _save(fig, plt, path)


def acceptance_by_position(windows: Sequence[Any], path: Path) -> Path | None:
    """Per-position acceptance of each drafter variant, one panel per temperature (concurrency 1 first)."""
    plt = _pyplot()
    rows = [w if isinstance(w, dict) else w.model_dump() for w in windows]
    rows = [r for r in rows if r.get("per_position_acceptance")]
    if not rows:
        return None
    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(4.2 * len(temps), 3.4), squeeze=False)
    for ax, t in zip(axes[0], temps):
        at_t = [r for r in rows if r["temperature"] == t]
        conc = min(r["concurrency"] for r in at_t)
        shown = [r for r in at_t if r["concurrency"] == conc]
        k = max(len(r["per_position_acceptance"]) for r in shown)
        width = 0.8 / max(len(shown), 1)
        for i, r in enumerate(shown):
            xs = [p + 1 + (i - (len(shown) - 1) / 2) * width for p in range(len(r["per_position_acceptance"]))]
            al = r.get("mean_acceptance_length")
            ax.bar(
                xs,
                r["per_position_acceptance"],
                width,
                color=COLORS.get(r["variant"]),
                label=f"{r['variant']} (AL {al:.2f})" if al else r["variant"],
            )
        ax.set(
            title=f"temperature {t:g}, concurrency {conc}",
            xlabel="draft position",
            ylabel="accepted",
            ylim=(0, 1),
            xticks=list(range(1, k + 1)),
        )
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, plt, path)


def speedup_grid(windows: Sequence[Any], path: Path) -> Path | None:
    """Each drafter variant's output tok/s over no speculation, by temperature x concurrency."""
    plt = _pyplot()
    rows = [w if isinstance(w, dict) else w.model_dump() for w in windows]
    base = {(r["temperature"], r["concurrency"]): r["output_tok_s"] for r in rows if r["variant"] == "baseline"}
    settings = sorted(base)
    variants = [v for v in dict.fromkeys(r["variant"] for r in rows) if v != "baseline"]
    if not settings or not variants:
        return None
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(settings) + 2), 3.4))
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        by = {(r["temperature"], r["concurrency"]): r["output_tok_s"] for r in rows if r["variant"] == v}
        xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(settings))]
        ys = [by.get(s, 0.0) / base[s] if base[s] else 0.0 for s in settings]
        bars = ax.bar(xs, ys, width, color=COLORS.get(v), label=v)
        for b, y in zip(bars, ys):
            ax.annotate(
                f"{y:.2f}x",
                (b.get_x() + b.get_width() / 2, y),
                textcoords="offset points",
                xytext=(0, 3),
                ha="center",
                fontsize=8,
            )
    ax.axhline(1.0, color="#7f7f7f", lw=1, ls="--", label="no speculation")
    ax.set_xticks(range(len(settings)), [f"t={t:g}\nc={c}" for t, c in settings])
    ax.set(title="speedup over no speculation", ylabel="output tok/s ratio")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, plt, path)


def al_by_night(nights: Sequence[Any], path: Path) -> Path | None:
    """The nightly retrain's acceptance length night by night, on the same held-out prompts: the trainer's
    simulated AL and the engine's served AL (with its 95% interval), with each night's pool size."""
    plt = _pyplot()
    rows = [n if isinstance(n, dict) else n.model_dump() for n in nights]
    if not rows:
        return None
    x = [r["night"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(rows) + 3), 3.4))
    held = [(r["night"], r["holdout_al"]) for r in rows if r.get("holdout_al") is not None]
    if held:
        ax.plot(*zip(*held), "s--", color=COLORS["current"], label="holdout (trainer)")
    served = [r for r in rows if r.get("served_al") is not None]
    if served:
        ci = [r.get("served_al_ci") or [r["served_al"], r["served_al"]] for r in served]
        ax.errorbar(
            [r["night"] for r in served],
            [r["served_al"] for r in served],
            yerr=[
                [r["served_al"] - c[0] for r, c in zip(served, ci)],
                [c[1] - r["served_al"] for r, c in zip(served, ci)],
            ],
            fmt="o-",
            color=COLORS["drafter"],
            capsize=3,
            label="served (engine, 95% CI)",
        )
    for r in rows:
        ax.annotate(
            f"{r.get('pool_samples', 0):,} samples",
            (r["night"], ax.get_ylim()[0]),
            textcoords="offset points",
            xytext=(0, 4),
            ha="center",
            fontsize=7,
            color="#555555",
        )
    ax.set_xticks(x)
    ax.set(title="acceptance length by night (the same held-out prompts)", xlabel="night", ylabel="AL")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: Path) -> Path:
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=DPI, format="png", metadata={"Software": None})  # no version stamp: same input, same bytes
    plt.close(fig)
    tmp.replace(path)
    return path


def draw(plots: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """{file name: thunk(path) -> path | None} -> {name: file name} of those drawn; failures logged."""
    drawn: dict[str, str] = {}
    for name, fn in plots.items():
        try:
            if fn(out_dir / name) is not None:
                drawn[name.rsplit(".", 1)[0]] = name
        except Exception as exc:  # noqa: BLE001 - a picture must never cost the stage its figures
            log.warning("could not draw %s: %s: %s", name, type(exc).__name__, exc)
    return drawn


def main(argv: list[str] | None = None) -> int:
    """`python -m eagleflow.reporting.plots nights NIGHTS_JSON OUT_PNG`: the AL-by-night picture of the nightly pool
    (the control side has no matplotlib; it asks the host to draw)."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "nights":
        print("usage: python -m eagleflow.reporting.plots nights NIGHTS_JSON OUT_PNG", file=sys.stderr)
        return 2
    drawn = al_by_night(json.loads(Path(args[1]).read_text()), Path(args[2]))
    print(drawn or "nothing to draw")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
