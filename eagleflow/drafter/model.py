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

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eagleflow.drafter.arch import DrafterArch
from eagleflow.drafter.attention import Attention, MLAAttention
from eagleflow.drafter.kernels import RMSNorm, rms_norm, rope_tables, silu_mul


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
                [RMSNorm(arch.target_hidden_size, arch.rms_norm_eps) for _ in range(arch.num_aux_hidden_states)]
            )
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

    def ttt_forward(
        self,
        aux: torch.Tensor,
        input_ids: torch.Tensor,
        steps: int,
        query_start: torch.Tensor | None = None,
        query_len: int | None = None,
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
                x, residual = layer.attn_input(self.embed(token_at(1 + i)), hidden)  # noqa: F821 - step i-1's
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
        hidden = layer(
            self.embed(input_ids),
            self.combine_hidden_states(aux),
            lambda x: layer.self_attn.attend_all(x, cos, sin, kv),
        )
        normed = self.norm(hidden)
        return normed, normed if self.arch.norm_output else hidden

    def decode_one_token(self, token: torch.Tensor, hidden: torch.Tensor, position: int, kv: list):
        """One drafting step: token [1, 1], the previous step's fed state [1, 1, H], attends to all of `kv`."""
        cos, sin = self._rope(torch.tensor([position], device=hidden.device))
        layer = self.layers[0]
        hidden = layer(self.embed(token), hidden, lambda x: layer.self_attn.attend_all(x, cos, sin, kv))
        normed = self.norm(hidden)
        return normed, normed if self.arch.norm_output else hidden
