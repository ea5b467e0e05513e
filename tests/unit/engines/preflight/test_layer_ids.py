"""The aux layer id conventions (eagleflow.engines.preflight.layer_ids): vLLM's id k is the input of
decoder layer k, SpecForge/SGLang's the output of layer k-1; a drafter in the other convention, ids
outside the target, and missing ids are each named with the ids to use. No engine is imported."""

from __future__ import annotations

from eagleflow.engines.preflight.findings import Finding
from eagleflow.engines.preflight.layer_ids import check_aux_layer_ids


def _levels(findings: list[Finding]) -> list[str]:
    return [f.level for f in findings]


def test_layer_ids_shift_between_conventions():
    (f,) = check_aux_layer_ids("new", [1, 30, 57], 61, [2, 30, 58], [2, 31, 58], 3)
    assert f.level == "error" and "one below" in f.message and "[2, 31, 58]" in f.message
    (f,) = check_aux_layer_ids("new", [3, 32, 59], 61, [2, 30, 58], [2, 31, 58], 3)
    assert f.level == "error" and "one above" in f.message
    (f,) = check_aux_layer_ids("new", [2, 31, 58], 61, [2, 30, 58], [2, 31, 58], 3)
    assert f.level == "ok"
    # SGLang adds 1 itself: there the config must hold the training ids minus one.
    (f,) = check_aux_layer_ids("new", [1, 30, 57], 61, None, [2, 31, 58], 3, engine_kind="sglang")
    assert f.level == "ok"
    (f,) = check_aux_layer_ids("new", [2, 31, 58], 61, None, [2, 31, 58], 3, engine_kind="sglang")
    assert f.level == "error" and "one above" in f.message and "[1, 30, 57]" in f.message


def test_sglang_reads_a_deepseek_targets_ids_as_given_unless_they_start_at_1():
    # SGLang 0.5.15's deepseek_v2.py (Kimi-K2.5's too): +1 only when the first id is 1, else the ids as vLLM reads them
    (f,) = check_aux_layer_ids("new", [2, 30, 58], 61, None, [2, 30, 58], 3, engine_kind="sglang", deepseek=True)
    assert f.level == "ok"
    (f,) = check_aux_layer_ids("new", [1, 29, 57], 61, None, [2, 30, 58], 3, engine_kind="sglang", deepseek=True)
    assert f.level == "ok"  # SpecForge's "output of layer i" ids, shifted by SGLang to the same layers
    (f,) = check_aux_layer_ids("new", [2, 30, 58], 61, None, [3, 31, 59], 3, engine_kind="sglang", deepseek=True)
    assert f.level == "error" and "one below" in f.message and "[3, 31, 59]" in f.message
    # the same config ids on a Llama-family target are one layer later
    (f,) = check_aux_layer_ids("new", [2, 30, 58], 61, None, [2, 30, 58], 3, engine_kind="sglang")
    assert f.level == "error" and "one above" in f.message and "[1, 29, 57]" in f.message
    # trained on layer 1 (the MLA demo target's [1, 2, 3]): no config makes SGLang feed it on this family
    (f,) = check_aux_layer_ids("new", [1, 2, 3], 4, None, [1, 2, 3], 3, engine_kind="sglang", deepseek=True)
    assert f.level == "error" and "cannot feed" in f.message and "target.aux_layer_ids" in f.message


def test_layer_ids_without_training_ids():
    (f,) = check_aux_layer_ids("new", [1, 29, 57], 61, [2, 30, 58], None, 3)  # SpecForge [1, L/2-1, L-4]
    assert f.level == "warning" and "other convention" in f.message and "[2, 30, 58]" in f.message
    assert _levels(check_aux_layer_ids("new", [2, 30, 58], 61, [2, 30, 58], None, 3)) == ["ok"]
    errs = check_aux_layer_ids("new", [2, 30, 61], 61, [2, 30, 58], None, 3)
    assert _levels(errs) == ["error"] and "final state" in errs[0].message
    errs = check_aux_layer_ids("new", [2, 30, 70], 61, [2, 30, 58], None, 3)
    assert _levels(errs) == ["error"] and "never captured" in errs[0].message
    errs = check_aux_layer_ids("new", [2, 30], 61, [2, 30, 58], None, 3)
    assert "error" in _levels(errs) and "fc takes 3" in errs[0].message
    assert "warning" in _levels(check_aux_layer_ids("new", [30, 2, 58], 61, [2, 30, 58], None, 3))


def test_missing_layer_ids_name_the_engine_default():
    (f,) = check_aux_layer_ids("new", None, 61, [2, 30, 58], None, 3)
    assert f.level == "warning" and "[2, 30, 58]" in f.message
    (f,) = check_aux_layer_ids("new", None, 61, [2, 30, 58], [2, 31, 58], 3)
    assert f.level == "error" and '"eagle_aux_hidden_state_layer_ids": [2, 31, 58]' in f.message
