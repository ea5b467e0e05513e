"""Triage: when a drafter serves far below its offline estimate, find where the acceptance is lost.

The reference run (docs/reference-run.md) served two drafters at 15 % acceptance and could only suspect the engine; the
fault was its verify
step under one attention backend. Three suspects sit on the engine's side and one on ours, and each has a
probe that answers for it alone (the benchmark stage runs them inside its production window, after the
measured windows, each in an engine of its own):

  verify     vLLM's ngram speculation (no drafter model) on prompts built to be copied, against the same
             prompts without speculation; and, free, the measured drafters' temperature-0 answers against no
             speculation's (a correct verify step is lossless)                        (eagleflow.triage.verify)
  plumbing   the engine's own aux and final states for held-out tokens against the states the drafter was
             trained on                                                            (eagleflow.triage.plumbing)
  backends   the same drafter under each other attention backend the engine offers for target and draft,
             k = 1                                                                 (eagleflow.triage.backends)
  drafter    the drafter's lineage (which target its states came from) and the other drafter of the run

`eagleflow.triage.blame` turns the figures into the verdict: "verify step", "hidden-state plumbing",
"attention backend X (Y restores acceptance)" or "the drafter or its data", and what to do.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import Measurement, Triage
from eagleflow.contracts.manifest import Manifest
from eagleflow.contracts.prompts import Messages
from eagleflow.contracts.request import StageError
from eagleflow.triage.blame import decide
from eagleflow.triage.lineage import lineage, same_target, trained_target
from eagleflow.triage.verify import CopyReference, lossless

log = logging.getLogger("eagleflow.triage")

__all__ = ["TriageInputs", "run_triage", "offline_first_position", "CopyReference"]


@dataclass
class TriageInputs:
    """What the benchmark measured, and where the probes' engines and references are."""

    cfg: RunConfig
    stage_dir: Path
    variant: str  # the drafter variant to triage ('drafter' or 'current')
    drafter_dir: str
    trigger: str
    suspect: bool
    windows: list[Measurement]
    answers: dict[str, list[str]]  # temperature-0 answers per variant, same prompts in the same order
    prompts: list[Messages]
    copy_reference: CopyReference | None
    extract: Manifest | None  # the run's own extract stage (upstream), if any
    engine_env: dict[str, str] | None
    other: list[str] = field(default_factory=list)  # what the other drafter of the run scored


def offline_first_position(drafter_dir: str) -> float | None:
    """The offline first-position acceptance eagleflow's trainer measured for a drafter it exported."""
    try:
        val = (json.loads((Path(drafter_dir) / "config.json").read_text()).get("eagleflow") or {}).get("validation")
    except (OSError, ValueError):
        return None
    pos = (val or {}).get("accept_pos")
    return float(pos[0]) if pos else None


def _measured_first_position(windows: list[Measurement], variant: str) -> float | None:
    mine = sorted(
        (w for w in windows if w.variant == variant and w.per_position_acceptance),
        key=lambda w: (w.temperature, w.concurrency),
    )
    return mine[0].per_position_acceptance[0] if mine else None


def run_triage(x: TriageInputs) -> Triage:
    from eagleflow.triage.backends import backend_probe
    from eagleflow.triage.plumbing import plumbing_probe
    from eagleflow.triage.verify import verify_probe

    t = x.cfg.benchmark.triage
    start = time.monotonic()
    skipped: list[str] = []
    facts = list(x.other)
    log.info("triage of %s (%s): probes %s", x.variant, x.trigger, ", ".join(t.probes))
    checks = lossless({v: a for v, a in x.answers.items() if v in ("baseline", x.variant)})

    # Whose states was the drafter trained on? Its lineage names the extract stage and that stage's target.
    _, trained_extract = lineage(x.drafter_dir)
    other_target = None
    reference = x.extract
    if trained_extract is not None:
        tt = trained_target(trained_extract)
        if tt is not None and not same_target(tt, x.cfg.target.model_path):
            other_target = tt
            facts.append(
                f"the drafter's training states came from {tt} ({trained_extract.dir}), not from this "
                f"target {x.cfg.target.model_path}"
            )
        elif reference is None:
            reference = trained_extract
        if tt is not None and other_target is None:
            facts.append(f"the drafter was trained on this target's states ({trained_extract.dir})")
    else:
        facts.append(f"{x.drafter_dir} was not trained by eagleflow (no lineage): its training data is unknown")

    deadline = start + t.max_s

    def attempt(name: str, probe):  # a probe whose engine fails is reported, never the end of the benchmark
        if time.monotonic() >= deadline:
            skipped.append(f"{name}: not run: the triage's budget of {t.max_s:g} s is spent (benchmark.triage.max_s)")
            log.warning("triage: the %s probe not run: its budget of %g s is spent", name, t.max_s)
            return None
        try:
            return probe()
        except StageError as exc:
            skipped.append(f"{name}: {str(exc).splitlines()[0][:600]}")
            log.warning("triage: the %s probe did not run: %s", name, exc)
            return None

    verify = plumbing = backends = None
    probes = t.probes_on(x.cfg.engine.kind)
    # a probe the config asks for that this engine has none of (SGLang: every one) is said, not failed
    skipped += [
        f"{name}: a vLLM probe, not built for engine.kind {x.cfg.engine.kind!r}; the lossless check ran"
        for name in t.probes
        if name not in probes
    ]
    if "verify" in probes:
        if x.copy_reference is None:
            skipped.append("verify: no copy prompts were recorded without speculation (see the stage log)")
        else:
            verify = attempt("verify", lambda: verify_probe(x.cfg, x.copy_reference, x.stage_dir, x.engine_env))
    if "plumbing" in probes:
        if reference is None:
            skipped.append(
                "plumbing: no extract stage of this target to compare with (run the pipeline's extract, "
                "or benchmark a drafter eagleflow trained)"
            )
        else:
            plumbing = attempt("plumbing", lambda: plumbing_probe(x.cfg, reference, x.stage_dir, x.engine_env))
    if "backends" in probes:
        backends = attempt(
            "backends",
            lambda: backend_probe(
                x.cfg,
                x.drafter_dir,
                _measured_first_position(x.windows, x.variant),
                offline_first_position(x.drafter_dir),
                x.prompts,
                x.stage_dir,
                x.engine_env,
                deadline,
            ),
        )
    b = decide(
        suspect=x.suspect,
        lossless=checks,
        min_agreement=t.min_agreement,
        verify=verify,
        plumbing=plumbing,
        backends=backends,
        other_target=other_target,
        drafter_facts=facts,
        skipped=skipped,
    )
    result = Triage(
        variant=x.variant,
        trigger=x.trigger,
        lossless=checks,
        verify=verify,
        plumbing=plumbing,
        backends=backends,
        drafter=facts,
        skipped=skipped,
        blame=b.blame,
        culprit=b.culprit,
        evidence=b.evidence,
        advice=b.advice,
        seconds=time.monotonic() - start,
    )
    log.info("triage: %s (%.0f s)", result.culprit, result.seconds)
    return result
