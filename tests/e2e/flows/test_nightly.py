"""The nightly retrain (flows.retrain) three nights running, through the config's nightly deployment and a
process worker on the session's real Prefect server, with real vLLM (CPU) and the demo target; the prompt
source (a directory of JSONL files) grows between nights (`nightly_runs`, tests/e2e/conftest.py). The first night
is refused by its gate (tests/e2e/flows/test_nightly_evidence.py reads it), the second promoted.

Every night's states come from production itself while it serves (extract.backend 'production', eagleflow's
capture plugin in production's engine, behind its drafter's aux layers). What every night after the first must
show: only the new prompts generated and extracted (every earlier stage a cache hit), a baseline measured once, the
held-out split byte-identical, and AL by night in the report as a table and a picture; and a night after a promoted
one: training that continues from the promoted drafter with at most a third of that night's steps and no worse
acceptance, and that drafter measured as the current one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagleflow.contracts.manifest import read_manifest
from eagleflow.contracts.stage_records import ExtractMetrics
from tests.e2e.conftest import NIGHT_PROMPTS

pytestmark = pytest.mark.e2e


def test_each_night_generates_and_extracts_only_its_new_prompts(nightly_runs):
    reports = [n["report"] for n in nightly_runs["nights"]]
    first, *later = reports
    assert first["nights"][-1]["new_samples"] == NIGHT_PROMPTS[0] - 12
    assert not any(
        first["stages"][s]["cached"] for s in ("generate: holdout", "generate", "extract: holdout", "extract")
    )
    for k, r in enumerate(later, 2):
        night = r["nights"][-1]
        assert night["night"] == k and night["new_samples"] == NIGHT_PROMPTS[k - 1]
        # the held-out batch: the first night's stages, cache hits; tonight's batch: computed, keys of its own
        assert r["stages"]["generate: holdout"]["cached"] and r["stages"]["extract: holdout"]["cached"]
        assert r["stages"]["generate: holdout"]["key"] == first["stages"]["generate: holdout"]["key"]
        assert not r["stages"]["generate"]["cached"] and not r["stages"]["extract"]["cached"]
        assert r["stages"]["generate"]["key"] not in {x["stages"]["generate"]["key"] for x in reports[: k - 1]}
        assert night["replay_sequences"] > 0 and night["pool_samples"] == sum(NIGHT_PROMPTS[:k]) - 12
    for r in reports:  # captured by production while it served: no engine of ours, no production window for it
        x = read_manifest(r["stages"]["extract"]["manifest"])
        assert (ExtractMetrics.of(x).backend, ExtractMetrics.of(x).device) == ("production", "production")
        assert not list(Path(x.dir).glob("engine*.log"))
        assert all("extract" not in w["stages"] for w in r["production_windows"]), r["production_windows"]
        assert read_manifest(r["stages"]["check"]["manifest"]).metrics["production_capture"] == "captures"
    ledger = json.loads((nightly_runs["work"] / "runs" / "nightly" / "nightly-e2e" / "ledger.json").read_text())
    assert [len(b["prompts"]) for b in ledger["batches"]] == [NIGHT_PROMPTS[0] - 12, *NIGHT_PROMPTS[1:]]
    used = [h for b in ledger["batches"] for h in b["prompts"]]
    assert len(used) == len(set(used))  # no prompt used twice


def test_later_nights_continue_from_the_promoted_drafter_with_a_third_of_the_steps_and_no_worse_al(nightly_runs):
    nights = nightly_runs["nights"][-1]["report"]["nights"]
    refused, first, *later = nights  # the refused night: test_nightly_evidence.py
    assert refused["promoted"] is False and first["warm_start"] is None and first["promoted"]
    assert later
    for n in later:
        assert n["warm_start"] and n["train_steps"] <= first["train_steps"] / 3, n
        # The same held-out prompts every night: the figures compare. No lower beyond noise: the trainer's
        # holdout AL within 0.1 of the first promoted night's, and that night's served AL inside or below tonight's
        # 95% interval.
        assert n["holdout_al"] >= first["holdout_al"] - 0.1, (n, first)
        assert n["served_al_ci"][1] >= first["served_al"], (n, first)
    print("AL by night:", [(n["night"], n["train_steps"], n["holdout_al"], n["served_al"]) for n in nights])


def test_one_engine_load_a_night_the_baseline_once_and_the_new_drafter_on_production(nightly_runs):
    reports = [n["report"] for n in nightly_runs["nights"]]
    assert reports[0]["nights"][-1]["baseline"] == "measured tonight"

    def engines(r: dict, stage: str) -> list[str]:
        return sorted(p.name for p in Path(r["stages"][stage]["manifest"]).parent.glob("engine-*.log"))

    # production.promote 'serve' (the fixture's production): the references inside the production window, the
    # new drafter on production, which serves it since the window closed. Engines of our own load only on the first
    # night: the baseline, and the drafter production serves (adopted, nothing promoted yet: the gate's bar).
    assert engines(reports[0], "benchmark: references") == ["engine-baseline.log", "engine-current.log"]
    for r in reports:
        assert engines(r, "benchmark") == [], r["stages"]["benchmark"]
    for r in reports[1:]:
        assert engines(r, "benchmark: references") == []
        assert r["nights"][-1]["baseline"].startswith("reused: measured")
        # what production serves, measured before (the adopted drafter after a refused night, else the promoted one)
        assert r["current"] is not None and r["current"]["measured"].startswith("measured"), r["current"]
        # the drafter's window stopped at the precision asked, or ran all its prompts
        w = next(x for x in r["windows"] if x["variant"] == "drafter")
        assert w["stopped"] in ("precision", "all prompts") and w["requests"] <= 12


def test_the_held_out_split_is_byte_identical_across_nights(nightly_runs):
    nights = nightly_runs["nights"]
    assert len({n["holdout_sha256"] for n in nights}) == 1
    held = []
    for n in nights:
        pool = Path(n["report"]["stages"]["pool"]["manifest"]).parent
        index = json.loads((pool / "data" / "index.json").read_text())
        held.append([(e["file"], e["sample_sha256"], e["bytes"]) for e in index["shards"] if e["split"] == "holdout"])
        assert not any(e["split"] == "holdout" for e in index["shards"] if "select" in e)
    assert held[0] and all(h == held[0] for h in held[1:])


def test_the_report_shows_al_by_night_as_a_table_and_a_picture(nightly_runs):
    r = nightly_runs["nights"][-1]["report"]
    assert [n["night"] for n in r["nights"]] == list(range(1, len(NIGHT_PROMPTS) + 1))
    md = (Path(r["path"]).parent / "report.md").read_text()
    assert "**AL by night**" in md and "![al-by-night](al-by-night.png)" in md
    table = md.split("**AL by night**")[1]
    for n in r["nights"]:
        assert f"{n['holdout_al']:.2f}" in table and f"{n['served_al']:.2f}" in table
    png = (Path(r["path"]).parent / "al-by-night.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_each_night_reads_productions_traffic_from_its_engine(nightly_runs):
    """From night 2 on, production's engine has finished requests (the nights' generate, canaries and probes): the
    check stage reads its /metrics and the report says the load and lengths production served."""
    for k, night in enumerate(nightly_runs["nights"][1:], 2):
        seen = night["report"]["production_traffic"]
        assert seen is not None, f"night {k}: no traffic read"
        assert seen["requests"] > 0 and seen["seconds"] > 0 and seen["in_flight"] > 0 and seen["answer_tokens"] > 0
        report_md = (Path(night["report"]["path"]).parent / "report.md").read_text()
        assert f"production's traffic, as its engine counted it: {seen['requests']:,} requests" in report_md
