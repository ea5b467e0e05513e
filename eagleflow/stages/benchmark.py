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
   (eagleflow.verdict). `report.md` (the table) is written beside the manifest.

With `benchmark.side_by_side` all engines load at once and each window alternates request rounds
between them (A B, B A, ...), so a noisy machine's drift hits every variant alike.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import time
import os
from contextlib import ExitStack, nullcontext
from pathlib import Path

import httpx

from eagleflow.config import RunConfig
from eagleflow.engines import EngineServer, make_server
from eagleflow.engines.chat import ChatClient, ChatResult
from eagleflow.engines.launch import served_name, speculative, target_launch
from eagleflow.engines.remote import ProductionEndpoint
from eagleflow.intervals import StoppingRule
from eagleflow.manifest import Manifest, read_manifest
from eagleflow import measurements, plots
from eagleflow.measurements import VariantRecord
from eagleflow.outputs import (
    BenchmarkMetrics, BenchmarkOutputs, ExportOutputs, Measurement, PreflightFinding, ProductionResult, Verdict,
)
from eagleflow.promotion import PromotionRecord, promotion_record_path
from eagleflow.prompts import Messages, PromptError, run_holdout
from eagleflow.production import WINDOW_ENV, production_stopped
from eagleflow.progress import Progress
from eagleflow.request import StageError, StageRequest
from eagleflow.stages.common import stage_main
from eagleflow.triage import CopyReference, TriageInputs, run_triage
from eagleflow.triage.verify import record_reference
from eagleflow.rounds import WindowRecorder
from eagleflow.verdict import judge, render_markdown

log = logging.getLogger("eagleflow.benchmark")

SEED = 1234  # sampled settings: request i of every variant uses seed SEED + i


@dataclasses.dataclass
class Variant:
    """One engine configuration under test."""

    name: str
    drafter: str | None
    offline_al: float | None = None
    server: EngineServer | ProductionEndpoint | None = None  # production: benchmark.drafter_on production
    client: ChatClient | None = None  # one per engine: every round of every window goes through it
    key: str | None = None  # baseline / current: what determines the measurement (eagleflow.measurements)
    reused: VariantRecord | None = None  # measured by an earlier run, still valid: no engine for it


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
            raise StageError(f"{field}: {p} is a {m.stage} manifest without outputs['vllm']; pass an export "
                             "stage's manifest.json or a drafter directory")
        return m.path(vllm_dir)
    if not (p / "config.json").is_file():
        raise StageError(f"{field}: {p} is neither a drafter directory (no config.json there) nor an export "
                         "manifest.json; point it at the directory the engine should load")
    return str(p)


