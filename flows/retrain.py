"""Nightly retrain: a data pool that grows, continual training, a benchmark that measures only what changed.

    python -m flows.retrain configs/demo.yaml      (the config's nightly deployment, NAME-nightly, runs it on the
    config's schedule)

One night (eagleflow.nightly.pool, docs/nightly.md):
1. `select` takes tonight's new prompts from the source (nightly.source): the first ones in source order
   never used before, repeats dropped by content. The held-out prompts were chosen on the first night
   and stay the same every night: the benchmark's prompts and the trainer's validation split.
2. generate and extract run on tonight's batch only; the held-out batch's stages, and every earlier
   night's, are cache hits (their keys follow their prompts' contents).
3. `pool` records the batch, evicts the oldest nights' states beyond nightly.pool_budget_gib, and writes
   tonight's training index: the new batch, a replay sample of older nights, the held-out split.
4. train: the first night as train.* says (a full run); later nights from the promoted drafter's weights
   with a fresh optimizer, for nightly.train_steps steps.
5. benchmark: the baseline and the current drafter are reused from earlier nights while nothing that
   determines them changed (benchmark.reuse_for_h); only the new drafter is measured, and its windows
   stop once benchmark.precision is reached.
6. The report (with AL by night) and the promotion gate.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from prefect import flow, get_run_logger
from prefect.states import Completed, State

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import BenchmarkMetrics
from eagleflow.contracts.stage_records import (
    ExportOutputs,
    GenerateOutputs,
    NightRecord,
    PoolMetrics,
    SelectOutputs,
    TrainMetrics,
)
from eagleflow.hosts import Host
from eagleflow.nightly.pool import batch_config, benchmark_on, continuing_train_config, full_length, whole_pool_config
from eagleflow.nightly.promotion import Decision, PromotionGate, PromotionRecord, decide, promotion_record_path
from eagleflow.reporting.report import Report, build_report
from flows.host_slot import host_slot, stop_jobs_of_run
from flows.params import RetrainParams, main_cli
from flows.promote import roll_back, switch_in_window
from tasks.benchmark import benchmark
from tasks.check import check, extract_config
from tasks.dispatch import StageRun, run_cached
from tasks.export import export
from tasks.extract import extract
from tasks.generate import generate
from tasks.naming import flow_run_owner
from tasks.nightly import record_night, record_promotion
from tasks.pool import pool
from tasks.production import Windows, production_windows
from tasks.promotion import promote
from tasks.report import publish_report
from tasks.select import select
from tasks.served import confirm_drafter, publish_history
from tasks.train import train


@dataclass
class Night:
    """What one night ran: its stages (by label), tonight's selection and what it continued from."""

    runs: dict[str, StageRun]
    selection: SelectOutputs
    warm_start: str | None = None
    tonight: RunConfig | None = None  # production.promote 'serve': the config the new drafter is measured with


def promoted_drafter(host: Host, config: RunConfig) -> str | None:
    """The drafter the gate promoted last, when its directory is still on the host."""
    path = promotion_record_path(config.host.work_root, config.name)
    if not host.exists(path):
        return None
    drafter = PromotionRecord.model_validate_json(host.read_text(path)).drafter_dir
    return drafter if host.exists(f"{drafter}/config.json") else None


