"""The hidden-state plumbing: does the engine hand the drafter the states it was trained on?

The engine is launched as the extract stage's `backend: vllm` launches it (vLLM's
`extract_hidden_states` method, which captures through the same model hook EAGLE-3 serving uses:
`set_aux_hidden_state_layers` with the ids of the speculative config), held-out sequences of the
drafter's training data are sent, and each captured layer is compared with every trained one:

    rel_err[i][j] = mean over tokens of |engine_i - trained_j| / |trained_j|       [4 x 4]

A healthy engine matches on the diagonal (bf16 rounding and another kernel's arithmetic: ~0.005-0.02);
a one-layer slip in the engine's capture shows as an off-diagonal match (id k carries what the drafter
knows as id k - 1), a kernel that computes the target differently as no match at all.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from eagleflow.config import RunConfig
from eagleflow.contracts.benchmark_records import LayerMatch, PlumbingProbe
from eagleflow.contracts.manifest import Manifest
from eagleflow.contracts.request import StageError
from eagleflow.contracts.stage_records import ExtractOutputs
from eagleflow.drafter.data import SequenceStore, read_index
from eagleflow.drafter.errors import DataError
from eagleflow.extraction.vllm import serving_for_capture

log = logging.getLogger("eagleflow.triage")


# -- the probe ---------------------------------------------------------------------------------------


def held_out(extract: Manifest, n: int, max_len: int) -> SequenceStore:
    """The first `n` held-out sequences of an extract stage (its train split when it held none out)."""
    try:
        index = read_index(extract.path(ExtractOutputs.of(extract).index), extract.dir)
    except DataError as exc:
        raise StageError(f"triage: the states the drafter was trained on cannot be read: {exc}") from None
    shards = index.split("holdout") or index.split("train")
    return SequenceStore(shards[:1] if shards[0].num_seqs >= n else shards, max_len, max_seqs=n)


COMPARE_TOKENS = 512  # per chunk: [512, 4, 4, 7168] f32 differences are 235 MB at Kimi-K2.5's width


def compare(engine: torch.Tensor, trained: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean relative error and mean cosine of every engine layer against every trained one.

    engine, trained: [T, n, H] -> ([n, n], [n, n]); entry [i, j] is engine layer i against trained layer j.
    Chunked over tokens: a 32k-token sequence of a 7168-wide target at once would take 15 GB.
    """
    n = engine.shape[1]
    rel_sum, cos_sum = torch.zeros(n, n), torch.zeros(n, n)
    for s in range(0, engine.shape[0], COMPARE_TOKENS):
        e = engine[s : s + COMPARE_TOKENS].float()[:, :, None, :]  # [t, n, 1, H]
        t = trained[s : s + COMPARE_TOKENS].float()[:, None, :, :]  # [t, 1, n, H]
        rel_sum += ((e - t).norm(dim=-1) / t.norm(dim=-1).clamp_min(1e-6)).sum(0)  # [n, n]
        cos_sum += torch.nn.functional.cosine_similarity(e, t, dim=-1).sum(0)  # [n, n]
    return rel_sum / engine.shape[0], cos_sum / engine.shape[0]


def plumbing_probe(cfg: RunConfig, extract: Manifest, stage_dir: Path, env: dict[str, str] | None) -> PlumbingProbe:
    t = cfg.benchmark.triage
    ids_of = [*cfg.target.aux_layer_ids, cfg.target.final_layer_id]
    max_len = min(cfg.extract.max_seq_len, cfg.engine.max_model_len - 1)
    store = held_out(extract, t.num_prompts, max_len)
    if len(store) == 0:
        raise StageError(f"triage: {extract.dir} holds no sequence to compare")
    rel_sum = torch.zeros(len(ids_of), len(ids_of))
    cos_sum = torch.zeros(len(ids_of), len(ids_of))
    tokens = 0
    probe_dir = stage_dir / f"plumbing-{stage_dir.name}"  # names the capture spool too: one per stage
    probe_dir.mkdir(exist_ok=True)
    with serving_for_capture(cfg, probe_dir, store.hidden_size, env=env, name="triage-plumbing") as engine:
        try:
            for i in range(len(store)):
                ids, _ = store.tokens(i)
                trained = store.hidden(i)  # [L, 4, H]
                captured = engine.collect(engine.request(ids.tolist()), ids.tolist())  # [L, 4, H]
                if captured.shape != trained.shape:
                    raise StageError(
                        f"triage: the engine captured states of shape {tuple(captured.shape)} where "
                        f"the drafter was trained on {tuple(trained.shape)}"
                    )
                rel, cos = compare(captured, trained)
                n = ids.numel()
                rel_sum += rel * n
                cos_sum += cos * n
                tokens += n
        finally:
            engine.close()
    rel, cos = rel_sum / tokens, cos_sum / tokens
    layers = []
    for i, lid in enumerate(ids_of):
        j = int(rel[i].argmin())
        best = ids_of[j] if float(rel[i, j]) <= t.max_rel_err else None
        layers.append(
            LayerMatch(
                layer_id=lid,
                rel_err=float(rel[i, i]),
                cosine=float(cos[i, i]),
                best_id=best,
                best_rel_err=float(rel[i, j]),
            )
        )
    healthy = all(m.rel_err <= t.max_rel_err for m in layers)
    parts = [
        f"id {m.layer_id}: rel err {m.rel_err:.3f}, cosine {m.cosine:.4f}"
        + (
            ""
            if m.best_id == m.layer_id
            else f" (closest: trained id {m.best_id}, {m.best_rel_err:.3f})"
            if m.best_id is not None
            else " (matches no trained layer)"
        )
        for m in layers
    ]
    reason = (
        f"engine vs trained states over {tokens} held-out tokens: "
        + "; ".join(parts)
        + (
            ": the engine feeds the states the drafter was trained on"
            if healthy
            else f": above {t.max_rel_err} (benchmark.triage.max_rel_err)"
        )
    )
    log.info("triage plumbing probe: %s", reason)
    return PlumbingProbe(
        reference=extract.dir, sequences=len(store), tokens=tokens, layers=layers, healthy=healthy, reason=reason
    )
