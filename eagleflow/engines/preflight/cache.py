"""The preflight's findings kept by what they were computed from, so a benchmark need not import the engine again.

Every check but disk and GPU memory reads only the engine install, the engine settings, the target's small files
and the drafters' layout (config and tensor shapes, never their values), and each asks the engine by importing
it: about 9 CPU-seconds on a CPU host, half a minute on a GPU host, every benchmark. A nightly measures a new
drafter of the same shape on the same engine every night; so do the benchmark-only reruns. The findings are kept
under a key of all those inputs and reused while the key holds:

- the engine install: the Python (its environment's real path), the versions of vllm, torch, transformers and
  safetensors, when vllm was installed (its metadata directory's time: a reinstall of the same version is a new
  key), the vLLM general plugins installed, every VLLM_* variable of this process, and eagleflow's own preflight
  and plugin sources;
- the engine's launch settings (its address and port, timeouts, log patterns and the disk and GPU thresholds
  aside: no engine check reads them, and the disk and GPU are checked every time);
- the target's small files (config, tokenizer, code) by content, its weight files by name and size;
- each drafter's config (eagleflow's own record in it aside: the engine never reads it) and tensor names,
  shapes and types from the safetensors headers;
- the expected aux layer ids, the draft attention backend, and whether any temperature measured samples (all the
  sampled verify check's verdict depends on: an error is never kept, and its warning names no temperature).

Only findings without an error are kept: an error's fix may lie outside the key (a package installed, a file
made readable), and it must be checked again after it. Paths in the findings' messages are stored as placeholders
and restored to the paths of the run that reads them. An edit inside an installed package that changes no
version is not seen: `engine.preflight_cache: false` checks every time.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from eagleflow.config import EngineConfig
from eagleflow.engines.preflight.findings import Finding
from eagleflow.util.files import write_json_atomic

CACHE_ENV = "EAGLEFLOW_PREFLIGHT_CACHE"  # a directory shared by several work roots of one host (a fleet, a suite)
KEY_VERSION = 2
DISTRIBUTIONS = ("vllm", "torch", "transformers", "safetensors")
SMALL_SUFFIXES = (".json", ".py", ".txt", ".model", ".tiktoken", ".jinja")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
# EngineConfig fields no engine check reads: where and how long to wait for the engine, and the host-state checks'
# thresholds (disk and GPU memory, checked every run). A nightly that changes one imports no engine to check again.
NOT_CHECKED = frozenset(
    {
        "host",
        "port",
        "startup_timeout_s",
        "stall_timeout_s",
        "fatal_patterns",
        "request_timeout_s",
        "preflight",
        "preflight_cache",
        "min_free_disk_gib",
        "min_free_gpu_fraction",
    }
)
_HERE = Path(__file__).resolve().parent


def cache_dir(work_root: str) -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path(work_root) / "cache" / "preflight")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _install() -> dict[str, Any]:
    dists: dict[str, Any] = {}
    for name in DISTRIBUTIONS:
        try:
            d = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            dists[name] = None
            continue
        where = getattr(d, "_path", None)  # the .dist-info directory: a reinstall touches it
        dists[name] = [d.version, os.stat(where).st_mtime_ns if where else None]
    plugins = sorted(
        f"{ep.name}={ep.value}@{ep.dist.version if ep.dist else '?'}"
        for ep in metadata.entry_points(group="vllm.general_plugins")
    )
    sources = sorted(_HERE.glob("*.py")) + [_HERE.parent / "vllm_plugin.py"]
    return {
        # the environment by where it really lies: a checkout that links the same venv is the same install
        "python": [os.path.realpath(sys.prefix), sys.version],
        "distributions": dists,
        "plugins": plugins,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")},
        "eagleflow": _sha(b"".join(p.read_bytes() for p in sources if p.exists())),
    }


def _target(path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    root = Path(path)
    if not root.is_dir():
        return {"missing": path}
    for f in sorted(root.iterdir()):
        if not f.is_file():
            continue
        if f.suffix in WEIGHT_SUFFIXES:
            out[f.name] = f.stat().st_size
        elif f.suffix in SMALL_SUFFIXES:
            out[f.name] = _sha(f.read_bytes())
    return out


def safetensors_header(path: Path) -> dict[str, Any]:
    """The tensors' names, dtypes and shapes from a safetensors file's header (8 bytes of length, then JSON)."""
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return {k: [v["dtype"], v["shape"]] for k, v in header.items() if k != "__metadata__"}


def _drafter(path: str) -> dict[str, Any]:
    root = Path(path)
    try:
        cfg = json.loads((root / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return {"unreadable": f"{type(exc).__name__}: {exc}"}
    cfg.pop("eagleflow", None)  # its training record: provenance and validation, which no engine reads
    return {"config": cfg, "tensors": {f.name: safetensors_header(f) for f in sorted(root.glob("*.safetensors"))}}


def preflight_key(
    engine: EngineConfig,
    target_path: str,
    drafters: dict[str, str],
    expected_aux_layer_ids: dict[str, list[int]],
    draft_attention_backend: str | None,
    temperatures: list[float],
) -> str:
    """The key of everything the engine checks read (the module's docstring lists it)."""
    inputs = {
        "version": KEY_VERSION,
        "install": _install(),
        "engine": engine.model_dump(mode="json", exclude=set(NOT_CHECKED)),
        "target": _target(target_path),
        "drafters": {name: _drafter(d) for name, d in sorted(drafters.items())},
        "expected_aux": {k: list(v) for k, v in sorted(expected_aux_layer_ids.items())},
        "draft_attention_backend": draft_attention_backend,
        "sampled": any(t > 0 for t in temperatures),
    }
    return _sha(json.dumps(inputs, sort_keys=True, default=str).encode())[:32]


def _placeholders(target_path: str, drafters: dict[str, str]) -> list[tuple[str, str]]:
    """(path, placeholder), longest path first, so a path inside another is replaced whole."""
    pairs = [(target_path, "\u27e8target\u27e9")] + [(d, f"\u27e8drafter:{n}\u27e9") for n, d in drafters.items()]
    return sorted(pairs, key=lambda p: -len(p[0]))


def load(directory: Path, key: str, target_path: str, drafters: dict[str, str]) -> tuple[list[Finding], str] | None:
    """The kept findings with this run's paths, and when they were computed; None when none are kept."""
    path = directory / f"{key}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    findings = []
    for f in data["findings"]:
        message = f["message"]
        for real, token in _placeholders(target_path, drafters):
            message = message.replace(token, real)
        findings.append(Finding(f["check"], f["level"], message))
    return findings, str(data.get("computed", "?"))


def store(
    directory: Path, key: str, findings: list[Finding], target_path: str, drafters: dict[str, str], computed: str
) -> bool:
    """Keep findings without an error (written whole or not at all); whether they were kept."""
    if any(f.level == "error" for f in findings):
        return False
    rows = []
    for f in findings:
        row = asdict(f)
        for real, token in _placeholders(target_path, drafters):
            row["message"] = row["message"].replace(real, token)
        rows.append(row)
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(directory / f"{key}.json", {"computed": computed, "findings": rows})
    return True