def offline_estimate(drafter_dir: str) -> float | None:
    """The simulated acceptance length eagleflow's trainer measured for a drafter it exported, if any."""
    try:
        conf = json.loads((Path(drafter_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    val = (conf.get("eagleflow") or {}).get("validation") or {}
    al = val.get("acceptance_length")
    return float(al) if isinstance(al, (int, float)) else None


def current_drafter(cfg: RunConfig) -> str | None:
    """benchmark.current_drafter, else the drafter the nightly retrain promoted for this run name. With
    production.promote 'deploy' the promoted drafter wins once there is one: it is what production serves (a
    rollback rewrites the record to the drafter it returned to); benchmark.current_drafter is then only what
    production served before eagleflow's first deploy."""
    record = Path(promotion_record_path(cfg.host.work_root, cfg.name))
    deploy = cfg.production.promote == "deploy" and record.is_file()
    if cfg.benchmark.current_drafter and not deploy:
        return resolve_drafter(cfg.benchmark.current_drafter, "benchmark.current_drafter")
    if record.is_file():
        path = PromotionRecord.model_validate_json(record.read_text()).drafter_dir
        if Path(path, "config.json").is_file():
            log.info("current drafter: the promoted one, %s (from %s)", path, record)
            return path
    if cfg.benchmark.current_drafter:
        return resolve_drafter(cfg.benchmark.current_drafter, "benchmark.current_drafter")
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
    argv = [sys.executable, "-m", "eagleflow.engines.preflight", "--engine-json", cfg.engine.model_dump_json(),
            "--target", cfg.target.model_path, "--disk-path", cfg.host.work_root, "--json", str(out)]
    if skip_gpu:
        argv.append("--skip-gpu")
    for v in variants:
        if v.drafter:
            argv += ["--drafter", f"{v.name}={v.drafter}"]
    # The ids the new drafter was trained on are the run's; a public current drafter's are unknown.
    argv += ["--expected-aux", "drafter=" + ",".join(str(i) for i in cfg.target.aux_layer_ids)]
    if cfg.benchmark.draft_attention_backend:
        argv += ["--draft-attention-backend", cfg.benchmark.draft_attention_backend]
    argv += ["--temperatures", ",".join(f"{t:g}" for t in cfg.benchmark.temperatures)]
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - start
    for line in proc.stdout.splitlines():
        log.info("preflight: %s", line)
    if proc.returncode not in (0, 1) or not out.exists():
        raise StageError(f"the preflight itself failed (exit {proc.returncode}) in {sys.executable}:\n"
                         f"{(proc.stderr or proc.stdout)[-3000:]}")
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


def reuse_measurements(cfg: RunConfig, variants: list[Variant], prompts: list[Messages]) -> None:
    """Key every variant; take the baseline's and the current drafter's measurements from an earlier run when
    one is still valid (benchmark.reuse_for_h): then no engine loads for them. The new drafter is always
    measured (and kept: promoted, it is the next night's current drafter)."""
    version = measurements.engine_version(cfg.engine.kind)
    for v in variants:
        v.key = measurements.measurement_key(cfg, v.name, v.drafter, prompts, version)
        if v.name == "drafter":
            continue
        v.reused = measurements.load_reusable(cfg.host.work_root, measurements.kind_of(v.drafter), v.key,
                                              cfg.benchmark.reuse_for_h)
        if v.reused is not None:
            log.info("%s: reusing its measurement of %s (%.1f h ago, within benchmark.reuse_for_h %g h): engine, "
                     "target, settings, prompts%s unchanged", v.name, _when(v.reused.measured_at),
                     v.reused.age_h(), cfg.benchmark.reuse_for_h, " and drafter files" if v.drafter else "")


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def reused_rows(v: Variant) -> dict[tuple[str, float, int], Measurement]:
    assert v.reused is not None
    r = v.reused
    note = (f"measured {_when(r.measured_at)} ({r.age_h():.1f} h ago) in {r.stage_dir}"
            + (f" as variant '{r.variant}'" if r.variant != v.name else ""))
    return {(v.name, w.temperature, w.concurrency): w.model_copy(update={"measured": note, "variant": v.name})
            for w in r.windows}


def run(request: StageRequest) -> Manifest:
    cfg = request.config
    b = cfg.benchmark
    prompts = benchmark_prompts(cfg)
    if len(prompts) < b.num_prompts:
        raise StageError(f"only {len(prompts)} held-out prompts; lower benchmark.num_prompts or raise generate.holdout")
    on = b.drafter_on
    variants = [v for v in variants_for(request) if on != "none" or v.name != "drafter"]
    reuse_measurements(cfg, variants, prompts)
    measured = [v for v in variants if v.reused is None]
    if on == "production" and (stale := [v.name for v in measured if v.name != "drafter"]):
        raise StageError(f"benchmark.drafter_on 'production': no reusable measurement of the {' and the '.join(stale)} "
                         f"(benchmark.reuse_for_h {b.reuse_for_h:g} h): production serves the new drafter now, so they "
                         "cannot be measured here; measure them first while production is down (benchmark.drafter_on "
                         "'none', as the nightly does)")
    has_production = cfg.production.kind != "none"
    findings = (preflight(request, variants, skip_gpu=has_production or on == "production")
                if cfg.engine.preflight else [])

    settings = [(t, c) for t in b.temperatures for c in b.concurrencies]
    windows = {(v.name, t, c): WindowRecorder(v.name, t, c) for v in measured for t, c in settings}
    rows: dict[tuple[str, float, int], Measurement] = {}
    for v in variants:
        if v.reused is not None:
            rows.update(reused_rows(v))
    rule = StoppingRule(b.precision, b.min_requests)

    def send(v: Variant, convs: list[Messages], t: float, c: int) -> tuple[list[ChatResult], float]:
        assert v.server is not None and v.client is not None
        results, seconds = v.client.chat(convs, max_tokens=b.max_tokens, temperature=t, concurrency=c,
                                         extra={"ignore_eos": True}, seed=SEED if t > 0 else None)
        errors = [r.error for r in results if r.error]
        if errors:
            raise StageError(f"{v.name} (temperature {t:g}, concurrency {c}): {len(errors)} of {len(results)} "
                             f"benchmark requests failed; first: {errors[0]}\n{v.server.post_mortem()}")
        return results, seconds

    def snapshot(v: Variant) -> dict[str, float]:
        assert v.server is not None
        try:
            return v.server.snapshot()
        except httpx.HTTPError as exc:
            raise StageError(f"{v.name}: the engine's metrics did not answer ({type(exc).__name__}: {exc})\n"
                             f"{v.server.post_mortem()}") from None

    def counters(v: Variant, before: dict[str, float], after: dict[str, float]) -> tuple[float, float]:
        assert v.server is not None
        got = v.server.acceptance(before, after, b.num_speculative_tokens)
        return got["num_drafts"], got["num_accepted_tokens"]

    def reference(t: float, c: int) -> Measurement | WindowRecorder | None:
        """The baseline's rounds at this setting: reused, or measured by this run (first, or beside)."""
        return rows.get(("baseline", t, c)) or windows.get(("baseline", t, c))

    def measure_setting(group: list[Variant], t: float, c: int) -> None:
        """Rounds of c held-out prompts, in order, to every variant of the group (side by side: alternating who
        goes first). The drafters' windows stop together once the stopping rule holds for each of them."""
        rounds = [prompts[i:i + c] for i in range(0, len(prompts), c)]
        last = {}
        for v in group:
            last[v.name] = windows[(v.name, t, c)].before = snapshot(v)
        drafters = [v for v in group if v.drafter]
        sent, why = 0, "all prompts"
        for r, convs in enumerate(rounds):
            for v in group if r % 2 == 0 else group[::-1]:
                results, seconds = send(v, convs, t, c)
                now = snapshot(v) if v.drafter else last[v.name]
                windows[(v.name, t, c)].add(results, seconds, counters(v, last[v.name], now) if v.drafter else None)
                last[v.name] = now
                progress.update(progress.done + len(convs),
                                {"measuring": f"{v.name} at temperature {t:g}, concurrency {c}"})
            sent += len(convs)
            if drafters and sent < len(prompts) and all(
                    rule.done(sent, windows[(v.name, t, c)].estimates(reference(t, c))) for v in drafters):
                why = "precision"
                break
        for v in group:
            w = windows[(v.name, t, c)]
            w.after = snapshot(v) if not v.drafter else last[v.name]
            w.stopped = why
            rows[(v.name, t, c)] = w.measurement(v.server, b.num_speculative_tokens)
        if why == "precision":
            progress.update(progress.done + (len(prompts) - sent) * len(group), {"measuring": "stopped early"})
        log.info("measured temperature %g, concurrency %d: %s", t, c, ", ".join(
            f"{v.name} {rows[(v.name, t, c)].output_tok_s:.1f} tok/s" for v in group)
            + (f"; stopped after {sent} of {len(prompts)} requests: within benchmark.precision {b.precision:.0%}"
               if why == "precision" else ""))

    # The triage's references, taken while the engines are up: the copy prompts served without speculation
    # (on the baseline engine), and every variant's temperature-0 answers (speculation must not change them).
    tri = b.triage
    triage_on = tri.when != "never" and cfg.engine.kind == "vllm" and on == "engine"
    if tri.when != "never" and not triage_on:
        log.info("triage: not run: %s", f"engine.kind {cfg.engine.kind} (vLLM's ngram and capture methods)"
                 if cfg.engine.kind != "vllm" else f"benchmark.drafter_on {on} (its probes load engines of their own)")
    copy_ref: CopyReference | None = None
    t0 = (0.0, min(b.concurrencies)) if 0.0 in b.temperatures else None
    triage_result = None
    base = next(v for v in variants if v.name == "baseline")
    if base.reused is not None and base.reused.copy_reference and base.reused.copy_settings == copy_settings(cfg):
        copy_ref = CopyReference(**base.reused.copy_reference)

    groups = [measured] if b.side_by_side else [[v] for v in measured]
    # Requests of every measured variant at every setting, at most (a window may stop early); engine loads
    # between groups count in the rate.
    progress = Progress("benchmark", "requests", max(len(measured) * len(settings) * len(prompts), 1), "requests")
    # Inside the pipeline's production window, production is already down and the flow gives it back
    # (our engines inherit the window's token); run alone, the stage stops and restores it itself.
    window = os.environ.get(WINDOW_ENV)
    if window:
        log.info("measuring inside the production window of %s", window)
    if on == "production":
        log.info("the new drafter is measured on production (%s), which serves it since its deploy", cfg.production.url)
    stopped = (nullcontext(None) if window or on == "production" else
               production_stopped(cfg.production, request.path, work_root=cfg.host.work_root, log=log.info))
    with stopped as downtime:
        if cfg.engine.preflight and has_production and on != "production":
            findings += gpus_free(cfg)
        for group in groups:
            with ExitStack() as stack:
                for i, v in enumerate(group):
                    launch = target_launch(cfg, speculative(v.drafter, b.num_speculative_tokens, b.draft_attention_backend) if v.drafter else None,
                                           port_offset=i)  # side by side: engine.port, +1, +2
                    v.server = ProductionEndpoint(cfg) if on == "production" else make_server(
                        launch, request.path / f"engine-{v.name}.log", env=downtime.engine_env() if downtime else None,
                        name=v.name)
                    stack.callback(v.server.stop)  # whatever happens, end what this stage started
                    v.server.start()  # side by side: all load at once
                for v in group:
                    assert v.server is not None
                    v.server.wait_healthy()
                    v.client = stack.enter_context(ChatClient(
                        v.server.base_url, served_name(cfg), max_concurrency=max(b.concurrencies),
                        timeout_s=cfg.engine.request_timeout_s, api_key=getattr(v.server, "api_key", None)))
                    if b.warmup_requests:
                        send(v, prompts[: b.warmup_requests], 0.0, 1)
                for t, c in settings:
                    measure_setting(group, t, c)
                for v in group:
                    if v.name == "baseline" and triage_on and "verify" in tri.probes:
                        assert v.server is not None
                        try:
                            copy_ref = record_reference(cfg, v.server.base_url, prompts)
                            copy_ref.save(request.path / "triage-copy-prompts.json")
                        except StageError as exc:  # the measurement stands; the verify probe says why it is missing
                            log.warning("triage: no copy prompts recorded: %s", exc)
            for v in group:
                keep_measurement(request, v, rows, windows, t0, copy_ref if v.name == "baseline" else None)
        progress.finish()
        table = [rows[(v.name, t, c)] for v in variants for t, c in settings]
        if on == "none":
            return references_manifest(request, variants, table, findings, len(prompts))
        offline = {v.name: v.offline_al for v in variants if v.drafter}
        verdict = judge(table, offline, suspect_ratio=b.suspect_ratio, sampled_suspect_ratio=b.sampled_suspect_ratio)
        if triage_on and (tri.when == "always" or verdict.suspects):
            env = downtime.engine_env() if downtime else None
            if copy_ref is None and "verify" in tri.probes:
                copy_ref = copy_reference_engine(request, prompts, env)
            # Still inside the production window: the probes' engines need the GPUs too.
            triage_result = run_triage(triage_inputs(request, variants, verdict, table, windows, t0, prompts,
                                                     copy_ref, env))
    production = ProductionResult.model_validate(downtime.result) if downtime and downtime.result else None

    if triage_result is not None:
        verdict = judge(table, offline, suspect_ratio=b.suspect_ratio, sampled_suspect_ratio=b.sampled_suspect_ratio,
                        triage=triage_result)
    log.info("verdict: %s", verdict.summary)
    for f in verdict.findings:
        log.info("  %s", f)
    drawn = plots.draw({"acceptance.png": lambda path: plots.acceptance_by_position(table, path),
                        "speedup.png": lambda path: plots.speedup_grid(table, path)}, request.path)
    report = render_markdown(f"Benchmark {cfg.name}: {served_name(cfg)}", table, verdict, b.num_speculative_tokens,
                             production=production, plots=drawn)
    (request.path / "report.md").write_text(report)

    head_t, head_c = settings[0]
    headline = {v.name: rows[(v.name, head_t, head_c)] for v in variants}
    head_speedup = verdict.headline.drafter_vs_baseline if verdict.headline else None
    metrics = BenchmarkMetrics(
        # baseline / current / drafter at the first setting: what the report and the promotion gate read
        baseline=headline["baseline"], current=headline.get("current"), drafter=headline["drafter"],
        speedup=head_speedup or headline["drafter"].output_tok_s / headline["baseline"].output_tok_s,
        windows=table, verdict=verdict, production=production,
        offline={v.name: v.offline_al for v in variants if v.drafter},
        drafters={v.name: v.drafter for v in variants if v.drafter},
        preflight=findings, settings=b,
        reused={v.name: headline[v.name].measured or "" for v in variants if v.reused is not None},
        requests={v.name: sum(w.requests or 0 for w in table if w.variant == v.name) for v in measured},
    )
    outputs = BenchmarkOutputs(drafter_dir=headline_drafter(variants), num_prompts=len(prompts), report_md="report.md",
                               plots=drawn)
    return request.manifest(outputs=outputs, metrics=metrics)


def references_manifest(request: StageRequest, variants: list[Variant], table: list[Measurement],
                        findings: list[PreflightFinding], num_prompts: int) -> Manifest:
    """benchmark.drafter_on 'none': the baseline and the current drafter, measured or reused, kept for the
    measurement of the new drafter on production; no verdict (there is no new drafter here)."""
    b = request.config.benchmark
    head = {w.variant: w for w in table if (w.temperature, w.concurrency) == (b.temperatures[0], b.concurrencies[0])}
    summary = "references only: " + ", ".join(f"{n} {'reused' if v.reused else 'measured'}"
                                               for n, v in ((v.name, v) for v in variants))
    metrics = BenchmarkMetrics(
        baseline=head["baseline"], current=head.get("current"), drafter=None, speedup=None, windows=table,
        verdict=Verdict(summary=summary, integration_suspect=False, findings=[], speedups=[]), production=None,
        offline={v.name: v.offline_al for v in variants if v.drafter}, drafters={v.name: v.drafter for v in variants
                                                                                  if v.drafter},
        preflight=findings, settings=b,
        reused={v.name: head[v.name].measured or "" for v in variants if v.reused is not None},
        requests={v.name: sum(w.requests or 0 for w in table if w.variant == v.name) for v in variants if not v.reused})
    log.info("%s", summary)
    return request.manifest(outputs=BenchmarkOutputs(drafter_dir=None, num_prompts=num_prompts, report_md=None),
                            metrics=metrics)


def keep_measurement(request: StageRequest, v: Variant, rows: dict[tuple[str, float, int], Measurement],
                     windows: dict[tuple[str, float, int], WindowRecorder], t0: tuple[float, int] | None,
                     copy_ref: CopyReference | None) -> None:
    """Keep a freshly measured variant for later runs (benchmark.reuse_for_h)."""
    cfg = request.config
    if v.key is None or v.reused is not None or cfg.benchmark.reuse_for_h <= 0:
        return
    mine = [w for (name, _, _), w in rows.items() if name == v.name]
    answers = [f"{r.reasoning or ''}\n{r.content or ''}" for r in windows[(v.name, *t0)].results] if t0 else None
    record = VariantRecord(key=v.key, variant=v.name, drafter=v.drafter, measured_at=time.time(),
                           stage_dir=str(request.path), engine_version=measurements.engine_version(cfg.engine.kind),
                           windows=mine, answers_t0=answers,
                           copy_reference=dataclasses.asdict(copy_ref) if copy_ref is not None else None,
                           copy_settings=copy_settings(cfg) if copy_ref is not None else None)
    path = measurements.save(cfg.host.work_root, record)
    log.info("%s: measurement kept for later runs at %s (reused for %g h)", v.name, path, cfg.benchmark.reuse_for_h)


def copy_settings(cfg: RunConfig) -> dict[str, int]:
    """What a copy reference depends on beyond the baseline's key (the triage's own settings)."""
    return {"num_prompts": cfg.benchmark.triage.num_prompts, "max_tokens": cfg.benchmark.triage.max_tokens}


def copy_reference_engine(request: StageRequest, prompts: list[Messages], env: dict[str, str] | None) -> CopyReference | None:
    """The verify probe's reference when the baseline was reused without one: an engine without speculation,
    only for it (one load, only when the triage runs)."""
    cfg = request.config
    log.info("triage: the reused baseline has no copy-prompt reference; loading the target without speculation for it")
    try:
        with make_server(target_launch(cfg, None), request.path / "engine-triage-reference.log", env=env,
                         name="triage-reference") as server:
            ref = record_reference(cfg, server.base_url, prompts)
        ref.save(request.path / "triage-copy-prompts.json")
        return ref
    except StageError as exc:  # the verify probe then says why it is missing
        log.warning("triage: no copy prompts recorded: %s", exc)
        return None


def triage_inputs(request: StageRequest, variants: list[Variant], verdict: Verdict, table: list[Measurement],
                  windows: dict[tuple[str, float, int], WindowRecorder], t0: tuple[float, int] | None,
                  prompts: list[Messages], copy_ref: CopyReference | None, env: dict[str, str] | None) -> TriageInputs:
    """The suspect drafter (the new one first), what the run measured, and the references the probes need."""
    name = verdict.suspects[0] if verdict.suspects else "drafter"
    v = next(x for x in variants if x.name == name)
    assert v.drafter is not None
    if verdict.suspects:
        why = next((f for f in verdict.findings if f.startswith((f"{name}: served", f"{name}: at temperature"))
                    and ("allows" in f)), f"{name} is below its estimate")
        trigger = f"auto: {why}"
    else:
        trigger = "always (benchmark.triage.when)"
    answers = {}
    if t0 is not None:
        for x in variants:
            if x.reused is not None:
                answers[x.name] = x.reused.answers_t0 or []
            else:
                answers[x.name] = [f"{r.reasoning or ''}\n{r.content or ''}" for r in windows[(x.name, *t0)].results]
    other = [f for f in verdict.findings if f.startswith("current: served") and name != "current"]
    return TriageInputs(cfg=request.config, stage_dir=request.path, variant=name, drafter_dir=v.drafter,
                        trigger=trigger, suspect=bool(verdict.suspects), windows=table, answers=answers,
                        prompts=prompts, copy_reference=copy_ref, extract=request.upstream.get("extract"),
                        engine_env=env, other=other)


def headline_drafter(variants: list[Variant]) -> str:
    return next(v.drafter for v in variants if v.name == "drafter" and v.drafter)


if __name__ == "__main__":
    sys.exit(stage_main("benchmark", run))
