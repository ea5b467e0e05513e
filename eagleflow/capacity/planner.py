"""The capacity plan: each stage's disk, GPU memory and time, from the run config and the host's facts.

Pure (standard library + pydantic, no I/O): `plan(config, facts, progress)` -> `CapacityPlan`;
`render_plan` prints it as a table, `disk_refusal` says why a run will not fit the free disk. The
facts (`HostFacts`: GPUs and free disk as `python -m eagleflow.hosts.facts` prints them, plus the
target's shape, the prompts' length and the rates earlier runs on the host measured) are gathered on
the host by `eagleflow.capacity.facts`, or stated in a JSON file (`configs/hosts/*.json`).

Tokens. Before generate they are an estimate: samples x (mean prompt tokens + mean answer tokens), each conversation
cut at `extract.max_seq_len`. The answer length is the mean that earlier generate runs of the same target measured
on this host, else `DEFAULT_ANSWER_TOKENS` (the reference run's), never more than `generate.max_tokens`;
`upper_bound_tokens`
takes every answer at `max_tokens`. After generate the count is exact (`GenerateOutputs.num_tokens`, in
`FinishedStages`).

Defaults are the reference run's (docs/reference-run.md: Kimi-K2.5, INT4, 8 x RTX PRO 6000 Blackwell, vLLM): 10,000
samples in 5.3 h,
hidden states at 3,165 tok/s and 828 GB in bf16 (56 KiB a token: 4 x 7168 x 2 B), 5 epochs in 2.6 h, a 30-minute
engine load, 82.5 tok/s per request. Each figure in a plan says whether it was "measured (run <stage>/<key>)" on the
host or is such a "default: ..." (with its source).
"""

from __future__ import annotations

import math

from eagleflow.capacity.costs import (
    PARQUET_BYTES_PER_TOKEN,
    STATE_BYTES,
    TOKEN_SIDE_BYTES,
    checkpoint_bytes,
    drafter_params,
    extract_bytes,
    state_bytes_per_token,
    train_gpu_bytes,
)
from eagleflow.capacity.defaults import HostDefaults, defaults_for
from eagleflow.capacity.rates import (
    DEFAULT_ANSWER_TOKENS,
    DEFAULT_DISK_WRITE_BPS,
    DEFAULT_PROMPT_TOKENS,
    SOURCES,
    TRAIN_GPU_FRACTION,
)
from eagleflow.config import RunConfig
from eagleflow.config.measure import WARMUP_TOKENS
from eagleflow.contracts.plan import (
    CapacityPlan,
    FinishedStages,
    HostFacts,
    MeasuredRun,
    Stage,
    StagePlan,
    TokenEstimate,
)
from eagleflow.extraction.backends import backend_of
from eagleflow.util.text import duration_text, size_text

# -- bytes of one extracted token (the shard format of eagleflow.drafter.shards, torch-free here) -------


# -- facts ------------------------------------------------------------------------------------------


# -- the plan, as recorded -------------------------------------------------------------------------


# -- arithmetic -------------------------------------------------------------------------------------


def measured_runs(history: list[MeasuredRun], stage: str, **match: object) -> list[MeasuredRun]:
    """Runs of `stage` whose fields equal `match`, newest first."""
    runs = [r for r in history if r.stage == stage and all(getattr(r, k) == v for k, v in match.items())]
    return sorted(runs, key=lambda r: r.created, reverse=True)


