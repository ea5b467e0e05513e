"""Atomic writes (eagleflow.util.files): a reader sees the old content or the new, never half of either;
a failed write leaves the old content and no temporary file; units of work that are directories
are built beside their place and renamed into it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagleflow.util.files import (
    copy_file_atomic,
    fresh_temp_dir,
    read_json,
    replace_dir,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)


def _temps(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


def test_json_is_written_whole_and_a_failure_keeps_the_old_content(tmp_path):
    target = tmp_path / "deep" / "x.json"
    write_json_atomic(target, {"ok": 1, "a": [1, 2]})  # parents are created
    assert json.loads(target.read_text()) == {"ok": 1, "a": [1, 2]}
    assert target.read_text().index('"a"') < target.read_text().index('"ok"')  # sorted keys

    class Boom:
        pass

    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": Boom()})
    # The failed write left the earlier complete file and no temp file behind.
    assert json.loads(target.read_text()) == {"ok": 1, "a": [1, 2]}
    assert _temps(target.parent) == []


def test_a_write_that_fails_midway_keeps_the_old_content(tmp_path):
    target = tmp_path / "x.bin"
    write_bytes_atomic(target, b"old")
    with pytest.raises(TypeError):
        write_bytes_atomic(target, "not bytes")  # fails while writing the temp file
    assert target.read_bytes() == b"old" and _temps(tmp_path) == []


def test_a_reader_of_the_old_file_keeps_the_old_content(tmp_path):
    """The new content goes to a new file renamed over the old: an open reader is never cut short."""
    target = tmp_path / "state.txt"
    write_text_atomic(target, "old " * 1000)
    with open(target) as reader:
        write_text_atomic(target, "new")
        assert reader.read() == "old " * 1000
    assert target.read_text() == "new" and _temps(tmp_path) == []


def test_copy_file_atomic(tmp_path):
    src, dst = tmp_path / "src.bin", tmp_path / "out" / "dst.bin"
    src.write_bytes(b"payload")
    copy_file_atomic(src, dst)
    assert dst.read_bytes() == b"payload"
    with pytest.raises(FileNotFoundError):
        copy_file_atomic(tmp_path / "missing", dst)
    assert dst.read_bytes() == b"payload" and _temps(dst.parent) == []


def test_read_json_is_none_for_a_missing_or_torn_record(tmp_path):
    assert read_json(tmp_path / "none.json") is None
    (tmp_path / "torn.json").write_text('{"state": "runn')
    assert read_json(tmp_path / "torn.json") is None
    write_json_atomic(tmp_path / "ok.json", {"state": "running"})
    assert read_json(tmp_path / "ok.json") == {"state": "running"}


def test_a_directory_unit_is_built_beside_its_place_and_renamed_into_it(tmp_path):
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "old.txt").write_text("old unit")
    tmp = fresh_temp_dir(final)
    assert tmp == tmp_path / ".ckpt.tmp" and list(tmp.iterdir()) == []
    (tmp / "half.txt").write_text("an attempt that died while writing")
    tmp = fresh_temp_dir(final)  # the next attempt starts empty
    assert list(tmp.iterdir()) == []
    (tmp / "new.txt").write_text("new unit")
    replace_dir(tmp, final)
    assert [p.name for p in final.iterdir()] == ["new.txt"]  # nothing of the old unit survives
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
