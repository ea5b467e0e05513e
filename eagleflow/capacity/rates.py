"""The rates a capacity plan uses where the host has measured none, each with its source: the reference run's
(docs/reference-run.md: Kimi-K2.5 INT4 served by vLLM on 8 x RTX PRO 6000 Blackwell, the pipeline run by hand)
and what this project measured on an H200 GPU host (docs/benchmarks.md). Pure constants, and the engine's start
built of them; the planner states them in a plan. The extraction backends' rates are theirs
(eagleflow.extraction.backends).
"""

from __future__ import annotations

NUM_STATES = 4  # the three aux states, then the final layer's output

REFERENCE_SAMPLES = 10_000
REFERENCE_BF16_BYTES = 828e9  # its hidden states in bf16
REFERENCE_TOKENS = REFERENCE_BF16_BYTES / (NUM_STATES * 7168 * 2)  # ~14.44 M: 1,444 tokens a sample
DEFAULT_PROMPT_TOKENS = 250  # an assumption: the reference run measured the total per sample, not the split
DEFAULT_ANSWER_TOKENS = round(REFERENCE_TOKENS / REFERENCE_SAMPLES) - DEFAULT_PROMPT_TOKENS  # 1,194
REFERENCE_GENERATE_S = 5.3 * 3600
DEFAULT_GENERATE_TOK_S = REFERENCE_SAMPLES * DEFAULT_ANSWER_TOKENS / REFERENCE_GENERATE_S  # ~626 output tok/s
DEFAULT_DISK_WRITE_BPS = 0.7e9  # an H200 host's disk, measured (docs/benchmarks.md); a later one wrote 1.3 GB/s
REFERENCE_TRAIN_S, REFERENCE_EPOCHS, REFERENCE_TRAIN_FRACTION = 2.6 * 3600, 5, 0.9
DEFAULT_TRAIN_TOK_S = REFERENCE_EPOCHS * REFERENCE_TRAIN_FRACTION * REFERENCE_TOKENS / REFERENCE_TRAIN_S  # ~6,900 tok/s
# Engine loads with eagleflow's launch settings (vLLM's own load strategy, the compile cache kept), measured on one
# H200 with vLLM 0.26 from its local NVMe (benchmarks/engine_load.py, docs/benchmarks.md "Engine loads", 26 GB):
# seconds a GB of weights read cold (1.5 GB/s: the disk) and warm (the page cache), on top of ~60 s of the rest
# (two imports of vLLM, engine init with the compile cache kept, graph capture). Not in them: a quantized MoE's
# repacking at every start (Kimi-K2.5's INT4 Marlin) and 8 tensor-parallel workers; the reference run saw 22-40 min.
LOAD_S_PER_GB = {"cold": 0.666, "warm": 0.154}
ENGINE_BASE_START_S = 60.0
HF_MEASURED_WEIGHTS_BYTES = 16e9  # the hf backend's default rate (eagleflow.extraction.backends): an 8B bf16 target
# SGLang's start is not measured here; the plan uses vLLM's rates for it and says what the reference run saw.
SGLANG_ENGINE_NOTE = (
    "; SGLang's own start not measured here (the reference run: Kimi-K2.5 on SGLang in 22 s from a warm page cache, "
    "~25 min cold; docs/reference-run.md)"
)
# Capture from production (extract.backend 'production'), measured on a GPU host (docs/benchmarks.md, "Capture from
# production on a GPU host": one H100, vLLM 0.26, the demo MLA target behind an EAGLE-3 drafter at k = 3, 8 of its own
# requests in flight): its own traffic's throughput against the same engine without eagleflow's capture plugin,
# with the plugin loaded and idle, and while capture requests of these many prompt tokens were in flight. A small
# target's figures: what capture takes of a large target depends on how its own batch compares with the capture
# tokens in flight, which no GPU host here has measured at Kimi-K2.5's scale.
CAPTURE_IDLE_RATIO = 1.065
CAPTURE_BUSY_RATIO = 0.483
CAPTURE_BUSY_TOKENS = 4 * 512
# Training on GPUs, measured (docs/benchmarks.md, "The trainer at Kimi-K2.5's drafter shape"): one H200's model
# FLOP/s at that shape, T 8,192; the train stage against the bare step (28,594 / 30,376 tok/s, Llama-8B shape); per
# GPU with 2 ranks against 1 (21,786 / (2 x 17,068), Llama-1B shape, 2 H200s: a floor, a small drafter's gradients
# weigh more against its compute). 8 GPUs are scaled from those.
H200_TRAIN_TFLOPS = 522.5
TRAIN_STAGE_FRACTION = 0.94
DDP_GPU_EFFICIENCY = 0.64
# Muon's Newton-Schulz (train.optimizer 'muon'): a fixed cost a step on every rank (DDP repeats it), measured as the
# step's growth against AdamW at Kimi-K2.5's drafter shape on one H200 (912.9 - 666.7 ms, T 8,192,
# benchmarks/train_gpu.py --optimizer muon), over its FLOPs as eagleflow.capacity.costs.muon_flops_per_step counts them
# (1.61e14): the rate those matrices orthogonalize at.
H200_MUON_NS_TFLOPS = 654.0
# The LK loss (train.loss 'lk'): a step at Kimi-K2.5's drafter shape on one H200 against soft_ce's, AdamW, T 8,192
# (679.1 / 667.1 ms, benchmarks/train_gpu.py --loss soft_ce lk): the acceptance term's softmax at every unroll step.
LK_STEP_COST = 1.018
# Production paused instead of stopped (benchmarks/pause_gpu.py, vLLM 0.26, one H200, the demo target): from
# the window's release to healthy with a new drafter swapped in and probed, 7.2-7.9 s (wake 0.12 s, swap 3.4-3.8 s
# with the sender's start, the probe's 4 requests). A level-1 wake copies the weights back from pinned host RAM:
# at Kimi-K2.5's size that copy dominates, at a stated 25 GB/s a GPU (PCIe Gen5 x16 at half its peak; not measured).
PAUSE_RESUME_S = 7.9
WAKE_H2D_GB_S = 25.0
DEFAULT_DECODE_TOK_S = 82.5  # Kimi-K2.5 tok/s per request, no speculation
DEFAULT_EXPORT_S = 60.0
DEFAULT_CHECK_S = 30.0
TRAIN_GPU_FRACTION = 0.95  # of a GPU's memory the trainer may use
SOURCES = {  # where each default comes from, as a plan states it
    "prompt": "default: an assumed 250 of the reference run's 1,444 tokens a sample (it measured only the total; "
    "docs/reference-run.md)",
    "answer": "default: the reference run's 10,000 samples came to ~14.4 M tokens (docs/reference-run.md)",
    "generate": "default: the reference run's 10,000 answers took 5.3 h from Kimi-K2.5's server "
    "(docs/reference-run.md)",
    "train": "default: the reference run trained 5 epochs in 2.6 h (docs/reference-run.md)",
    "engine": "measured: an H200's NVMe with vLLM 0.26, 26 GB (docs/benchmarks.md, Engine loads), scaled by the "
    "weights; a quantized MoE's repack and TP8 start not in it (the reference run saw 22-40 min)",
    "benchmark": "default: Kimi-K2.5 serves 82.5 tok/s a request without speculation (docs/reference-run.md), a window "
    "at that rate x its concurrency",
    "export": "default: a drafter export takes about a minute",
    "check": "default: seconds of host checks",
}


