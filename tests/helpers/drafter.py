"""Building blocks of the drafter tests (host environment: torch): a tiny drafter and target, a tiny
synthetic extract-stage output, public drafters in each layout, a stage request, a tiny trainer.

Used by tests/unit/drafter/*, tests/unit/stages/test_train.py and tests/integration/stages/test_train.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from eagleflow.config.train import TrainConfig
from eagleflow.drafter.arch import DrafterArch
from eagleflow.drafter.model import Eagle3Drafter, TargetHead, rms_norm
from eagleflow.drafter.vocab import DraftVocab

torch.set_num_threads(1)

V, H = 40, 32  # the tiny target's vocabulary and hidden size


def make_arch(**kw) -> DrafterArch:
    base = dict(
        hidden_size=H,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        vocab_size=V,
        draft_vocab_size=V,
        target_hidden_size=H,
        max_position_embeddings=256,
    )
    return DrafterArch(**{**base, **kw})


def make_model(seed: int = 0, **kw) -> Eagle3Drafter:
    torch.manual_seed(seed)
    model = Eagle3Drafter(make_arch(**kw), torch.randn(V, H))
    # Random (not unit) norms so a wrong norm placement shows up.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model.eval()


def target_head(seed: int = 0) -> TargetHead:
    """A random target head (embedding, final norm, lm_head) of the tiny target."""
    g = torch.Generator().manual_seed(seed)
    return TargetHead(
        embed_tokens=torch.randn(V, H, generator=g),
        norm_weight=torch.rand(H, generator=g) + 0.5,
        rms_norm_eps=1e-5,
        lm_head=torch.randn(V, H, generator=g) * 3,
        config={},
    )


class Oracle:
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


def write_synthetic(root: Path, n_train: int = 24, n_hold: int = 6, seed: int = 0) -> Path:
    """A tiny target checkpoint and extract-stage shards (random states, structured tokens)."""
    g = torch.Generator().manual_seed(seed)
    (root / "target").mkdir(parents=True)
    (root / "target" / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": H,
                "vocab_size": V,
                "rms_norm_eps": 1e-5,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 8,
                "intermediate_size": 48,
                "num_hidden_layers": 4,
                "tie_word_embeddings": False,
                "max_position_embeddings": 256,
            }
        )
    )
    save_file(
        {
            "model.embed_tokens.weight": torch.randn(V, H, generator=g).to(torch.bfloat16),
            "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
            "lm_head.weight": torch.randn(V, H, generator=g).to(torch.bfloat16),
        },
        str(root / "target" / "model.safetensors"),
    )
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
        save_file(
            {
                "input_ids": torch.randint(0, V, (total,), generator=g),
                "loss_mask": mask,
                "seq_lens": lens,
                "hidden_states": torch.randn(total, 4, H, generator=g).to(torch.bfloat16),
            },
            str(root / name),
        )
        shards.append({"file": name, "split": split, "num_seqs": n, "num_tokens": total})
    index = {"shards": shards, "aux_layer_ids": [1, 2, 3], "final_layer_id": 4, "hidden_size": H, "dtype": "bfloat16"}
    (root / "data" / "index.json").write_text(json.dumps(index))
    return root


def public_tensors(model: Eagle3Drafter, vocab: DraftVocab, layout: str) -> dict[str, torch.Tensor]:
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


def write_public_drafter(
    path: Path, layout: str, model: Eagle3Drafter, vocab: DraftVocab, aux=(1, 2, 3), **overrides
) -> Path:
    """A small public EAGLE-3 drafter in `layout`: config.json as each project writes it + model.safetensors."""
    a = model.arch
    llama = {
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads,
        "head_dim": a.head_dim,
        "rms_norm_eps": a.rms_norm_eps,
        "rope_theta": a.rope_theta,
        "vocab_size": a.vocab_size,
        "num_hidden_layers": 1,
        "max_position_embeddings": 256,
        "hidden_act": "silu",
        "model_type": "llama",
    }
    if layout == "vllm":
        cfg = {
            **llama,
            "architectures": ["LlamaForCausalLMEagle3"],
            "draft_vocab_size": vocab.size,
            "target_hidden_size": a.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(aux),
            "norm_before_fc": a.norm_before_fc,
            "norm_before_residual": a.norm_before_residual,
        }
    elif layout == "eagle":  # EAGLE-3 reference / SpecForge: no norm_before_* keys
        cfg = {**llama, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": vocab.size}
    else:  # speculators: the layer's shape under transformer_layer_config
        cfg = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": llama,
            "draft_vocab_size": vocab.size,
            "norm_before_residual": a.norm_before_residual,
            "target_hidden_size": None,
            "eagle_aux_hidden_state_layer_ids": list(aux),
            "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "target"}},
        }
    for key, value in overrides.items():
        (cfg["transformer_layer_config"] if layout == "speculators" and key in llama else cfg)[key] = value
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(public_tensors(model, vocab, layout), str(path / "model.safetensors"))
    return path


def stage_request(tmp_path: Path, root: Path, stage: str, upstream: dict, train: dict):
    """A StageRequest for `stage` over the synthetic target in `root`, its stage dir under tmp_path/runs."""
    from eagleflow.config import parse_config
    from eagleflow.contracts.request import StageRequest

    (tmp_path / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    cfg = parse_config(
        {
            "name": "t",
            "host": {"work_root": str(tmp_path / "runs"), "python": "python"},
            "target": {"model_path": str(root / "target"), "aux_layer_ids": [1, 2, 3], "final_layer_id": 4},
            "generate": {"prompts_path": str(tmp_path / "prompts.jsonl"), "num_samples": 40, "holdout": 32},
            "train": train,
        }
    )
    stage_dir = tmp_path / "runs" / stage / "k"
    stage_dir.mkdir(parents=True, exist_ok=True)
    return StageRequest(stage=stage, key="k", dir=str(stage_dir), config=cfg, upstream=upstream)


def extract_manifest(root: Path):
    """The extract stage's manifest for the synthetic data in `root` (what the train stage reads)."""
    from eagleflow.contracts.manifest import Manifest
    from eagleflow.contracts.stage_records import ExtractOutputs

    index = json.loads((root / "data" / "index.json").read_text())
    outputs = ExtractOutputs(
        index="data/index.json",
        shards=[s["file"] for s in index["shards"]],
        hidden_size=index["hidden_size"],
        num_tokens={s["split"]: s["num_tokens"] for s in index["shards"]},
    )
    return Manifest(stage="extract", key="e", dir=str(root), outputs=outputs.model_dump(mode="json"))


