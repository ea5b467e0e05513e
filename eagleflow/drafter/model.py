"""The EAGLE-3 drafter in the exact layout vLLM's `LlamaForCausalLMEagle3` (or, with MLA attention,
`Eagle3DeepseekV2ForCausalLM`) loads.

One decoder layer over the target's three auxiliary states. Parameter names of `Eagle3Drafter`
are the checkpoint names vLLM reads (`fc.weight`, `layers.0.self_attn.q_proj.weight`, ...); the
target's embedding is a frozen, non-persistent buffer and never exported (vLLM shares the target's).

Forward of one drafting step at position t (vLLM `llama_eagle3.LlamaDecoderLayer`, layer_idx 0):

    g      = fc(input_norm(cat(aux_1, aux_2, aux_3)))      step 0 only; later steps get the
                                                           previous step's r2 (norm(r2) with norm_output)
    e      = input_layernorm(embed(token))
    h      = hidden_norm(g);  residual = h if norm_before_residual else g
    a      = o_proj(attn(q,k,v from cat(e, h)))            attention input is 2H wide
    r1     = a + residual;  m = mlp(post_attention_layernorm(r1))
    r2     = m + r1                                         -> fed to the next drafting step
    logits = lm_head(norm(r2))                              over the draft vocabulary

Which token and which target state sit at a position, and what the label is, is settled in
`ttt_forward` below.

`DrafterArch.attention` picks the attention: 'llama' (GQA, `Attention`) or 'mla' (DeepSeek-V2/V3
multi-head latent attention, `MLAAttention`, vLLM `deepseek_eagle3.DeepseekV2Eagle3DecoderLayer`).
The rest of the layer is the same; with MLA the state normalisation before fc is per target state
(vLLM `fc_norm`, weights `fc_norm.{i}.weight`) since vLLM's DeepSeek drafter has no `input_norm`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from eagleflow.drafter.kernels import RMSNorm, apply_rope, apply_rope_interleaved, rms_norm, rope_tables, silu_mul

# flex_attention runs its fused kernel only when compiled; eager flex is a slow reference.
_compiled_flex = torch.compile(flex_attention)
# Rows of a fused TTT unroll are padded to whole flex blocks: each step's diagonal keys then start on a block
# edge, so a diagonal touches one key block per query block instead of two (half the partially masked blocks).
FLEX_BLOCK = 128


def ttt_block_mask(qpos: torch.Tensor, t: int, steps_done: int, mask_mod) -> BlockMask:
    """The TTT unroll's flex block mask, from block arithmetic: which 128 x 128 blocks are empty, partial or full.

    create_block_mask would evaluate `mask_mod` on every (query, key) pair of every step, T x (T + i Tq) of them
    (at T 8,192 the last step's grid is 470 M pairs; compiled, 4% of a training step at Kimi-K2.5's shape). The
    pattern is known: step-0 key s is visible to row r when s <= qpos[r] (a block is full when all its keys lie
    at or below every row's qpos, partial when some do), and step j's keys T + (j-1) Tq + r' only on their
    diagonal r' == r (partial blocks). `mask_mod` still decides each pair inside a partial block. Blocks on a
    ragged edge (rows past Tq, keys past T) are never full, as create_block_mask has it.
    """
    # qpos shape: [B, Tq] (context ends, clamped to T - 1)
    bs, dev = FLEX_BLOCK, qpos.device
    b, tq = qpos.shape
    kv_len = t + steps_done * tq
    nq, nkv = -(-tq // bs), -(-kv_len // bs)
    pad = nq * bs - tq
    q_lo = F.pad(qpos, (0, pad), value=torch.iinfo(qpos.dtype).max).view(b, nq, bs).amin(-1)  # shape: [B, nq]
    q_hi = F.pad(qpos, (0, pad), value=-1).view(b, nq, bs).amax(-1)  # shape: [B, nq]
    k_lo = torch.arange(nkv, device=dev) * bs  # shape: [nkv], first key of each block
    k_hi = k_lo + bs - 1
    causal_any = (k_lo < t)[None, None, :] & (k_lo[None, None, :] <= q_hi[..., None])  # shape: [B, nq, nkv]
    whole_rows = torch.arange(nq, device=dev) * bs + bs - 1 < tq  # shape: [nq]
    full = (k_hi < t)[None, None, :] & (k_hi[None, None, :] <= q_lo[..., None]) & whole_rows[None, :, None]
    partial = causal_any & ~full
    rows_lo = torch.arange(nq, device=dev) * bs  # shape: [nq], each query block's first and last row
    rows_hi = torch.clamp(rows_lo + bs - 1, max=tq - 1)
    for j in range(1, steps_done + 1):
        base = t + (j - 1) * tq
        for first in ((base + rows_lo) // bs, (base + rows_hi) // bs):  # a diagonal crosses at most two blocks
            partial[:, torch.arange(nq, device=dev), first] = True

    def ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # dense [B, nq, nkv] -> (counts [B, 1, nq], indices [B, 1, nq, nkv]: the set blocks first, ascending)
        counts = dense.sum(-1, dtype=torch.int32)
        idx = torch.argsort((~dense).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[:, None], idx[:, None]

    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=bs, mask_mod=mask_mod,
                                    seq_lengths=(tq, kv_len))


@dataclass(frozen=True)
class DrafterArch:
    """The drafter's shape; every field is written to the vLLM config.json under the same name."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    max_position_embeddings: int
    num_aux_hidden_states: int = 3
    norm_before_fc: bool = True  # one RMSNorm over the concatenated states (`input_norm`; llama only)
    norm_before_residual: bool = True
    norm_output: bool = False  # the next step is fed norm(r2), not r2 (EAGLE 3.1; vLLM `norm_output`)
    # --- MLA (attention == "mla"): vLLM's Eagle3DeepseekV2ForCausalLM; the dims are the target's -------
    attention: str = "llama"  # "llama" (GQA) or "mla"
    fc_norm: bool = False  # one RMSNorm per target state before fc (`fc_norm.{i}`; vLLM `fc_norm`, EAGLE 3.1)
    q_lora_rank: int | None = None  # MLA: q_a_proj -> q_a_layernorm -> q_b_proj (vLLM 0.32 loads no q_proj)
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        if self.attention not in ("llama", "mla"):
            raise ValueError(f"attention must be 'llama' or 'mla', got {self.attention!r}")
        if self.attention == "mla":
            self._check_mla()
        elif self.fc_norm and self.norm_before_fc:
            # vLLM's llama drafter would apply both (input_norm, then a norm per state); no published drafter does
            raise ValueError("a drafter normalises the target states once: fc_norm (a norm per state, EAGLE 3.1) or "
                             "norm_before_fc (one over the concatenation), not both")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.hidden_size != self.target_hidden_size:
            # vLLM asserts hidden_states.shape[-1] == input_embeds.shape[-1]: the drafter shares the
            # target's embedding, so its width must be the target's.
            raise ValueError(
                f"drafter hidden_size {self.hidden_size} must equal the target's {self.target_hidden_size}"
            )

    def _check_mla(self) -> None:
        dims = {"kv_lora_rank": self.kv_lora_rank, "qk_nope_head_dim": self.qk_nope_head_dim,
                "qk_rope_head_dim": self.qk_rope_head_dim, "v_head_dim": self.v_head_dim}
        bad = {k: v for k, v in dims.items() if v <= 0}
        if bad:
            raise ValueError(f"an MLA drafter needs positive {', '.join(bad)} (got {bad})")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even for rotary embeddings, got {self.qk_rope_head_dim}")
        if not self.q_lora_rank or self.q_lora_rank <= 0:
            # vLLM 0.32's deepseek_eagle3 loader always stacks kv_a_proj_with_mqa into fused_qkv_a_proj, which
            # DeepseekV2MLAAttention has only with q_lora_rank: a q_proj drafter fails to load ("There is no
            # module or parameter named 'layers.0.self_attn.fused_qkv_a_proj' in DeepseekV2Eagle3Model").
            raise ValueError(
                f"an MLA drafter needs a positive q_lora_rank (vLLM loads no q_proj), got {self.q_lora_rank}")
        if self.norm_before_fc:
            raise ValueError("vLLM's MLA drafter (Eagle3DeepseekV2ForCausalLM) has no input_norm: use fc_norm "
                             "(per-state norms) instead of norm_before_fc")
        if self.num_key_value_heads != self.num_attention_heads:
            raise ValueError("MLA has one latent KV per token: num_key_value_heads must equal num_attention_heads")

    @property
    def rope_dim(self) -> int:
        """The rotated part of a query/key head: the whole head (llama) or qk_rope_head_dim (MLA)."""
        return self.qk_rope_head_dim if self.attention == "mla" else self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TargetHead:
    """The frozen pieces of the target the drafter needs (float32)."""

    embed_tokens: torch.Tensor  # shape: [V, H]
    norm_weight: torch.Tensor  # shape: [H]
    rms_norm_eps: float
    lm_head: torch.Tensor  # shape: [V, H]
    config: dict  # the target's (text) config.json

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.lm_head.shape[1])

    def logits(self, final_state: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Target logits from the final layer's pre-norm output, over all ids or only `rows`."""
        # final_state shape: [N, H]
        normed = rms_norm(final_state, self.norm_weight, self.rms_norm_eps)
        weight = self.lm_head if rows is None else self.lm_head[rows]
        return normed @ weight.T  # shape: [N, V] or [N, len(rows)]


class AttentionBase(nn.Module):
    """The training-time-test and inference-style attention over per-head keys and values; a subclass
    supplies q (rotated queries [B, nh, T, dk]), kv (rotated keys [B, nkv|nh, T, dk], values
    [B, nkv|nh, T, dv]), out (o [B, nh, T, dv] -> [B, T, H]), and nh, nkv, scale."""

    nh: int
    nkv: int
    scale: float

    def q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, expand: bool = True
           ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def out(self, o: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def ttt_flex(self, q: torch.Tensor, qpos: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, diag: list
                 ) -> torch.Tensor:
        """`ttt` through one fused flex-attention call (CUDA): the same keys and mask, never materialised.

        Keys are [step-0 keys (T); step-1 keys (Tq); ...; step-i keys (Tq)], unexpanded (GQA in the
        kernel). A query row r attends to step-0 key s when s <= qpos[r], and to key T + (j-1)*Tq + r' of
        step j when r' == r. The block mask skips the blocks above the causal edge and off the diagonals.
        """
        # q shape: [B, nh, Tq, hd]; k0, v0 shape: [B, nkv, T, hd]; diag: (k_j, v_j) each [B, nkv, Tq, hd]
        b, _, tq, _ = q.shape
        t = k0.shape[2]
        dt = v0.dtype  # the projections' output dtype (bf16 under autocast); rope may have promoted q, k
        keys = torch.cat([k0, *[kj for kj, _ in diag]], dim=2).to(dt)  # shape: [B, nkv, T + i*Tq, hd]
        values = torch.cat([v0, *[vj for _, vj in diag]], dim=2)
        q = q.to(dt)

        def mask_mod(bi, _h, qi, kv):
            return torch.where(kv < t, kv <= qpos[bi, qi], (kv - t) % tq == qi)

        mask = ttt_block_mask(qpos, t, len(diag), mask_mod)
        o = _compiled_flex(q, keys, values, block_mask=mask, scale=self.scale, enable_gqa=self.nkv != self.nh)
        return self.out(o)

    def ttt(self, q: torch.Tensor, qpos: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, diag: list) -> torch.Tensor:
        """Training-time-test attention (see `Eagle3Drafter.ttt_forward` for the layout).

        A query at context end p (its row's `qpos`) attends to the step-0 keys at positions <= p
        (causal) and to each later step's key at its own row only (the diagonal; its own key, for
        steps >= 1, is the last of those).
        """
        # q shape: [B, nh, Tq, hd]; qpos shape: [B, Tq]; k0, v0 shape: [B, nh, T, hd] (MLA: v is vd wide);
        # diag: (k_j, v_j) of steps 1..i, each [B, nh, Tq, hd]
        t = k0.shape[2]
        scale = self.scale
        causal = torch.arange(t, device=q.device)[None, None, :] <= qpos[:, :, None]  # shape: [B, Tq, T]
        s0 = (q @ k0.transpose(-1, -2)) * scale  # shape: [B, nh, Tq, T]
        s0 = s0.masked_fill(~causal[:, None], float("-inf"))
        if not diag:
            return self.out(torch.softmax(s0, dim=-1) @ v0)
        kd = torch.stack([kj for kj, _ in diag], dim=-2)  # shape: [B, nh, Tq, i, hd]
        vd = torch.stack([vj for _, vj in diag], dim=-2)  # shape: [B, nh, Tq, i, hd]
        sd = (q.unsqueeze(-2) * kd).sum(-1) * scale  # shape: [B, nh, Tq, i]
        probs = torch.softmax(torch.cat([s0, sd], dim=-1), dim=-1)  # shape: [B, nh, Tq, T+i]
        o = probs[..., :t] @ v0 + (probs[..., t:].unsqueeze(-1) * vd).sum(-2)  # shape: [B, nh, Tq, hd]
        return self.out(o)

    def attend_all(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: list) -> torch.Tensor:
        """Inference-style attention: the new keys join `kv`; each query sees every earlier key and
        the new ones at or before itself. B must be 1."""
        q = self.q(x, cos, sin)
        kv.append(self.kv(x, cos, sin))
        keys = torch.cat([kk for kk, _ in kv], dim=2)  # shape: [1, nh, S, hd]
        values = torch.cat([vv for _, vv in kv], dim=2)
        t, s = q.shape[2], keys.shape[2]
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device)
        mask[:, s - t:] = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        return self.out(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale))


