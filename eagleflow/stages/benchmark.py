"""benchmark: no speculation, production's current drafter and the new drafter, on the real engine.

    python -m eagleflow.stages.benchmark <stage_dir>/request.json

1. Preflight (a subprocess in this host environment, seconds, before any weights load): the engine
   imports, the target supports EAGLE-3 in this engine version, each drafter fits the target and
   the engine's conventions, GPU memory and disk. A failed check ends the stage, naming cause and fix.
2. Production is stopped for the measurement and restored however the stage ends (a guardian
   process on the host watches the stage and, through the host lease, the pipeline that started it;
   see eagleflow.production).
3. Each variant runs in its own engine (this stage's own process group; the launch watchdog
   reports load progress and fails within seconds on a dead or failing engine). After warm-up,
   every setting (temperature x concurrency) sends the same held-out chat prompts with a fixed
   number of output tokens (`ignore_eos`), sampled settings seeded per prompt. Throughput is output
   tokens over the window's wall time; TTFT, inter-token latency and acceptance come from the
   engine's own histograms and counters around each window.
4. The verdict: speedups, and whether serving acceptance matches the drafter's offline estimate
   (eagleflow.measure.verdict). `report.md` (the table) is written beside the manifest.
5. With `benchmark.k_sweep`: the new drafter at each other k, the k that serves fastest (eagleflow.measure.k_sweep).

With `benchmark.side_by_side` all engines load at once and each window alternates request rounds
between them (A B, B A, ...), so a noisy machine's drift hits every variant alike.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import (
    BenchmarkMetrics,
    BenchmarkOutputs,
    Measurement,
    PreflightFinding,
    ProductionResult,
    Verdict,
)
from eagleflow.contracts.manifest import Manifest, read_manifest
from eagleflow.contracts.prompts import Messages, PromptError, run_holdout
from eagleflow.contracts.request import StageError, StageRequest
from eagleflow.contracts.stage_records import ExportOutputs
from eagleflow.engines import make_server
from eagleflow.engines.launch import served_name, target_launch
from eagleflow.engines.preflight.command import preflight_argv
from eagleflow.measure.k_sweep import KSweep, measure_sweep, sweep_result, sweep_section, sweep_variants
from eagleflow.measure.reused import HostLoad
from eagleflow.measure.session import Session, Variant, reuse_measurements
from eagleflow.measure.verdict import engine_spread, headline_setting, judge, render_markdown
from eagleflow.nightly.promotion import PromotionRecord, promotion_record_path
from eagleflow.production import WINDOW_ENV, production_stopped
from eagleflow.production.served import good_drafter, offline_al, served_dir
from eagleflow.reporting import plots
from eagleflow.stages.common import planned_seconds, stage_main
from eagleflow.triage import CopyReference, TriageInputs, run_triage
from eagleflow.triage.verify import record_reference

log = logging.getLogger("eagleflow.benchmark")


# -- inputs ----------------------------------------------------------------------------------------


def benchmark_prompts(cfg: RunConfig) -> list[Messages]:
    """The held-out prompts of the run config: the same seeded split the generate stage holds out,
    so a benchmark of a given drafter needs no generate stage."""
    try:
        return run_holdout(cfg.generate, cfg.benchmark.num_prompts)
    except PromptError as exc:
        raise StageError(str(exc)) from None


def resolve_drafter(path: str, field: str) -> str:
    """A drafter directory, or an export manifest.json naming one."""
    p = Path(path)
    if p.is_file() and p.name == "manifest.json":
        m = read_manifest(p)
        vllm_dir = ExportOutputs.of(m).vllm if m.stage == "export" else None
        if vllm_dir is None:
            raise StageError(
                f"{field}: {p} is a {m.stage} manifest without outputs['vllm']; pass an export "
                "stage's manifest.json or a drafter directory"
            )
        return m.path(vllm_dir)
    if not (p / "config.json").is_file():
        raise StageError(
            f"{field}: {p} is neither a drafter directory (no config.json there) nor an export "
            "manifest.json; point it at the directory the engine should load"
        )
    return str(p)


def offline_estimate(drafter_dir: str) -> float | None:
    """The simulated acceptance length eagleflow's trainer measured for a drafter it exported, if any."""
    return got[0] if (got := offline_al(Path(drafter_dir))) else None


