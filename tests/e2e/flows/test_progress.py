"""Progress on long work, live, as a person meets it: the Prefect progress artifacts of the session's
first pipeline run (tests/e2e/conftest.py `first_run_watched`), read from the server while it ran,
and the progress lines in its terminal output."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.e2e

# stage -> (artifact key, figures its description must carry)
EXPECTED = {
    "generate": ("eagleflow-e2e-generate-samples-progress", ("samples", "output tok/s", "failed")),
    "extract": ("eagleflow-e2e-extract-tokens-progress", ("tokens", "tok/s", "written")),
    "train": ("eagleflow-e2e-train-steps-progress", ("steps", "epoch", "loss", "acc", "simulated AL")),
    "benchmark": ("eagleflow-e2e-benchmark-requests-progress", ("requests", "measuring")),
}


def test_the_long_stages_progress_artifacts_moved_while_the_run_went_on(first_run_watched):
    seen = first_run_watched["progress"]
    for stage, (key, figures) in EXPECTED.items():
        assert key in seen, (stage, sorted(seen))
        values = seen[key]
        last_progress, last_description = values[-1]
        assert float(last_progress) == 100.0, (stage, values[-1])
        assert "state | done" in last_description, (stage, last_description)
        for figure in figures:
            assert figure in last_description, (stage, figure, last_description)
        progress = [float(p) for p, _ in values]
        assert progress == sorted(progress), (stage, progress)  # never backwards
    # Read mid-run: at least one stage was seen at two or more points short of its end.
    moving = {k: [p for p, _ in v] for k, v in seen.items() if len({p for p, _ in v}) >= 2}
    assert moving, seen
    train = seen[EXPECTED["train"][0]]
    assert len(train) >= 2 and any("time left" in d for _, d in train), train


def test_each_engine_load_has_its_progress_and_ends_loaded(first_run_watched):
    seen = first_run_watched["progress"]
    loads = {
        k: v for k, v in seen.items() if re.fullmatch(r"eagleflow-e2e-(generate|benchmark)-load-[a-z-]+-progress", k)
    }
    assert "eagleflow-e2e-generate-load-target-progress" in loads, sorted(seen)
    assert {"eagleflow-e2e-benchmark-load-baseline-progress", "eagleflow-e2e-benchmark-load-drafter-progress"} <= set(
        loads
    )
    for key, values in loads.items():
        progress, description = values[-1]
        assert float(progress) == 100.0 and "1 of 1 checkpoint shards" in description and "seconds" in description, key


def test_the_terminal_shows_progress_lines_without_their_json(first_run_watched):
    out = first_run_watched["proc"].stdout + first_run_watched["proc"].stderr
    lines = [line for line in out.splitlines() if "progress generate:" in line or "progress train:" in line]
    assert any("samples (" in line and "left" in line for line in lines), lines[:5]
    assert any("done in" in line for line in lines if "progress train:" in line)
    assert not any("#progress" in line or '{"stage"' in line for line in out.splitlines()), (
        "the JSON reached the terminal"
    )


def test_the_stage_log_on_the_host_keeps_the_whole_event(first_run):
    log = open(first_run["stages"]["train"]["manifest"].replace("manifest.json", "stage.log")).read()
    events = [json.loads(line.split(" #progress ", 1)[1]) for line in log.splitlines() if " #progress " in line]
    assert events and events[-1]["final"] and events[-1]["done"] == events[-1]["total"]
    assert events[-1]["figures"]["AL by epoch"] and len(events[-1]["figures"]["AL by epoch"]) == 4  # 4 epochs