def estimate_tokens(cfg: RunConfig, facts: HostFacts, progress: FinishedStages) -> TokenEstimate:
    g, cut = cfg.generate, cfg.extract.max_seq_len
    if facts.prompts is not None:
        prompt, prompt_src = facts.prompts.mean_tokens, f"{facts.prompts.method} over {facts.prompts.count:,} prompts"
    else:
        prompt, prompt_src = float(DEFAULT_PROMPT_TOKENS), SOURCES["prompt"]
    measured = [r for r in measured_runs(facts.history, "generate", target=cfg.target.model_path) if r.answer_tokens]
    if measured:
        answer = sum(r.answer_tokens for r in measured) / len(measured)
        answer_src = f"measured (mean of {len(measured)} run(s): {', '.join(r.run for r in measured[:3])})"
    else:
        answer, answer_src = float(DEFAULT_ANSWER_TOKENS), SOURCES["answer"]
    room = max(cfg.engine.max_model_len - prompt, 1)  # the engine ends an answer at its context length
    if answer > min(g.max_tokens, room):
        answer, answer_src = float(min(g.max_tokens, room)), f"{answer_src}, cut at generate.max_tokens"
    upper = g.num_samples * int(min(prompt + min(g.max_tokens, room), cut))
    if progress.generate_tokens is not None:
        return TokenEstimate(
            samples=progress.generate_samples or g.num_samples,
            prompt_tokens=prompt,
            prompt_source=prompt_src,
            answer_tokens=answer,
            answer_source=answer_src,
            tokens=progress.generate_tokens,
            upper_bound_tokens=progress.generate_tokens,
            exact=True,
        )
    return TokenEstimate(
        samples=g.num_samples,
        prompt_tokens=round(prompt, 1),
        prompt_source=prompt_src,
        answer_tokens=round(answer, 1),
        answer_source=answer_src,
        tokens=int(g.num_samples * min(prompt + answer, cut)),
        upper_bound_tokens=upper,
        exact=False,
    )


def measured_rate(
    history: list[MeasuredRun], stage: str, default: float, source: str, **match: object
) -> tuple[float, str]:
    for r in measured_runs(history, stage, **match):
        if r.tok_s:
            return r.tok_s, f"measured (run {r.run})"
    return default, source


def generate_rate(hist: list[MeasuredRun], cfg: RunConfig, target: str, d: HostDefaults) -> tuple[float, str]:
    """Generate's output tok/s: measured on the host, else the closest measured host's one server's x production's
    replicas."""
    rate, src = measured_rate(hist, "generate", d.generate_tok_s, d.generate_src, target=target)
    n = max(1, len(cfg.production.replicas)) if cfg.generate.server == "production" and src == d.generate_src else 1
    return rate * n, src + (f", x {n} production replicas (one server's rate each)" if n > 1 else "")


