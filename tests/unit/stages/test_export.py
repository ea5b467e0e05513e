"""The export stage's ids for SGLang (eagleflow.stages.export.sglang_ids), read off the real demo targets' configs:
eagle_config names the trained layers as SGLang 0.5.15 reads them, and a DeepSeek-architecture target trained on
layer 1, which SGLang cannot feed, is refused by name."""

from __future__ import annotations

import pytest

from eagleflow.config import load_config
from eagleflow.contracts.request import StageError
from eagleflow.engines.preflight.layer_ids import sglang_config_ids
from eagleflow.stages.export import sglang_ids
from tests.conftest import ROOT

SGLANG = {"engine.kind": "sglang", "extract.backend": "hf"}


def test_a_llama_targets_ids_are_one_lower_for_sglang():
    cfg = load_config(ROOT / "configs" / "demo.yaml", SGLANG)
    assert list(cfg.target.aux_layer_ids) == [1, 2, 3] and sglang_ids(cfg) == [0, 1, 2]


def test_a_deepseek_target_trained_on_layer_1_cannot_be_served_by_sglang():
    cfg = load_config(ROOT / "configs" / "demo-mla.yaml", SGLANG)
    with pytest.raises(StageError, match=r"cannot feed a DeepSeek-architecture target's layer 1"):
        sglang_ids(cfg)
    # its 4 layers leave no three aux layers that skip layer 1; Kimi-K2.5's (61 layers) are read as given
    assert sglang_config_ids([2, 30, 58], deepseek=True) == [2, 30, 58]


def test_a_vllm_run_names_sglangs_reading_too_where_sglang_can_be_told():
    # the same directory serves its trained layers on both engines: a vLLM run's export names SGLang's ids in
    # eagle_config as well; where SGLang cannot be told the layers, a vLLM run exports as before (no refusal)
    assert sglang_ids(load_config(ROOT / "configs" / "demo.yaml"), required=False) == [0, 1, 2]
    assert sglang_ids(load_config(ROOT / "configs" / "demo-mla.yaml"), required=False) is None
