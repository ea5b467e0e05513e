"""Production's managed drafter link: switch, confirm, reject and roll back, on real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagleflow.production import deployed


def drafter(tmp: Path, name: str) -> Path:
    d = tmp / "exports" / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": name}))
    (d / "model.safetensors").write_bytes(name.encode() * 10)
    return d


def served(d: Path) -> str:
    """What production's launch would read through the link."""
    return json.loads((d / "drafter" / "config.json").read_text())["name"]


def test_switch_confirm_then_a_rejected_drafter_rolls_back_to_the_last_good(tmp_path):
    d = tmp_path / "production" / "demo"
    deployed.adopt(d, drafter(tmp_path, "public"))
    assert served(d) == "public" and deployed.last_good(d) == 0

    window = tmp_path / "window"
    window.mkdir()
    out = deployed.switch(d, drafter(tmp_path, "night1"), run="r1", record={"mean_acceptance_length": 2.5}, window=window)
    assert served(d) == "night1" and out["state"] == "pending" and out["last_good"] == 0
    assert json.loads((window / deployed.WINDOW_MARK).read_text())["seq"] == 1  # the guardian may undo it
    assert (d / deployed.PENDING).exists()
    out = deployed.confirm(d, {"mean_acceptance_length": 2.4})
    assert out["state"] == "good" and out["last_good"] == 0 and not (d / deployed.PENDING).exists()

    deployed.switch(d, drafter(tmp_path, "night2"), run="r2")
    out = deployed.rollback(d, "AL 1.00 on production")
    assert served(d) == "night1" and out["serving"] == 1 and out["record"] == {"mean_acceptance_length": 2.5}
    assert deployed.states(out["events"]) == {0: "good", 1: "good", 2: "rejected"}
    assert out["events"][-2]["why"] == "AL 1.00 on production"

    # by hand: the serving drafter itself rejected, production back to the one before it
    out = deployed.rollback(d, "by hand")
    assert served(d) == "public" and deployed.states(out["events"])[1] == "rejected"
    with pytest.raises(deployed.DeployError, match="no earlier good drafter"):
        deployed.rollback(d, "again")


def test_a_deployed_drafter_is_a_copy_and_the_link_always_names_a_whole_one(tmp_path):
    d = tmp_path / "p"
    src = drafter(tmp_path, "a")
    deployed.switch(d, src, run="r")
    (src / "config.json").unlink()  # the export cleaned up later: production keeps its copy
    assert served(d) == "a"
    assert os.readlink(d / "drafter") == "drafters/0"
    assert not list((d / "drafters").glob(".*"))  # no partial copy left behind
    with pytest.raises(deployed.DeployError, match="no config.json"):
        deployed.switch(d, tmp_path / "exports" / "missing", run="r")
    assert served(d) == "a" and deployed.current(d) == 0


def test_the_cli_prints_one_json_line_and_names_the_fix_on_error(tmp_path):
    d = tmp_path / "p"
    run = lambda *a: subprocess.run([sys.executable, "-m", "eagleflow.production.deployed", *a],  # noqa: E731
                                    capture_output=True, text=True)
    r = run("rollback", str(d), "--why", "x")
    assert r.returncode == 1 and "nothing is deployed" in json.loads(r.stdout)["error"]
    r = run("switch", str(d), "--drafter", str(drafter(tmp_path, "b")), "--run", "r", "--record", "null")
    assert r.returncode == 0 and json.loads(r.stdout)["serving"] == 0
