"""The run report (eagleflow.reporting.report) from real stage manifests, built with the eagleflow.contracts
models as the stages write them: what it takes from each manifest, the figures in its text and
markdown renderings, and report.json written atomically with its path recorded."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from eagleflow.contracts.benchmark_records import ProductionResult, ProductionWindow
from eagleflow.contracts.manifest import Manifest
from eagleflow.reporting.report import Report, StageTiming, build_report, render_markdown, render_text, write_report
from tests.helpers.records import benchmark_manifest, export_manifest, train_manifest

PRODUCTION = ProductionResult(ok=True, was_running=True, started=True, healthy_after_s=41.5, by="stage")


def _manifests(root: str) -> dict[str, Manifest]:
    return {
        "train": train_manifest(f"{root}/train/trainkey"),
        "export": export_manifest(f"{root}/export/exportkey"),
        "benchmark": benchmark_manifest(f"{root}/benchmark/benchkey", production=PRODUCTION),
    }


TIMINGS = {
    "train": StageTiming(seconds=0.0123, cached=True),
    "export": StageTiming(seconds=0.02, cached=True),
    "benchmark": StageTiming(seconds=81.236, cached=False),
}


def test_build_report_takes_each_figure_from_its_manifest():
    manifests = _manifests("/w")
    r = build_report("demo", manifests, TIMINGS)
    bench = manifests["benchmark"].metrics
    assert r.run == "demo" and r.created.endswith("Z")
    assert (r.baseline.output_tok_s, r.drafter.output_tok_s, r.current.output_tok_s) == (100, 140, 120)
    assert r.speedup == pytest.approx(1.4) and r.drafter.mean_acceptance_length == 3.3
    assert [w.model_dump(mode="json") for w in r.windows] == bench["windows"] and len(r.windows) == 6
    assert r.verdict.model_dump(mode="json") == bench["verdict"] and not r.verdict.integration_suspect
    assert r.production == PRODUCTION
    assert r.drafter_dir == "/host/drafter" and r.drafters == {"drafter": "/host/drafter", "current": "/host/current"}
    assert r.benchmark_settings == bench["settings"] and r.benchmark_settings["num_prompts"] == 32
    # The offline estimate is the train stage's best epoch (the higher holdout AL: epoch 2).
    assert r.offline.best_epoch == 2 and r.offline.best.acceptance_length == 2.9 and r.offline.best.epoch == 2
    assert set(r.stages) == {"train", "export", "benchmark"}
    train = r.stages["train"]
    assert (train.seconds, train.cached, train.key, train.compute_seconds) == (0.01, True, "trainkey", 45.6)
    assert train.manifest == "/w/train/trainkey/manifest.json"
    bench_stage = r.stages["benchmark"]
    assert (bench_stage.seconds, bench_stage.cached, bench_stage.compute_seconds) == (81.24, False, 78.9)
    assert r.path is None  # not written yet


def test_a_benchmark_only_report_has_no_offline_estimate_and_says_what_ran():
    r = build_report(
        "demo",
        {"benchmark": benchmark_manifest("/w/benchmark/b")},
        {"benchmark": StageTiming(seconds=5.0, cached=False)},
        kind="benchmark",
    )
    assert r.offline is None and list(r.stages) == ["benchmark"] and r.production is None
    assert render_text(r).splitlines()[0] == "eagleflow benchmark-only run demo"
    assert render_markdown(r).splitlines()[0] == "# eagleflow benchmark-only run `demo`"
    nightly = build_report("demo", _manifests("/w"), TIMINGS, kind="nightly")
    assert render_markdown(nightly).splitlines()[0] == "# eagleflow nightly run `demo`"
    with pytest.raises(ValidationError, match="kind"):
        build_report("demo", _manifests("/w"), TIMINGS, kind="weekly")


def test_a_manifest_with_renamed_metrics_fails_the_report():
    """The old flat epoch keys (train_loss, val_*) are not read as something else: they fail, named."""
    manifests = _manifests("/w")
    old = manifests["train"].model_copy(deep=True)
    old.metrics["epochs"][0]["train_loss"] = old.metrics["epochs"][0]["train"].pop("loss")
    with pytest.raises(ValidationError, match="train_loss"):
        build_report("demo", {**manifests, "train": old}, TIMINGS)


def test_text_and_markdown_carry_the_figures():
    r = build_report("demo", _manifests("/w"), TIMINGS)
    text = render_text(r)
    assert text.splitlines()[0] == "eagleflow pipeline run demo"
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert lines["output tok/s"].split()[-2:] == ["100.0", "140.0"]
    assert lines["speedup"].split()[-2:] == ["1.00x", "1.40x"]
    assert lines["mean acceptance length"].split()[-1] == "3.30"
    assert lines["acceptance rate"].split()[-1] == f"{(3.3 - 1) / 3:.3f}"
    assert "0.90 / 0.80 / 0.60" in text
    assert f"verdict: {r.verdict.summary}" in text
    window_rows = [
        row
        for row in map(str.split, text.splitlines())
        if row[:1] in (["baseline"], ["current"], ["drafter"]) and len(row) == 8
    ]
    assert len(window_rows) == 6
    assert ["drafter", "0", "1", "140.0", "1.40x", "3.30", "50", "10.0"] in window_rows
    assert ["current", "0", "4", "330.0", "1.10x", "2.40", "50", "10.0"] in window_rows
    stage_rows = {line.split()[0]: line.split() for line in text.splitlines()[-3:]}
    assert stage_rows == {
        "train": ["train", "0.0", "yes", "45.6"],
        "export": ["export", "0.0", "yes", "1.2"],
        "benchmark": ["benchmark", "81.2", "no", "78.9"],
    }

    md = render_markdown(r)
    assert md.splitlines()[0] == "# eagleflow pipeline run `demo`"
    assert "| output tok/s | 100.0 | 140.0 |" in md and "| speedup | 1.00x | 1.40x |" in md
    assert "| mean acceptance length | - | 3.30 |" in md
    assert "| per-position acceptance | - | 0.90 / 0.80 / 0.60 |" in md
    assert f"**Verdict:** {r.verdict.summary}" in md
    assert "| train | 0.0 | yes | 45.6 |" in md and "| benchmark | 81.2 | no | 78.9 |" in md
    assert md.count("\ndrafter ") == 2 and md.count("\nbaseline ") == 2  # every window, in the code block


def test_the_report_says_for_which_stages_and_how_long_production_was_down():
    windows = [
        ProductionWindow(
            stages=["extract", "train", "export", "benchmark"],
            ok=True,
            was_running=True,
            down_s=3725.4,
            healthy_after_s=1803.2,
            summary="production restored, healthy after 1803.2 s",
        )
    ]
    r = build_report("demo", _manifests("/w"), TIMINGS, production_windows=windows)
    line = "production down 3725 s for extract, train, export, benchmark: production restored, healthy after 1803.2 s"
    assert line in render_text(r) and f"- {line}" in render_markdown(r)
    assert Report.model_validate_json(r.model_dump_json()).production_windows == windows
    assert "production down" not in render_text(build_report("demo", _manifests("/w"), TIMINGS))


def test_write_report_is_atomic_and_records_its_path(tmp_path):
    r = build_report("demo", _manifests("/w"), TIMINGS)
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 64
    path = write_report(r, tmp_path / "reports", {"speedup": png})
    assert r.path == str(path) and path.name == "report.json"
    assert path.parent.parent == tmp_path / "reports" and path.parent.name.startswith("demo-")
    on_disk = json.loads(path.read_text())
    assert on_disk["path"] == str(path)  # the file says where it is
    assert Report.model_validate(on_disk) == r
    # report.md beside it, its picture a file of its own; no temp file left
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.json", "report.md", "speedup.png"]
    assert (path.parent / "speedup.png").read_bytes() == png
    md = (path.parent / "report.md").read_text()
    assert "![speedup](speedup.png)" in md and "| mean acceptance length |" in md