def plan(cfg: RunConfig, facts: HostFacts, progress: FinishedStages | None = None) -> CapacityPlan:
    """Each stage's disk, GPU memory and time for `cfg` on the host `facts` describe."""
    progress = progress or FinishedStages()
    t = facts.target
    if t is None:
        raise ValueError(
            f"no facts of the target {cfg.target.model_path}: its config.json was not readable on the "
            "host; state its shape in the facts file's 'target' section"
        )
    tok = estimate_tokens(cfg, facts, progress)
    h, dtype, hist, target = t.hidden_size, cfg.extract.storage_dtype, facts.history, cfg.target.model_path
    findings: list[str] = []
    gpus = facts.gpus
    util = cfg.engine.gpu_memory_utilization or 0.9
    one_gpu = min(g.memory_total_mib for g in gpus) * 2**20 if gpus else None
    budget = int(one_gpu * util) if one_gpu else None
    weights, tp = t.weights_bytes, cfg.engine.tensor_parallel_size
    d = defaults_for(facts, cfg.engine.kind)
    start = d.engine_start_s(weights)
    start_note = f"; + {duration_text(start)} engine start, {d.engine_src}"
    stages: list[StagePlan] = []

    def add(
        stage: Stage,
        disk: int,
        seconds: float,
        rate: str,
        source: str,
        gpu: int | None = None,
        ngpu: int = 0,
        gpu_detail: str = "",
    ) -> None:
        done = stage in progress.done
        stages.append(
            StagePlan(
                stage=stage,
                status="done" if done else "to run",
                disk_bytes=0 if done else disk,
                gpu_bytes=gpu,
                gpus=ngpu,
                gpu_detail=gpu_detail,
                seconds=0.0 if done else seconds,
                rate=rate,
                source=source,
            )
        )
        limit = budget if stage != "train" else (int(one_gpu * TRAIN_GPU_FRACTION) if one_gpu else None)
        if not done and gpu is not None and limit is not None and gpu > limit:
            fix = (
                f"raise train.grad_accum_steps or train.nproc about {math.ceil(gpu / limit)}x (activations shrink "
                "with the micro-batch; a rough estimate)"
                if stage == "train"
                else "raise engine.tensor_parallel_size or use a host with bigger GPUs"
            )
            findings.append(
                f"{stage}: needs ~{size_text(gpu)} on each GPU but one holds {size_text(limit)} usable; {fix}"
            )

    add("check", 0, d.check_s, "", d.check_src)
    # generate: answers from the target's own server (the production one when generate.server says so)
    own = cfg.generate.server != "production"
    out_tok_s, src = generate_rate(hist, cfg, target, d)
    secs = tok.samples * tok.answer_tokens / out_tok_s + (start if own else 0)
    add(
        "generate",
        int(tok.tokens * PARQUET_BYTES_PER_TOKEN),
        secs,
        f"{out_tok_s:,.0f} output tok/s",
        src + (start_note if own else ""),
        *((_per_gpu(weights, tp), tp, f"weights / TP {tp}") if own and weights and gpus else ()),
    )
    # extract
    backend = backend_of(cfg)
    x_bytes = {d: extract_bytes(tok.tokens, tok.samples, h, d) for d in STATE_BYTES}
    x_tok_s, src = measured_rate(
        hist, "extract", *d.extract(backend, t.weights_bytes), target=target, backend=backend.name
    )
    if src.startswith("default"):
        disk_bound = DEFAULT_DISK_WRITE_BPS / (state_bytes_per_token(h, dtype) + TOKEN_SIDE_BYTES)
        if disk_bound < x_tok_s:
            x_tok_s, src = (
                disk_bound,
                f"default: the disk writes {size_text(DEFAULT_DISK_WRITE_BPS)}/s (an H200 host, docs/benchmarks.md)",
            )
    if backend.on_production:  # production's own engine computes them while it serves: no GPU of ours, no load
        secs = tok.tokens / x_tok_s
        src += (
            f"; prefills on production while it serves, at most {cfg.extract.concurrency} capture requests in flight "
            "(extract.concurrency)"
        )
    elif backend.loads_engine:
        x_gpu, x_n, x_detail = _per_gpu(weights, tp), tp, f"weights / TP {tp}"
        secs, src = tok.tokens / x_tok_s + start, src + start_note
    else:
        spread = (
            len(gpus) if (gpus and weights and budget and weights > budget and cfg.extract.spread != "never") else 1
        )
        x_gpu, x_n, x_detail = _per_gpu(weights, spread), spread, f"weights over {spread} GPU(s) (extract.spread)"
        secs = tok.tokens / x_tok_s
    add(
        "extract",
        x_bytes[dtype],
        secs,
        f"{x_tok_s:,.0f} tok/s ({backend.name})",
        src,
        # on production: no GPU column, the GPUs stay production's
        *((x_gpu, x_n, x_detail) if weights and gpus and not backend.on_production else ()),
    )
    # train
    train_tokens = tok.tokens * (tok.samples - cfg.generate.holdout) / tok.samples
    train_tokens = min(train_tokens, tok.samples * cfg.train.max_seq_len)
    trained = cfg.train.epochs * train_tokens
    if cfg.train.max_steps:
        trained = min(trained, cfg.train.max_steps * cfg.train.batch_tokens)
    tr_tok_s, src = measured_rate(hist, "train", *d.train(t, cfg, facts), target=target)
    tr_gpu, tr_detail = train_gpu_bytes(t, cfg)
    kept = cfg.train.epochs + (1 if cfg.train.checkpoint_every_steps else 0)
    on_gpu = cfg.train.device != "cpu" and bool(gpus)
    add(
        "train",
        kept * checkpoint_bytes(t, cfg),
        trained / tr_tok_s,
        f"{tr_tok_s:,.0f} tok/s x {trained / 1e6:,.1f} M",
        src,
        *((tr_gpu, cfg.train.nproc, tr_detail) if on_gpu else ()),
    )
    # export: the drafter in bf16
    ex = [r for r in measured_runs(hist, "export") if r.seconds]
    add(
        "export",
        2 * drafter_params(t, cfg)[0],
        ex[0].seconds if ex else d.export_s,
        "",
        f"measured (run {ex[0].run})" if ex else d.export_src,
    )
    # benchmark: each variant's engine start, then every window at the decode rate
    settings = cfg.benchmark.model_dump(mode="json")
    same = [r for r in measured_runs(hist, "benchmark", target=target) if r.seconds and r.settings == settings]
    # baseline, the new drafter, production's current one, the new drafter at each other k (benchmark.k_sweep), and
    # no speculation once more (benchmark.remeasure_baseline)
    b = cfg.benchmark
    variants = 2 + (1 if b.current_drafter else 0) + len(b.swept_ks()) + (1 if b.remeasure_baseline else 0)
    if same:
        secs, rate, src = same[0].seconds, "", f"measured (run {same[0].run}, the same benchmark settings)"
    else:
        warm_tokens = min(b.max_tokens, WARMUP_TOKENS)
        per_variant = sum(b.num_prompts * b.max_tokens / (d.decode_tok_s * c) for c in b.concurrencies) * len(
            b.temperatures
        ) + sum(n * warm_tokens / (d.decode_tok_s * c) for _, c, n in b.warmup())
        secs, rate = variants * (per_variant + start), f"{d.decode_tok_s:,.1f} tok/s a request, {variants} variants"
        src = d.decode_src + start_note
    # the triage: one engine load per probe (each alternative backend its own), a few short requests on each
    tri = b.triage
    probes = tri.probes_on(cfg.engine.kind)  # on SGLang none: its triage is the lossless check, no load
    loads = int("verify" in probes) + int("plumbing" in probes) + (tri.max_backend_runs if "backends" in probes else 0)
    # ... and never more than its own budget (benchmark.triage.max_s): no probe starts once it is spent
    tri_secs = min(loads * (start + 2 * tri.num_prompts * tri.max_tokens / d.decode_tok_s), tri.max_s)
    capped = " (its budget, benchmark.triage.max_s)" if tri_secs == tri.max_s else ""
    if tri.when == "always" and loads and not same:
        secs, rate = secs + tri_secs, rate + f", triage: up to {loads} engine loads{capped}"
    elif tri.when == "auto" and loads:
        findings.append(
            f"benchmark: should the triage run (a drafter below its offline estimate beyond its served AL's "
            f"interval), it adds up to {loads} engine loads, about {duration_text(tri_secs)}{capped} "
            f"(benchmark.triage; at most benchmark.triage.max_s {duration_text(tri.max_s)})"
        )
    bench_gpu = _per_gpu(weights + 2 * drafter_params(t, cfg)[0], tp) if weights else None
    add(
        "benchmark",
        0,
        secs,
        rate,
        src,
        *((bench_gpu, tp, f"(weights + bf16 drafter) / TP {tp}") if weights and gpus else ()),
    )

    reserve = int(cfg.engine.min_free_disk_gib * 2**30)
    needed = sum(s.disk_bytes for s in stages) + reserve
    free = facts.disk.free_bytes if facts.disk else None
    upper = extract_bytes(tok.upper_bound_tokens, tok.samples, h, dtype)
    if not tok.exact and free is not None and needed - x_bytes[dtype] + upper > free >= needed:
        findings.append(
            f"extract: if every answer ran to generate.max_tokens ({cfg.generate.max_tokens:,}) the "
            f"states would take {size_text(upper)}, more than the {size_text(free)} free"
        )
    if tp > len(gpus) and gpus:
        findings.append(f"engine.tensor_parallel_size is {tp} but the host has {len(gpus)} GPU(s)")
    if not gpus:
        findings.append("no GPUs on the host: GPU memory is not planned (CPU stages use host memory)")
    if weights is None:
        findings.append("the target's weight bytes are unknown: its engine's GPU memory is not planned")
    result = CapacityPlan(
        host=facts.hostname or cfg.host.name,
        target=target,
        hidden_size=h,
        storage_dtype=dtype,
        bytes_per_token=state_bytes_per_token(h, dtype) + TOKEN_SIDE_BYTES,
        tokens=tok,
        stages=stages,
        extract_bytes=x_bytes,
        disk_needed_bytes=needed,
        disk_reserve_bytes=reserve,
        disk_free_bytes=free,
        disk_path=facts.disk.path if facts.disk else None,
        gpu_budget_bytes=budget,
        total_seconds=sum(s.seconds for s in stages),
        findings=findings,
    )
    result.refusal = disk_refusal(result, cfg)
    return result


