"""What bootstrap did and what the host has, as a person reads it: the terminal's text and the Prefect
artifact's markdown, from one list of rows."""

from __future__ import annotations

from typing import Any


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """(fact, value) rows for a terminal or a Markdown table."""
    torch = result["torch"]
    if torch is None:
        torch_text = "not installed"
    elif torch["cuda_available"]:
        torch_text = f"{torch['version']}, CUDA {torch['cuda']} available ({torch['cuda_devices']} devices)"
    else:
        torch_text = f"{torch['version']}, CUDA {'unavailable' if torch['cuda'] else 'not built in'}"
    if result["editable"]:
        wheel = f"editable install from {result['editable']}: kept"
    else:
        wheel = f"{result['wheel']['file']} sha256 {result['wheel']['sha256'][:12]}, " + (
            "installed now" if result["installed_wheel"] else "already installed"
        )
    disk = result["disk"]
    rows = [
        ("host", f"{result['address']}, hostname {result['hostname']}"),
        ("venv", result["venv"] + (" (created now)" if result["created_venv"] else "")),
        ("python", f"{result['python']['version']} {result['python']['executable']}"),
        ("eagleflow", f"{result['eagleflow']} ({wheel})"),
        (
            "packages",
            ("installed " + " ".join(result["packages_changed"]))
            if result["packages_changed"]
            else "nothing installed",
        ),
        ("torch", torch_text),
        ("transformers", result["transformers"] or "not installed"),
        *((engine, version or "not installed") for engine, version in result["engines"].items()),
        *(
            (f"gpu {g['index']}", f"{g['name']}, {g['memory_free_mib']} MiB free of {g['memory_total_mib']} MiB")
            for g in result["gpus"]
        ),
        (
            "disk",
            f"{_gib(disk['free_bytes'])} free of {_gib(disk['total_bytes'])} under {disk['path']}"
            if disk
            else "unknown",
        ),
    ]
    if not result["gpus"]:
        rows.insert(-1, ("gpus", "none (no nvidia-smi)" if "gpus" not in result["errors"] else "unknown"))
    rows += [(f"error ({section})", error) for section, error in result["errors"].items()]
    return rows


def render_text(result: dict[str, Any]) -> str:
    return "\n".join(f"{name:<13} {value}" for name, value in summary_rows(result))


def render_markdown(result: dict[str, Any]) -> str:
    lines = [f"# Host {result['host']}", "", "| fact | value |", "|---|---|"]
    lines += ["| {} | {} |".format(name, value.replace("|", "\\|")) for name, value in summary_rows(result)]
    return "\n".join(lines) + "\n"
