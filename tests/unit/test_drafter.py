"""Unit tests of the EAGLE-3 drafter: shapes, the TTT attention layout against engine-style
drafting, the draft vocabulary, label alignment and loss masking per unroll step, the KL loss,
checkpoint/export names as vLLM loads them, warm starts from public drafters in the vLLM, EAGLE
and speculators layouts, gradient accumulation, resume state, and the train/export stages end to
end on a tiny synthetic target. Host environment (torch). Killing and resuming a real stage
process, and torchrun, are in tests/integration/test_trainer.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from eagleflow.drafter.config import TrainConfig  # noqa: E402
from eagleflow.drafter.data import Batch, SequenceStore, collate, make_batches, read_index  # noqa: E402
from eagleflow.drafter.formats import (  # noqa: E402
    FormatError, export_vllm, load_checkpoint, read_target_head, save_checkpoint, vllm_weight_names,
)
from eagleflow.drafter.model import DrafterArch, Eagle3Drafter, TargetHead, rms_norm  # noqa: E402
from eagleflow.drafter.trainer import StepStats, engine_walk, label_positions, ttt_loss  # noqa: E402
from eagleflow.drafter.vocab import DraftVocab, count_tokens  # noqa: E402

torch.set_num_threads(1)

V, H = 40, 32


def make_arch(**kw) -> DrafterArch:
    base = dict(hidden_size=H, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                rms_norm_eps=1e-5, rope_theta=10000.0, vocab_size=V, draft_vocab_size=V, target_hidden_size=H,
                max_position_embeddings=256)
    return DrafterArch(**{**base, **kw})


def make_model(seed: int = 0, **kw) -> Eagle3Drafter:
    torch.manual_seed(seed)
    model = Eagle3Drafter(make_arch(**kw), torch.randn(V, H))
    # Random (not unit) norms so a wrong norm placement shows up.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model.eval()


# ------------------------------------------------------------------------------------ model

def test_shapes():
    model = make_model(draft_vocab_size=24)
    aux, ids = torch.randn(3, 11, 3 * H), torch.randint(0, V, (3, 11))
    outs, qpos = model.ttt_forward(aux, ids, steps=4)
    assert len(outs) == 4 and qpos.shape == (3, 11)
    assert all(o.shape == (3, 11, H) for o in outs)
    assert model.logits(outs[0]).shape == (3, 11, 24)
    assert model.combine_hidden_states(aux).shape == (3, 11, H)


@pytest.mark.parametrize("norm_before_residual", [True, False])
def test_ttt_unroll_equals_engine_style_drafting(norm_before_residual):
    """Step i of the unroll at index p == the i-th draft made with a KV cache the way vLLM's
    proposer drafts after the target has verified up to position p: a first pass over positions
    0..p (token x[s+1], target state s), then tokens x[p+1+i] at positions p+i fed the previous
    pre-norm output, each attending to everything cached. This pins the TTT mask, the rotary
    positions and the hidden-state feedback."""
    model = make_model(norm_before_residual=norm_before_residual)
    t, k = 14, 3
    aux, ids = torch.randn(1, t, 3 * H), torch.randint(0, V, (1, t))
    with torch.no_grad():
        outs, _ = model.ttt_forward(aux, ids, k)
        for p in range(t - k):
            kv: list = []
            normed, pre = model.prefill(aux[:, : p + 1], ids[:, 1 : p + 2], kv)
            ref = [normed[0, -1]]
            hidden = pre[:, -1:]
            for i in range(1, k):
                normed, hidden = model.decode_one_token(ids[:, p + 1 + i : p + 2 + i], hidden, p + i, kv)
                ref.append(normed[0, 0])
            for i in range(k):
                torch.testing.assert_close(outs[i][0, p], ref[i], atol=1e-4, rtol=1e-4)


def test_ttt_is_causal_and_batch_independent():
    model = make_model()
    t, k, p = 12, 3, 5
    aux, ids = torch.randn(2, t, 3 * H), torch.randint(0, V, (2, t))
    with torch.no_grad():
        base, _ = model.ttt_forward(aux, ids, k)
        aux2, ids2 = aux.clone(), ids.clone()
        aux2[:, p + 1 :] += 3.0  # target states after p
        ids2[0, p + 1 + k :] = (ids2[0, p + 1 + k :] + 1) % V  # tokens no step at p reads
        aux2[1] = torch.randn(t, 3 * H)  # another sequence in the batch
        moved, _ = model.ttt_forward(aux2, ids2, k)
    for i in range(k):
        torch.testing.assert_close(base[i][0, : p + 1], moved[i][0, : p + 1])
        assert not torch.allclose(base[i][1, : p + 1], moved[i][1, : p + 1])


def test_ttt_query_window_equals_full_unroll():
    """Computing outputs only for a window of context ends (per-row start) changes nothing inside it."""
    model = make_model()
    t, k = 16, 3
    aux, ids = torch.randn(2, t, 3 * H), torch.randint(0, V, (2, t))
    start = torch.tensor([5, 2])
    with torch.no_grad():
        full, _ = model.ttt_forward(aux, ids, k)
        win, qpos = model.ttt_forward(aux, ids, k, query_start=start, query_len=7)
    assert qpos.tolist() == [list(range(5, 12)), list(range(2, 9))]
    for i in range(k):
        for row in range(2):
            torch.testing.assert_close(win[i][row], full[i][row, qpos[row]], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------ vocab

def test_draft_vocab_top_k_and_offsets():
    counts = torch.tensor([5, 0, 9, 9, 1, 7, 0, 3])
    vocab = DraftVocab.from_counts(counts, 4)
    assert vocab.draft_to_target.tolist() == [0, 2, 3, 5]
    draft_ids = torch.arange(vocab.size)
    assert (draft_ids + vocab.d2t).tolist() == [0, 2, 3, 5]  # target_id = draft_id + d2t[draft_id]
    assert vocab.t2d.tolist() == [True, False, True, True, False, True, False, False]
    back = DraftVocab.from_d2t(vocab.d2t, 8)
    assert torch.equal(back.draft_to_target, vocab.draft_to_target)
    assert torch.equal(vocab.t2d.nonzero().flatten(), vocab.draft_to_target)
    assert not vocab.is_full


def test_draft_vocab_full_and_fill():
    full = DraftVocab.from_counts(torch.tensor([1, 2, 3]), 10)
    assert full.is_full and full.size == 3 and full.d2t.tolist() == [0, 0, 0]
    sparse = DraftVocab.from_counts(torch.tensor([0, 0, 4, 0, 0, 0]), 3)  # unseen ids fill, lowest first
    assert sparse.draft_to_target.tolist() == [0, 1, 2]
    ids = torch.tensor([1, 2, 2, 7])
    assert count_tokens(ids, torch.tensor([0, 1, 1, 1]), 8).tolist() == [0, 0, 2, 0, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        count_tokens(ids, torch.ones(4), 5)


# ------------------------------------------------------------------------- label alignment

class _Oracle:
    """A 'drafter' whose step i at index p outputs the target's own normed final state of the
    position `p + 1 + i + offset`; with offset 0 it should match the target everywhere."""

    def __init__(self, target: TargetHead, final: torch.Tensor, offset: int) -> None:
        self.target, self.final, self.offset = target, final, offset

    def ttt_forward(self, aux, input_ids, steps, query_start, query_len):
        b, t, _ = self.final.shape
        normed = rms_norm(self.final, self.target.norm_weight, self.target.rms_norm_eps)
        qpos = query_start[:, None] + torch.arange(query_len)[None, :]
        outs = []
        for i in range(steps):
            src = (qpos + 1 + i + self.offset).clamp(0, t - 1)
            outs.append(normed.gather(1, src[..., None].expand(-1, -1, H)))
        return outs, qpos

    def logits(self, normed):
        return normed @ self.target.lm_head.T


def _target(seed: int = 0) -> TargetHead:
    g = torch.Generator().manual_seed(seed)
    return TargetHead(embed_tokens=torch.randn(V, H, generator=g), norm_weight=torch.rand(H, generator=g) + 0.5,
                      rms_norm_eps=1e-5, lm_head=torch.randn(V, H, generator=g) * 3, config={})


def test_labels_are_the_targets_distribution_at_p_plus_1_plus_i():
    target = _target()
    b, t, k = 2, 20, 3
    final = torch.randn(b, t, H)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[:, :4] = False  # prompt
    batch = Batch(torch.randint(0, V, (b, t)), mask, torch.tensor([t, t - 5]), torch.randn(b, t, 3 * H), final)
    rows = torch.arange(V)
    _, good = ttt_loss(_Oracle(target, final, 0), target, rows, batch, k, 0.8, walk=True)
    s = good.summary(0.8)
    assert s["acc"] == [1.0] * k and s["acceptance_length"] == pytest.approx(1 + k)
    assert s["acceptance_length_uniform"] == pytest.approx(1 + k)
    logp = torch.log_softmax(target.logits(final[label_positions(batch)]), -1)
    entropy = -(logp.exp() * logp).sum(-1).mean().item()
    assert s["loss_per_step"][0] == pytest.approx(entropy, rel=1e-3)  # soft CE of a perfect drafter
    _, off = ttt_loss(_Oracle(target, final, -1), target, rows, batch, k, 0.8)  # one position early
    assert max(off.summary(0.8)["acc"]) < 0.5


def test_label_positions_and_acceptance_chain():
    ids = torch.zeros(1, 8, dtype=torch.int64)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    batch = Batch(ids, mask, torch.tensor([7]), torch.zeros(1, 8, 3 * H), torch.zeros(1, 8, H))
    # assistant input token (mask) and a next token inside the sequence (j <= len-2 = 5)
    assert label_positions(batch)[0].tolist() == [False, False, False, True, True, True, False, False]
    stats = StepStats(3, correct=torch.tensor([9.0, 6, 3]), count=torch.tensor([10.0, 10, 10]),
                      chain_accepted=torch.tensor([9.0, 5, 2]), chain_count=10)
    s = stats.summary(0.8)
    assert s["accept_pos_uniform"] == [0.9, 0.5, 0.2]
    assert s["acceptance_length_uniform"] == pytest.approx(2.6)
    assert s["acceptance_length_indep"] == pytest.approx(1 + 0.9 + 0.9 * 0.6 + 0.9 * 0.6 * 0.3)


def test_engine_walk_replays_greedy_verification():
    """Answer starts at index 3, so the first round drafts at p=2; accepting a drafts moves to p+a+1."""
    n, k = 12, 3
    correct = torch.ones(k, 1, n, dtype=torch.bool)
    correct[2, 0, 2] = False  # p=2: accepts 2 -> next p=5
    correct[0, 0, 5] = False  # p=5: accepts 0 -> next p=6; p=6 accepts 3 -> p=10, past the end
    correct[:, 0, [3, 4, 7]] = False  # never visited
    mask = torch.tensor([[0, 0, 0] + [1] * 9], dtype=torch.bool)
    drafts, accepted = engine_walk(correct, mask, torch.tensor([n]))
    assert drafts == 3 and accepted.tolist() == [2, 2, 1]
    stats = StepStats(3, walk_accepted=accepted, walk_drafts=drafts)
    assert stats.summary(0.8)["acceptance_length"] == pytest.approx(1 + 5 / 3, abs=1e-4)


# ------------------------------------------------------------------------ formats / vLLM

def test_checkpoint_and_vllm_export_layout(tmp_path):
    model = make_model(draft_vocab_size=16)
    vocab = DraftVocab(torch.arange(0, 32, 2), V)
    save_checkpoint(tmp_path / "ckpt", model, vocab, {"aux_layer_ids": [1, 2, 3], "epoch": 1})
    arch, weights, vocab2, meta = load_checkpoint(tmp_path / "ckpt")
    assert arch == model.arch and torch.equal(vocab2.draft_to_target, vocab.draft_to_target)
    torch.testing.assert_close(weights["fc.weight"], model.fc.weight)

    out = export_vllm(tmp_path / "ckpt", tmp_path / "vllm", [1, 2, 3])
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert tuple(f.get_tensor("layers.0.self_attn.q_proj.weight").shape) == (4 * 8, 2 * H)
        assert tuple(f.get_tensor("lm_head.weight").shape) == (16, H)
    assert names == vllm_weight_names(arch, vocab)
    assert "embed_tokens.weight" not in names  # vLLM shares the target's embedding
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.shape == (V,)
    assert (torch.arange(16) + d2t).tolist() == list(range(0, 32, 2))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert (cfg["vocab_size"], cfg["draft_vocab_size"], cfg["num_hidden_layers"]) == (V, 16, 1)
    assert cfg["target_hidden_size"] == H and cfg["norm_before_fc"] is True
    with pytest.raises(FormatError, match="trained on aux layers"):
        export_vllm(tmp_path / "ckpt", tmp_path / "vllm2", [2, 3, 4])


def test_export_names_land_on_vllm_parameters(tmp_path):
    """Our names, renamed the way vLLM 0.32's Eagle3LlamaForCausalLM.load_weights and its
    LlamaModel.hf_to_vllm_mapper rename them, are exactly the drafter's vLLM parameters."""
    llama_eagle3 = pytest.importorskip("vllm.model_executor.models.llama_eagle3")
    model = make_model(draft_vocab_size=16)
    names = vllm_weight_names(model.arch, DraftVocab(torch.arange(16), V))
    assert set(names) == set(model.state_dict()) | {"d2t", "t2d"}
    mapped = set()
    for name in names:
        if "t2d" in name:
            continue  # skipped by vLLM
        if "d2t" in name:
            mapped.add("draft_id_to_target_id")
        elif "lm_head" in name:
            mapped.add(name)
        else:
            mapped.update("model." + n for n in llama_eagle3.LlamaModel.hf_to_vllm_mapper.apply_list([name]))
    layer = "model.layers.0."
    vllm_params = {
        "model.fc.weight", "model.input_norm.weight", "model.norm.weight", "lm_head.weight", "draft_id_to_target_id",
        layer + "self_attn.qkv_proj.weight", layer + "self_attn.o_proj.weight",
        layer + "mlp.gate_up_proj.weight", layer + "mlp.down_proj.weight",
        layer + "input_layernorm.weight", layer + "hidden_norm.weight", layer + "post_attention_layernorm.weight",
    }
    assert mapped == vllm_params


