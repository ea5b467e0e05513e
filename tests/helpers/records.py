"""Typed stage records for the verdict, report, promotion and outputs tests: measured windows, and
train and benchmark manifests built with the eagleflow.contracts models, as the stages write them.
Pydantic only (no torch)."""

from __future__ import annotations

from eagleflow.config import BenchmarkConfig
from eagleflow.contracts.benchmark_records import (
    BenchmarkMetrics,
    BenchmarkOutputs,
    Measurement,
    PreflightFinding,
    ProductionResult,
)
from eagleflow.contracts.manifest import Manifest
from eagleflow.contracts.stage_records import (
    BestEpoch,
    EpochMetrics,
    EvalSummary,
    ExportMetrics,
    ExportOutputs,
    TrainMetrics,
    TrainOutputs,
)
from eagleflow.measure.verdict import judge


def window(
    variant: str, tok_s: float, al: float | None = None, t: float = 0.0, c: int = 1, pos: list[float] | None = None
) -> Measurement:
    """One measured window; speculative variants (given `al`) carry acceptance figures."""
    w = dict(variant=variant, temperature=t, concurrency=c, output_tok_s=tok_s, ttft_ms=50.0, tpot_ms=10.0, itl_ms=20.0)
    if al is not None:
        w.update(mean_acceptance_length=al, acceptance_rate=(al - 1) / 3, per_position_acceptance=pos or [0.5] * 3)
    return Measurement(**w)


def eval_summary(al: float | None = None, loss: float = 2.0, tokens: int = 1000) -> EvalSummary:
    """Scores over a split; with `al`, the engine-walk figures of a validation pass."""
    walk = dict(accept_pos=[0.8, 0.6, 0.4], acceptance_length=al, drafts=100, seconds=1.5) if al is not None else {}
    return EvalSummary(
        loss=loss,
        loss_per_step=[loss] * 3,
        acc=[0.8, 0.7, 0.6],
        accept_pos_uniform=[0.8, 0.56, 0.34],
        acceptance_length_uniform=2.7,
        acceptance_length_indep=2.6,
        positions=900,
        tokens=tokens,
        **walk,
    )


def train_manifest(stage_dir: str, holdout_al: tuple[float, ...] = (2.4, 2.9), seconds: float = 45.6) -> Manifest:
    """A finished train stage: one epoch per holdout AL, the best epoch the highest."""
    epochs = [
        EpochMetrics(
            epoch=i + 1,
            complete=True,
            step=10 * (i + 1),
            lr=1e-3,
            tokens_per_s=500.0,
            seconds=2.0,
            train=eval_summary(loss=3.0 - i),
            validation=eval_summary(al, loss=3.1 - i),
        )
        for i, al in enumerate(holdout_al)
    ]
    best = max(epochs, key=lambda e: e.validation.acceptance_length)
    metrics = TrainMetrics(
        best_epoch=best.epoch,
        best=BestEpoch(epoch=best.epoch, **best.validation.model_dump()),
        epochs=epochs,
        tokens_per_s=500.0,
        steps=epochs[-1].step,
        bounded_by="epochs",
        draft_vocab_size=512,
        nproc=1,
    )
    outputs = TrainOutputs(
        checkpoints=[f"checkpoints/epoch-{e.epoch}" for e in epochs],
        best=f"checkpoints/epoch-{best.epoch}",
        best_epoch=best.epoch,
        aux_layer_ids=[1, 2, 3],
        arch={"hidden_size": 192},
    )
    return Manifest(
        stage="train",
        key="trainkey",
        dir=stage_dir,
        upstream={"extract": "extractkey"},
        outputs=outputs.model_dump(mode="json"),
        metrics=metrics.model_dump(mode="json"),
        seconds=seconds,
    )


def export_manifest(stage_dir: str) -> Manifest:
    return Manifest(
        stage="export",
        key="exportkey",
        dir=stage_dir,
        upstream={"train": "trainkey"},
        outputs=ExportOutputs(vllm="vllm").model_dump(mode="json"),
        metrics=ExportMetrics(
            source_checkpoint="checkpoints/epoch-2", best_epoch=2, acceptance_length_sim=2.9
        ).model_dump(mode="json"),
        seconds=1.2,
    )


def benchmark_windows() -> list[Measurement]:
    """Baseline, current and new drafter at two settings; the new drafter 1.40x at the first."""
    return [
        window("baseline", 100),
        window("current", 120, 2.4),
        window("drafter", 140, 3.3, pos=[0.9, 0.8, 0.6]),
        window("baseline", 300, c=4),
        window("current", 330, 2.4, c=4),
        window("drafter", 360, 3.2, c=4),
    ]


def benchmark_manifest(
    stage_dir: str,
    windows: list[Measurement] | None = None,
    drafter_dir: str = "/host/drafter",
    production: ProductionResult | None = None,
    seconds: float = 78.9,
) -> Manifest:
    windows = windows or benchmark_windows()
    first = (windows[0].temperature, windows[0].concurrency)
    at = {w.variant: w for w in windows if (w.temperature, w.concurrency) == first}
    offline = {"drafter": 3.4, **({"current": None} if "current" in at else {})}
    metrics = BenchmarkMetrics(
        baseline=at["baseline"],
        current=at.get("current"),
        drafter=at["drafter"],
        speedup=at["drafter"].output_tok_s / at["baseline"].output_tok_s,
        windows=windows,
        verdict=judge(windows, offline, suspect_ratio=0.6),
        production=production,
        offline=offline,
        drafters={"drafter": drafter_dir, **({"current": "/host/current"} if "current" in at else {})},
        preflight=[PreflightFinding(check="engine", level="ok", message="vllm 0.32.0")],
        settings=BenchmarkConfig(),
    )
    outputs = BenchmarkOutputs(drafter_dir=drafter_dir, num_prompts=24, report_md="report.md")
    return Manifest(
        stage="benchmark",
        key="benchkey-20260101T000000-abcdef12",
        dir=stage_dir,
        upstream={"export": "exportkey"},
        outputs=outputs.model_dump(mode="json"),
        metrics=metrics.model_dump(mode="json"),
        seconds=seconds,
    )
