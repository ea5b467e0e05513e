"""The attention backend: the same drafter under each other backend the engine offers, k = 1.

The reference run's fault lived here: on its GPUs vLLM's FLASHINFER_MLA verified draft tokens without a causal
mask inside the verify block (0 % acceptance) where TRITON_MLA gave 50-70 %. One draft token per step
isolates the first position, whose acceptance the measured run already gives for the backends it used.
The target's backend is `--attention-backend`, the draft's `speculative_config.attention_backend`; each
alternative is tried with the other side left as the measured run had it.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import BackendProbe, BackendRun
from eagleflow.contracts.prompts import Messages
from eagleflow.contracts.request import StageError
from eagleflow.engines import make_server
from eagleflow.engines.chat import ChatClient
from eagleflow.engines.launch import served_name, speculative, target_launch
from eagleflow.engines.preflight.mla import selected_backend  # argv parsing only: no vLLM import here

log = logging.getLogger("eagleflow.triage")

DEFAULT = "default"


def offered_backends(cfg: RunConfig, drafter_dir: str) -> dict[str, dict]:
    """{'target': {'default': NAME, 'offered': [...]}, 'draft': {...}} from the installed engine."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "backends.json"
        argv = [
            sys.executable,
            "-m",
            "eagleflow.engines.preflight.backends",
            "--target",
            cfg.target.model_path,
            "--drafter",
            drafter_dir,
            "--dtype",
            cfg.target.dtype,
            "--json",
            str(out),
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not out.exists():
            raise StageError(
                f"triage: listing the engine's attention backends failed (exit {proc.returncode}):\n"
                f"{(proc.stderr or proc.stdout)[-2000:]}"
            )
        return json.loads(out.read_text())


def target_backend_args(extra_args: list[str], backend: str) -> list[str]:
    """engine.extra_args with `--attention-backend` set to `backend` (any earlier setting dropped)."""
    out, skip = [], False
    for arg in extra_args:
        if skip:
            skip = False
            continue
        if arg == "--attention-backend":
            skip = True
            continue
        if arg.startswith("--attention-backend="):
            continue
        out.append(arg)
    return out + ["--attention-backend", backend]


def first_position(
    cfg: RunConfig,
    drafter_dir: str,
    target_backend: str,
    draft_backend: str,
    prompts: list[Messages],
    stage_dir: Path,
    env: dict[str, str] | None,
) -> BackendRun:
    """One engine: the drafter at k = 1 with these backends; first-position acceptance on the prompts."""
    t = cfg.benchmark.triage
    run_cfg = cfg
    if target_backend != DEFAULT:
        run_cfg = cfg.model_copy(
            update={
                "engine": cfg.engine.model_copy(
                    update={"extra_args": target_backend_args(list(cfg.engine.extra_args), target_backend)}
                )
            }
        )
    spec = speculative(drafter_dir, 1, None if draft_backend == DEFAULT else draft_backend)
    name = f"triage-backend-{target_backend}-{draft_backend}".lower()
    run = BackendRun(target_backend=target_backend, draft_backend=draft_backend, first_position_acceptance=None)
    try:
        with make_server(target_launch(run_cfg, spec), stage_dir / f"engine-{name}.log", env=env, name=name) as server:
            with ChatClient(
                server.base_url, served_name(cfg), max_concurrency=1, timeout_s=cfg.engine.request_timeout_s
            ) as client:
                before = server.snapshot()
                results, _ = client.chat(
                    prompts[: t.num_prompts],
                    max_tokens=t.max_tokens,
                    temperature=0.0,
                    concurrency=1,
                    extra={"ignore_eos": True},
                )
                after = server.snapshot()
            errors = [r.error for r in results if r.error]
            if errors:
                raise StageError(f"{len(errors)} of {len(results)} requests failed; first: {errors[0]}")
            run.first_position_acceptance = server.acceptance(before, after, 1)["per_position_acceptance"][0]
    except StageError as exc:
        run.error = str(exc).splitlines()[0][:500]
    log.info(
        "triage backend probe: target %s, draft %s: %s",
        target_backend,
        draft_backend,
        f"first-position acceptance {run.first_position_acceptance:.1%}" if run.error is None else run.error,
    )
    return run


def backend_probe(
    cfg: RunConfig,
    drafter_dir: str,
    measured: float | None,
    offline: float | None,
    prompts: list[Messages],
    stage_dir: Path,
    env: dict[str, str] | None,
    deadline: float | None = None,
) -> BackendProbe:
    """`measured`: the run's first-position acceptance with its own backends; `offline`: the drafter's offline
    first-position acceptance, if known; `deadline` (time.monotonic()): no backend run starts after it (the
    triage's budget, benchmark.triage.max_s)."""
    t = cfg.benchmark.triage
    found = offered_backends(cfg, drafter_dir)
    offered = {role: found[role]["offered"] for role in ("target", "draft")}
    chosen = {
        "target": found["target"]["default"],
        "draft": cfg.benchmark.draft_attention_backend or found["draft"]["default"],
    }
    chosen["target"] = selected_backend(list(cfg.engine.extra_args)) or chosen["target"]
    default = BackendRun(
        target_backend=f"{chosen['target']}", draft_backend=f"{chosen['draft']}", first_position_acceptance=measured
    )
    combos = [(b, DEFAULT) for b in offered["target"] if b != chosen["target"]]
    combos += [(DEFAULT, b) for b in offered["draft"] if b != chosen["draft"]]
    runs = []
    for tb, db in combos[: t.max_backend_runs]:
        if deadline is not None and time.monotonic() >= deadline:
            break  # the triage's budget is spent: the runs left are named below as not tried
        runs.append(first_position(cfg, drafter_dir, tb, db, prompts, stage_dir, env))
    floor = cfg.benchmark.suspect_ratio * offline if offline is not None else None

    def restores(r: BackendRun) -> bool:
        a = r.first_position_acceptance
        return (
            a is not None and measured is not None and a >= measured + t.restore_gain and (floor is None or a >= floor)
        )

    best = max((r for r in runs if restores(r)), key=lambda r: r.first_position_acceptance or 0.0, default=None)
    if not combos:
        reason = (
            f"the engine offers no other attention backend for this target ({', '.join(offered['target'])}) "
            f"or this drafter ({', '.join(offered['draft'])})"
        )
    else:
        tried = "; ".join(
            f"target {r.target_backend} / draft {r.draft_backend}: "
            + (f"{r.first_position_acceptance:.0%}" if r.error is None else f"did not serve ({r.error[:120]})")
            for r in runs
        )
        left = len(combos) - len(runs)
        reason = (
            f"first-position acceptance with {chosen['target']} / {chosen['draft']}: "
            + (f"{measured:.0%}" if measured is not None else "unknown")
            + f"; {tried}"
            + (
                f"; {left} more not tried (benchmark.triage.max_backend_runs"
                + (", or its budget benchmark.triage.max_s spent" if len(runs) < t.max_backend_runs else "")
                + ")"
                if left > 0
                else ""
            )
        )
    log.info("triage backend probe: %s", reason)
    return BackendProbe(default=default, offered=offered, runs=runs, restores=best, reason=reason)
