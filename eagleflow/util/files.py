"""Writing files so a reader sees the old content or the new, never half of either. Standard library only.

Every atomic write in the project goes through here: a temporary name in the same directory (so the
rename stays on one filesystem), then `os.replace`. A unit of work that is a directory (a checkpoint,
an exported drafter) is built in a temporary directory and renamed into place the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | Path, data: bytes, *, fsync: bool = True) -> None:
    """Write `data` to a temp file beside `path`, (fsync,) rename over `path`; parents are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str, *, fsync: bool = True) -> None:
    write_bytes_atomic(path, text.encode(), fsync=fsync)


def write_json_atomic(path: str | Path, data: Any, *, indent: int | None = 2, fsync: bool = True) -> None:
    """JSON (sorted keys) written atomically: manifests, job records, production's state files."""
    write_bytes_atomic(path, json.dumps(data, indent=indent, sort_keys=True).encode(), fsync=fsync)


def copy_file_atomic(src: str | Path, dst: str | Path) -> None:
    """Copy `src` to a temp name beside `dst`, then rename over `dst`."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def writing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` for a library that writes files itself (Parquet, safetensors);
    renamed over `path` when the block succeeds, removed when it fails: `path` is whole or absent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: str | Path) -> Any | None:
    """A JSON record, or None when it is missing or being replaced (a torn read cannot happen with
    the writers above, but a file from elsewhere may be incomplete)."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def fresh_temp_dir(final: str | Path) -> Path:
    """An empty `.<name>.tmp` directory beside `final`, for a unit of work built in place of it."""
    final = Path(final)
    tmp = final.parent / f".{final.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # a leftover of an attempt that died while writing
    tmp.mkdir(parents=True)
    return tmp


def replace_dir(tmp: str | Path, final: str | Path) -> None:
    """Rename a completed temp directory into place (an older copy of the unit is dropped first)."""
    final = Path(final)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
