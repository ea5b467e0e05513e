"""A stage's progress lines (eagleflow.contracts.progress) as Prefect progress artifacts, updated while it runs.

One artifact per piece of work of the stage (generate's samples, extract's tokens, train's steps,
each engine's load), keyed `eagleflow-<run>-<stage>-<work>-progress` and shown on the task run's
page: the bar is the share done, the description the figures (rate, failures, loss, time left).
The person in the terminal sees the same line without its JSON.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from eagleflow.contracts.progress import ProgressEvent, parse_line
from eagleflow.util.text import duration_text
from tasks.naming import artifact_key

# At most one update per artifact this often (the final one always goes): the server is shared.
MIN_INTERVAL_S = 2.0


def describe(event: ProgressEvent) -> str:
    """The artifact's description: what, how far, the figures, the time left (markdown)."""
    rows = [("done", f"{event.done:,.0f}" + (f" of {event.total:,.0f}" if event.total else "") + f" {event.unit}")]
    if event.rate:
        rows.append(("rate", f"{event.rate:,.1f} {event.unit}/s"))
    rows += [(k, _cell(v)) for k, v in event.figures.items()]
    rows.append(("elapsed", duration_text(event.elapsed_s)))
    if event.final:
        rows.append(("state", "done"))
    elif event.eta_s is not None:
        rows.append(("time left", f"about {duration_text(event.eta_s)}"))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"**{event.label}**: {event.percent:.1f}%\n\n| | |\n|---|---|\n{table}"


def _cell(v: object) -> str:
    if isinstance(v, list):
        return " / ".join(f"{x:.3f}" for x in v)
    if isinstance(v, float):
        return f"{v:,.4g}"
    return str(v)


class ProgressArtifacts:
    """Turns the progress lines of one stage into artifacts; `line(text)` returns what to log instead."""

    def __init__(self, run_name: str, stage: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.run_name, self.stage, self.clock = run_name, stage, clock
        self.ids: dict[str, UUID] = {}
        self.sent: dict[str, float] = {}
        self.failed = False

    def line(self, text: str) -> str:
        shown, event = parse_line(text)
        if event is not None and not self.failed:
            try:
                self.publish(event)
            except Exception as exc:  # noqa: BLE001 - reporting must never end the stage it reports on
                self.failed = True
                get_run_logger().warning("progress artifacts stopped: %s", exc)
        return shown

    def publish(self, event: ProgressEvent) -> None:
        now = self.clock()
        if not event.final and now - self.sent.get(event.what, -1e9) < MIN_INTERVAL_S:
            return
        self.sent[event.what] = now
        description = describe(event)
        if event.what not in self.ids:
            key = artifact_key("eagleflow", self.run_name, self.stage, event.what, "progress")
            self.ids[event.what] = create_progress_artifact(event.percent, key=key, description=description)
        else:
            update_progress_artifact(self.ids[event.what], event.percent, description=description)