def test_read_target_head(tmp_path):
    cfg = {"hidden_size": H, "vocab_size": V, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    emb = torch.randn(V, H).to(torch.bfloat16)
    save_file({"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(H)}, str(tmp_path / "model.safetensors"))
    head = read_target_head(tmp_path)
    assert torch.equal(head.lm_head, emb.float()) and head.rms_norm_eps == 1e-6  # tied: lm_head is the embedding
    cfg["tie_word_embeddings"] = False
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=r"'lm_head.weight' not found in .*model.safetensors"):
        read_target_head(tmp_path)


# ---------------------------------------------------------------------- data + stages

def write_synthetic(root: Path, n_train: int = 24, n_hold: int = 6, seed: int = 0) -> Path:
    """A tiny target checkpoint and extract-stage shards (random states, structured tokens)."""
    g = torch.Generator().manual_seed(seed)
    (root / "target").mkdir(parents=True)
    (root / "target" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": H, "vocab_size": V, "rms_norm_eps": 1e-5,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
        "num_hidden_layers": 4, "tie_word_embeddings": False, "max_position_embeddings": 256}))
    save_file({"model.embed_tokens.weight": torch.randn(V, H, generator=g).to(torch.bfloat16),
               "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
               "lm_head.weight": torch.randn(V, H, generator=g).to(torch.bfloat16)},
              str(root / "target" / "model.safetensors"))
    (root / "data").mkdir()
    shards = []
    for split, n in (("train", n_train), ("holdout", n_hold)):
        lens = torch.randint(10, 30, (n,), generator=g)
        total = int(lens.sum())
        mask = torch.ones(total, dtype=torch.int8)
        start = 0
        for n_tok in lens.tolist():
            mask[start : start + 4] = 0  # prompt
            start += n_tok
        name = f"data/shard-00000-{split}.safetensors"
        save_file({"input_ids": torch.randint(0, V, (total,), generator=g), "loss_mask": mask, "seq_lens": lens,
                   "hidden_states": torch.randn(total, 4, H, generator=g).to(torch.bfloat16)}, str(root / name))
        shards.append({"file": name, "split": split, "num_seqs": n, "num_tokens": total})
    index = {"shards": shards, "aux_layer_ids": [1, 2, 3], "final_layer_id": 4, "hidden_size": H, "dtype": "bfloat16"}
    (root / "data" / "index.json").write_text(json.dumps(index))
    return root


