"""The drafter layer's attention: Llama (GQA) and DeepSeek's multi-head latent attention (MLA), each over a
2H-wide input, with the training-time-test unroll's masks (flex attention on CUDA, an explicit mask on CPU)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from eagleflow.drafter.arch import DrafterArch
from eagleflow.drafter.kernels import CudaCompiled, RMSNorm, apply_rope, apply_rope_interleaved

# flex_attention runs its fused kernel only when compiled; eager flex is a slow reference.
_compiled_flex = CudaCompiled(flex_attention)

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

    return BlockMask.from_kv_blocks(
        *ordered(partial), *ordered(full), BLOCK_SIZE=bs, mask_mod=mask_mod, seq_lengths=(tq, kv_len)
    )


class AttentionBase(nn.Module):
    """The training-time-test and inference-style attention over per-head keys and values; a subclass
    supplies q (rotated queries [B, nh, T, dk]), kv (rotated keys [B, nkv|nh, T, dk], values
    [B, nkv|nh, T, dv]), out (o [B, nh, T, dv] -> [B, T, H]), and nh, nkv, scale."""

    nh: int
    nkv: int
    scale: float

    def q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, expand: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def out(self, o: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def ttt_flex(
        self, q: torch.Tensor, qpos: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, diag: list
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
        mask[:, s - t :] = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
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

    def kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, expand: bool = True
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
        self.scale = qk**-0.5
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

    def kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, expand: bool = True
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