def current_drafter(cfg: RunConfig) -> str | None:
    """What production serves, variant 'current': benchmark.current_drafter (with production.promote 'serve' only
    until the nightly promotes one), else the promoted drafter (a rollback rewrites its record), else with 'serve'
    the good one production's link names: the bar is what production serves, not no speculation (docs/nightly.md)."""
    record = Path(promotion_record_path(cfg.host.work_root, cfg.name))
    deploy = cfg.production.promote == "serve" and record.is_file()
    if cfg.benchmark.current_drafter and not deploy:
        return resolve_drafter(cfg.benchmark.current_drafter, "benchmark.current_drafter")
    if record.is_file():
        path = PromotionRecord.model_validate_json(record.read_text()).drafter_dir
        if Path(path, "config.json").is_file():
            log.info("current drafter: the promoted one, %s (from %s)", path, record)
            return path
    if cfg.benchmark.current_drafter:
        return resolve_drafter(cfg.benchmark.current_drafter, "benchmark.current_drafter")
    if cfg.production.promote == "serve" and (served := good_drafter(Path(served_dir(cfg.host.work_root, cfg.name)))):
        log.info("current drafter: %s, the one production serves", served)
        return served
    return None


def variants_for(request: StageRequest) -> list[Variant]:
    cfg = request.config
    if cfg.benchmark.drafter:
        new = resolve_drafter(cfg.benchmark.drafter, "benchmark.drafter")
    else:
        export = request.upstream.get("export")
        if export is None:
            raise StageError("the benchmark needs a drafter: the export stage's manifest, or benchmark.drafter")
        vllm_dir = ExportOutputs.of(export).vllm
        if vllm_dir is None:
            raise StageError(f"the export stage in {export.dir} wrote no vLLM drafter (export.formats lacks 'vllm')")
        new = export.path(vllm_dir)
    out = [Variant("baseline", None)]
    cur = current_drafter(cfg)
    if cur and Path(cur).resolve() != Path(new).resolve():
        out.append(Variant("current", cur, offline_estimate(cur)))
    out.append(Variant("drafter", new, offline_estimate(new)))
    return out


# -- preflight -------------------------------------------------------------------------------------


def preflight(request: StageRequest, variants: list[Variant], skip_gpu: bool) -> list[PreflightFinding]:
    """Run the preflight in this host environment; fail the stage on an error finding.

    `skip_gpu`: production still holds the GPUs now; their memory is checked once it has stopped.
    """
    cfg = request.config
    out = request.path / "preflight.json"
    argv = preflight_argv(cfg, {v.name: v.drafter for v in variants if v.drafter}, out, skip_gpu)
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - start
    for line in proc.stdout.splitlines():
        log.info("preflight: %s", line)
    if proc.returncode not in (0, 1) or not out.exists():
        raise StageError(
            f"the preflight itself failed (exit {proc.returncode}) in {sys.executable}:\n"
            f"{(proc.stderr or proc.stdout)[-3000:]}"
        )
    findings = [PreflightFinding.model_validate(f) for f in json.loads(out.read_text())["findings"]]
    errors = [f for f in findings if f.level == "error"]
    log.info("preflight: %d checks in %.1f s, %d error(s)", len(findings), seconds, len(errors))
    fail_on(errors, "preflight failed before any weights were loaded")
    return findings


def fail_on(errors: list[PreflightFinding], what: str) -> None:
    if errors:
        raise StageError(f"{what}:\n" + "\n".join(f"- [{f.check}] {f.message}" for f in errors))


def gpus_free(cfg: RunConfig) -> list[PreflightFinding]:
    """The GPU part of the preflight, once production has let go of the GPUs."""
    from eagleflow.engines.preflight.resources import check_gpus

    need = cfg.engine.min_free_gpu_fraction or (cfg.engine.gpu_memory_utilization or 0.0)
    findings = [PreflightFinding.model_validate(dataclasses.asdict(f)) for f in check_gpus(need)]
    for f in findings:
        log.info("preflight (production stopped): %s %s: %s", f.level.upper(), f.check, f.message)
    fail_on([f for f in findings if f.level == "error"], "GPU memory is not free after stopping production")
    return findings