def run_night(host: Host, config: RunConfig, windows: Windows) -> Night:
    """The night's stages, in order; each cached one taken from cache while its manifest is on the host."""
    start = time.monotonic()
    runs: dict[str, StageRun] = {"check": StageRun(check(host, config), cached=False, seconds=time.monotonic() - start)}
    runs["select"] = run_cached(select, host, config)
    sel = SelectOutputs.of(runs["select"].manifest)
    night = Night(runs, sel)
    if sel.batch_file is None:
        return night
    held = batch_config(config, sel.holdout_file, "holdout")  # the benchmark's prompts too
    new = batch_config(config, sel.batch_file, "train")
    promoted = None if sel.first_night else promoted_drafter(host, config)
    runs["generate: holdout"] = run_cached(generate, host, held, label="generate: holdout")
    runs["generate"] = run_cached(generate, host, new, label=f"generate: batch {sel.batch_id}")
    checked = runs["check"].manifest
    for key, cfg, gen in (("extract: holdout", held, "generate: holdout"), ("extract", new, "generate")):
        up = {"generate": runs[gen].manifest}
        label = key if key != "extract" else f"extract: batch {sel.batch_id}"
        runs[key] = windows.run(extract, up, config=extract_config(host, cfg, checked, up), label=label)
    # No drafter to continue: tonight is a full run, and a full run trains on all the data, not a replay sample.
    pool_config = config if sel.first_night or promoted else whole_pool_config(config)
    runs["pool"] = run_cached(
        pool,
        host,
        pool_config,
        {
            "select": runs["select"].manifest,
            "holdout": runs["extract: holdout"].manifest,
            "extract": runs["extract"].manifest,
        },
    )
    data = runs["pool"].manifest
    tonight = held
    if promoted:
        pm = PoolMetrics.of(data)
        tonight = continuing_train_config(held, promoted, pm.new_tokens + pm.replay_tokens)
        night.warm_start = promoted
    runs["train"] = windows.run(train, {"extract": data}, config=tonight)
    runs["export"] = windows.run(export, {"train": runs["train"].manifest}, config=tonight)
    bench_in = {"export": runs["export"].manifest, "extract": data}
    if config.production.promote == "serve":
        # The baseline and the current drafter now, while production is down (reused: no engine at all); the new
        # drafter once production serves it (`deploy_night`).
        runs["benchmark: references"] = windows.run(
            benchmark, bench_in, config=benchmark_on(tonight, "none"), label="benchmark: references"
        )
        night.tonight = tonight
    else:
        runs["benchmark"] = windows.run(benchmark, bench_in, config=tonight)
        night.tonight = tonight
    return night


def night_report(config: RunConfig, night: Night) -> Report:
    return build_report(config.name, {s: r.manifest for s, r in night.runs.items()}, {}, kind="nightly")


def decide_on_evidence(
    host: Host,
    config: RunConfig,
    night: Night,
    gate: PromotionGate,
    label: str,
    rerun: Callable[[RunConfig, str], StageRun],
) -> Decision:
    """The gate's decision on tonight's benchmark; while its intervals overlap its bars, the new drafter measured
    again (`rerun(config)`: every held-out prompt, no early stop) up to nightly.decision_reruns times."""
    promoted = read_promoted(host, config)
    decision = decide(night_report(config, night), promoted, gate)
    for n in range(config.nightly.decision_reruns):
        if not decision.undecided:
            break
        get_run_logger().warning(
            "the promotion gate is undecided (%s): measuring the new drafter again, every held-out prompt (%d of %d)",
            decision.decided_by,
            n + 1,
            config.nightly.decision_reruns,
        )
        night.runs["benchmark"] = rerun(full_length(night.tonight), f"{label}: again ({n + 1})")
        decision = decide(night_report(config, night), promoted, gate)
    return decision


def read_promoted(host: Host, config: RunConfig) -> PromotionRecord | None:
    path = promotion_record_path(config.host.work_root, config.name)
    return PromotionRecord.model_validate_json(host.read_text(path)) if host.exists(path) else None


def night_record(night: Night) -> NightRecord:
    """Tonight's line of the record of nights (its number is set when it is recorded)."""
    runs = night.runs
    pm = PoolMetrics.of(runs["pool"].manifest)
    tm = TrainMetrics.of(runs["train"].manifest)
    bm = BenchmarkMetrics.of(runs["benchmark"].manifest)
    # where the baseline was measured or reused first tonight: the references (production.promote 'serve')
    first = BenchmarkMetrics.of(runs["benchmark: references"].manifest) if "benchmark: references" in runs else bm
    head = bm.verdict.headline
    return NightRecord(
        night=0,
        run=flow_run_owner(),
        date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        batch=night.selection.batch_id,
        new_samples=GenerateOutputs.of(runs["generate"].manifest).num_train,
        new_tokens=pm.new_tokens,
        replay_sequences=pm.replay_sequences,
        trained_on="the whole pool" if pm.whole_pool or night.selection.first_night else "tonight's batch + replay",
        train_sequences=pm.new_sequences + pm.replay_sequences,
        pool_samples=pm.samples,
        pool_bytes=pm.pool_bytes,
        evicted=pm.evicted,
        train_steps=tm.steps,
        warm_start=night.warm_start,
        holdout_al=tm.best.acceptance_length,
        served_al=bm.drafter.mean_acceptance_length,
        served_al_ci=bm.drafter.al_interval,
        speedup=head.drafter_vs_baseline if head else bm.speedup,
        speedup_ci=head.drafter_vs_baseline_ci if head else None,
        benchmark_requests=sum(bm.requests.values()),
        baseline=f"reused: {bm.reused['baseline']}" if "baseline" in first.reused else "measured tonight",
    )


