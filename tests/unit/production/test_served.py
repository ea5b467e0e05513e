"""Production's managed drafter link: switch, confirm, reject and roll back, on real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagleflow.production import served


def drafter(tmp: Path, name: str) -> Path:
    d = tmp / "exports" / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": name}))
    (d / "model.safetensors").write_bytes(name.encode() * 10)
    return d


def link_target(d: Path) -> str:
    """What production's launch would read through the link."""
    return json.loads((d / "drafter" / "config.json").read_text())["name"]


def test_switch_confirm_then_a_rejected_drafter_rolls_back_to_the_last_good(tmp_path):
    d = tmp_path / "production" / "demo"
    served.adopt(d, drafter(tmp_path, "public"))
    assert link_target(d) == "public" and served.last_good(d) == 0

    window = tmp_path / "window"
    window.mkdir()
    out = served.switch(d, drafter(tmp_path, "night1"), run="r1", record={"mean_acceptance_length": 2.5}, window=window)
    assert link_target(d) == "night1" and out["state"] == "pending" and out["last_good"] == 0 == out["good"]
    assert json.loads((window / served.WINDOW_MARK).read_text())["seq"] == 1  # the guardian may undo it
    assert (d / served.PENDING).exists()
    out = served.confirm(d, {"mean_acceptance_length": 2.4})
    assert out["state"] == "good" and out["last_good"] == 0 and out["good"] == 1 and not (d / served.PENDING).exists()

    served.switch(d, drafter(tmp_path, "night2"), run="r2")
    out = served.rollback(d, "AL 1.00 on production")
    assert link_target(d) == "night1" and out["serving"] == 1 and out["record"] == {"mean_acceptance_length": 2.5}
    assert served.states(out["events"]) == {0: "good", 1: "good", 2: "rejected"}
    assert out["events"][-2]["why"] == "AL 1.00 on production"

    # by hand: the serving drafter itself rejected, production back to the one before it
    out = served.rollback(d, "by hand")
    assert link_target(d) == "public" and served.states(out["events"])[1] == "rejected"
    with pytest.raises(served.ServedDrafterError, match="no earlier good drafter"):
        served.rollback(d, "again")


def test_a_deployed_drafter_is_a_copy_and_the_link_always_names_a_whole_one(tmp_path):
    d = tmp_path / "p"
    src = drafter(tmp_path, "a")
    served.switch(d, src, run="r")
    (src / "config.json").unlink()  # the export cleaned up later: production keeps its copy
    assert link_target(d) == "a"
    assert os.readlink(d / "drafter") == "drafters/0"
    assert not list((d / "drafters").glob(".*"))  # no partial copy left behind
    with pytest.raises(served.ServedDrafterError, match="no config.json"):
        served.switch(d, tmp_path / "exports" / "missing", run="r")
    assert link_target(d) == "a" and served.current(d) == 0


def test_the_cli_prints_one_json_line_and_names_the_fix_on_error(tmp_path):
    d = tmp_path / "p"
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "eagleflow.production.served", *a],  # noqa: E731
        capture_output=True,
        text=True,
    )
    r = run("rollback", str(d), "--why", "x")
    assert r.returncode == 1 and "nothing is deployed" in json.loads(r.stdout)["error"]
    r = run("switch", str(d), "--drafter", str(drafter(tmp_path, "b")), "--run", "r", "--record", "null")
    assert r.returncode == 0 and json.loads(r.stdout)["serving"] == 0
