"""What `eagleflow status` and `eagleflow trigger --wait` print of a finished run (cli.status): the whole verdict,
and one config however its path was spelled."""

from __future__ import annotations

import os
from types import SimpleNamespace

from cli.status import _same_config, config_identity, verdict_lines


def test_the_whole_verdict_is_shown_not_only_its_line():
    # issue 43: "slower than no speculation at ..." was in report.md and nowhere a shell user looks
    result = {
        "verdict": "the new drafter serves 1.29x the output tokens/s of no speculation (temperature 0, concurrency 1)",
        "findings": ["slower than no speculation at: temperature 0.7 / concurrency 1 (0.46x)"],
        "report": "/srv/reports/r1/report.json",
    }
    assert verdict_lines(result, "    ") == [
        f"    verdict: {result['verdict']}",
        "      - slower than no speculation at: temperature 0.7 / concurrency 1 (0.46x)",
        "    report: /srv/reports/r1/report.json",
    ]
    # a record written before findings were kept, or a run with no drafter measured
    assert verdict_lines({"verdict": None, "report": "/r.json"}) == ["report: /r.json"]


def test_one_config_under_two_spellings_is_one_config(tmp_path, monkeypatch):
    # issue 43: `configs/demo.yaml` and its absolute path were listed as two configs
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "demo.yaml").write_text("name: demo\n")
    os.symlink(tmp_path / "configs", tmp_path / "linked")
    monkeypatch.chdir(tmp_path)
    spellings = ["configs/demo.yaml", str(tmp_path / "configs" / "demo.yaml"), "./linked/../configs/demo.yaml"]
    assert len({config_identity(p) for p in [*spellings, "linked/demo.yaml"]}) == 1
    run = SimpleNamespace(parameters={"params": {"config_path": spellings[0]}})
    assert all(_same_config(run, p) for p in spellings) and not _same_config(run, "configs/other.yaml")