def tiny_trainer(out_dir: Path, root: Path, **kw):
    """A Trainer (set up) over the synthetic data in `root`, writing to out_dir; `kw` overrides TrainConfig."""
    from eagleflow.drafter.data import read_index
    from eagleflow.drafter.target import read_target_head
    from eagleflow.drafter.trainer import Trainer

    index = read_index(root / "data" / "index.json", stage_dir=root)
    cfg = TrainConfig(
        **{
            "epochs": 1,
            "batch_tokens": 128,
            "draft_vocab_size": 24,
            "warmup_steps": 2,
            "max_seq_len": 32,
            "num_threads": 1,
            **kw,
        }
    )
    return Trainer(cfg, read_target_head(root / "target"), index, out_dir, [1, 2, 3]).setup()


def assert_unroll_matches_kv_cache(
    model: Eagle3Drafter, aux: torch.Tensor, ids: torch.Tensor, steps: int, outs: list, lengths: list[int]
) -> None:
    """Each row's training-time unroll (`outs` of ttt_forward) equals drafting step by step with a KV cache:
    prefill up to position p, then one token at a time, as an engine drafts."""
    for row, n in enumerate(lengths):
        for p in range(n - steps):
            kv: list = []
            normed, pre = model.prefill(aux[row : row + 1, : p + 1], ids[row : row + 1, 1 : p + 2], kv)
            ref, hidden = [normed[0, -1]], pre[:, -1:]
            for i in range(1, steps):
                normed, hidden = model.decode_one_token(ids[row : row + 1, p + 1 + i : p + 2 + i], hidden, p + i, kv)
                ref.append(normed[0, 0])
            for i in range(steps):
                torch.testing.assert_close(outs[i][row, p], ref[i], atol=2e-4, rtol=2e-4)
