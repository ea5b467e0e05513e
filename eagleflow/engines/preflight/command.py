"""The preflight's command line for a run, as the benchmark stage runs it in the host's Python."""

from __future__ import annotations

import sys
from pathlib import Path

from eagleflow.config import RunConfig
from eagleflow.engines.preflight.cache import cache_dir


def preflight_argv(cfg: RunConfig, drafters: dict[str, str], out: Path, skip_gpu: bool) -> list[str]:
    """`python -m eagleflow.engines.preflight` for `cfg`'s engine and target and these drafters (variant name ->
    directory), its findings written to `out`. `skip_gpu`: production still holds the GPUs."""
    argv = [
        sys.executable,
        "-m",
        "eagleflow.engines.preflight",
        "--engine-json",
        cfg.engine.model_dump_json(),
        "--target",
        cfg.target.model_path,
        "--disk-path",
        cfg.host.work_root,
        "--json",
        str(out),
    ]
    if skip_gpu:
        argv.append("--skip-gpu")
    for name, drafter in drafters.items():
        argv += ["--drafter", f"{name}={drafter}"]
    # The ids the new drafter was trained on are the run's; a public current drafter's are unknown.
    argv += ["--expected-aux", "drafter=" + ",".join(str(i) for i in cfg.target.aux_layer_ids)]
    if cfg.benchmark.draft_attention_backend:
        argv += ["--draft-attention-backend", cfg.benchmark.draft_attention_backend]
    argv += ["--temperatures", ",".join(f"{t:g}" for t in cfg.benchmark.temperatures)]
    if cfg.engine.preflight_cache:
        argv += ["--cache-dir", str(cache_dir(cfg.host.work_root))]
    return argv
