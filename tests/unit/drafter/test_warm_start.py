"""Warm starts from public EAGLE-3 drafters (eagleflow.drafter.warm_start): the vLLM, EAGLE
(midlayer) and speculators layouts detected from their keys and loaded onto the same parameters by
the trainer's setup, their draft vocabulary kept, and every mismatch with the target named with its
file, field and both values. Host environment (torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from eagleflow.config.train import TrainConfig  # noqa: E402
from eagleflow.drafter.data import collate, read_index  # noqa: E402
from eagleflow.drafter.errors import FormatError  # noqa: E402
from eagleflow.drafter.objective import ttt_loss  # noqa: E402
from eagleflow.drafter.target import read_target_head  # noqa: E402
from eagleflow.drafter.vocab import DraftVocab  # noqa: E402
from eagleflow.drafter.warm_start import check_warm_start, read_public_drafter  # noqa: E402
from tests.helpers.drafter import (  # noqa: E402
    H,
    V,
    make_model,
    public_tensors,
    target_head,
    write_public_drafter,
    write_synthetic,
)


@pytest.mark.parametrize(
    "layout,norm_before_fc,norm_before_residual",
    [
        ("vllm", True, True),
        ("eagle", False, False),
        ("speculators", False, True),
    ],
)
def test_warm_start_from_public_drafters(tmp_path, layout, norm_before_fc, norm_before_residual):
    """Each layout is detected from its keys; weights land on the same parameters; the public draft
    vocabulary (d2t/t2d) is kept, so its lm_head rows still mean the same target ids. Crosses
    Trainer.setup, which builds the model from the public drafter."""
    from eagleflow.drafter.trainer import Trainer

    root = write_synthetic(tmp_path / "syn")
    index = read_index(root / "data" / "index.json", stage_dir=root)
    target = read_target_head(root / "target")
    model = make_model(
        seed=3,
        draft_vocab_size=16,
        norm_before_fc=norm_before_fc,
        norm_before_residual=norm_before_residual,
        intermediate_size=40,
    )
    vocab = DraftVocab(torch.tensor([0, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 33, 35, 37, 39]), V)
    public = write_public_drafter(tmp_path / "public", layout, model, vocab)
    assert read_public_drafter(public).layout == layout
    cfg = TrainConfig(warm_start=str(public), draft_vocab_size=24, num_threads=1)
    trainer = Trainer(cfg, target, index, tmp_path / "train", [1, 2, 3]).setup()
    arch = trainer.model.arch
    assert (arch.norm_before_fc, arch.norm_before_residual, arch.intermediate_size) == (
        norm_before_fc,
        norm_before_residual,
        40,
    )
    assert torch.equal(trainer.vocab.draft_to_target, vocab.draft_to_target)
    bf16 = {n: t.to(torch.bfloat16).float() for n, t in model.state_dict().items()}
    got = trainer.model.state_dict()
    assert set(got) == set(bf16)
    for name in bf16:
        if name != "embed_weight":
            torch.testing.assert_close(got[name], bf16[name], msg=name)
    # A training step runs on the loaded drafter.
    batch = collate(trainer.train_data, [0, 1])
    loss, _ = ttt_loss(trainer.model, trainer.target, trainer.vocab_rows, batch, 3, 0.8)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("layout", ["vllm", "eagle", "speculators"])
@pytest.mark.parametrize(
    "override,field,values",
    [
        ({"hidden_size": 48}, "hidden_size", ("48", f"{H}")),
        ({"vocab_size": 64}, "vocab_size", ("64", f"{V}")),
        ({"num_hidden_layers": 2}, "num_hidden_layers", ("2", "1 decoder layer")),
    ],
)
def test_warm_start_mismatch_names_file_field_and_values(tmp_path, layout, override, field, values):
    target = target_head()
    target.config = {"num_hidden_layers": 4}
    model = make_model(draft_vocab_size=16)
    vocab = DraftVocab(torch.arange(16) * 2, V) if "vocab_size" not in override else DraftVocab(torch.arange(16), 64)
    public = write_public_drafter(tmp_path / layout, layout, model, vocab, **override)
    with pytest.raises(FormatError) as err:
        check_warm_start(read_public_drafter(public), target, [1, 2, 3])
    msg = str(err.value)
    assert str(public / "config.json") in msg and field in msg and all(v in msg for v in values), msg


def test_warm_start_layer_count_errors(tmp_path):
    """Tensors of a second decoder layer, and aux layers the target does not have, are refused."""
    model = make_model(draft_vocab_size=16)
    vocab = DraftVocab(torch.arange(16) * 2, V)
    public = write_public_drafter(tmp_path / "two", "eagle", model, vocab)
    tensors = public_tensors(model, vocab, "vllm")
    tensors["layers.1.self_attn.q_proj.weight"] = tensors["layers.0.self_attn.q_proj.weight"].clone()
    save_file(tensors, str(public / "model.safetensors"))
    with pytest.raises(FormatError, match=r"num_hidden_layers is 1 \(tensors of layers 1 in .*model.safetensors\)"):
        read_public_drafter(public)

    target = target_head()
    target.config = {"num_hidden_layers": 4}
    deep = write_public_drafter(tmp_path / "deep", "vllm", model, vocab, aux=(2, 30, 58))
    with pytest.raises(FormatError, match=r"eagle_aux_hidden_state_layer_ids is \[2, 30, 58\], .* num_hidden_layers 4"):
        check_warm_start(read_public_drafter(deep), target, [1, 2, 3])
    other = write_public_drafter(tmp_path / "other", "vllm", model, vocab, aux=(0, 1, 2))
    warnings = check_warm_start(read_public_drafter(other), target, [1, 2, 3])
    assert any("[0, 1, 2]" in w and "[1, 2, 3]" in w for w in warnings)
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text("{}")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "bare" / "model.safetensors"))
    with pytest.raises(FormatError, match="cannot tell the layout"):
        read_public_drafter(tmp_path / "bare")


def test_warm_start_vocab_from_t2d_and_inconsistent_lm_head(tmp_path):
    model = make_model(draft_vocab_size=16)
    vocab = DraftVocab(torch.arange(16) * 2 + 1, V)
    public = write_public_drafter(tmp_path / "p", "speculators", model, vocab)
    tensors = public_tensors(model, vocab, "speculators")
    del tensors["d2t"]  # t2d alone still gives the mapping
    save_file(tensors, str(public / "model.safetensors"))
    assert torch.equal(read_public_drafter(public).vocab.draft_to_target, vocab.draft_to_target)
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:10].contiguous()
    save_file(tensors, str(public / "model.safetensors"))
    with pytest.raises(FormatError, match="lm_head.weight has 10 rows"):
        read_public_drafter(public)


def test_a_rebuilt_draft_vocabulary_carries_the_warm_starts_rows_for_the_ids_both_hold(tmp_path):
    """warm_start_vocab 'rebuild' (nightly.rebuild_vocab): the vocabulary comes from this run's data, every
    other weight from the warm start, and the lm_head row of a target id both vocabularies hold is the warm
    start's row for that id."""
    from eagleflow.drafter.trainer import Trainer

    root = write_synthetic(tmp_path / "syn")
    index = read_index(root / "data" / "index.json", stage_dir=root)
    target = read_target_head(root / "target")
    model = make_model(seed=3, draft_vocab_size=16)
    old = DraftVocab(torch.tensor([0, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 33, 35, 37, 39]), V)
    public = write_public_drafter(tmp_path / "public", "vllm", model, old)
    cfg = TrainConfig(warm_start=str(public), warm_start_vocab="rebuild", draft_vocab_size=16, num_threads=1)
    trainer = Trainer(cfg, target, index, tmp_path / "train", [1, 2, 3]).setup()
    new_ids = trainer.vocab.draft_to_target.tolist()
    assert new_ids != old.draft_to_target.tolist()  # built from the synthetic data's counts
    old_row = {t: i for i, t in enumerate(old.draft_to_target.tolist())}
    shared = [(i, old_row[t]) for i, t in enumerate(new_ids) if t in old_row]
    assert shared
    head = model.state_dict()["lm_head.weight"].to(torch.bfloat16).float()
    for i, j in shared:
        torch.testing.assert_close(trainer.model.lm_head.weight[i].detach(), head[j])
    fc = model.state_dict()["fc.weight"].to(torch.bfloat16).float()
    torch.testing.assert_close(trainer.model.state_dict()["fc.weight"], fc)  # the rest: the warm start's
