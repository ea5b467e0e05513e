"""A CPU engine's start with the KV cache it is given: 1 GiB (VLLM_CPU_KVCACHE_SPACE=1, the demo's setting before
engine.kv_cache_gib) against the demo's 0.25 GiB (`engine.kv_cache_gib`), side by side.

    .hostenv/bin/python benchmarks/engine_start_cpu.py --rounds 3          (the figures in docs/benchmarks.md)

The demo target's engine as the benchmark stage launches it (`eagleflow.engines.launch.target_launch` from
configs/demo.yaml, `make_server`), no drafter, started alternately with each KV cache size, `--rounds` times each.
Per start: seconds to healthy, vLLM's own "init engine (profile, create kv cache, warmup model) took" figure, and
the CPU seconds of the engine's processes (read from /proc just before the stop). Prints each start and the
medians. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagleflow.config import load_config  # noqa: E402
from eagleflow.engines import make_server  # noqa: E402
from eagleflow.engines.launch import target_launch  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds_of_group(pgid: int) -> float:
    """User + system seconds of every live process in process group `pgid` (the engine and its EngineCore)."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = (Path("/proc") / pid / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) / HZ
    return total


def start_once(name: str, overrides: dict, work: Path, port: int) -> dict:
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"engine.port": port, **overrides})
    log = work / f"{name}-{time.monotonic_ns()}.log"
    server = make_server(target_launch(cfg), log, name=name)
    t0 = time.monotonic()
    server.start()
    try:
        server.wait_healthy()
        wall = time.monotonic() - t0
        assert server.proc is not None
        cpu = cpu_seconds_of_group(os.getpgid(server.proc.pid))
    finally:
        server.stop()
    init = re.search(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s", log.read_text())
    return {"healthy_s": round(wall, 1), "init_s": float(init.group(1)) if init else None, "cpu_s": round(cpu, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=18931)
    args = ap.parse_args()
    sizes = {
        "1 GiB (VLLM_CPU_KVCACHE_SPACE=1)": {
            "engine.kv_cache_gib": None,
            "engine.env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        },
        "0.25 GiB (engine.kv_cache_gib)": {"engine.kv_cache_gib": 0.25},
    }
    rows: dict[str, list[dict]] = {k: [] for k in sizes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, overrides in sizes.items():
                got = start_once(name.split()[0], overrides, Path(tmp), args.port)
                rows[name].append(got)
                print(f"round {r}: {name}: {got}", flush=True)
    for name, got in rows.items():
        med = {k: statistics.median(x[k] for x in got if x[k] is not None) for k in ("healthy_s", "init_s", "cpu_s")}
        print(f"median {name}: {med}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
