"""The attention backends the installed engine offers for a target and a drafter (the triage's backend probe).

    python -m eagleflow.engines.preflight.backends --target DIR --drafter DIR [--dtype bfloat16] --json OUT

For each of vLLM's attention backends, the platform's own selector is asked whether it would serve this
shape with it (as `--attention-backend NAME` / `speculative_config.attention_backend NAME` would ask at
start-up); those it takes are offered, the one it picks unasked first. Seconds, no weights: a subprocess of
the host environment, so the stage that asks never imports vLLM (nor touches a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from eagleflow.engines.preflight.configs import read_config, text_config
from eagleflow.engines.preflight.mla import _pick


def other_platform(name: str) -> bool:
    """A backend of another platform's build: vLLM 0.26's CUDA selector took ROCM_AITER_MLA and CPU_ATTN by name
    on the H200 (the engine then failed: "No module named 'aiter'"); a probe run of them says nothing."""
    from vllm.platforms import current_platform

    if "ROCM" in name and not current_platform.is_rocm():
        return True
    if name.startswith(("CPU_", "AMX_", "ZENTORCH")) and not current_platform.is_cpu():
        return True
    return "XPU" in name and not current_platform.is_xpu()


def offered(cfg: dict[str, Any], dtype: str) -> tuple[str | None, list[str]]:
    """(the platform's own pick, every backend it takes for this attention shape)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    default, _ = _pick(cfg, None, dtype)
    names = []
    for enum in AttentionBackendEnum:
        if other_platform(enum.name) or "DIFFKV" in enum.name:  # DIFFKV: for keys and values of other widths
            continue
        cls, _ = _pick(cfg, enum.name, dtype)
        if cls is not None and cls.get_name() == enum.name:
            names.append(enum.name)
    first = default.get_name() if default is not None else None
    return first, ([first] if first in names else []) + [n for n in names if n != first]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagleflow.engines.preflight.backends", description=__doc__)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json", dest="json_out", required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    out: dict[str, Any] = {}
    for role, path in (("target", args.target), ("draft", args.drafter)):
        cfg, finding = read_config(path)
        if cfg is None:
            raise SystemExit(finding.message if finding else f"no config.json in {path}")
        default, names = offered(text_config(cfg), args.dtype)
        out[role] = {"default": default, "offered": names}
    Path(args.json_out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
