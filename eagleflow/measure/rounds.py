"""One measured benchmark window: its rounds of requests, and the record they make.

A window is a variant at one temperature and concurrency; a round is `concurrency` held-out prompts sent together.
The rounds' wall times, tokens and (a drafter) drafting counters are what the paired speedup and the acceptance
length's interval are computed from (eagleflow.measure.intervals), and what the stopping rule watches.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Protocol

from eagleflow.contracts.benchmark_records import Measurement
from eagleflow.engines.chat import ChatResult
from eagleflow.measure.intervals import Estimate, acceptance_length, paired_speedup


class Counters(Protocol):
    """What a window reads of the engine it measured (an engine of the stage's own, or production's endpoint)."""

    def latency(self, before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]: ...

    def acceptance(self, before: dict[str, float], after: dict[str, float], k: int) -> dict[str, Any]: ...


def window_acceptance(
    server: Counters, results: list[ChatResult], before: dict[str, float], after: dict[str, float], k: int
) -> dict[str, Any]:
    """Acceptance over a window: from its answers where each reports its own (SGLang's meta_info: exact per
    request, per position too), else the engine's counters between the two snapshots (vLLM)."""
    from_answers = getattr(server, "answers_acceptance", None)
    got = from_answers(results, k) if from_answers is not None else None
    return got if got is not None else server.acceptance(before, after, k)


@dataclasses.dataclass
class WindowRecorder:
    """Collects one measured window (a variant at one temperature and concurrency): the answers, the
    wall time, the engine's counters before and after; `measurement` turns them into the record."""

    variant: str
    temperature: float
    concurrency: int
    results: list[ChatResult] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    before: dict[str, float] = dataclasses.field(default_factory=dict)
    after: dict[str, float] = dataclasses.field(default_factory=dict)
    round_seconds: list[float] = dataclasses.field(default_factory=list)
    round_tokens: list[int] = dataclasses.field(default_factory=list)
    round_drafts: list[float] = dataclasses.field(default_factory=list)
    round_accepted: list[float] = dataclasses.field(default_factory=list)
    stopped: str | None = None

    def add(self, results: list[ChatResult], seconds: float, counters: tuple[float, float] | None = None) -> None:
        """One round: its answers, its wall time and (a drafter) its (drafting steps, accepted drafts)."""
        self.results += results
        self.seconds += seconds
        self.round_seconds.append(seconds)
        self.round_tokens.append(sum(r.completion_tokens for r in results))
        if counters is not None:
            self.round_drafts.append(counters[0])
            self.round_accepted.append(counters[1])

    def estimates(self, reference: Measurement | WindowRecorder | None) -> list[Estimate | None]:
        """The figures the stopping rule watches: the paired speedup over `reference` (the baseline's rounds)
        and the acceptance length."""
        speedup = None
        if reference is not None and reference.round_seconds and reference.round_tokens:
            speedup = paired_speedup(
                reference.round_seconds, reference.round_tokens, self.round_seconds, self.round_tokens
            )
        return [speedup, acceptance_length(self.round_accepted, self.round_drafts)]

    def measurement(self, server: Counters, k: int) -> Measurement:
        tokens = sum(r.completion_tokens for r in self.results)
        latency = sorted(r.latency_s for r in self.results if r.latency_s is not None)
        drafter = not self.variant.startswith("baseline")  # "baseline" and "baseline-again": no speculation
        al = acceptance_length(self.round_accepted, self.round_drafts) if drafter else None
        return Measurement(
            variant=self.variant,
            temperature=self.temperature,
            concurrency=self.concurrency,
            output_tok_s=tokens / self.seconds,
            output_tokens=tokens,
            seconds=self.seconds,
            requests=len(self.results),
            # Latencies from the engine's own histograms; the client's round trip beside them.
            **server.latency(self.before, self.after),
            client_latency_ms_p50=1000 * statistics.median(latency) if latency else None,
            **(window_acceptance(server, self.results, self.before, self.after, k) if drafter else {}),
            round_seconds=self.round_seconds,
            round_tokens=self.round_tokens,
            round_drafts=self.round_drafts if drafter else None,
            round_accepted=self.round_accepted if drafter else None,
            al_interval=[al.low, al.high] if al and al.n > 1 else None,
            stopped=self.stopped,
        )
