"""The drafter's aux layer ids against the target's depth, the engine's convention and the training ids."""

from __future__ import annotations

from eagleflow.engines.preflight.findings import Finding


def specforge_default(num_layers: int) -> list[int]:
    """SpecForge/SGLang configs' ids ("output of layer i") for an L-layer target: [1, L//2-1, L-4]."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def sglang_layers(ids: list[int], deepseek: bool) -> list[int]:
    """The layers (vLLM convention) SGLang 0.5.15 feeds a drafter whose config names `ids`. It reads only
    `eagle_config.eagle_aux_hidden_state_layer_ids` and captures the input of each layer it is given, after adding 1
    to every id for Llama-family targets (llama.py, qwen2.py: "output of layer i") and, for DeepSeek-V2/V3-family
    targets (deepseek_v2.py, which Kimi-K2.5's model wraps), only when the first id is 1; other lists are read as
    given there."""
    if deepseek and (not ids or ids[0] != 1):
        return list(ids)
    return [i + 1 for i in ids]


SGLANG_LAYER_1 = (
    "target.aux_layer_ids start at layer 1, and SGLang cannot feed a DeepSeek-architecture target's layer 1 to a "
    'drafter (it reads ids starting at 1 as "output of layer i" and adds 1, any other list as given). Fix: train on '
    "aux ids not starting at 1 (the default [2, L//2, L-3] serves on both engines), or serve with vLLM"
)


def sglang_config_ids(vllm_ids: list[int], deepseek: bool) -> list[int] | None:
    """What a drafter's eagle_config must name for SGLang 0.5.15 to feed it `vllm_ids` (the inverse of
    `sglang_layers`); None where no list does: layer 1 of a DeepSeek-V2/V3-family target."""
    if not deepseek:
        return [i - 1 for i in vllm_ids]
    return None if vllm_ids and vllm_ids[0] == 1 else list(vllm_ids)


def check_aux_layer_ids(
    name: str,
    ids: list[int] | None,
    num_layers: int,
    default_ids: list[int] | None,
    expected: list[int] | None,
    num_aux_states: int | None,
    engine_kind: str = "vllm",
    where: str = "config.json",
    deepseek: bool = False,
) -> list[Finding]:
    """The drafter's layer ids against the target's depth, the engine's convention and the training ids.

    `expected` and the checks are in vLLM's convention: id k = the input of decoder layer k = HF
    hidden_states[k] (vLLM 0.32 llama.py captures id 0 before the first layer and id idx+1 after layer
    idx, so L is the last layer's output, the final state). SGLang 0.5.15 captures the input of layer i too but
    reads the drafter config's ids its own way (`sglang_layers`): `deepseek` says the target is of the
    DeepSeek-V2/V3 family (Kimi-K2.5), whose rule differs from the others'.
    """
    check = f"aux_layer_ids[{name}]"
    shift = 1 if engine_kind == "sglang" and not deepseek else 0
    field = f"eagle_aux_hidden_state_layer_ids in {where}"

    def to_config(vllm_ids: list[int]) -> list[int]:
        if engine_kind != "sglang":
            return list(vllm_ids)
        return sglang_config_ids(vllm_ids, deepseek) or list(vllm_ids)  # a DeepSeek layer 1: refused first

    if engine_kind == "sglang" and deepseek and expected and expected[0] == 1:
        return [
            Finding(
                check,
                "error",
                f"the drafter was trained on layers {list(expected)} (vLLM convention), and SGLang cannot feed a "
                "DeepSeek-architecture target's layer 1 to a drafter: it reads ids starting at 1 as \"output of "
                'layer i" and adds 1 to them, any other list as given. Fix: train with target.aux_layer_ids not '
                "starting at 1 (the default [2, L//2, L-3] serves on both engines), or serve with vLLM",
            )
        ]

    if not ids:
        if default_ids is None:
            return [
                Finding(
                    check,
                    "warning",
                    f"{field} is not set: the engine picks its default layers, which "
                    "preflight could not determine; write the ids the drafter was trained on",
                )
            ]
        msg = (
            f"{field} is not set: {engine_kind} then feeds its default layers {default_ids} "
            "(vLLM convention; SupportsEagle3.get_eagle3_default_aux_hidden_state_layers = [2, L//2, L-3])"
        )
        if expected is not None and list(expected) != list(default_ids):
            return [
                Finding(
                    check,
                    "error",
                    f"{msg}, but the drafter was trained on {list(expected)}: acceptance "
                    f'collapses. Fix: write "eagle_aux_hidden_state_layer_ids": {to_config(expected)} '
                    f"into {where}",
                )
            ]
        return [Finding(check, "ok" if expected is not None else "warning", msg)]

    served = sglang_layers(ids, deepseek) if engine_kind == "sglang" else list(ids)  # vLLM convention from here on
    findings: list[Finding] = []
    if num_aux_states is not None and len(ids) != num_aux_states:
        findings.append(
            Finding(
                check,
                "error",
                f"{field} is {ids}: {len(ids)} ids, but the drafter's fc takes "
                f"{num_aux_states} target states; write {num_aux_states} ids",
            )
        )
    if sorted(set(ids)) != list(ids):
        findings.append(
            Finding(
                check,
                "warning",
                f"{field} is {ids}, not strictly increasing: vLLM sorts and "
                "de-duplicates them (EagleModelMixin._set_aux_hidden_state_layers), so the drafter "
                "may get its states in another order than it was trained on",
            )
        )
    beyond = [i for i, s in zip(ids, served) if s > num_layers]
    final = [i for i, s in zip(ids, served) if s == num_layers]
    below = [i for i, s in zip(ids, served) if s < 1]
    if beyond:
        findings.append(
            Finding(
                check,
                "error",
                f"{field} is {ids}: {beyond} lie beyond the target's "
                f"{num_layers} layers and are never captured, so the drafter gets fewer states than "
                f"its fc expects; write ids in [{1 - shift}, {num_layers - 1 - shift}]",
            )
        )
    if final:
        findings.append(
            Finding(
                check,
                "error",
                f"{field} is {ids}: {final} is the last layer's output (the final "
                "state, not an auxiliary layer); EAGLE-3 aux ids lie in "
                f"[{1 - shift}, {num_layers - 1 - shift}] for a {num_layers}-layer target",
            )
        )
    if below:
        findings.append(
            Finding(
                check,
                "error",
                f"{field} is {ids}: {below} is the embedding output, not a decoder "
                f"layer's state; aux ids lie in [{1 - shift}, {num_layers - 1 - shift}]",
            )
        )
    if expected is not None:
        exp = list(expected)
        if served == exp:
            findings.append(
                Finding(check, "ok", f"{field} is {ids}: the layers the drafter was trained on (vLLM convention {exp})")
            )
        elif len(served) == len(exp) and all(s == e - 1 for s, e in zip(served, exp)):
            findings.append(
                Finding(
                    check,
                    "error",
                    f"{field} is {ids}, one below the layers the drafter was trained "
                    f"on ({exp} in vLLM's convention): these are SpecForge/SGLang-style \"output of "
                    f'layer i" ids, and {engine_kind} would feed every state one layer too early '
                    f'(acceptance collapses). Fix: write "eagle_aux_hidden_state_layer_ids": '
                    f"{to_config(exp)} into {where}",
                )
            )
        elif len(served) == len(exp) and all(s == e + 1 for s, e in zip(served, exp)):
            findings.append(
                Finding(
                    check,
                    "error",
                    f"{field} is {ids}, one above the layers the drafter was trained "
                    f"on ({exp} in vLLM's convention): the ids were shifted twice between "
                    f'conventions. Fix: write "eagle_aux_hidden_state_layer_ids": {to_config(exp)} '
                    f"into {where}",
                )
            )
        else:
            findings.append(
                Finding(
                    check,
                    "error",
                    f"{field} is {ids}, but the drafter was trained on {exp} "
                    f"(vLLM convention, target.aux_layer_ids). Fix: write {to_config(exp)}, or "
                    "correct target.aux_layer_ids if the drafter really was trained on these",
                )
            )
    elif not any(f.level == "error" for f in findings):
        pattern = specforge_default(num_layers)
        if (
            engine_kind == "vllm"
            and ids == pattern
            and pattern != (default_ids or [])
            and len(set(pattern)) == 3
            and pattern[0] >= 1
        ):
            findings.append(
                Finding(
                    check,
                    "warning",
                    f'{field} is {ids}, SpecForge/SGLang\'s "output of layer i" '
                    f"pattern [1, L/2-1, L-4] for L={num_layers}: probably the other convention. "
                    f"vLLM reads id k as the input of layer k; the same layers are "
                    f"{[i + 1 for i in ids]} there",
                )
            )
        else:
            findings.append(
                Finding(
                    check,
                    "ok",
                    f"{field} is {ids} (within the target's {num_layers} layers; "
                    "pass the training ids to check the convention)",
                )
            )
    return findings
