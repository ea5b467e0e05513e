"""What SGLang would serve of a drafter (eagleflow.engines.preflight.sglang.sglang_drafter_checks), on drafters the
project's own export writes: SGLang 0.5.15 skips weights its EAGLE-3 layer does not know, so a drafter trained with
a norm that layer lacks would load and draft wrongly; the preflight says so by name. SGLang is not needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagleflow.config.train import TrainConfig
from eagleflow.engines.preflight.configs import safetensors_shapes
from eagleflow.engines.preflight.layer_ids import check_aux_layer_ids
from eagleflow.engines.preflight.sglang import check_moe_layer_freq, sglang_checks, sglang_drafter_checks
from tests.conftest import ROOT
from tests.make_drafter import make_drafter


def _checks(drafter: Path, max_model_len: int = 1024, **edit) -> list:
    cfg = json.loads((drafter / "config.json").read_text())
    cfg.update(edit)
    return sglang_drafter_checks("new", str(drafter), cfg, safetensors_shapes(drafter), max_model_len)


@pytest.fixture(scope="module")
def drafters(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("drafters")
    sglang = TrainConfig(norm_before_fc=False, norm_before_residual=False)
    return {
        "default": make_drafter(out / "default"),
        "sglang": make_drafter(out / "sglang", train=sglang, sglang=True),
        "mla": make_drafter(out / "mla", target_dir=ROOT / "demo" / "target-mla", train=sglang),
    }


def test_the_default_layout_is_refused_by_the_norms_sglang_would_drop(drafters):
    errors = [f.message for f in _checks(drafters["default"]) if f.level == "error"]
    assert len(errors) == 2
    assert "norm_before_fc" in errors[0] and "train.norm_before_fc: false" in errors[0]
    assert "norm_before_residual" in errors[1] and "train.norm_before_residual: false" in errors[1]


def test_a_drafter_trained_for_sglang_passes_on_both_layers(drafters):
    for name in ("sglang", "mla"):
        (f,) = _checks(drafters[name])
        assert f.level == "ok", f.message
    assert "Eagle3DeepseekV2ForCausalLM" in _checks(drafters["mla"])[0].message


def test_what_sglang_ignores_or_refuses_is_named(drafters):
    d = drafters["sglang"]
    (f,) = _checks(d, max_model_len=4096)  # the export keeps the target's 2,048 positions
    assert f.level == "error" and "max_position_embeddings 2048" in f.message and "engine.max_model_len" in f.message
    (f,) = _checks(d, architectures=["Eagle3Speculator"], speculators_model_type="eagle3")
    assert f.level == "error" and "speculators' format" in f.message


def test_the_export_for_sglang_names_the_trained_layers_in_each_engines_reading(drafters):
    """vLLM reads the top level's ids first (its convention), SGLang only eagle_config's (its own): a drafter exported
    for SGLang serves its trained layers [1, 2, 3] on both."""
    cfg = json.loads((drafters["sglang"] / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # SGLang adds 1 on a Llama target
    (f,) = check_aux_layer_ids("new", [0, 1, 2], 4, None, [1, 2, 3], 3, engine_kind="sglang")
    assert f.level == "ok"
    # the default export names vLLM's ids in both places: on SGLang every state would come one layer late
    plain = json.loads((drafters["default"] / "config.json").read_text())["eagle_config"]
    found = check_aux_layer_ids("new", plain["eagle_aux_hidden_state_layer_ids"], 4, None, [1, 2, 3], 3, "sglang")
    assert {f.level for f in found} == {"error"} and any("one above" in f.message for f in found)


def test_a_deepseek_target_without_moe_layer_freq_is_refused_before_sglang_loads_it():
    """SGLang 0.5.15 reads moe_layer_freq with no default; transformers' DeepseekV3Config never writes it. The MLA
    demo target carries it (its builder writes it); the check runs whether SGLang imports here or not."""
    mla = json.loads((ROOT / "demo" / "target-mla" / "config.json").read_text())
    assert check_moe_layer_freq(mla, "demo/target-mla").level == "ok"
    without = {k: v for k, v in mla.items() if k != "moe_layer_freq"}
    found = [f for f in sglang_checks(without, "t") if f.check == "moe_layer_freq"]
    assert [f.level for f in found] == ["error"] and "t/config.json has no moe_layer_freq" in found[0].message
    assert '"moe_layer_freq": 1' in found[0].message
    kimi = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {**without, "model_type": "kimi_k2"}}
    assert "(text_config)" in check_moe_layer_freq(kimi, "k").message
    dense = json.loads((ROOT / "demo" / "target" / "config.json").read_text())
    assert check_moe_layer_freq(dense, "demo/target") is None
    assert check_moe_layer_freq({**without, "n_routed_experts": None}, "t") is None  # a dense DeepSeek