# -- measurement -----------------------------------------------------------------------------------


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    b = cfg.benchmark
    prompts = benchmark_prompts(cfg)
    if len(prompts) < b.num_prompts:
        raise StageError(f"only {len(prompts)} held-out prompts; lower benchmark.num_prompts or raise generate.holdout")
    on = b.drafter_on
    variants = [v for v in variants_for(request) if on != "none" or v.name != "drafter"]
    # Before our engines; on production (its traffic loads the host) the references are this night's: no load rule.
    load = HostLoad.now()
    reuse_measurements(cfg, variants, prompts, None if on == "production" else load)
    if on == "production" and (stale := [v.name for v in variants if v.reused is None and v.name != "drafter"]):
        raise StageError(
            f"benchmark.drafter_on 'production': no reusable measurement of the {' and the '.join(stale)} "
            f"(benchmark.reuse_for_h {b.reuse_for_h:g} h): production serves the new drafter now, so they "
            "cannot be measured here; measure them first while production is down (benchmark.drafter_on "
            "'none', as the nightly does)"
        )
    has_production = cfg.production.kind != "none"
    began = time.monotonic()
    findings = (
        preflight(request, variants, skip_gpu=has_production or on == "production") if cfg.engine.preflight else []
    )
    preflight_s = round(time.monotonic() - began, 1)

    # The triage's references, taken while the engines are up: the copy prompts served without speculation
    # (on the baseline engine), and every variant's temperature-0 answers (speculation must not change them).
    tri = b.triage
    triage_on = tri.when != "never" and on == "engine"
    if tri.when != "never" and not triage_on:
        log.info("triage: not run: benchmark.drafter_on %s (its probes load engines of their own)", on)
    # the copy prompts feed the verify probe alone, which is vLLM's (on SGLang the triage is the lossless check)
    wants_copy = triage_on and "verify" in tri.probes_on(cfg.engine.kind)
    t0 = (0.0, min(b.concurrencies)) if 0.0 in b.temperatures else None
    copy_ref = reused_copy_reference(cfg, variants)
    triage_result = None

    swept = sweep_variants(b, variants) if on == "engine" else []
    session = Session(cfg, prompts, variants, load, planned_seconds(cfg, "benchmark"), swept=swept)
    if cfg.engine.preflight:
        session.seconds["preflight"] = preflight_s
    # Inside the pipeline's production window, production is already down and the flow gives it back
    # (our engines inherit the window's token); run alone, the stage stops and restores it itself.
    window = os.environ.get(WINDOW_ENV)
    if window:
        log.info("measuring inside the production window of %s", window)
    if on == "production":
        log.info("the new drafter is measured on production (%s), which serves it since its deploy", cfg.production.url)
    stopped = (
        nullcontext(None)
        if window or on == "production"
        else production_stopped(cfg.production, request.path, work_root=cfg.host.work_root, log=log.info)
    )
    with stopped as downtime:
        env = downtime.engine_env() if downtime else None
        if cfg.engine.preflight and has_production and on != "production":
            findings += gpus_free(cfg)
        for group in session.groups():
            with ExitStack() as stack:
                session.open(group, stack, request.path, on == "production", env)
                for t, c in session.settings:
                    session.measure_setting(group, t, c)
                baseline = next((v for v in group if v.name == "baseline"), None)
                if baseline is not None and wants_copy:
                    copy_ref = record_copy_reference(request, baseline, prompts) or copy_ref
            for v in group:
                ref = v.name == "baseline" and copy_ref is not None
                session.keep(
                    v,
                    request.path,
                    t0,
                    dataclasses.asdict(copy_ref) if ref else None,
                    copy_settings(cfg) if ref else None,
                )
        measure_sweep(session, swept, request.path, env)
        # benchmark.remeasure_baseline: no speculation once more on a fresh engine, the engine-to-engine spread
        spread = engine_spread(session.table(), session.measure_again(request.path, env))
        session.progress.finish()
        table = session.table()
        if on == "none":
            return references_manifest(request, variants, table, findings, len(prompts))
        offline = {v.name: v.offline_al for v in variants if v.drafter}
        # production's traffic mix (production.traffic): the verdict and the nightly's gate judge the whole of it;
        # rounds paired between engines that ran one after another hold no engine-to-engine spread unless measured
        how = {"traffic": cfg.production.traffic, "traffic_floor_share": cfg.production.traffic_floor_share}
        how.update(spread=spread, engines_apart=on == "engine" and not b.side_by_side and len(session.measured) > 1)
        verdict = judge(
            table, offline, suspect_ratio=b.suspect_ratio, sampled_suspect_ratio=b.sampled_suspect_ratio, **how
        )
        if triage_on and (tri.when == "always" or verdict.suspects):
            began = time.monotonic()
            if copy_ref is None and wants_copy:
                copy_ref = copy_reference_engine(request, prompts, env)
            # Still inside the production window: the probes' engines need the GPUs too.
            triage_result = run_triage(triage_inputs(request, session, verdict, t0, copy_ref, env))
            session.seconds[f"triage of {triage_result.variant}"] = round(time.monotonic() - began, 1)
    production = ProductionResult.model_validate(downtime.result) if downtime and downtime.result else None
    if triage_result is not None:
        verdict = judge(
            table,
            offline,
            suspect_ratio=b.suspect_ratio,
            sampled_suspect_ratio=b.sampled_suspect_ratio,
            triage=triage_result,
            **how,
        )
    return verdict_manifest(request, session, verdict, production, findings, sweep_result(cfg, session, swept, spread))


