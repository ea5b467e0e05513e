"""Hidden sizes, vocabularies and the d2t / lm_head / fc shapes the engine will load (config + headers)."""

from __future__ import annotations

from typing import Any

from eagleflow.engines.preflight.findings import Finding


def check_dimensions(
    name: str, target_text: dict[str, Any], drafter: dict[str, Any], shapes: dict[str, list[int]], drafter_dir: str
) -> list[Finding]:
    """Hidden sizes, vocabularies and the d2t / lm_head / fc shapes the engine will load."""
    check = f"dimensions[{name}]"
    cfg_path = f"{drafter_dir}/config.json"
    st_path = f"{drafter_dir}/*.safetensors"
    out: list[Finding] = []
    t_hidden = target_text.get("hidden_size")
    t_vocab = target_text.get("vocab_size")
    d_hidden = drafter.get("hidden_size")
    d_target_hidden = drafter.get("target_hidden_size") or d_hidden
    vocab = drafter.get("vocab_size")
    draft_vocab = drafter.get("draft_vocab_size") or vocab

    if t_hidden is not None and d_hidden is not None and int(d_hidden) != int(t_hidden):
        out.append(
            Finding(
                check,
                "error",
                f"{cfg_path}: hidden_size is {d_hidden}, the target's is {t_hidden}: the "
                "drafter shares the target's embedding and takes its states, so it must be as wide. vLLM "
                '0.32 still loads it and answers healthy, then the engine dies on the first request ("The '
                'size of tensor a (3*target) must match the size of tensor b (3*drafter)"). This drafter '
                "belongs to another model. Fix: train/export it for this target",
            )
        )
    if t_hidden is not None and d_target_hidden is not None and int(d_target_hidden) != int(t_hidden):
        out.append(
            Finding(
                check,
                "error",
                f"{cfg_path}: target_hidden_size is {d_target_hidden}, the target's "
                f"hidden_size is {t_hidden}: its fc cannot take the target's states",
            )
        )
    if t_vocab is not None and vocab is not None and int(vocab) != int(t_vocab):
        out.append(
            Finding(
                check,
                "error",
                f"{cfg_path}: vocab_size is {vocab}, the target's is {t_vocab}: draft "
                "tokens would map into another vocabulary. Fix: export the drafter for this target",
            )
        )

    lm_head = shapes.get("lm_head.weight")
    if lm_head is not None and draft_vocab is not None and lm_head[0] != int(draft_vocab):
        out.append(
            Finding(
                check,
                "error",
                f"{st_path}: lm_head.weight has {lm_head[0]} rows, {cfg_path} says "
                f"draft_vocab_size {draft_vocab}. Fix: set draft_vocab_size to {lm_head[0]}",
            )
        )
    if lm_head is not None and d_hidden is not None and lm_head[1] != int(d_hidden):
        out.append(Finding(check, "error", f"{st_path}: lm_head.weight is {lm_head} wide, hidden_size is {d_hidden}"))
    d2t = shapes.get("d2t")
    if draft_vocab is not None and vocab is not None and int(draft_vocab) < int(vocab):
        if d2t is None:
            out.append(
                Finding(
                    check,
                    "error",
                    f"{st_path} has no d2t, but draft_vocab_size {draft_vocab} < "
                    f"vocab_size {vocab}: vLLM then maps draft id d to target id d (its d2t buffer stays "
                    "zero) and acceptance collapses without any error. Fix: export with the draft "
                    "vocabulary's d2t (eagleflow.drafter.vllm_export.export_vllm writes d2t and t2d)",
                )
            )
        elif d2t != [int(draft_vocab)]:
            out.append(
                Finding(
                    check,
                    "error",
                    f"{st_path}: d2t has shape {d2t}, draft_vocab_size is "
                    f"{draft_vocab}: they must agree ([draft_vocab_size] offsets)",
                )
            )
    elif d2t is not None and vocab is not None and draft_vocab is not None and int(draft_vocab) >= int(vocab):
        out.append(
            Finding(
                check,
                "error",
                f"{st_path} has d2t {d2t} but draft_vocab_size equals vocab_size "
                f"({vocab}): vLLM allocates no d2t then and its loader fails on the unexpected tensor. "
                "Fix: drop d2t/t2d, or set draft_vocab_size to the d2t length",
            )
        )
    fc = shapes.get("fc.weight")
    if fc is not None and t_hidden is not None:
        n_states = fc[1] / int(t_hidden)
        if n_states != int(n_states):
            out.append(
                Finding(
                    check,
                    "error",
                    f"{st_path}: fc.weight is {fc}: its input {fc[1]} is no multiple of "
                    f"the target's hidden_size {t_hidden}",
                )
            )
    if not out:
        out.append(
            Finding(
                check,
                "ok",
                f"hidden_size {d_hidden} = target's {t_hidden}; vocab_size {vocab} = "
                f"target's {t_vocab}; draft_vocab_size {draft_vocab}" + (f" with d2t {d2t}" if d2t else ""),
            )
        )
    return out


