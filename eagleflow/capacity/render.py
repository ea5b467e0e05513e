"""The plans as a person reads them: the full run's table and the nightly's beside it (pure)."""

from __future__ import annotations

from eagleflow.contracts.plan import CapacityPlan, NightlyPlan
from eagleflow.util.text import duration_text, size_text


def render_plan(p: CapacityPlan) -> str:
    """The plan as a terminal table (the check stage's log, `python -m cli.plan`, the report)."""
    t = p.tokens
    kind = "exact (the generate stage's manifest)" if t.exact else "estimated"
    lines = [
        f"capacity plan: {p.target} on {p.host}",
        f"tokens: {t.tokens:,} {kind} = {t.samples:,} samples x ({t.prompt_tokens:,.0f} prompt [{t.prompt_source}] "
        f"+ {t.answer_tokens:,.0f} answer [{t.answer_source}])"
        + ("" if t.exact else f"; at most {t.upper_bound_tokens:,} (every answer at generate.max_tokens)"),
        f"states: {p.bytes_per_token:,} B a token (4 x {p.hidden_size} in {p.storage_dtype}); bf16 "
        f"{size_text(p.extract_bytes['bfloat16'])}, fp8 {size_text(p.extract_bytes['float8_e4m3fn'])}",
        "",
        f"{'stage':10}{'status':>8}{'disk':>11}{'GPU each':>11}{'GPUs':>5}{'time':>9}  rate / source",
    ]
    for s in p.stages:
        gpu = size_text(s.gpu_bytes) if s.gpu_bytes is not None else "-"
        lines.append(
            f"{s.stage:10}{s.status:>8}{size_text(s.disk_bytes):>11}{gpu:>11}{s.gpus or '-':>5}"
            f"{duration_text(s.seconds):>9}  " + "; ".join(x for x in (s.rate, s.source) if x)
        )
    free = size_text(p.disk_free_bytes) if p.disk_free_bytes is not None else "unknown"
    lines += [
        "",
        f"disk: needs {size_text(p.disk_needed_bytes)} (with {size_text(p.disk_reserve_bytes)} kept free), "
        f"free {free} at {p.disk_path or '?'}" + (" - DOES NOT FIT" if p.refusal else ""),
        f"GPU: {size_text(p.gpu_budget_bytes)} usable a GPU" if p.gpu_budget_bytes else "GPU: none on the host",
        f"time: {duration_text(p.total_seconds)} for the stages to run, one after the other",
    ]
    lines += [f"  ! {f}" for f in p.findings]
    if p.refusal:
        lines.append(f"refused: {p.refusal}")
    return "\n".join(lines)


def render_nightly(p: NightlyPlan, full: CapacityPlan) -> str:
    """The nightly next to the full run, as a table (`eagleflow plan`)."""
    by_stage = {s.stage: s for s in full.stages}
    lines = [
        "",
        f"nightly (each night after the first): {p.new_samples:,} new samples, {p.new_tokens:,} tokens",
        f"{'stage':10}{'full run':>10}{'a night':>10}  how a night does it",
    ]
    for s in p.stages:
        f = by_stage.get(s.stage)
        lines.append(
            f"{s.stage:10}{duration_text(f.seconds) if f else '-':>10}{duration_text(s.seconds):>10}  "
            + "; ".join(x for x in (s.rate, s.source) if x)
        )
    lines += [
        f"{'total':10}{duration_text(full.total_seconds):>10}{duration_text(p.total_seconds):>10}",
        f"production down a night: {duration_text(p.down_seconds)} ({', '.join(p.down_stages) or 'never'})",
        f"engine loads a night: {len(p.loads)}" + (": " + "; ".join(p.loads) if p.loads else ""),
        f"production leaves the GPUs: {p.pause}",
        *([f"capture on production: {p.capture}"] if p.capture else []),
        f"pool: the first night {size_text(p.first_night_bytes)} of states, each night "
        f"+{size_text(p.night_bytes)}"
        + (
            f"; budget {size_text(p.budget_bytes)} (nightly.pool_budget_gib), full after {p.nights_to_budget} "
            "more nights, then the oldest nights are evicted"
            if p.budget_bytes is not None
            else "; no budget (nightly.pool_budget_gib): it grows every night"
        ),
        f"baseline: {p.baseline}",
        f"benchmark windows: ~{p.window_requests} requests each (paired per-round spread {p.round_cv:.2f}, "
        f"{p.round_cv_source})",
    ]
    return "\n".join(lines)
