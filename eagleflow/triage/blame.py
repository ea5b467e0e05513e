"""Which suspect the probes blame, with the figures and what to do (pure: no engine, no torch).

In this order, the first that holds:
1. an alternative attention backend restores acceptance -> "attention backend X (Y restores acceptance)";
2. the verify step is wrong (ngram copy prompts, or speculation changed the temperature-0 answers)
   -> "verify step";
3. the engine's captured states are not the ones the drafter was trained on -> "hidden-state plumbing";
4. the engine verifies correctly and feeds the trained states -> "the drafter or its data".
A backend comes first because a backend fault shows in the verify probe too (the reference run's FLASHINFER_MLA
verified without a causal mask); naming the backend that restores acceptance is the sharper answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagleflow.contracts.benchmark_records import BackendProbe, LosslessCheck, PlumbingProbe, VerifyProbe


@dataclass
class Blame:
    blame: str
    culprit: str
    evidence: list[str]
    advice: str


def _shift(plumbing: PlumbingProbe) -> str | None:
    """'id k carries trained id j' for the layers whose closest trained state is another id's."""
    moved = [
        f"id {m.layer_id} carries what the drafter was trained on as id {m.best_id}"
        for m in plumbing.layers
        if m.best_id is not None and m.best_id != m.layer_id
    ]
    lost = [str(m.layer_id) for m in plumbing.layers if m.best_id is None]
    parts = moved + (
        [f"id{'s' if len(lost) > 1 else ''} {', '.join(lost)} match{'' if len(lost) > 1 else 'es'} no trained layer"]
        if lost
        else []
    )
    return "; ".join(parts) or None


def decide(
    *,
    suspect: bool,
    lossless: list[LosslessCheck],
    min_agreement: float,
    verify: VerifyProbe | None,
    plumbing: PlumbingProbe | None,
    backends: BackendProbe | None,
    other_target: str | None,
    drafter_facts: list[str],
    skipped: list[str],
) -> Blame:
    """`suspect`: the triaged drafter serves far below its offline estimate. `other_target`: the target the
    drafter's training states came from, when that is not this one."""
    lossless_bad = [c for c in lossless if c.agreement < min_agreement]
    evidence: list[str] = []
    if backends is not None and backends.restores is not None:
        r, d = backends.restores, backends.default
        side = "target" if r.target_backend != "default" else "draft"
        bad = d.target_backend if side == "target" else d.draft_backend
        alt = r.target_backend if side == "target" else r.draft_backend
        evidence.append(
            f"first-position acceptance {d.first_position_acceptance:.0%} with the {side}'s {bad}, "
            f"{r.first_position_acceptance:.0%} with {alt} (k = 1, same drafter, same prompts)"
        )
        if verify is not None:
            evidence.append(f"verify probe: {verify.reason}")
        how = (
            f"add `--attention-backend {alt}` to engine.extra_args (and to production's launch)"
            if side == "target"
            else f"set benchmark.draft_attention_backend: {alt} (and attention_backend {alt} in production's "
            "speculative config)"
        )
        return Blame(
            "attention backend",
            f"attention backend {bad} ({alt} restores acceptance)",
            evidence,
            f"Serve the {side} with {alt}: {how}. Report {bad} upstream with these figures.",
        )
    if (verify is not None and not verify.healthy) or lossless_bad:
        if verify is not None:
            evidence.append(f"verify probe (no drafter model): {verify.reason}")
        evidence += [
            f"{c.variant}: speculation at temperature 0 reproduced a median {c.agreement:.0%} of the answers "
            f"without speculation ({c.identical} of {c.prompts} identical); a correct verify step is lossless"
            for c in lossless_bad
        ]
        if (
            verify is not None
            and verify.sampled_healthy is False
            and not lossless_bad
            and verify.agreement >= min_agreement
        ):
            return Blame(
                "verify step",
                "verify step (at temperature > 0; sound when greedy)",
                evidence,
                "The engine's sampled verify path (rejection sampling) rejects drafts that its greedy path "
                "accepts, at a temperature as sharp as greedy: acceptance and speed at temperature > 0 are the "
                "engine's, not the drafter's. Trust this engine's temperature-0 figures only. On vLLM's CPU "
                "build the preflight's sampled_verify check names the known fault and its fix (eagleflow's "
                "vLLM plugin eagleflow_fixes); elsewhere report it upstream with the verify probe's figures.",
            )
        return Blame(
            "verify step",
            "verify step",
            evidence,
            "The engine verifies draft tokens wrongly: speculation changes what the target emits, so no drafter "
            "can fix it. Try another attention backend for the target (--attention-backend) or another engine "
            "version, and report it upstream with the verify probe's figures (ngram on copy prompts).",
        )
    if verify is not None:
        evidence.append(f"verify probe: {verify.reason}")
    evidence += [
        f"{c.variant}: lossless at temperature 0 ({c.identical} of {c.prompts} answers identical to no speculation)"
        for c in lossless
        if c not in lossless_bad
    ]
    if plumbing is not None and not plumbing.healthy:
        shift = _shift(plumbing)
        evidence.append(f"plumbing probe: {plumbing.reason}")
        culprit = "hidden-state plumbing" + (f" ({shift})" if shift else "")
        return Blame(
            "hidden-state plumbing",
            culprit,
            evidence,
            "The engine hands the drafter other states than it was trained on. Check the speculative "
            "config's eagle_aux_hidden_state_layer_ids against target.aux_layer_ids and the engine's "
            "convention (vLLM: the input of layer k, SpecForge/SGLang: the output of layer k), the engine's "
            "capture code for this model class (DeepSeek/Kimi before vLLM PR 46973), and any plugin or patch "
            "in the engine (VLLM_PLUGINS); or extract with extract.backend vllm so the drafter learns the "
            "states this engine produces.",
        )
    if plumbing is not None:
        evidence.append(f"plumbing probe: {plumbing.reason}")
    if backends is not None:
        evidence.append(f"backend probe: {backends.reason}")
    evidence += drafter_facts
    engine_clear = plumbing is not None and (verify is not None or bool(lossless))
    if other_target is not None or (engine_clear and suspect):
        culprit = "the drafter or its data" + (f" (trained on the states of {other_target})" if other_target else "")
        return Blame(
            "the drafter or its data",
            culprit,
            evidence,
            "The engine verifies drafts correctly and feeds the drafter the states it was trained on, so the "
            "loss is the drafter's: "
            + (f"it was trained for {other_target}, not this target; " if other_target else "")
            + "retrain it on this target's own answers and states (this pipeline's generate and extract), "
            "and check that the data was rendered with the served chat template and reasoning parser.",
        )
    if engine_clear:
        return Blame(
            "none",
            "no fault found",
            evidence,
            "Nothing to do: the engine and the drafter agree with the offline estimate.",
        )
    return Blame(
        "undetermined",
        "undetermined",
        evidence + [f"not run: {s}" for s in skipped],
        "Run the probes that were skipped (benchmark.triage.probes), with the drafter's training data "
        "at hand for the plumbing probe.",
    )