def fc_num_states(shapes: dict[str, list[int]], target_hidden: int | None) -> int | None:
    """How many target states the drafter's fc takes: fc.weight is [H, n * target_hidden_size], with the
    drafter's own target_hidden_size (a mismatch with the real target is the dimensions check's)."""
    fc = shapes.get("fc.weight")
    if fc is None or not target_hidden or fc[1] % int(target_hidden):
        return None
    return fc[1] // int(target_hidden)


# SGLang 0.5.15's EAGLE-3 loaders rename the per-state norms of older checkpoints (llama_eagle3.py).
LEGACY_STATE_NORMS = {"aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}


def check_state_norms(
    name: str, drafter: dict[str, Any], shapes: dict[str, list[int]], drafter_dir: str, engine: str
) -> Finding | None:
    """The per-state norms (EAGLE 3.1's `fc_norm.{i}`, one RMSNorm per target state before fc) against the config
    flag that makes the engine build them. Both engines build them from config.json alone (`fc_norm`; SGLang also
    `use_aux_norm`) and load the weights only into norms they built: weights without the flag are skipped (SGLang
    0.5.15, without a word) or refused at load (vLLM 0.32, after the target's load); the flag without the weights
    leaves the norms at their initial scale of 1. Either way the drafter drafts from states it was not trained on.
    None for a speculators-format drafter (its own conversion) or one with neither."""
    if drafter.get("speculators_model_type"):
        return None
    check, cfg_path = f"state_norms[{name}]", f"{drafter_dir}/config.json"
    weights = sorted(
        k
        for k in shapes
        if k.startswith("fc_norm.") or any(k.startswith(f"{legacy}.") for legacy in LEGACY_STATE_NORMS)
    )
    flags = ["fc_norm"] + (["use_aux_norm"] if engine == "sglang" else [])
    on = [f for f in flags if drafter.get(f)]
    if not weights and not on:
        return None
    if weights and not on:
        return Finding(
            check,
            "error",
            f"{drafter_dir}/*.safetensors holds per-state norms ({', '.join(weights)}) but {cfg_path} does not turn "
            f"on fc_norm: {engine} builds the drafter without them and drops the trained weights (SGLang without a "
            "word, vLLM at load, after the target's), so the drafter would draft from un-normed states. Fix: set "
            '"fc_norm": true in its config.json (eagleflow\'s export writes it)',
        )
    n_states = len(drafter.get("eagle_aux_hidden_state_layer_ids") or []) or int(
        drafter.get("num_aux_hidden_states") or 3
    )
    if len(weights) != n_states:
        have = f"only {', '.join(weights)}" if weights else "no fc_norm.{i}.weight"
        return Finding(
            check,
            "error",
            f"{cfg_path} turns on {on[0]} (one RMSNorm per target state before fc) but {drafter_dir}/*.safetensors "
            f"has {have} for its {n_states} states: {engine} would keep the missing norms at their initial scale "
            "of 1, not the trained ones. Fix: export the drafter with its norms (eagleflow's export writes them), "
            f"or turn {on[0]} off if it was trained without them",
        )
    return Finding(check, "ok", f"{on[0]} on: {len(weights)} per-state norms, one for each target state")
