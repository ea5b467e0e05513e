"""The local host (eagleflow.hosts.local): short commands run from the home directory with host.env,
a missing executable reads as status 127, files are put atomically, and a stage's failure carries its
exit status and last lines."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from eagleflow.hosts import LocalHost, StageFailed
from eagleflow.hosts.base import HostError


def test_exec_runs_from_home_with_the_host_env():
    host = LocalHost(env={"EAGLEFLOW_TEST_VAR": "from-host-env"})
    rc, out, err = host.exec(
        [
            sys.executable,
            "-c",
            "import os, sys; print(os.getcwd()); "
            "print(os.environ['EAGLEFLOW_TEST_VAR']); print('oops', file=sys.stderr); sys.exit(3)",
        ]
    )
    assert rc == 3 and out.splitlines() == [os.path.expanduser("~"), "from-host-env"] and err.strip() == "oops"
    assert host.label == "localhost (this machine)"


def test_exec_of_a_missing_program_is_127_and_a_slow_one_a_host_error():
    rc, _, err = LocalHost().exec(["/nonexistent/python3.99", "-V"])
    assert rc == 127 and "/nonexistent/python3.99" in err
    with pytest.raises(HostError, match="did not finish within 1 s"):
        LocalHost().exec(["sleep", "5"], timeout=1)


def test_put_file_and_write_text_are_atomic(tmp_path):
    host = LocalHost()
    src = tmp_path / "wheel.whl"
    src.write_bytes(b"wheel")
    host.put_file(str(src), str(tmp_path / "remote" / "w.whl"))
    assert (tmp_path / "remote" / "w.whl").read_bytes() == b"wheel"
    host.write_text(str(tmp_path / "remote" / "request.json"), "{}")
    assert host.read_text(str(tmp_path / "remote" / "request.json")) == "{}"
    assert sorted(p.name for p in (tmp_path / "remote").iterdir()) == ["request.json", "w.whl"]  # no temp files
    assert host.exists(str(src)) and not host.exists(str(tmp_path / "nope"))


def test_a_failing_stage_names_its_status_and_last_lines(tmp_path):
    lines: list[str] = []
    log = tmp_path / "stage.log"
    with pytest.raises(StageFailed) as err:
        LocalHost().run(
            [sys.executable, "-c", "print('working'); print('error: the disk is full'); exit(3)"],
            log=lines.append,
            log_path=str(log),
        )
    assert err.value.returncode == 3 and "the disk is full" in str(err.value)
    assert lines == ["working", "error: the disk is full"] and Path(log).read_text().splitlines() == lines
