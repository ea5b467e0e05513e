"""Free disk under a directory and free memory on each visible GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

from eagleflow.engines.preflight.findings import Finding

_GIB = 1024**3


def check_disk(path: str, min_free_gib: float) -> Finding:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent  # the directory may not exist yet; its filesystem does
    free = shutil.disk_usage(p).free / _GIB
    if free < min_free_gib:
        return Finding(
            "disk",
            "error",
            f"{free:.1f} GiB free under {path}, engine.min_free_disk_gib is "
            f"{min_free_gib:g}: free space there or lower the limit",
        )
    return Finding("disk", "ok", f"{free:.1f} GiB free under {path} (need {min_free_gib:g})")


def check_gpus(min_free_fraction: float) -> list[Finding]:
    """Free memory per visible GPU (torch.cuda.mem_get_info). Meaningful only once nothing else (e.g.
    production) holds the GPUs. The CPU build has no CUDA: then the check says so and is skipped."""
    import torch

    if not torch.cuda.is_available():
        build = "CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} build, no visible GPU"
        return [
            Finding(
                "gpu", "ok", f"torch {torch.__version__} ({build}): the engine runs on CPU; GPU memory checks skipped"
            )
        ]
    out = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        frac = free / total
        name = torch.cuda.get_device_name(i)
        if frac < min_free_fraction:
            out.append(
                Finding(
                    "gpu",
                    "error",
                    f"GPU {i} ({name}): {free / _GIB:.1f} of {total / _GIB:.1f} GiB "
                    f"free ({frac:.0%}), the engine needs {min_free_fraction:.0%}: another process holds "
                    "it (nvidia-smi shows which); stop it or lower engine.gpu_memory_utilization",
                )
            )
        else:
            out.append(Finding("gpu", "ok", f"GPU {i} ({name}): {frac:.0%} free (need {min_free_fraction:.0%})"))
    return out