def _per_gpu(weights: int | None, n: int) -> int | None:
    return None if weights is None else math.ceil(weights / max(n, 1))


def disk_refusal(p: CapacityPlan, cfg: RunConfig) -> str | None:
    """Why this run will not fit the free disk, naming both numbers and what to do; None when it fits."""
    if p.disk_free_bytes is None or p.disk_needed_bytes <= p.disk_free_bytes:
        return None
    x = next(s for s in p.stages if s.stage == "extract")
    others = p.disk_needed_bytes - x.disk_bytes - p.disk_reserve_bytes
    what = "exact, from the generate stage" if p.tokens.exact else "estimated"
    fixes = []
    if p.storage_dtype != "float8_e4m3fn":
        fp8 = p.disk_needed_bytes - x.disk_bytes + p.extract_bytes["float8_e4m3fn"]
        fixes.append(f"set extract.storage_dtype: float8_e4m3fn (the run then needs {size_text(fp8)})")
    fixes.append(
        f"put host.work_root on a bigger disk (or free {size_text(p.disk_needed_bytes - p.disk_free_bytes)} "
        f"at {p.disk_path})"
    )
    spare = p.disk_free_bytes - p.disk_reserve_bytes - others
    fit = int(p.tokens.samples * spare / x.disk_bytes) if x.disk_bytes and spare > 0 else 0
    fixes.append(f"lower generate.num_samples (about {fit:,} of {p.tokens.samples:,} fit)")
    return (
        f"the extraction will not fit the free disk: this run needs {size_text(p.disk_needed_bytes)} "
        f"({p.disk_needed_bytes:,} bytes) under {cfg.host.work_root} but {size_text(p.disk_free_bytes)} "
        f"({p.disk_free_bytes:,} bytes) is free at {p.disk_path}. The states of {p.tokens.tokens:,} tokens "
        f"({what}) x {p.bytes_per_token:,} B in {p.storage_dtype} are {size_text(x.disk_bytes)}; the other stages "
        f"{size_text(others)}; {size_text(p.disk_reserve_bytes)} stays free (engine.min_free_disk_gib). To fix: "
        + "; or ".join(fixes)
        + "."
    )


