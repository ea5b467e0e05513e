"""The drafter's shape: every size and choice of its one decoder layer, as its config.json records it."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
            raise ValueError(
                "a drafter normalises the target states once: fc_norm (a norm per state, EAGLE 3.1) or "
                "norm_before_fc (one over the concatenation), not both"
            )
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
        dims = {
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
        }
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
                f"an MLA drafter needs a positive q_lora_rank (vLLM loads no q_proj), got {self.q_lora_rank}"
            )
        if self.norm_before_fc:
            raise ValueError(
                "vLLM's MLA drafter (Eagle3DeepseekV2ForCausalLM) has no input_norm: use fc_norm "
                "(per-state norms) instead of norm_before_fc"
            )
        if self.num_key_value_heads != self.num_attention_heads:
            raise ValueError("MLA has one latent KV per token: num_key_value_heads must equal num_attention_heads")

    @property
    def rope_dim(self) -> int:
        """The rotated part of a query/key head: the whole head (llama) or qk_rope_head_dim (MLA)."""
        return self.qk_rope_head_dim if self.attention == "mla" else self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)