class Attention(AttentionBase):
    """Llama attention whose input is 2H wide: [input_layernorm(embed); hidden_norm(hidden)]."""

    def __init__(self, arch: DrafterArch) -> None:
        super().__init__()
        h, nh, nkv, hd = arch.hidden_size, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.scale = 1.0 / math.sqrt(hd)
        self.q_proj = nn.Linear(2 * h, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)

    def q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x shape: [B, T, 2H]; cos/sin shape: [T, hd] or [B, 1, T, hd]
        b, t, _ = x.shape
        return apply_rope(self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2), cos, sin)  # [B, nh, T, hd]

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, expand: bool = True
           ) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        k = apply_rope(self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2), cos, sin)  # [B, nkv, T, hd]
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        if expand and self.nkv != self.nh:
            k = k.repeat_interleave(self.nh // self.nkv, dim=1)  # shape: [B, nh, T, hd]
            v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        return k, v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = o.shape  # o shape: [B, nh, T, hd]
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))  # shape: [B, T, H]

class MLAAttention(AttentionBase):
    """DeepSeek-V2/V3 multi-head latent attention whose input is 2H wide (vLLM `DeepseekV2MLAAttention`
    with `input_size=2H`, as `deepseek_eagle3` builds it; names are the HF DeepSeek checkpoint names).

        q       = q_b_proj(q_a_layernorm(q_a_proj(x)))                       [nh, nope + rope]
        c, k_pe = split(kv_a_proj_with_mqa(x), [kv_lora_rank, rope])          one latent per token
        k_nope, v = split(kv_b_proj(kv_a_layernorm(c)), [nope, vd])           per head
        k       = [k_nope; rope(k_pe)] (k_pe shared by all heads);  q = [q_nope; rope(q_pe)]
        out     = o_proj(softmax(q k^T / sqrt(nope + rope)) v)

    RoPE on the rope dims is interleaved (vLLM `is_neox_style=False`). Training materialises the
    per-head keys and values (vLLM's kernel absorbs kv_b_proj instead: the same function).
    """

    def __init__(self, arch: DrafterArch) -> None:
        super().__init__()
        h2, nh = 2 * arch.hidden_size, arch.num_attention_heads
        self.nh = self.nkv = nh
        self.nope, self.rope, self.vd = arch.qk_nope_head_dim, arch.qk_rope_head_dim, arch.v_head_dim
        self.rank = arch.kv_lora_rank
        qk = self.nope + self.rope
        self.scale = qk ** -0.5
        self.q_a_proj = nn.Linear(h2, arch.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(arch.q_lora_rank, arch.rms_norm_eps)
        self.q_b_proj = nn.Linear(arch.q_lora_rank, nh * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h2, self.rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.rank, arch.rms_norm_eps)
        self.kv_b_proj = nn.Linear(self.rank, nh * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(nh * self.vd, arch.hidden_size, bias=False)

    def q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x shape: [B, T, 2H]; cos/sin shape: [T, rope] or [B, 1, T, rope]
        b, t, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, t, self.nh, self.nope + self.rope).transpose(1, 2)  # shape: [B, nh, T, nope+rope]
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        return torch.cat([q_nope, apply_rope_interleaved(q_pe, cos, sin)], dim=-1)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, expand: bool = True
           ) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)  # [B, T, rank], [B, T, rope]
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(b, t, self.nh, self.nope + self.vd).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)  # [B, nh, T, nope], [B, nh, T, vd]
        k_pe = apply_rope_interleaved(k_pe.unsqueeze(1), cos, sin)  # shape: [B, 1, T, rope]
        k = torch.cat([k_nope, k_pe.expand(-1, self.nh, -1, -1)], dim=-1)  # shape: [B, nh, T, nope+rope]
        return k, v.contiguous()

    def out(self, o: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = o.shape  # o shape: [B, nh, T, vd]
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.vd))  # shape: [B, T, H]