# A host without GPUs (eagleflow.capacity.defaults): `make demo` on a 2-core CPU machine, quiet, 2026-12-05, the demo
# target (demo/target), real vLLM's CPU build; each rate from that run's stage manifests and log (docs/benchmarks.md,
# "The demo's own rates"). Scaled by the target's weights and the host's cores where they differ.
CPU_REFERENCE = {
    "cores": 2,
    "weights_bytes": 3_939_696,  # demo/target's model.safetensors
    "generate_tok_s": 824.8,  # output tok/s, 32 requests in flight (generate/939cd7b084b318b8)
    "extract_tok_s": 3_761.1,  # the hf backend: forward, shards written and hashed (extract/2d4e181dce56c4d4)
    "train_tok_s": 11_663.7,  # (train/8df677b8d36c3d7d)
    "export_s": 3.4,
    "check_s": 5.4,
    "decode_tok_s": 219.9,  # one request without speculation, temperature 0 (the benchmark's baseline window)
    "engine_start_s": 31.3,  # healthy after: the mean of its three engines (26.9, 39.2, 27.7 s)
}
CPU_SOURCE = (
    "measured: make demo on a 2-core CPU host (docs/benchmarks.md, The demo's own rates), the closest measured host"
)


def engine_start_s(weights_bytes: int | None, cache: str = "cold") -> float:
    """An engine's start from a cold (or warm) page cache, at the H200's measured rates scaled by the weights."""
    return ENGINE_BASE_START_S + (weights_bytes or 0) / 1e9 * LOAD_S_PER_GB[cache]
