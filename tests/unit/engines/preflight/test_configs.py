"""Reading drafter configs in every layout (eagleflow.engines.preflight.configs): the fields the
checks need, wherever each layout keeps them."""

from __future__ import annotations

from eagleflow.engines.preflight.configs import drafter_fields


def test_drafter_fields_read_every_layout():
    assert drafter_fields({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}})[
        "eagle_aux_hidden_state_layer_ids"
    ] == [1, 2, 3]
    spec = drafter_fields(
        {
            "speculators_model_type": "eagle3",
            "draft_vocab_size": 32000,
            "transformer_layer_config": {"hidden_size": 7168, "vocab_size": 163840},
            "eagle_aux_hidden_state_layer_ids": [2, 30, 58],
        }
    )
    assert (spec["hidden_size"], spec["vocab_size"], spec["draft_vocab_size"]) == (7168, 163840, 32000)
    assert drafter_fields({"hidden_size": 8})["eagle_aux_hidden_state_layer_ids"] is None