def verdict_manifest(
    request: StageRequest,
    session: Session,
    verdict: Verdict,
    production: ProductionResult | None,
    findings: list[PreflightFinding],
    sweep: KSweep | None = None,
) -> Manifest:
    """The verdict logged, the pictures and report.md written, and the manifest: the first setting's figures
    (what the report and the promotion gate read) beside every window."""
    cfg, b, variants, table = request.config, request.config.benchmark, session.variants, session.table()
    log.info("verdict: %s", verdict.summary)
    for f in verdict.findings:
        log.info("  %s", f)
    drawn = plots.draw(
        {
            "acceptance.png": lambda path: plots.acceptance_by_position(table, path),
            "speedup.png": lambda path: plots.speedup_grid(table, path),
        },
        request.path,
    )
    report = render_markdown(
        f"Benchmark {cfg.name}: {served_name(cfg)}",
        table,
        verdict,
        b.num_speculative_tokens,
        production=production,
        plots=drawn,
        seconds=session.seconds,
    )
    report += sweep_section(sweep)
    (request.path / "report.md").write_text(report)

    head_t, head_c = headline_setting(verdict, session.settings)
    headline = {v.name: session.rows[(v.name, head_t, head_c)] for v in variants}
    head_speedup = verdict.headline.drafter_vs_baseline if verdict.headline else None
    metrics = BenchmarkMetrics(
        # baseline / current / drafter at the headline setting: what the report and the promotion gate read
        baseline=headline["baseline"],
        current=headline.get("current"),
        drafter=headline["drafter"],
        speedup=head_speedup or headline["drafter"].output_tok_s / headline["baseline"].output_tok_s,
        windows=table,
        verdict=verdict,
        production=production,
        offline={v.name: v.offline_al for v in variants if v.drafter},
        drafters={v.name: v.drafter for v in variants if v.drafter},
        preflight=findings,
        settings=b,
        reused={v.name: headline[v.name].measured or "" for v in variants if v.reused is not None},
        requests={v.name: sum(w.requests or 0 for w in table if w.variant == v.name) for v in session.measured},
        seconds=session.seconds,
        k_sweep=sweep,
    )
    outputs = BenchmarkOutputs(
        drafter_dir=headline_drafter(variants), num_prompts=len(session.prompts), report_md="report.md", plots=drawn
    )
    return request.manifest(outputs=outputs, metrics=metrics)


def references_manifest(
    request: StageRequest,
    variants: list[Variant],
    table: list[Measurement],
    findings: list[PreflightFinding],
    num_prompts: int,
) -> Manifest:
    """benchmark.drafter_on 'none': the baseline and the current drafter, measured or reused, kept for the
    measurement of the new drafter on production; no verdict (there is no new drafter here)."""
    b = request.config.benchmark
    head = {w.variant: w for w in table if (w.temperature, w.concurrency) == (b.temperatures[0], b.concurrencies[0])}
    summary = "references only: " + ", ".join(
        f"{n} {'reused' if v.reused else 'measured'}" for n, v in ((v.name, v) for v in variants)
    )
    metrics = BenchmarkMetrics(
        baseline=head["baseline"],
        current=head.get("current"),
        drafter=None,
        speedup=None,
        windows=table,
        verdict=Verdict(summary=summary, integration_suspect=False, findings=[], speedups=[]),
        production=None,
        offline={v.name: v.offline_al for v in variants if v.drafter},
        drafters={v.name: v.drafter for v in variants if v.drafter},
        preflight=findings,
        settings=b,
        reused={v.name: head[v.name].measured or "" for v in variants if v.reused is not None},
        requests={v.name: sum(w.requests or 0 for w in table if w.variant == v.name) for v in variants if not v.reused},
    )
    log.info("%s", summary)
    return request.manifest(
        outputs=BenchmarkOutputs(drafter_dir=None, num_prompts=num_prompts, report_md=None), metrics=metrics
    )


