"""Progress of long work as lines of the stage's log: one a person reads, the control side parses.

At most every `every_s` seconds, and when the work ends, a stage logs one line such as

    progress generate: 480/1150 samples (41.7%), output tok/s 352, failed 0, 3m 10s left #progress {...}

The text before ` #progress ` is for a person (the terminal, the Prefect log, stage.log on the host);
the JSON after it is a `ProgressEvent`, which the control side (tasks/progress.py) turns into a
Prefect progress artifact and strips from the line it logs. Progress is reporting only: nothing a
stage computes or writes depends on it, or on the clock it reads.

At Kimi scale generate runs for hours, extract for hours and writes hundreds of GB, an engine takes
half an hour to load 64 checkpoint shards: the rate and the time left are what an operator asks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from eagleflow.util.text import duration_text

MARK = " #progress "
EVERY_S = 5.0  # a line every few seconds: enough to watch, few enough to read back
# The share of the work done before its own rate is trusted for the time left: one request, one shard of a
# thousand, says how fast the first went (a cold engine, an empty cache), not how fast the rest will. Before it,
# the time left is the plan's (`planned_s`), or not said.
RATE_AFTER = 0.05

log = logging.getLogger("eagleflow.contracts.progress")

Figure = float | int | str | list[float]


class ProgressEvent(BaseModel):
    """One progress report of one piece of work of a stage."""

    stage: str = Field(description="The stage doing the work (generate, extract, train, benchmark).")
    what: str = Field(description="Which work within the stage: samples, tokens, steps, engine-load.")
    label: str = Field(description="How a person names it: 'generate', 'engine drafter load'.")
    done: float
    total: float | None = Field(None, description="None when the end is not known in advance.")
    unit: str
    elapsed_s: float = Field(description="Seconds since this process started the work.")
    rate: float | None = Field(None, description="Units a second, over the work this process did.")
    eta_s: float | None = Field(None, description="Seconds left at that rate; None while the rate is unknown.")
    eta_planned: bool = Field(False, description="eta_s is the plan's, not yet this work's own rate.")
    figures: dict[str, Figure] = Field(default_factory=dict, description="What else a person watches: tok/s, loss.")
    final: bool = Field(False, description="The last report: the work is over.")

    @property
    def percent(self) -> float:
        """0-100, as Prefect's progress artifact takes it; 0 while the total is unknown."""
        if not self.total:
            return 100.0 if self.final else 0.0
        return max(0.0, min(100.0, 100.0 * self.done / self.total))

    def text(self) -> str:
        """The line a person reads."""
        count = f"{_num(self.done)}/{_num(self.total)}" if self.total else _num(self.done)
        parts = [f"{count} {self.unit}" + (f" ({self.percent:.1f}%)" if self.total else "")]
        parts += [f"{k} {_fig(v)}" for k, v in self.figures.items()]
        if self.final:
            parts.append(f"done in {duration_text(self.elapsed_s)}")
        elif self.eta_s is not None:
            parts.append(f"{duration_text(self.eta_s)} left" + (" (planned)" if self.eta_planned else ""))
        return f"progress {self.label}: " + ", ".join(parts)

    def line(self) -> str:
        return self.text() + MARK + self.model_dump_json()


def parse_line(line: str) -> tuple[str, ProgressEvent | None]:
    """(what to show, the event) of a log line; a line without a progress event comes back as it is."""
    text, sep, payload = line.partition(MARK)
    if not sep:
        return line, None
    try:
        return text, ProgressEvent.model_validate_json(payload)
    except ValueError:
        return line, None


class Progress:
    """Reports one piece of work: `update(done, **figures)` as it goes, `finish()` at its end.

    `start` is work already done before this process began (shards of an earlier attempt): it counts
    toward `done`, not toward the rate, so the time left is not promised from work that cost nothing.
    `planned_s`: what the capacity plan gave this work, the time left until a share `RATE_AFTER` of it is done.
    """

    def __init__(
        self,
        stage: str,
        what: str,
        total: float | None,
        unit: str,
        *,
        label: str | None = None,
        start: float = 0,
        every_s: float = EVERY_S,
        emit: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        planned_s: float | None = None,
    ) -> None:
        self.stage, self.what, self.total, self.unit = stage, what, total, unit
        self.label = label or stage
        self.start, self.done = start, start
        self.every_s, self.clock = every_s, clock
        self.emit = emit or log.info
        self.planned_s = planned_s
        self.t0 = clock()
        self.last: float | None = None
        self.figures: dict[str, Figure] = {}

    def restart_clock(self) -> None:
        """Count the rate from now (what came before, an engine's load, was not this work)."""
        self.t0 = self.clock()

    def due(self) -> bool:
        """Whether the next `update` prints: ask before computing figures that cost something."""
        return self.last is None or self.clock() - self.last >= self.every_s

    def event(self, final: bool = False) -> ProgressEvent:
        elapsed = self.clock() - self.t0
        worked = self.done - self.start
        rate = worked / elapsed if worked > 0 and elapsed > 0 else None
        eta, planned = None, False
        if self.total and not final:
            if rate and worked >= RATE_AFTER * (self.total - self.start):
                eta = (self.total - self.done) / rate
            elif self.planned_s is not None:
                eta, planned = max(self.planned_s - elapsed, 0.0), True
        return ProgressEvent(
            stage=self.stage,
            what=self.what,
            label=self.label,
            done=self.done,
            total=self.total,
            unit=self.unit,
            elapsed_s=round(elapsed, 2),
            rate=rate,
            eta_s=eta,
            eta_planned=planned,
            figures=dict(self.figures),
            final=final,
        )

    def update(self, done: float | None = None, figures: dict[str, Any] | None = None, *, force: bool = False) -> bool:
        """Record `done` and `figures` ({"output tok/s": 352}); print a line when one is due or `force`.
        Returns whether it printed."""
        if done is not None:
            self.done = done
        self.figures.update({k: v for k, v in (figures or {}).items() if v is not None})
        if not (force or self.due()):
            return False
        self.last = self.clock()
        self.emit(self.event().line())
        return True

    def finish(self, done: float | None = None, figures: dict[str, Any] | None = None) -> None:
        if done is not None:
            self.done = done
        self.figures.update({k: v for k, v in (figures or {}).items() if v is not None})
        self.last = self.clock()
        self.emit(self.event(final=True).line())


def _num(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.1f}"


def _fig(v: Figure) -> str:
    if isinstance(v, list):
        return "/".join(f"{x:.2f}" for x in v)
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)