@flow(name="retrain", log_prints=True, on_cancellation=[stop_jobs_of_run], on_crashed=[stop_jobs_of_run])
def retrain(params: RetrainParams = RetrainParams()) -> Report | State:
    """Tonight's report, or a Completed state saying nothing was new (its state message, which `eagleflow status`,
    `eagleflow trigger --wait` and the run's page in the UI show); the promotion decision is an artifact."""
    config = params.load()
    gate = PromotionGate(min_speedup=params.min_speedup, min_acceptance_length=params.min_acceptance_length)
    deploy = config.production.promote == "serve"
    with host_slot(config, f"retrain {config.name}") as host:
        with production_windows(host, config) as windows:
            night = run_night(host, config, windows)
            sel = night.selection
            if "export" not in night.runs:
                said = (
                    f"nothing new tonight: the source's {sel.source_prompts} distinct prompts are all used or held "
                    f"out, so nothing was trained or measured; production keeps its drafter. Append prompts to "
                    f"{config.nightly.source or config.generate.prompts_path}"
                )
                get_run_logger().warning("%s", said)
                return Completed(message=said)
            if deploy:
                promoted = deploy_night(host, config, night, windows, gate)
            else:
                inputs = {"export": night.runs["export"].manifest, "extract": night.runs["pool"].manifest}
                decide_on_evidence(
                    host,
                    config,
                    night,
                    gate,
                    "benchmark",
                    lambda cfg, label: windows.run(benchmark, inputs, config=cfg, label=label),
                )
        nights, picture = record_night(host, config, sel.pool_dir, night_record(night))
        report = publish_report(
            host,
            config,
            night.runs,
            "nightly",
            windows.records,
            nights=nights,
            plots={"al-by-night": picture} if picture else None,
        )
        if not deploy:
            decision = promote(host, config, report, gate)
            promoted, decided_by = decision.promote, decision.decided_by
        else:
            promoted, decided_by = promoted
        record_promotion(host, sel.pool_dir, nights[-1].run, promoted, decided_by)
        return report


def deploy_night(
    host: Host, config: RunConfig, night: Night, windows: Windows, gate: PromotionGate
) -> tuple[bool, str]:
    """production.promote 'serve': tonight's drafter goes into production before production comes back, so the
    one load that restores production is also its measurement. The benchmark then measures it on production
    (paired with the references measured or reused in the window), the gate decides on those figures, and a
    drafter that loses is rolled back (one more load)."""
    assert night.tonight is not None
    runs = night.runs
    drafter = runs["export"].manifest.path(ExportOutputs.of(runs["export"].manifest).vllm)
    switch_in_window(host, config, windows, drafter, None)
    try:
        runs["benchmark"] = run_cached(
            benchmark,
            host,
            benchmark_on(night.tonight, "production"),
            {"export": runs["export"].manifest, "extract": runs["pool"].manifest},
            label="benchmark: on production",
        )
    except Exception as exc:
        # Unmeasured, it does not stay: production goes back to the drafter that was measured good.
        roll_back(host, config, windows, drafter, f"its benchmark on production failed: {exc}"[:500], None)
        raise
    inputs = {"export": runs["export"].manifest, "extract": runs["pool"].manifest}
    decide_on_evidence(
        host,
        config,
        night,
        gate,
        "benchmark: on production",
        lambda cfg, label: run_cached(benchmark, host, benchmark_on(cfg, "production"), inputs, label=label),
    )
    preview = night_report(config, night)
    decision = promote(host, config, preview, gate)
    d = preview.drafter
    figures = {
        "mean_acceptance_length": d.mean_acceptance_length,
        "output_tok_s": d.output_tok_s,
        "requests": d.requests,
        "per_position_acceptance": d.per_position_acceptance,
        "measured_by": f"the benchmark on production ({runs['benchmark'].manifest.dir})",
    }
    if decision.promote:
        assert decision.record is not None
        after = confirm_drafter(host, config, figures, decision.record.model_dump(mode="json"))
        publish_history(
            config,
            after,
            f"Deployed: production serves {drafter} (AL {d.mean_acceptance_length or 0:.2f}, "
            f"{preview.speedup:.2f}x on production)",
        )
    else:
        roll_back(host, config, windows, drafter, "; ".join(decision.reasons), figures)
    return decision.promote, decision.decided_by


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    gate_flags = {
        "--min-speedup": "promote only when the speedup's 95% interval lies at or above this (default 1.0)",
        "--min-acceptance-length": "promote only when the AL's 95% interval lies at or above this (default 1.5)",
    }
    return main_cli(retrain, __doc__, params_cls=RetrainParams, extra_args=gate_flags, argv=argv, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
