"""A failed stage as the control side raises it (eagleflow.hosts.base.StageFailed): three lines, and the same three
lines wherever Prefect prints it (its log writes an exception by its repr)."""

from __future__ import annotations

import pickle

from eagleflow.hosts.base import StageFailed


def test_a_failed_stage_reads_as_its_three_lines_in_its_repr_too():
    # issue 43: Prefect's "Encountered exception during execution: StageFailed('...\\ncause: ...')" showed the three
    # lines on one line, with a literal \n between them
    exc = StageFailed(
        "gpu1",
        ["python", "-m", "eagleflow.stages.benchmark", "/w/request.json"],
        1,
        ["INFO loading", "error: engine baseline exited with code 2 while starting; root cause: bad flag"],
        "/w/stage.log",
    )
    lines = repr(exc).splitlines()
    assert lines == [
        "StageFailed: benchmark failed on gpu1 (exit 1)",
        "cause: engine baseline exited with code 2 while starting; root cause: bad flag",
        "logs: gpu1:/w/stage.log",
    ]
    assert "\\n" not in repr(exc)
    assert repr(pickle.loads(pickle.dumps(exc))) == repr(exc)  # as Prefect keeps it
