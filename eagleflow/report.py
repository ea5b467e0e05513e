"""The run report: report.json, a terminal table and a markdown table, from the stage manifests."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagleflow.manifest import Manifest, write_json_atomic


@dataclass
class StageTiming:
    seconds: float
    cached: bool


def build_report(run_name: str, manifests: dict[str, Manifest], timings: dict[str, StageTiming]) -> dict[str, Any]:
    bench = manifests["benchmark"].metrics
    train = manifests["train"].metrics if "train" in manifests else {}
    keep = ("output_tok_s", "acceptance_rate", "mean_acceptance_length", "per_position_acceptance",
            "num_drafts", "num_accepted_tokens", "output_tokens", "seconds")
    return {
        "run": run_name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "baseline": {k: v for k, v in bench["baseline"].items() if k in keep},
        "drafter": {k: v for k, v in bench["drafter"].items() if k in keep},
        "current": {k: v for k, v in bench["current"].items() if k in keep} if "current" in bench else None,
        "speedup": bench["speedup"],
        "verdict": bench.get("verdict"),
        "windows": bench.get("windows", []),
        "production": bench.get("production"),
        "drafter_dir": manifests["benchmark"].outputs.get("drafter_dir"),
        "drafters": bench.get("drafters", {}),
        "benchmark_settings": bench.get("settings", {}),
        "offline": {k: train[k] for k in ("best_epoch", "best") if k in train},
        "stages": {
            s: {"seconds": round(t.seconds, 2), "cached": t.cached, "key": manifests[s].key,
                "compute_seconds": manifests[s].seconds, "manifest": f"{manifests[s].dir}/manifest.json"}
            for s, t in timings.items()
        },
    }


def write_report(report: dict[str, Any], report_dir: str | Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = Path(report_dir) / f"{report['run']}-{stamp}" / "report.json"
    write_json_atomic(path, report)
    return path


def _rows(report: dict[str, Any]) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str, str]]]:
    b, d = report["baseline"], report["drafter"]
    per_pos = " / ".join(f"{x:.2f}" for x in d.get("per_position_acceptance", []))
    serving = [
        ("output tok/s", f"{b['output_tok_s']:.1f}", f"{d['output_tok_s']:.1f}"),
        ("speedup", "1.00x", f"{report['speedup']:.2f}x"),
        ("acceptance rate", "-", f"{d.get('acceptance_rate', 0):.3f}"),
        ("mean acceptance length", "-", f"{d.get('mean_acceptance_length', 0):.2f}"),
        ("per-position acceptance", "-", per_pos),
    ]
    stages = [(s, f"{t['seconds']:.1f}", "yes" if t["cached"] else "no", f"{t['compute_seconds']:.1f}")
              for s, t in report["stages"].items()]
    return serving, stages


def _window_lines(report: dict[str, Any]) -> list[str]:
    """Every measured window: variant x temperature x concurrency."""
    windows = report.get("windows") or []
    if not windows:
        return []
    base = {(w["temperature"], w["concurrency"]): w["output_tok_s"] for w in windows if w["variant"] == "baseline"}
    lines = [f"{'variant':10}{'temp':>6}{'conc':>6}{'tok/s':>9}{'vs none':>9}{'AL':>7}{'TTFT ms':>9}{'TPOT ms':>9}"]
    for w in windows:
        b = base.get((w["temperature"], w["concurrency"]))
        al = w.get("mean_acceptance_length")
        lines.append(
            f"{w['variant']:10}{w['temperature']:>6g}{w['concurrency']:>6}{w['output_tok_s']:>9.1f}"
            f"{(w['output_tok_s'] / b if b else 0):>8.2f}x{(f'{al:.2f}' if al else '-'):>7}"
            f"{(w.get('ttft_ms') or 0):>9.0f}{(w.get('tpot_ms') or 0):>9.1f}"
        )
    return lines


def _verdict_lines(report: dict[str, Any]) -> list[str]:
    v = report.get("verdict")
    if not v:
        return []
    return [f"verdict: {v['summary']}"] + [f"  - {f}" for f in v.get("findings", [])]


def render_text(report: dict[str, Any]) -> str:
    serving, stages = _rows(report)
    lines = [f"eagleflow run {report['run']}", "", f"{'':26}{'baseline':>12}{'drafter':>22}"]
    lines += [f"{name:26}{base:>12}{dr:>22}" for name, base, dr in serving]
    if report.get("windows"):
        lines += [""] + _window_lines(report)
    if report.get("verdict"):
        lines += [""] + _verdict_lines(report)
    lines += ["", f"{'stage':12}{'seconds':>10}{'cached':>8}{'compute s':>12}"]
    lines += [f"{s:12}{sec:>10}{c:>8}{comp:>12}" for s, sec, c, comp in stages]
    return "\n".join(lines)


def render_markdown(report: dict[str, Any]) -> str:
    serving, stages = _rows(report)
    md = [f"# eagleflow run `{report['run']}`", "", "| metric | baseline | drafter |", "|---|---:|---:|"]
    md += [f"| {n} | {b} | {d} |" for n, b, d in serving]
    if report.get("verdict"):
        md += ["", f"**Verdict:** {report['verdict']['summary']}", ""]
        md += [f"- {f}" for f in report["verdict"].get("findings", [])]
    if report.get("windows"):
        md += ["", "```", *_window_lines(report), "```"]
    md += ["", "| stage | seconds | cached | compute seconds |", "|---|---:|:-:|---:|"]
    md += [f"| {s} | {sec} | {c} | {comp} |" for s, sec, c, comp in stages]
    return "\n".join(md)
