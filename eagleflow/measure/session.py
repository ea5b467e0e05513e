"""One benchmark's measurement: the variants under test, their engines, and every window at every setting.

A `Session` holds what the benchmark stage measures with: the held-out prompts, the settings (temperature x
concurrency), a `WindowRecorder` per measured variant and setting, the rows of variants reused from an earlier
run (eagleflow.measure.reused), and the stopping rule. `open` starts a group's engines (all at once when
`benchmark.side_by_side`), `measure_setting` sends the rounds, `keep` stores a measured variant for later runs.
The stage (eagleflow.stages.benchmark) decides which variants there are, where production is, and the verdict.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from eagleflow.config import RunConfig
from eagleflow.config.measure import WARMUP_TOKENS
from eagleflow.contracts.benchmark_records import Measurement
from eagleflow.contracts.progress import Progress
from eagleflow.contracts.prompts import Messages
from eagleflow.contracts.request import StageError
from eagleflow.engines import EngineServer, make_server
from eagleflow.engines.chat import ChatClient, ChatResult, sampling_extra
from eagleflow.engines.launch import served_name, speculative, target_launch
from eagleflow.engines.remote import ProductionEndpoint
from eagleflow.measure import reused
from eagleflow.measure.intervals import StoppingRule
from eagleflow.measure.reused import VariantRecord
from eagleflow.measure.rounds import WindowRecorder, window_acceptance

log = logging.getLogger("eagleflow.benchmark")

SEED = 1234  # sampled settings: request i of every variant uses seed SEED + i
AGAIN = "baseline-again"  # benchmark.remeasure_baseline: no speculation on a fresh engine after the others
Cell = tuple[str, float, int]  # (variant, temperature, concurrency)


@dataclasses.dataclass
class Variant:
    """One engine configuration under test."""

    name: str
    drafter: str | None
    offline_al: float | None = None
    server: EngineServer | ProductionEndpoint | None = None  # production: benchmark.drafter_on production
    client: ChatClient | None = None  # one per engine: every round of every window goes through it
    key: str | None = None  # baseline / current: what determines the measurement (eagleflow.measure.reused)
    reused: VariantRecord | None = None  # measured by an earlier run, still valid: no engine for it
    k: int | None = None  # num_speculative_tokens for this engine (benchmark.k_sweep); None: the benchmark's


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def reuse_measurements(
    cfg: RunConfig, variants: list[Variant], prompts: list[Messages], load_now: reused.HostLoad | None
) -> None:
    """Key every variant; take the baseline's and the current drafter's measurements from an earlier run when
    one is still valid (benchmark.reuse_for_h) and the host is as busy as it was then (`load_now`, read before any
    engine of this run: benchmark.reuse_max_load_change; None: no load rule, as when the references were measured
    this night on purpose): then no engine loads for them. The new drafter is always measured (and kept: promoted,
    it is the next night's current drafter)."""
    version = reused.engine_version(cfg.engine.kind)
    for v in variants:
        v.key = reused.measurement_key(cfg, v.name, v.drafter, prompts, version)
        if v.name == "drafter":
            continue
        v.reused = reused.load_reusable(cfg.host.work_root, reused.kind_of(v.drafter), v.key, cfg.benchmark.reuse_for_h)
        if v.reused is not None and v.reused.host_load is not None and load_now is not None:
            why = v.reused.host_load.differs(load_now, cfg.benchmark.reuse_max_load_change)
            if why:
                log.info(
                    "%s: measuring again, not reusing its measurement of %s: %s (benchmark.reuse_max_load_change %g)",
                    v.name,
                    when(v.reused.measured_at),
                    why,
                    cfg.benchmark.reuse_max_load_change,
                )
                v.reused = None
        if v.reused is not None:
            log.info(
                "%s: reusing its measurement of %s (%.1f h ago, within benchmark.reuse_for_h %g h): engine, "
                "target, settings, prompts%s unchanged",
                v.name,
                when(v.reused.measured_at),
                v.reused.age_h(),
                cfg.benchmark.reuse_for_h,
                " and drafter files" if v.drafter else "",
            )


def reused_rows(v: Variant) -> dict[Cell, Measurement]:
    assert v.reused is not None
    r = v.reused
    note = f"measured {when(r.measured_at)} ({r.age_h():.1f} h ago) in {r.stage_dir}" + (
        f" as variant '{r.variant}'" if r.variant != v.name else ""
    )
    return {
        (v.name, w.temperature, w.concurrency): w.model_copy(update={"measured": note, "variant": v.name})
        for w in r.windows
    }


class Session:
    """The windows of one benchmark run, measured and reused."""

    def __init__(
        self,
        cfg: RunConfig,
        prompts: list[Messages],
        variants: list[Variant],
        load: reused.HostLoad | None = None,
        planned_s: float | None = None,
        swept: list[Variant] | None = None,
    ) -> None:
        self.cfg, self.b, self.prompts, self.variants = cfg, cfg.benchmark, prompts, variants
        self.load = load  # what else kept the host busy before our engines: kept with each measured variant
        self.settings = [(t, c) for t in self.b.temperatures for c in self.b.concurrencies]
        self.measured = [v for v in variants if v.reused is None]
        # benchmark.k_sweep: the new drafter at other k, measured after the verdict's variants, outside its table
        self.swept = swept or []
        # benchmark.remeasure_baseline: no speculation once more, last, when this run measures it and its drafters
        self.again = (
            [Variant(AGAIN, None)]
            if self.b.remeasure_baseline
            and self.b.drafter_on == "engine"
            and any(v.name == "baseline" for v in self.measured)
            else []
        )
        self.windows = {
            (v.name, t, c): WindowRecorder(v.name, t, c)
            for v in self.measured + self.swept + self.again
            for t, c in self.settings
        }
        self.rows: dict[Cell, Measurement] = {}
        for v in variants:
            if v.reused is not None:
                self.rows.update(reused_rows(v))
        self.rule = StoppingRule(self.b.precision, self.b.min_requests)
        # Where the measuring time went, part by part, in the order it was spent (the report's table).
        self.seconds: dict[str, float] = {}
        # Requests of every measured variant at every setting, at most (a window may stop early); engine loads
        # between groups count in the rate.
        self.progress = Progress(
            "benchmark",
            "requests",
            max((len(self.measured) + len(self.swept) + len(self.again)) * len(self.settings) * len(prompts), 1),
            "requests",
            planned_s=planned_s,
        )

    def groups(self) -> list[list[Variant]]:
        """The measured variants in the order their engines load: all at once side by side, else one by one."""
        return [self.measured] if self.b.side_by_side else [[v] for v in self.measured]

    def table(self) -> list[Measurement]:
        return [self.rows[(v.name, t, c)] for v in self.variants for t, c in self.settings]

    def k_of(self, v: Variant) -> int:
        return v.k or self.b.num_speculative_tokens

    # -- engines ----------------------------------------------------------------------------------

    def open(
        self, group: list[Variant], stack: ExitStack, stage_dir: Path, on_production: bool, env: dict[str, str] | None
    ) -> None:
        """Start the group's engines (or reach production's endpoint), wait for them, warm them up. `stack`
        ends whatever this started, however the measurement ends."""
        b = self.b
        began = time.monotonic()
        for i, v in enumerate(group):
            spec = (
                speculative(v.drafter, self.k_of(v), b.draft_attention_backend, b.draft_sample_method)
                if v.drafter
                else None
            )
            launch = target_launch(self.cfg, spec, port_offset=i)  # side by side: engine.port, +1, +2
            v.server = (
                ProductionEndpoint(self.cfg)
                if on_production
                else make_server(launch, stage_dir / f"engine-{v.name}.log", env=env, name=v.name)
            )
            stack.callback(v.server.stop)
            v.server.start()  # side by side: all load at once
        for v in group:
            assert v.server is not None
            v.server.wait_healthy()
            v.client = stack.enter_context(
                ChatClient(
                    v.server.base_url,
                    served_name(self.cfg),
                    max_concurrency=max(b.concurrencies),
                    timeout_s=self.cfg.engine.request_timeout_s,
                    api_key=getattr(v.server, "api_key", None),
                )
            )
            # Every setting's shapes before its first measured round: on a GPU host a fresh engine compiles (Triton
            # JIT) the kernels of a batch size or a sampler the first time it meets them. Warmed at concurrency 1
            # alone, a baseline's first round at concurrency 8 read a TTFT of 342 ms (8-20 ms warm) and the drafter
            # 1.88x on 3 rounds; short answers: the kernels, not the tokens, are what warms.
            for t, c, n in b.warmup():
                self.send(v, self.prompts[:n], t, c, max_tokens=min(b.max_tokens, WARMUP_TOKENS))
            # side by side the group's engines load at once: each from the group's start
            where = "production's endpoint" if on_production else "engine"
            self.seconds[f"{where} {v.name}: load and warm-up"] = round(time.monotonic() - began, 1)

    def send(
        self, v: Variant, convs: list[Messages], t: float, c: int, max_tokens: int | None = None
    ) -> tuple[list[ChatResult], float]:
        assert v.server is not None and v.client is not None
        results, seconds = v.client.chat(
            convs,
            max_tokens=max_tokens or self.b.max_tokens,
            temperature=t,
            concurrency=c,
            extra={"ignore_eos": True, **sampling_extra(t, self.b.top_p), **getattr(v.server, "request_extra", {})},
            seed=SEED if t > 0 else None,
        )
        errors = [r.error for r in results if r.error]
        if errors:
            raise StageError(
                f"{v.name} (temperature {t:g}, concurrency {c}): {len(errors)} of {len(results)} "
                f"benchmark requests failed; first: {errors[0]}\n{v.server.post_mortem()}"
            )
        return results, seconds

    def snapshot(self, v: Variant) -> dict[str, float]:
        assert v.server is not None
        try:
            return v.server.snapshot()
        except httpx.HTTPError as exc:
            raise StageError(
                f"{v.name}: the engine's metrics did not answer ({type(exc).__name__}: {exc})\n{v.server.post_mortem()}"
            ) from None

    def counters(
        self, v: Variant, before: dict[str, float], after: dict[str, float], results: list[ChatResult]
    ) -> tuple[float, float]:
        """A round's (drafting steps, accepted drafts): from its answers where they say (SGLang), else the engine's
        counters around it."""
        assert v.server is not None
        got = window_acceptance(v.server, results, before, after, self.k_of(v))
        return got["num_drafts"], got["num_accepted_tokens"]

    # -- windows ----------------------------------------------------------------------------------

    def reference(self, t: float, c: int) -> Measurement | WindowRecorder | None:
        """The baseline's rounds at this setting: reused, or measured by this run (first, or beside)."""
        return self.rows.get(("baseline", t, c)) or self.windows.get(("baseline", t, c))

    def measure_setting(self, group: list[Variant], t: float, c: int) -> None:
        """Rounds of c held-out prompts, in order, to every variant of the group (side by side: alternating who
        goes first). The drafters' windows stop together once the stopping rule holds for each of them."""
        prompts, windows, progress = self.prompts, self.windows, self.progress
        rounds = [prompts[i : i + c] for i in range(0, len(prompts), c)]
        began = time.monotonic()
        last = {}
        for v in group:
            last[v.name] = windows[(v.name, t, c)].before = self.snapshot(v)
        drafters = [v for v in group if v.drafter]
        sent, why = 0, "all prompts"
        for r, convs in enumerate(rounds):
            for v in group if r % 2 == 0 else group[::-1]:
                results, seconds = self.send(v, convs, t, c)
                now = self.snapshot(v) if v.drafter else last[v.name]
                windows[(v.name, t, c)].add(
                    results, seconds, self.counters(v, last[v.name], now, results) if v.drafter else None
                )
                last[v.name] = now
                progress.update(
                    progress.done + len(convs), {"measuring": f"{v.name} at temperature {t:g}, concurrency {c}"}
                )
            sent += len(convs)
            if (
                drafters
                and sent < len(prompts)
                and all(self.rule.done(sent, windows[(v.name, t, c)].estimates(self.reference(t, c))) for v in drafters)
            ):
                why = "precision"
                break
        for v in group:
            w = windows[(v.name, t, c)]
            w.after = self.snapshot(v) if not v.drafter else last[v.name]
            w.stopped = why
            self.rows[(v.name, t, c)] = w.measurement(v.server, self.k_of(v))
        names = " and ".join(v.name for v in group)
        self.seconds[f"{names}: windows at temperature {t:g}, concurrency {c}"] = round(time.monotonic() - began, 1)
        if why == "precision":
            progress.update(progress.done + (len(prompts) - sent) * len(group), {"measuring": "stopped early"})
        log.info(
            "measured temperature %g, concurrency %d: %s",
            t,
            c,
            ", ".join(f"{v.name} {self.rows[(v.name, t, c)].output_tok_s:.1f} tok/s" for v in group)
            + (
                f"; stopped after {sent} of {len(prompts)} requests: within benchmark.precision {self.b.precision:.0%}"
                if why == "precision"
                else ""
            ),
        )

    def measure_again(self, stage_dir: Path, env: dict[str, str] | None) -> list[Measurement]:
        """benchmark.remeasure_baseline: no speculation on an engine of its own after every other variant (the sweep's
        included), every setting; its windows against the first baseline's are the engine-to-engine spread
        (eagleflow.measure.verdict.engine_spread). Empty when it is off or the baseline was reused."""
        for v in self.again:
            with ExitStack() as stack:
                self.open([v], stack, stage_dir, False, env)
                for t, c in self.settings:
                    self.measure_setting([v], t, c)
        return [self.rows[(v.name, t, c)] for v in self.again for t, c in self.settings]

    def answers_t0(self, name: str, t0: tuple[float, int]) -> list[str]:
        """A measured variant's answers at temperature 0 (speculation must not change them)."""
        return [f"{r.reasoning or ''}\n{r.content or ''}" for r in self.windows[(name, *t0)].results]

    def keep(
        self,
        v: Variant,
        stage_dir: Path,
        t0: tuple[float, int] | None,
        copy_reference: dict | None,
        copy_settings: dict[str, int] | None,
    ) -> None:
        """Keep a freshly measured variant for later runs (benchmark.reuse_for_h)."""
        cfg = self.cfg
        if v.key is None or v.reused is not None or cfg.benchmark.reuse_for_h <= 0:
            return
        mine = [w for (name, _, _), w in self.rows.items() if name == v.name]
        record = VariantRecord(
            key=v.key,
            variant=v.name,
            drafter=v.drafter,
            measured_at=time.time(),
            stage_dir=str(stage_dir),
            engine_version=reused.engine_version(cfg.engine.kind),
            host_load=self.load,
            windows=mine,
            answers_t0=self.answers_t0(v.name, t0) if t0 else None,
            copy_reference=copy_reference,
            copy_settings=copy_settings,
        )
        path = reused.save(cfg.host.work_root, record)
        log.info("%s: measurement kept for later runs at %s (reused for %g h)", v.name, path, cfg.benchmark.reuse_for_h)