class MLP(nn.Module):
    def __init__(self, arch: DrafterArch) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(arch.hidden_size, arch.intermediate_size, bias=False)
        self.up_proj = nn.Linear(arch.hidden_size, arch.intermediate_size, bias=False)
        self.down_proj = nn.Linear(arch.intermediate_size, arch.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(silu_mul(gate, up))


class DecoderLayer(nn.Module):
    def __init__(self, arch: DrafterArch) -> None:
        super().__init__()
        self.norm_before_residual = arch.norm_before_residual
        self.self_attn = MLAAttention(arch) if arch.attention == "mla" else Attention(arch)
        self.mlp = MLP(arch)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.hidden_norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def attn_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input [B, T, 2H], residual [B, T, H]) from the token embedding and the fed state."""
        h = self.hidden_norm(hidden)
        residual = h if self.norm_before_residual else hidden
        return torch.cat([self.input_layernorm(embeds), h], dim=-1), residual

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The pre-norm output: what the next drafting step is fed, and what the final norm sees."""
        residual = attn_out + residual
        return self.mlp(self.post_attention_layernorm(residual)) + residual  # shape: [B, T, H]

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, attend) -> torch.Tensor:
        """Pre-norm output; `attend(x [B, T, 2H]) -> [B, T, H]` runs the attention."""
        x, residual = self.attn_input(embeds, hidden)
        return self.finish(attend(x), residual)


