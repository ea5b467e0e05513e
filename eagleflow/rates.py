"""The rates a capacity plan uses where the host has measured none, each with its source: the seeds' run of
../shared/DESIGN.md (Kimi-K2.5, INT4, 8 x H200, vLLM) and what this project measured on an H200
(docs/benchmarks.md). Pure constants, and the engine's start built of them; eagleflow.capacity states them in
a plan.
"""

from __future__ import annotations

NUM_STATES = 4  # the three aux states, then the final layer's output

SEED_SAMPLES = 10_000
SEED_BF16_BYTES = 828e9  # their hidden states in bf16
SEED_TOKENS = SEED_BF16_BYTES / (NUM_STATES * 7168 * 2)  # ~14.44 M: 1,444 tokens a sample
DEFAULT_PROMPT_TOKENS = 250  # an assumption: DESIGN.md gives the total per sample, not the split
DEFAULT_ANSWER_TOKENS = round(SEED_TOKENS / SEED_SAMPLES) - DEFAULT_PROMPT_TOKENS  # 1,194
SEED_GENERATE_S = 5.3 * 3600
DEFAULT_GENERATE_TOK_S = SEED_SAMPLES * DEFAULT_ANSWER_TOKENS / SEED_GENERATE_S  # ~626 output tok/s
DEFAULT_EXTRACT_TOK_S = {"vllm": 3165.0, "hf": 14600.0}
DEFAULT_DISK_WRITE_BPS = 0.7e9  # an H200 host's disk (DESIGN.md); a later one wrote 1.3 GB/s
SEED_TRAIN_S, SEED_EPOCHS, SEED_TRAIN_FRACTION = 2.6 * 3600, 5, 0.9
DEFAULT_TRAIN_TOK_S = SEED_EPOCHS * SEED_TRAIN_FRACTION * SEED_TOKENS / SEED_TRAIN_S  # ~6,900 tok/s
# Engine loads with eagleflow's launch settings (vLLM's own load strategy, the compile cache kept), measured on one
# H200 with vLLM 0.26 from its local NVMe (benchmarks/engine_load.py, docs/benchmarks.md "Engine loads", 26 GB):
# seconds a GB of weights read cold (1.5 GB/s: the disk) and warm (the page cache), on top of ~60 s of the rest
# (two imports of vLLM, engine init with the compile cache kept, graph capture). Not in them: a quantized MoE's
# repacking at every start (Kimi-K2.5's INT4 Marlin) and 8 tensor-parallel workers; the seeds saw 22-40 min.
LOAD_S_PER_GB = {"cold": 0.666, "warm": 0.154}
ENGINE_BASE_START_S = 60.0
# Training on GPUs, measured (docs/benchmarks.md, "The trainer at Kimi-K2.5's drafter shape"): one H200's model
# FLOP/s at that shape, T 8,192; the train stage against the bare step (28,594 / 30,376 tok/s, Llama-8B shape); per
# GPU with 2 ranks against 1 (21,786 / (2 x 17,068), Llama-1B shape, 2 H200s: a floor, a small drafter's gradients
# weigh more against its compute). 8 GPUs are scaled from those.
H200_TRAIN_TFLOPS = 522.5
TRAIN_STAGE_FRACTION = 0.94
DDP_GPU_EFFICIENCY = 0.64
# Muon's Newton-Schulz (train.optimizer 'muon'): a fixed cost a step on every rank (DDP repeats it), measured as the
# step's growth against AdamW at Kimi-K2.5's drafter shape on one H200 (912.9 - 666.7 ms, T 8,192,
# benchmarks/train_gpu.py --optimizer muon), over its FLOPs as eagleflow.capacity.muon_flops_per_step counts them
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
    "prompt": "default: an assumed 250 of the seeds' 1,444 tokens a sample (DESIGN.md gives only the total)",
    "answer": "default: the seeds' 10,000 samples came to ~14.4 M tokens (DESIGN.md)",
    "generate": "default: the seeds' 10,000 answers took 5.3 h from Kimi-K2.5's server (DESIGN.md)",
    "vllm": "default: the seeds extracted Kimi-K2.5's states at 3,165 tok/s (DESIGN.md)",
    "hf": "default: the extract stage's transformers forward ran 14.6k tok/s on an H200, 8B Llama shape (DESIGN.md)",
    "train": "default: the seeds trained 5 epochs in 2.6 h (DESIGN.md)",
    "engine": "measured: an H200's NVMe with vLLM 0.26, 26 GB (docs/benchmarks.md, Engine loads), scaled by the "
              "weights; a quantized MoE's repack and TP8 start not in it (the seeds saw 22-40 min)",
    "benchmark": "default: Kimi-K2.5 serves 82.5 tok/s a request without speculation (DESIGN.md), a window "
                 "at that rate x its concurrency",
    "export": "default: a drafter export takes about a minute",
    "check": "default: seconds of host checks",
}


def engine_start_s(weights_bytes: int | None, cache: str = "cold") -> float:
    """An engine's start from a cold (or warm) page cache, at the H200's measured rates scaled by the weights."""
    return ENGINE_BASE_START_S + (weights_bytes or 0) / 1e9 * LOAD_S_PER_GB[cache]