def copy_settings(cfg: RunConfig) -> dict[str, int]:
    """What a copy reference depends on beyond the baseline's key (the triage's own settings)."""
    return {"num_prompts": cfg.benchmark.triage.num_prompts, "max_tokens": cfg.benchmark.triage.max_tokens}


def reused_copy_reference(cfg: RunConfig, variants: list[Variant]) -> CopyReference | None:
    """The verify probe's reference kept with a reused baseline, when the triage's settings still match."""
    base = next(v for v in variants if v.name == "baseline")
    if base.reused is not None and base.reused.copy_reference and base.reused.copy_settings == copy_settings(cfg):
        return CopyReference(**base.reused.copy_reference)
    return None


def record_copy_reference(request: StageRequest, baseline: Variant, prompts: list[Messages]) -> CopyReference | None:
    """The copy prompts served by the baseline's engine, while it is up (the triage's verify probe)."""
    assert baseline.server is not None
    try:
        ref = record_reference(request.config, baseline.server.base_url, prompts)
        ref.save(request.path / "triage-copy-prompts.json")
        return ref
    except StageError as exc:  # the measurement stands; the verify probe says why it is missing
        log.warning("triage: no copy prompts recorded: %s", exc)
        return None


def copy_reference_engine(
    request: StageRequest, prompts: list[Messages], env: dict[str, str] | None
) -> CopyReference | None:
    """The verify probe's reference when the baseline was reused without one: an engine without speculation,
    only for it (one load, only when the triage runs)."""
    cfg = request.config
    log.info("triage: the reused baseline has no copy-prompt reference; loading the target without speculation for it")
    try:
        with make_server(
            target_launch(cfg, None), request.path / "engine-triage-reference.log", env=env, name="triage-reference"
        ) as server:
            ref = record_reference(cfg, server.base_url, prompts)
        ref.save(request.path / "triage-copy-prompts.json")
        return ref
    except StageError as exc:  # the verify probe then says why it is missing
        log.warning("triage: no copy prompts recorded: %s", exc)
        return None


def triage_inputs(
    request: StageRequest,
    session: Session,
    verdict: Verdict,
    t0: tuple[float, int] | None,
    copy_ref: CopyReference | None,
    env: dict[str, str] | None,
) -> TriageInputs:
    """The suspect drafter (the new one first), what the run measured, and the references the probes need."""
    variants = session.variants
    name = verdict.suspects[0] if verdict.suspects else "drafter"
    v = next(x for x in variants if x.name == name)
    assert v.drafter is not None
    if verdict.suspects:
        why = next(
            (
                f
                for f in verdict.findings
                if f.startswith((f"{name}: served", f"{name}: at temperature")) and ("allows" in f)
            ),
            f"{name} is below its estimate",
        )
        trigger = f"auto: {why}"
    else:
        trigger = "always (benchmark.triage.when)"
    answers = {}
    if t0 is not None:
        for x in variants:
            if x.reused is not None:
                answers[x.name] = x.reused.answers_t0 or []
            else:
                answers[x.name] = session.answers_t0(x.name, t0)
    other = [f for f in verdict.findings if f.startswith("current: served") and name != "current"]
    return TriageInputs(
        cfg=request.config,
        stage_dir=request.path,
        variant=name,
        drafter_dir=v.drafter,
        trigger=trigger,
        suspect=bool(verdict.suspects),
        windows=session.table(),
        answers=answers,
        prompts=session.prompts,
        copy_reference=copy_ref,
        extract=request.upstream.get("extract"),
        engine_env=env,
        other=other,
    )


def headline_drafter(variants: list[Variant]) -> str:
    return next(v.drafter for v in variants if v.name == "drafter" and v.drafter)


if __name__ == "__main__":
    sys.exit(stage_main("benchmark", run))