class Eagle3Drafter(nn.Module):
    """Parameter names == vLLM checkpoint names (see vllm_export.vllm_weight_names)."""

    def __init__(self, arch: DrafterArch, embed_tokens: torch.Tensor) -> None:
        super().__init__()
        if tuple(embed_tokens.shape) != (arch.vocab_size, arch.hidden_size):
            raise ValueError(
                f"target embedding has shape {tuple(embed_tokens.shape)}, expected "
                f"({arch.vocab_size}, {arch.hidden_size})"
            )
        self.arch = arch
        fc_in = arch.target_hidden_size * arch.num_aux_hidden_states
        # Frozen and shared with the target: vLLM loads no embed_tokens from the drafter checkpoint.
        self.register_buffer("embed_weight", embed_tokens.detach().float().clone(), persistent=False)
        if arch.norm_before_fc:
            self.input_norm = RMSNorm(fc_in, arch.rms_norm_eps)
        if arch.fc_norm:
            self.fc_norm = nn.ModuleList(
                [RMSNorm(arch.target_hidden_size, arch.rms_norm_eps) for _ in range(arch.num_aux_hidden_states)])
        self.fc = nn.Linear(fc_in, arch.hidden_size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(arch)])
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.lm_head = nn.Linear(arch.hidden_size, arch.draft_vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def init_from_target(self, target: TargetHead, draft_to_target: torch.Tensor) -> None:
        """lm_head = the target's rows of the draft vocabulary; final norm = the target's final norm."""
        with torch.no_grad():
            self.lm_head.weight.copy_(target.lm_head[draft_to_target])
            self.norm.weight.copy_(target.norm_weight)

    def combine_hidden_states(self, aux: torch.Tensor) -> torch.Tensor:
        # aux shape: [B, T, 3*H_target] -> [B, T, H]
        if self.arch.norm_before_fc:
            aux = self.input_norm(aux)
        if self.arch.fc_norm:
            chunks = aux.chunk(self.arch.num_aux_hidden_states, dim=-1)
            aux = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(aux)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_weight)  # shape: [B, T, H]

    def _rope(self, positions: torch.Tensor):
        return rope_tables(positions, self.arch.rope_dim, self.arch.rope_theta, self.arch.attention == "mla")

    def ttt_forward(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int,
                    query_start: torch.Tensor | None = None, query_len: int | None = None
                    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The training-time-test unroll: (normed output of each step [B, Tq, H], context ends qpos [B, Tq]).

        Layout (p = a context end, the last position whose target states the engine has):
          step 0 at p: token x[p+1], hidden fc(aux[p]), rotary position p
          step i at p: token x[p+1+i], hidden = step i-1's output at the same p (pre-norm; normed
                       with norm_output),
                       rotary position p+i; attends to the step-0 keys at positions <= p and to
                       the keys of steps 1..i at p.
          label of step i at p: the target's next-token distribution at position p+1+i, i.e.
                       softmax(lm_head(norm(final[p+1+i]))) -- the distribution of x[p+2+i].
        This is vLLM's proposer exactly: once the target has verified up to p and sampled x[p+1],
        the drafter's first pass feeds input_ids shifted left by one (token x[s+1] with the target's
        state at s, position s, for every new s <= p); draft step i then feeds the token it just
        drafted (x[p+1+i] when accepted), the previous step's pre-norm output and position p+i,
        and attends to the whole KV cache: step-0 entries at positions <= p plus its drafts.

        Outputs are computed only for the context ends p = query_start[b] + r, r < query_len (the
        rows that carry labels), default all of 0..T-1; step-0 keys are computed everywhere.
        """
        # aux shape: [B, T, 3H]; input_ids shape: [B, T] (x[0..T-1], padded with any id)
        b, t = input_ids.shape
        dev = input_ids.device
        if query_start is None:
            query_start, query_len = torch.zeros(b, dtype=torch.int64, device=dev), t
        qpos = query_start[:, None] + torch.arange(query_len, device=dev)[None, :]  # shape: [B, Tq]
        rows = qpos.clamp(max=t - 1)

        def at_rows(z: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, Tq, D]
            return z.gather(1, rows[..., None].expand(-1, -1, z.shape[-1]))

        def token_at(offset: int) -> torch.Tensor:  # x[p + offset] for each row, 0 beyond the end
            idx = qpos + offset
            return torch.where(idx < t, input_ids.gather(1, idx.clamp(max=t - 1)), 0)  # shape: [B, Tq]

        cos, sin = self._rope(torch.arange(t + steps, device=dev))
        layer, attn = self.layers[0], self.layers[0].self_attn
        # Step 0 keys/values at every position: token x[s+1], state fc(aux[s]), position s.
        next_ids = torch.zeros_like(input_ids)
        next_ids[:, : t - 1] = input_ids[:, 1:]
        x_all, res_all = layer.attn_input(self.embed(next_ids), self.combine_hidden_states(aux))  # [B, T, 2H]
        fused = aux.is_cuda  # flex attention has no CPU backward
        k0, v0 = attn.kv(x_all, cos[:t], sin[:t], expand=not fused)  # shape: [B, nh or nkv, T, hd]
        x, residual = at_rows(x_all), at_rows(res_all)
        diag: list = []
        outs = []
        for i in range(steps):
            if i > 0:
                x, residual = layer.attn_input(self.embed(token_at(1 + i)), hidden)
            c, s = cos[rows + i].unsqueeze(1), sin[rows + i].unsqueeze(1)  # rotary position p+i: [B, 1, Tq, hd]
            q = attn.q(x, c, s)
            if i > 0:
                diag.append(attn.kv(x, c, s, expand=not fused))
            o = (attn.ttt_flex if fused else attn.ttt)(q, rows, k0, v0, diag)
            hidden = layer.finish(o, residual)  # pre-norm: [B, Tq, H]
            outs.append(self.norm(hidden))
            if self.arch.norm_output:
                hidden = outs[-1]  # EAGLE 3.1: the next step is fed the normed state
        return outs, qpos

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self.lm_head(normed)  # shape: [..., Vd]

    # --- inference-style reference (one sequence, KV cache), the way the engine runs the drafter ---

    def prefill(self, aux: torch.Tensor, input_ids: torch.Tensor, kv: list) -> tuple[torch.Tensor, torch.Tensor]:
        """First pass over positions 0..P-1: token x[s+1], state aux[s], position s.
        Returns (normed output, the state the next step is fed), shape [1, P, H]; `kv` receives the keys."""
        # aux shape: [1, P, 3H]; input_ids shape: [1, P] holding x[1..P]
        cos, sin = self._rope(torch.arange(aux.shape[1], device=aux.device))
        layer = self.layers[0]
        hidden = layer(self.embed(input_ids), self.combine_hidden_states(aux),
                       lambda x: layer.self_attn.attend_all(x, cos, sin, kv))
        normed = self.norm(hidden)
        return normed, normed if self.arch.norm_output else hidden

    def decode_one_token(self, token: torch.Tensor, hidden: torch.Tensor, position: int, kv: list):
        """One drafting step: token [1, 1], the previous step's fed state [1, 1, H], attends to all of `kv`."""
        cos, sin = self._rope(torch.tensor([position], device=hidden.device))
        layer = self.layers[0]
        hidden = layer(self.embed(token), hidden, lambda x: layer.self_attn.attend_all(x, cos, sin, kv))
        normed = self.norm(hidden)
        return normed, normed if self.arch.norm_output else hidden