def states_refusal(
    tokens: int, sequences: int, hidden_size: int, storage_dtype: str, written: int, free: int, path: str, reserve: int
) -> str | None:
    """The extract stage's own check before it writes: the exact tokens (cut at extract.max_seq_len)
    against the free disk, less what finished shards already hold. None when they fit."""
    needed = extract_bytes(tokens, sequences, hidden_size, storage_dtype) - written + reserve
    if needed <= free:
        return None
    fixes = ["put host.work_root on a bigger disk", "lower generate.num_samples"]
    if storage_dtype != "float8_e4m3fn":
        fp8 = extract_bytes(tokens, sequences, hidden_size, "float8_e4m3fn") - written + reserve
        fixes.insert(0, f"set extract.storage_dtype: float8_e4m3fn (needs {size_text(fp8)})")
    return (
        f"the extraction will not fit the free disk: {tokens:,} tokens (exact, from the generate stage) x "
        f"{state_bytes_per_token(hidden_size, storage_dtype) + TOKEN_SIDE_BYTES:,} B in {storage_dtype} need "
        f"{size_text(needed)} ({needed:,} bytes, with {size_text(written)} already written and {size_text(reserve)} "
        f"kept free) but "
        f"{size_text(free)} ({free:,} bytes) is free at {path}. To fix: " + "; or ".join(fixes) + "."
    )
