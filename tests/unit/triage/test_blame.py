"""The triage's blame (eagleflow.triage.blame) on probe records: which suspect each pattern of figures names,
and in which order. The probes themselves run against real vLLM in tests/e2e/flows/test_triage.py."""

from __future__ import annotations

from eagleflow.contracts.benchmark_records import BackendProbe, BackendRun, LayerMatch, PlumbingProbe, VerifyProbe
from eagleflow.triage.blame import decide
from eagleflow.triage.verify import lossless, prefix_share


def verify(healthy: bool = True) -> VerifyProbe:
    return VerifyProbe(
        prompts=8,
        method="ngram",
        acceptance_rate=0.79 if healthy else 0.06,
        copy_rate=0.3,
        agreement=1.0 if healthy else 0.02,
        healthy=healthy,
        reason="r",
    )


def plumbing(shift: bool = False, foreign: bool = False) -> PlumbingProbe:
    ids = [1, 2, 3, 4]
    if foreign:
        layers = [LayerMatch(layer_id=i, rel_err=0.9, cosine=0.4, best_id=None, best_rel_err=0.8) for i in ids]
    elif shift:  # asked for k, captured k - 1: id 2 holds trained id 1, id 3 trained id 2; id 1 holds layer 0
        layers = [
            LayerMatch(layer_id=1, rel_err=0.7, cosine=0.7, best_id=None, best_rel_err=0.7),
            LayerMatch(layer_id=2, rel_err=0.5, cosine=0.8, best_id=1, best_rel_err=0.01),
            LayerMatch(layer_id=3, rel_err=0.4, cosine=0.9, best_id=2, best_rel_err=0.01),
            LayerMatch(layer_id=4, rel_err=0.01, cosine=0.99, best_id=4, best_rel_err=0.01),
        ]
    else:
        layers = [LayerMatch(layer_id=i, rel_err=0.01, cosine=0.9999, best_id=i, best_rel_err=0.01) for i in ids]
    return PlumbingProbe(
        reference="x", sequences=8, tokens=2000, layers=layers, healthy=not (shift or foreign), reason="r"
    )


def backends(restore: bool) -> BackendProbe:
    default = BackendRun(
        target_backend="FLASHINFER_MLA", draft_backend="FLASHINFER_MLA", first_position_acceptance=0.02
    )
    runs = [
        BackendRun(
            target_backend="TRITON_MLA", draft_backend="default", first_position_acceptance=0.6 if restore else 0.03
        )
    ]
    return BackendProbe(
        default=default,
        offered={"target": ["FLASHINFER_MLA", "TRITON_MLA"], "draft": []},
        runs=runs,
        restores=runs[0] if restore else None,
        reason="r",
    )


def blame(**kw):
    args = dict(
        suspect=True,
        lossless=[],
        min_agreement=0.9,
        verify=verify(),
        plumbing=plumbing(),
        backends=None,
        other_target=None,
        drafter_facts=[],
        skipped=[],
    )
    return decide(**{**args, **kw})


def test_each_pattern_names_its_suspect():
    assert blame().blame == "the drafter or its data"
    assert blame(verify=verify(healthy=False)).blame == "verify step"
    b = blame(plumbing=plumbing(shift=True))
    assert b.blame == "hidden-state plumbing"
    assert "id 2 carries what the drafter was trained on as id 1" in b.culprit and "id 1 matches no" in b.culprit
    b = blame(verify=verify(healthy=False), backends=backends(restore=True))
    assert b.culprit == "attention backend FLASHINFER_MLA (TRITON_MLA restores acceptance)"
    assert "--attention-backend TRITON_MLA" in b.advice
    assert blame(backends=backends(restore=False)).blame == "the drafter or its data"


def test_a_clean_drafter_gets_no_false_alarm():
    b = blame(suspect=False)
    assert b.blame == "none" and b.culprit == "no fault found"


def test_a_drafter_trained_for_another_target_is_named_by_its_lineage_once_the_plumbing_is_clear():
    # The plumbing probe compares the engine's states with this run's own extract, so a foreign drafter leaves it
    # healthy. States that do not match are the plumbing's finding, and it comes first, lineage or not.
    b = blame(plumbing=plumbing(foreign=True), other_target="/models/other")
    assert b.blame == "hidden-state plumbing"
    b = blame(other_target="/models/other")
    assert b.blame == "the drafter or its data" and "/models/other" in b.culprit


def test_speculation_that_changes_the_answers_is_the_verify_step_even_without_the_ngram_probe():
    checks = lossless({"baseline": ["abcdef", "xyz"], "drafter": ["abQ", "xQ"]})
    assert checks[0].identical == 0 and checks[0].agreement < 0.9
    assert blame(verify=None, lossless=checks).blame == "verify step"
    ok = lossless({"baseline": ["abc", "xyz"], "drafter": ["abc", "xyz"]})
    assert ok[0].agreement == 1.0 and blame(verify=None, lossless=ok).blame == "the drafter or its data"


def test_without_the_plumbing_probe_the_drafter_is_not_blamed():
    b = blame(plumbing=None, skipped=["plumbing: no extract stage"])
    assert b.blame == "undetermined" and any("no extract stage" in e for e in b.evidence)


def test_prefix_share():
    assert prefix_share([1, 2, 3], [1, 2, 3]) == 1.0
    assert prefix_share([1, 9, 3], [1, 2, 3, 4]) == 0.25
    assert prefix_share([], []) == 1.0
    # lossless() scores each drafter variant against the baseline with it: 1 of 2 identical, the other half kept
    (check,) = lossless({"baseline": ["abcd", "wxyz"], "drafter": ["abcd", "wxQQ"]})
    assert (check.variant, check.prompts, check.identical) == ("drafter", 2, 1)
    assert check.agreement == (1.0 + prefix_share("wxQQ", "wxyz")) / 2 == 0.75


def test_a_sampled_path_that_rejects_what_greedy_accepts_is_the_verify_step_at_temperature():
    v = verify().model_copy(
        update={"sampled_temperature": 0.01, "sampled_acceptance_rate": 0.0, "sampled_healthy": False, "healthy": False}
    )
    b = blame(verify=v)
    assert b.blame == "verify step" and b.culprit == "verify step (at temperature > 0; sound when greedy)"


def test_the_plumbing_comparison_finds_a_shifted_layer_chunk_by_chunk():
    import torch

    from eagleflow.triage import plumbing

    g = torch.Generator().manual_seed(0)
    trained = torch.randn(1300, 4, 16, generator=g)  # [T, 4, H]: more tokens than one chunk
    engine = trained + 0.001 * torch.randn(trained.shape, generator=g)
    engine[:, 1] = trained[:, 0]  # the engine's id-2 slot holds what was trained as id 1
    rel, cos = plumbing.compare(engine, trained)
    assert rel.shape == (4, 4) and rel[0, 0] < 0.01 and rel[3, 3] < 0.01
    assert rel[1, 0] < 1e-6 and rel[1, 1] > 0.5 and cos[1, 0] > 0.999