def test_data_batches(tmp_path):
    root = write_synthetic(tmp_path)
    index = read_index(root / "data" / "index.json", stage_dir=root)
    store = SequenceStore(index.split("train"), max_seq_len=20)
    assert len(store) == 24 and max(store.lengths()) <= 20
    batches = make_batches(store.lengths(), 64, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(24))
    assert all(len(b) * max(store.lengths()[i] for i in b) <= 64 for b in batches)
    assert batches == make_batches(store.lengths(), 64, seed=3)  # seeded, reproducible
    batch = collate(store, batches[0])
    i = batches[0][0]
    ids, _ = store.tokens(i)
    n = store.refs[i].length
    assert torch.equal(batch.input_ids[0, :n], ids)
    hid = store.hidden(i).float()
    torch.testing.assert_close(batch.aux[0, :n], hid[:, :3].reshape(n, 3 * H))
    torch.testing.assert_close(batch.final[0, :n], hid[:, 3])


def _request(tmp_path: Path, root: Path, stage: str, upstream: dict, train: dict):
    from eagleflow.config import parse_config
    from eagleflow.stages.common import StageRequest

    (tmp_path / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    cfg = parse_config({
        "name": "t", "host": {"work_root": str(tmp_path / "runs"), "python": "python"},
        "target": {"model_path": str(root / "target"), "aux_layer_ids": [1, 2, 3], "final_layer_id": 4},
        "generate": {"prompts_path": str(tmp_path / "prompts.jsonl"), "num_samples": 40, "holdout": 32},
        "train": train,
    })
    stage_dir = tmp_path / "runs" / stage / "k"
    stage_dir.mkdir(parents=True, exist_ok=True)
    return StageRequest(stage=stage, key="k", dir=str(stage_dir), config=cfg, upstream=upstream)


def test_train_and_export_stages(tmp_path):
    from eagleflow.manifest import Manifest
    from eagleflow.stages import export as export_stage
    from eagleflow.stages import train as train_stage

    root = write_synthetic(tmp_path / "syn")
    extract = Manifest(stage="extract", key="e", dir=str(root), outputs={"index": "data/index.json"})
    train_cfg = {"epochs": 2, "batch_tokens": 128, "draft_vocab_size": 24, "warmup_steps": 2, "max_seq_len": 32,
                 "num_threads": 1}
    req = _request(tmp_path, root, "train", {"extract": extract}, train_cfg)
    manifest = train_stage.run(req)
    assert manifest.outputs["checkpoints"] == ["checkpoints/epoch-1", "checkpoints/epoch-2"]
    assert manifest.outputs["best"] in manifest.outputs["checkpoints"]
    assert len(manifest.metrics["epochs"]) == 2
    assert {"acceptance_length", "accept_pos", "acc", "loss"} <= set(manifest.metrics["best"])
    assert manifest.metrics["draft_vocab_size"] == 24
    assert (Path(req.dir) / "checkpoints" / "epoch-2" / "trainer_state.pt").is_file()
    assert not list((Path(req.dir) / "checkpoints").glob(".*tmp"))

    # A rerun resumes after the last finished epoch: same results, no new training.
    again = train_stage.run(req)
    assert again.metrics["epochs"] == manifest.metrics["epochs"]

    req_e = _request(tmp_path, root, "export", {"train": manifest}, train_cfg)
    exported = export_stage.run(req_e)
    vllm_dir = Path(req_e.dir) / exported.outputs["vllm"]
    cfg = json.loads((vllm_dir / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 24 and cfg["vocab_size"] == V
    assert set(exported.hashes) == {"vllm/config.json", "vllm/model.safetensors"}


# ------------------------------------------------------------------ warm start from public drafters

def _public_tensors(model: Eagle3Drafter, vocab: DraftVocab, layout: str) -> dict[str, torch.Tensor]:
    """The model's tensors named the way each public layout names them (bf16, as published)."""
    out = {}
    for name, t in model.state_dict().items():
        if layout == "eagle":
            name = name.replace("layers.0.", "midlayer.")
        out[name] = t.to(torch.bfloat16).contiguous()
    if layout in ("eagle", "speculators"):  # both ship the target's embedding beside the drafter
        out["embed_tokens.weight"] = model.embed_weight.to(torch.bfloat16).contiguous()
    out["d2t"], out["t2d"] = vocab.d2t.contiguous(), vocab.t2d.contiguous()
    return out


def write_public_drafter(path: Path, layout: str, model: Eagle3Drafter, vocab: DraftVocab,
                         aux=(1, 2, 3), **overrides) -> Path:
    """A small public EAGLE-3 drafter in `layout`: config.json as each project writes it + model.safetensors."""
    a = model.arch
    llama = {"hidden_size": a.hidden_size, "intermediate_size": a.intermediate_size,
             "num_attention_heads": a.num_attention_heads, "num_key_value_heads": a.num_key_value_heads,
             "head_dim": a.head_dim, "rms_norm_eps": a.rms_norm_eps, "rope_theta": a.rope_theta,
             "vocab_size": a.vocab_size, "num_hidden_layers": 1, "max_position_embeddings": 256,
             "hidden_act": "silu", "model_type": "llama"}
    if layout == "vllm":
        cfg = {**llama, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": vocab.size,
               "target_hidden_size": a.hidden_size, "eagle_aux_hidden_state_layer_ids": list(aux),
               "norm_before_fc": a.norm_before_fc, "norm_before_residual": a.norm_before_residual}
    elif layout == "eagle":  # EAGLE-3 reference / SpecForge: no norm_before_* keys
        cfg = {**llama, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": vocab.size}
    else:  # speculators: the layer's shape under transformer_layer_config
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "transformer_layer_config": llama, "draft_vocab_size": vocab.size,
               "norm_before_residual": a.norm_before_residual, "target_hidden_size": None,
               "eagle_aux_hidden_state_layer_ids": list(aux),
               "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "target"}}}
    for key, value in overrides.items():
        (cfg["transformer_layer_config"] if layout == "speculators" and key in llama else cfg)[key] = value
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(_public_tensors(model, vocab, layout), str(path / "model.safetensors"))
    return path


@pytest.mark.parametrize("layout,norm_before_fc,norm_before_residual", [
    ("vllm", True, True), ("eagle", False, False), ("speculators", False, True),
])
def test_warm_start_from_public_drafters(tmp_path, layout, norm_before_fc, norm_before_residual):
    """Each layout is detected from its keys; weights land on the same parameters; the public draft
    vocabulary (d2t/t2d) is kept, so its lm_head rows still mean the same target ids."""
    from eagleflow.drafter.formats import read_public_drafter
    from eagleflow.drafter.trainer import Trainer

    root = write_synthetic(tmp_path / "syn")
    index = read_index(root / "data" / "index.json", stage_dir=root)
    target = read_target_head(root / "target")
    model = make_model(seed=3, draft_vocab_size=16, norm_before_fc=norm_before_fc,
                       norm_before_residual=norm_before_residual, intermediate_size=40)
    vocab = DraftVocab(torch.tensor([0, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 33, 35, 37, 39]), V)
    public = write_public_drafter(tmp_path / "public", layout, model, vocab)
    assert read_public_drafter(public).layout == layout
    cfg = TrainConfig(warm_start=str(public), draft_vocab_size=24, num_threads=1)
    trainer = Trainer(cfg, target, index, tmp_path / "train", [1, 2, 3]).setup()
    arch = trainer.model.arch
    assert (arch.norm_before_fc, arch.norm_before_residual, arch.intermediate_size) == (
        norm_before_fc, norm_before_residual, 40)
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
@pytest.mark.parametrize("override,field,values", [
    ({"hidden_size": 48}, "hidden_size", ("48", f"{H}")),
    ({"vocab_size": 64}, "vocab_size", ("64", f"{V}")),
    ({"num_hidden_layers": 2}, "num_hidden_layers", ("2", "1 decoder layer")),
])
def test_warm_start_mismatch_names_file_field_and_values(tmp_path, layout, override, field, values):
    from eagleflow.drafter.formats import check_warm_start, read_public_drafter

    target = _target()
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
    from eagleflow.drafter.formats import check_warm_start, read_public_drafter

    model = make_model(draft_vocab_size=16)
    vocab = DraftVocab(torch.arange(16) * 2, V)
    public = write_public_drafter(tmp_path / "two", "eagle", model, vocab)
    tensors = _public_tensors(model, vocab, "vllm")
    tensors["layers.1.self_attn.q_proj.weight"] = tensors["layers.0.self_attn.q_proj.weight"].clone()
    save_file(tensors, str(public / "model.safetensors"))
    with pytest.raises(FormatError, match=r"num_hidden_layers is 1 \(tensors of layers 1 in .*model.safetensors\)"):
        read_public_drafter(public)

    target = _target()
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
    from eagleflow.drafter.formats import read_public_drafter

    model = make_model(draft_vocab_size=16)
    vocab = DraftVocab(torch.arange(16) * 2 + 1, V)
    public = write_public_drafter(tmp_path / "p", "speculators", model, vocab)
    tensors = _public_tensors(model, vocab, "speculators")
    del tensors["d2t"]  # t2d alone still gives the mapping
    save_file(tensors, str(public / "model.safetensors"))
    assert torch.equal(read_public_drafter(public).vocab.draft_to_target, vocab.draft_to_target)
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:10].contiguous()
    save_file(tensors, str(public / "model.safetensors"))
    with pytest.raises(FormatError, match="lm_head.weight has 10 rows"):
        read_public_drafter(public)


# ------------------------------------------------------------------------------------- loss

@pytest.mark.parametrize("steps", [3, 7])
def test_loss_reads_only_assistant_labels_at_every_step(steps):
    """d loss / d output of step i at context end p is non-zero iff the label j = p+1+i is an
    assistant position (loss_mask[j], j <= len-2): the mask is shifted with the unroll."""
    target = _target()
    b, t = 2, 24
    mask = torch.zeros(b, t, dtype=torch.bool)
    mask[0, 5:12] = True  # two assistant turns with a user turn between them
    mask[0, 16:22] = True
    mask[1, 3:] = True
    lengths = torch.tensor([t, t - 4])
    batch = Batch(torch.randint(0, V, (b, t)), mask, lengths, torch.randn(b, t, 3 * H), torch.randn(b, t, H))

    class Leaf(_Oracle):
        def ttt_forward(self, aux, input_ids, steps, query_start, query_len):
            outs, qpos = super().ttt_forward(aux, input_ids, steps, query_start, query_len)
            self.leaves = [o.clone().requires_grad_(True) for o in outs]
            return self.leaves, qpos

    drafter = Leaf(target, batch.final, 0)
    loss, _ = ttt_loss(drafter, target, torch.arange(V), batch, steps, 0.8)
    loss.backward()
    leaves = drafter.leaves
    jvalid = label_positions(batch)
    _, qpos = drafter.ttt_forward(None, None, steps, *_window(jvalid, lengths, steps))
    for i, leaf in enumerate(leaves):
        touched = leaf.grad.abs().sum(-1) > 0  # [B, Tq]
        j = qpos + 1 + i
        expect = torch.where(j < t, jvalid.gather(1, j.clamp(max=t - 1)), False)
        assert torch.equal(touched, expect), f"step {i}"


def _window(jvalid, lengths, steps):
    first = torch.where(jvalid.any(1), jvalid.float().argmax(1), torch.zeros_like(lengths))
    start = (first - steps).clamp(min=0)
    return start, max(int((lengths - 2 - start).max()), 1)


def test_kl_loss_is_soft_ce_minus_entropy_with_the_same_gradient():
    target = _target()
    model = make_model(draft_vocab_size=V)
    model.train()
    b, t = 2, 16
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[:, :3] = False
    batch = Batch(torch.randint(0, V, (b, t)), mask, torch.tensor([t, t - 3]), torch.randn(b, t, 3 * H),
                  torch.randn(b, t, H))
    grads = {}
    for kind in ("soft_ce", "kl"):
        model.zero_grad()
        loss, stats = ttt_loss(model, target, torch.arange(V), batch, 3, 0.8, loss_kind=kind)
        loss.backward()
        grads[kind] = (loss.item(), stats.summary(0.8)["loss_per_step"],
                       [p.grad.clone() for p in model.parameters() if p.grad is not None])
    jvalid = label_positions(batch)
    logp = torch.log_softmax(target.logits(batch.final[jvalid]), -1)
    entropy = -(logp.exp() * logp).sum(-1)
    j = torch.arange(t)[None].expand(b, t)[jvalid]
    for i in range(3):
        h_i = entropy[j >= 1 + i].mean().item()
        assert grads["kl"][1][i] == pytest.approx(grads["soft_ce"][1][i] - h_i, abs=1e-4)
        assert grads["kl"][1][i] >= 0
    for g_ce, g_kl in zip(grads["soft_ce"][2], grads["kl"][2]):
        torch.testing.assert_close(g_ce, g_kl, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("steps", [3, 7])
def test_ttt_unroll_equals_kv_cache_drafting_batched(steps):
    """The parallel unroll over a padded batch (GQA, a query window) equals one-sequence KV-cache
    drafting at every context end: each step sees step-0 keys at positions <= p and its own
    earlier drafts at p, never later positions."""
    model = make_model(num_attention_heads=4, num_key_value_heads=1)
    t = 18
    aux, ids = torch.randn(2, t, 3 * H), torch.randint(0, V, (2, t))
    lengths = [t, 13]
    with torch.no_grad():
        outs, qpos = model.ttt_forward(aux, ids, steps, query_start=torch.tensor([0, 0]), query_len=t - steps)
        for row, n in enumerate(lengths):
            for p in range(n - steps):
                kv: list = []
                normed, pre = model.prefill(aux[row:row + 1, : p + 1], ids[row:row + 1, 1 : p + 2], kv)
                ref, hidden = [normed[0, -1]], pre[:, -1:]
                for i in range(1, steps):
                    normed, hidden = model.decode_one_token(ids[row:row + 1, p + 1 + i : p + 2 + i], hidden, p + i, kv)
                    ref.append(normed[0, 0])
                for i in range(steps):
                    torch.testing.assert_close(outs[i][row, p], ref[i], atol=2e-4, rtol=2e-4)


# ------------------------------------------------------------ accumulation, data parallel, resume

def test_split_batch_and_label_counts():
    from eagleflow.drafter.data import split_batch
    from eagleflow.drafter.trainer import label_counts

    lengths = [5, 9, 3, 7, 8]
    parts = split_batch([0, 1, 2, 3, 4], lengths, 2)
    assert parts == [[1, 3, 2], [4, 0]]
    assert split_batch([2, 0], lengths, 4) == [[0], [2], [], []]
    assert split_batch([2, 0], lengths, 1) == [[2, 0]]
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]], dtype=torch.bool)
    # row 0: labels j in {2, 3, 4} (j <= len-2 = 4); row 1 (len 4): j in {1, 2}
    assert label_counts(mask, torch.tensor([6, 4]), 3).tolist() == [5.0, 4.0, 2.0]


def _tiny_trainer(tmp_path, root, **kw):
    from eagleflow.drafter.trainer import Trainer

    index = read_index(root / "data" / "index.json", stage_dir=root)
    cfg = TrainConfig(**{"epochs": 1, "batch_tokens": 128, "draft_vocab_size": 24, "warmup_steps": 2,
                         "max_seq_len": 32, "num_threads": 1, **kw})
    return Trainer(cfg, read_target_head(root / "target"), index, tmp_path, [1, 2, 3]).setup()


def test_grad_accumulation_gives_the_one_batch_step(tmp_path):
    """Micro-batches (some empty) with the whole step's label counts add up to the step's gradient."""
    root = write_synthetic(tmp_path / "syn", n_train=40)
    one = _tiny_trainer(tmp_path / "one", root)
    acc = _tiny_trainer(tmp_path / "acc", root, grad_accum_steps=4)
    idx = [0, 1, 2]  # 3 sequences in 4 micro-batches: one is a zero-weight pass
    for trainer in (one, acc):
        for group in trainer.optimizer.param_groups:
            group["lr"] = 1e-2
        stats, _ = trainer._optimizer_step(idx)
        trainer.stats = stats.summary(0.8)
    assert one.stats["positions"] == acc.stats["positions"] and one.stats["tokens"] == acc.stats["tokens"]
    assert one.stats["loss"] == pytest.approx(acc.stats["loss"], rel=1e-6)
    for (name, p1), p2 in zip(one.model.named_parameters(), acc.model.parameters()):
        if p1.requires_grad:  # the gradients (Adam's first step is sign-like: compare before it)
            torch.testing.assert_close(p1.grad, p2.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_resume_restores_rng_and_continues_mid_epoch(tmp_path):
    """A step checkpoint restores the CPU and Python generators, the data position and the epoch's
    statistics so far (not the freshly seeded state of a new process)."""
    import random

    root = write_synthetic(tmp_path / "syn", n_train=40)
    first = _tiny_trainer(tmp_path / "run", root, checkpoint_every_steps=3)
    torch.rand(7), random.random()  # the generators move on during training
    stats = StepStats(3, tokens=123)
    first._save_step_checkpoint(epoch=1, batch_index=3, step=3, train_s=1.5, epoch_s=1.5, epoch_stats=stats, lr=1e-3)
    expected = (torch.rand(5), random.random())
    second = _tiny_trainer(tmp_path / "run", root, checkpoint_every_steps=3)  # seeds again
    at = second._resume()
    assert (torch.rand(5).tolist(), random.random()) == (expected[0].tolist(), expected[1])
    assert (at.epoch, at.batch_index, at.step, at.train_seconds) == (1, 3, 3, 1.5)
    assert StepStats.from_vector(3, at.epoch_stats).tokens == 123
    restored, saved = second.optimizer.state_dict(), first.optimizer.state_dict()
    assert restored["param_groups"][0]["lr"] == saved["param_groups"][0]["lr"]


def test_step_checkpoints_are_superseded_by_the_epoch_checkpoint(tmp_path):
    root = write_synthetic(tmp_path / "syn", n_train=40)
    trainer = _tiny_trainer(tmp_path / "run", root, checkpoint_every_steps=2, epochs=2)
    result = trainer.train()
    names = sorted(d.name for d in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["epoch-1", "epoch-2"]  # no step-* left, no temp dirs
    assert [e.step for e in result.epochs][-1] > 2
