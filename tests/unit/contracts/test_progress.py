"""Progress lines (eagleflow.contracts.progress): what a person reads, what the control side parses back, how
often they come, and a rate that leaves out work done before this process began."""

from __future__ import annotations

import pytest

from eagleflow.contracts.progress import Progress, parse_line
from eagleflow.engines.base import shards_loaded
from eagleflow.util.text import duration_text, size_text


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_line_reads_as_text_and_parses_back_to_its_event():
    clock, lines = Clock(), []
    p = Progress("generate", "samples", 1150, "samples", start=150, emit=lines.append, clock=clock)
    clock.t += 100
    assert p.update(350, {"output tok/s": 352.4, "failed": 0})
    text, event = parse_line("2026-12-01 10:00:00 INFO eagleflow.contracts.progress: " + lines[-1])
    assert (
        text == "2026-12-01 10:00:00 INFO eagleflow.contracts.progress: progress generate: 350/1,150 samples (30.4%), "
        "output tok/s 352, failed 0, 6m 40s left"
    )
    assert event is not None and event.done == 350 and event.total == 1150
    assert event.rate == 2.0  # 200 samples in 100 s: the 150 of an earlier attempt cost nothing here
    assert event.eta_s == 400.0 and round(event.percent, 1) == 30.4
    assert event.figures == {"output tok/s": 352.4, "failed": 0}


def test_lines_come_at_most_every_interval_unless_forced_and_the_last_says_done():
    clock, lines = Clock(), []
    p = Progress("train", "steps", 10, "steps", every_s=5.0, emit=lines.append, clock=clock)
    assert p.update(1)  # the first is always due
    clock.t += 1
    assert not p.update(2) and len(lines) == 1
    assert p.update(3, force=True)
    clock.t += 5
    assert p.due() and p.update(4)
    p.finish(10)
    _, last = parse_line(lines[-1])
    assert last is not None and last.final and last.percent == 100.0 and last.eta_s is None
    assert "done in" in lines[-1] and len(lines) == 4


def test_a_line_without_an_event_or_with_a_broken_one_is_shown_as_it_is():
    assert parse_line("shard 1/2: 160 samples") == ("shard 1/2: 160 samples", None)
    broken = "progress x: 1 #progress {not json"
    assert parse_line(broken) == (broken, None)


def test_unknown_total_has_no_share_and_no_time_left():
    clock, lines = Clock(), []
    p = Progress("engine", "load-drafter", None, "checkpoint shards", emit=lines.append, clock=clock)
    clock.t += 3
    p.update(figures={"seconds": 3})
    _, e = parse_line(lines[-1])
    assert e is not None and e.percent == 0.0 and e.eta_s is None and "left" not in lines[-1]


def test_the_engine_loader_line_gives_shards_loaded_of_total():
    assert shards_loaded("Loading safetensors checkpoint shards:  50% Completed | 32/64 [15:00<15:00, 28s/it]") == (
        32,
        64,
    )
    tqdm = (
        "Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?]\rLoading safetensors checkpoint "
        "shards:  50% Completed | 1/2 [00:01<00:01]"
    )
    assert shards_loaded(tqdm) == (1, 2)
    assert shards_loaded("INFO Loading weights took 1.2 seconds") is None


def test_durations_and_sizes_read_like_a_person_writes_them():
    assert [duration_text(s) for s in (45, 190, 19_200)] == ["45s", "3m 10s", "5h 20m"]
    assert [size_text(b) for b in (512, 3.2e9, 828.4e9)] == ["512 B", "3.2 GB", "828.4 GB"]


def test_the_first_time_left_is_the_plans_not_one_requests():
    # issue 43: the first line said "55m 32s left" for work that took 1m 09s (one slow first request of 48)
    now = [0.0]
    lines: list[str] = []
    p = Progress("benchmark", "requests", 48, "requests", emit=lines.append, clock=lambda: now[0], planned_s=90)
    now[0] = 70.0
    p.update(1, force=True)
    first = parse_line(lines[-1])[1]
    assert first.eta_planned and first.eta_s == 20.0
    assert lines[-1].split(" #progress ")[0].endswith("20s left (planned)")
    now[0] = 100.0
    p.update(12, force=True)  # a quarter done: its own rate now
    later = parse_line(lines[-1])[1]
    assert not later.eta_planned and later.eta_s == pytest.approx(36 * 100 / 12)
    # no plan: nothing promised from one request
    q = Progress("generate", "samples", 1000, "samples", emit=lines.append, clock=lambda: now[0])
    now[0] = 200.0
    q.update(1, force=True)
    assert parse_line(lines[-1])[1].eta_s is None and "left" not in lines[-1].split(" #progress ")[0]
