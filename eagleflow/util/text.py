"""Sizes and durations as a person reads them: one formatter of each for every line eagleflow prints
(progress lines, the capacity plan, the report, the CLI)."""

from __future__ import annotations


def size_text(n: float | None) -> str:
    """Bytes in decimal units, as disks are sold: '828.0 GB', '512 B'; '?' when unknown."""
    if n is None:
        return "?"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def duration_text(seconds: float) -> str:
    """'45s', '3m 10s', '5h 20m': seconds while they matter, then minutes, then hours and minutes."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {(s % 3600) // 60:02d}m"
