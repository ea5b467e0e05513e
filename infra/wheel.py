"""The project's wheel, built here for a host: from a snapshot of this checkout, offline, and named by the
sha256 of its contents, so bootstrap sends and installs it only when its code changed."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from eagleflow.hosts.base import LogFn
from infra import BootstrapError, tail

ROOT = Path(__file__).resolve().parents[1]  # the checkout whose wheel is installed on the host

# What the wheel is built from: a copy of these (those that exist), so a build never leaves `build/`
# in the checkout, nor packs stale modules that a previous build left there.
WHEEL_SOURCES = ("pyproject.toml", "README.md", "setup.cfg", "setup.py", "MANIFEST.in", "LICENSE", "eagleflow")


MIN_SETUPTOOLS = (70, 1)  # bdist_wheel is built in from 70.1; older ones need the `wheel` package


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _isolation_reason() -> str | None:
    """Why this environment cannot build the wheel itself (pip then builds in isolation), or None."""
    try:
        version = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        return f"setuptools is not installed in the control environment ({sys.prefix})"
    if _version_tuple(version) < MIN_SETUPTOOLS:
        return f"the control environment's setuptools {version} has no bdist_wheel (needs >= 70.1)"
    return None


def wheel_digest(path: Path) -> str:
    """sha256 over the wheel's file names and contents, in name order: the zip's timestamps, which
    differ at every build, do not count, so the same code gives the same digest."""
    h = hashlib.sha256()
    with zipfile.ZipFile(path) as zf:
        for name in sorted(zf.namelist()):
            h.update(name.encode() + b"\0")
            h.update(hashlib.sha256(zf.read(name)).digest())
    return h.hexdigest()


def build_wheel(out_dir: Path, log: LogFn = print) -> Path:
    """Build the eagleflow wheel of this checkout into out_dir; return its path."""
    reason = _isolation_reason()
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(out_dir)]
    if reason is None:
        argv.append("--no-build-isolation")  # offline, and about a second faster
    else:
        log(f"{reason}: building the wheel in pip's build isolation, which fetches setuptools from the package index")
    with tempfile.TemporaryDirectory(prefix="eagleflow-wheel-src-") as tmp:
        src = Path(tmp)
        for name in WHEEL_SOURCES:
            path = ROOT / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif path.is_file():
                shutil.copy2(path, src / name)
        proc = subprocess.run([*argv, str(src)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        fix = (
            f"install setuptools into the control environment ({sys.executable} -m pip install "
            f"'setuptools>={'.'.join(map(str, MIN_SETUPTOOLS))}') to build without the package index"
            if reason
            else "fix the packaging error above"
        )
        raise BootstrapError(
            f"building the eagleflow wheel from {ROOT} failed (exit {proc.returncode}):\n"
            f"{tail(proc.stdout + proc.stderr)}\n{fix}"
        )
    wheels = sorted(out_dir.glob("eagleflow-*.whl"))
    if len(wheels) != 1:
        raise BootstrapError(f"pip wheel left {len(wheels)} eagleflow wheels in {out_dir}, expected one: {wheels}")
    return wheels[0]
