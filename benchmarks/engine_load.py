"""How long vLLM takes to become healthy on a large checkpoint: weight-loading strategies, a cold or warm
page cache, a fresh or kept torch.compile cache (issue 23, "production stays served").

    python3 benchmarks/engine_load.py --work $HOME/engine-load --out $OUT \\
        --runs probe lazy/cold/fresh lazy/warm/kept lazy/warm/fresh prefetch/cold/kept ...   (GPU host, vLLM)
    python3 benchmarks/engine_load.py --work /tmp/el --out /tmp/el --size-gb 0.05 --runs write   (CPU: checkpoint only)

`write` (implied by any start) writes a Llama-shaped checkpoint of random bf16 weights into WORK/ckpt
(Llama-2-13B's shape by default, the layer count chosen for --size-gb; --shard-gb per safetensors
file; tokenizer files copied from demo/target, vocab_size >= the tokenizer's), once: a later call
reuses it. Each run STRATEGY/CACHE/COMPILE then starts `python3 -m vllm.entrypoints.openai.api_server`
on it, times seconds to /health, sends one completion, stops it, and parses vLLM's own log lines:

    STRATEGY  default (no flag), lazy, eager, prefetch (--safetensors-load-strategy),
              mtN (--model-loader-extra-config '{"enable_multithread_load": true, "num_threads": N}'),
              mtN+prefetch (both; 0.26 refuses the pair, a start shows how)
    CACHE     cold: the shards' pages evicted first (fsync, posix_fadvise DONTNEED; checked with
              mincore), warm: read into the page cache first
    COMPILE   fresh: VLLM_CACHE_ROOT an empty folder, kept: the folder of the last run that compiled,
              eager: --enforce-eager

`probe` checks, without starting a server (one `import vllm`), which flags the installed engine's
parser accepts and which LoadConfig combinations its default loader accepts.

Prints one JSON line per run (also appended to OUT/engine_load.jsonl, each server's log in
OUT/engine_load-<n>.log) and a table at the end. Nothing else runs beside a start; every server is
this script's child, stopped by its process group.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.vllm_server import Server, gpu_used_mib, log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9

# vLLM 0.26.0's own log lines (vllm/model_executor/model_loader/*.py, v1/worker/gpu_model_runner.py,
# compilation/*.py, v1/engine/core.py).
PATTERNS = {
    "fs_type": r"Filesystem type for checkpoints: (\S+)\. Checkpoint size: ([\d.]+) GiB",
    "weights_s": r"Loading weights took ([\d.]+) seconds",
    "model_load": r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds",
    "prefetch_s": r"Prefetching checkpoint files into page cache finished in ([\d.]+)s",
    "dynamo_s": r"Dynamo bytecode transform time: ([\d.]+) s",
    "compile_graph_s": r"Compiling a graph for compile range (\(.*?\)) takes ([\d.]+) s",
    "cache_load_s": (
        r"Directly load the compiled graph\(s\) for compile range (\(.*?\)) from the cache, took ([\d.]+) s"
    ),
    "torch_compile_s": r"torch\.compile took ([\d.]+) s in total",
    "graph_capture": r"Graph capturing finished in ([\d.]+) secs, took ([\d.]+) GiB",
    "init_engine": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s(?: \(compilation: ([\d.]+) "
    r"s)?",
    "kv_cache_gib": r"Available KV cache memory: ([\d.]+) GiB",
}


def llama_shape(size_gb: float, vocab: int, hidden: int, inter: int, heads: int, kv_heads: int) -> dict:
    head_dim = hidden // heads
    per_layer = (2 * hidden * hidden + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter + 2 * hidden) * 2
    fixed = (2 * vocab * hidden + hidden) * 2
    layers = max(1, round((size_gb * GB - fixed) / per_layer))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "attention_bias": False,
        "mlp_bias": False,
    }


def write_checkpoint(
    ckpt: Path,
    size_gb: float,
    shard_gb: float,
    tokenizer_dir: Path,
    vocab: int,
    hidden: int,
    inter: int,
    heads: int,
    kv_heads: int,
) -> dict:
    """Random bf16 weights (std 0.02, norms 1) in safetensors shards of about shard_gb; reused if complete."""
    import torch
    from safetensors.torch import save_file

    done = ckpt / "done.json"
    if done.is_file():
        return json.loads(done.read_text())
    if ckpt.exists():
        shutil.rmtree(ckpt)
    ckpt.mkdir(parents=True)
    tok_cfg = json.loads((tokenizer_dir / "config.json").read_text())
    vocab = max(vocab, int(tok_cfg["vocab_size"]))
    cfg = llama_shape(size_gb, vocab, hidden, inter, heads, kv_heads)
    L, H, I, hd = cfg["num_hidden_layers"], hidden, inter, cfg["head_dim"]  # noqa: E741 - the formulas' names
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()

    def layer(i):
        p = f"model.layers.{i}."
        return {
            p + "self_attn.q_proj.weight": rnd(H, H),
            p + "self_attn.k_proj.weight": rnd(kv_heads * hd, H),
            p + "self_attn.v_proj.weight": rnd(kv_heads * hd, H),
            p + "self_attn.o_proj.weight": rnd(H, H),
            p + "mlp.gate_proj.weight": rnd(I, H),
            p + "mlp.up_proj.weight": rnd(I, H),
            p + "mlp.down_proj.weight": rnd(H, I),
            p + "input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
        }

    groups = (
        [lambda: {"model.embed_tokens.weight": rnd(vocab, H)}]
        + [lambda i=i: layer(i) for i in range(L)]
        + [lambda: {"model.norm.weight": torch.ones(H, dtype=torch.bfloat16), "lm_head.weight": rnd(vocab, H)}]
    )
    t0, written, shard, shard_bytes, files, weight_map = time.perf_counter(), 0, {}, 0, [], {}

    def flush():
        nonlocal shard, shard_bytes, written
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, str(ckpt / name), metadata={"format": "pt"})
        fd = os.open(ckpt / name, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        files.append(name)
        weight_map.update({k: name for k in shard})
        written += shard_bytes
        log(f"wrote {name}: {shard_bytes / GB:.2f} GB ({written / GB:.1f} GB, {time.perf_counter() - t0:.0f} s)")
        shard, shard_bytes = {}, 0

    for g in groups:
        tensors = g()
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if shard and shard_bytes + size > shard_gb * GB:
            flush()
        shard.update(tensors)
        shard_bytes += size
    flush()
    seconds = time.perf_counter() - t0
    # Rename to the n-of-N names transformers writes.
    final = {}
    for i, name in enumerate(files):
        new = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        (ckpt / name).rename(ckpt / new)
        final[name] = new
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {"total_size": written}, "weight_map": {k: final[v] for k, v in weight_map.items()}}, indent=1
        )
    )
    (ckpt / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (tokenizer_dir / f).is_file():
            shutil.copy(tokenizer_dir / f, ckpt / f)
    info = {
        "bytes": written,
        "gb": round(written / GB, 3),
        "files": len(files),
        "layers": L,
        "hidden": H,
        "intermediate": I,
        "heads": heads,
        "kv_heads": kv_heads,
        "vocab_size": vocab,
        "params_b": round(written / 2 / 1e9, 3),
        "write_s": round(seconds, 1),
        "write_gb_s": round(written / GB / seconds, 2),
        "device_for_random": dev,
    }
    done.write_text(json.dumps(info))
    return info


# ------------------------------------------------------------------------------------------ page cache

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_bytes(path: Path) -> int:
    """Bytes of the file in the page cache (mincore over a read-only shared mapping)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            n = (size + page - 1) // page
            vec = (ctypes.c_ubyte * n)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(b & 1 for b in bytes(vec)) * page
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def shard_files(ckpt: Path) -> list[Path]:
    return sorted(ckpt.glob("*.safetensors"))


def cached_gb(ckpt: Path) -> float:
    return round(sum(resident_bytes(f) for f in shard_files(ckpt)) / GB, 2)


def meminfo_cached_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Cached:"):
            return round(int(line.split()[1]) * 1024 / GB, 2)
    return -1.0


def make_cold(ckpt: Path) -> dict:
    before = (cached_gb(ckpt), meminfo_cached_gb())
    for f in shard_files(ckpt):
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    how = "posix_fadvise"
    if cached_gb(ckpt) > 0.05:  # fadvise left pages behind: drop the whole page cache (root)
        subprocess.run(["sync"], check=False)
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            how = "posix_fadvise+drop_caches"
        except OSError as exc:
            how = f"posix_fadvise (drop_caches refused: {exc})"
    return {
        "how": how,
        "ckpt_cached_gb_before": before[0],
        "meminfo_cached_gb_before": before[1],
        "ckpt_cached_gb_after": cached_gb(ckpt),
        "meminfo_cached_gb_after": meminfo_cached_gb(),
    }


def make_warm(ckpt: Path) -> dict:
    t0, n = time.perf_counter(), 0
    for f in shard_files(ckpt):
        with open(f, "rb") as fh:
            while chunk := fh.read(64 << 20):
                n += len(chunk)
    return {
        "how": "read",
        "read_s": round(time.perf_counter() - t0, 2),
        "ckpt_cached_gb_after": cached_gb(ckpt),
        "meminfo_cached_gb_after": meminfo_cached_gb(),
    }


# ------------------------------------------------------------------------------------------ server


def wait_gpu_free(limit_mib: int = 2048, timeout_s: float = 60) -> None:
    end = time.time() + timeout_s
    while time.time() < end:
        used = gpu_used_mib()
        if used is None or used < limit_mib:
            return
        time.sleep(1)
    log(f"GPU still has {gpu_used_mib()} MiB in use")


def parse_log(text: str) -> dict:
    out: dict = {}
    for key, pat in PATTERNS.items():
        hits = re.findall(pat, text)
        if not hits:
            continue
        if key == "fs_type":
            out["fs_type"], out["vllm_ckpt_gib"] = hits[0][0], float(hits[0][1])
        elif key == "model_load":
            out["model_load_gib"], out["model_load_s"] = float(hits[0][0]), float(hits[0][1])
        elif key == "graph_capture":
            out["graph_capture_s"], out["graph_capture_gib"] = float(hits[0][0]), float(hits[0][1])
        elif key == "init_engine":
            out["init_engine_s"] = float(hits[0][0])
            if hits[0][1]:
                out["init_compilation_s"] = float(hits[0][1])
        elif key in ("compile_graph_s", "cache_load_s"):
            out[key] = {r: float(s) for r, s in hits}
        else:
            out[key] = float(hits[0])
    return out


# Where the seconds to /health go: each marker's log timestamp (whole seconds) less the start.
PHASES = [
    ("api_server_up", r"version 0\.\d+"),
    ("arch_resolved", r"Resolved architecture"),
    ("engine_core_up", r"Initializing a V1 LLM engine"),
    ("load_start", r"Loading model from scratch|Starting to load model"),
    ("model_loaded", r"Model loading took"),
    ("dynamo_done", r"Dynamo bytecode transform"),
    ("compile_done", r"torch\.compile took"),
    ("graphs_captured", r"Graph capturing finished"),
    ("warmup_done", r"Kernel JIT monitor activated"),
    ("engine_ready", r"init engine \(profile"),
    ("serving", r"Starting vLLM server"),
]


def phases(text: str, start_hms: str) -> dict:
    """Seconds from the start (HH:MM:SS) to each marker's first log line (whole seconds, same day)."""

    def sec(t: str) -> int:
        h, m, s = map(int, t.split(":"))
        return h * 3600 + m * 60 + s

    out = {}
    for key, pat in PHASES:
        m = re.search(r"(\d\d:\d\d:\d\d)[^\n]*(?:" + pat + ")", text)
        if m:
            out[key] = sec(m.group(1)) - sec(start_hms)
    return out


def start_server(args, ckpt: Path, strategy: str, compile_mode: str, cache_root: Path, log_path: Path) -> dict:
    cmd = [
        "--model",
        str(ckpt),
        "--served-model-name",
        "big",
        "--max-model-len",
        str(args.max_model_len),
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--disable-uvicorn-access-log",
    ]
    flags: list[str] = []
    base, _, extra = strategy.partition("+")
    for part in filter(None, (base, extra)):
        if part in ("lazy", "eager", "prefetch"):
            flags += ["--safetensors-load-strategy", part]
        elif m := re.fullmatch(r"mt(\d+)", part):
            flags += [
                "--model-loader-extra-config",
                json.dumps({"enable_multithread_load": True, "num_threads": int(m.group(1))}),
            ]
        elif part != "default":
            raise SystemExit(f"unknown strategy {part!r}")
    if compile_mode == "eager":
        flags.append("--enforce-eager")
    cmd += flags
    start_hms = time.strftime("%H:%M:%S")
    server = Server(cmd, args.port, log_path, {"VLLM_CACHE_ROOT": str(cache_root)}, client_timeout_s=60)
    healthy, health_s, error, completion_ok, peak_cached = False, None, None, None, 0.0
    try:
        health_s = server.wait_healthy(args.start_timeout_s)
        healthy = True
        r = server.client.post(
            server.url + "/v1/completions",
            json={"model": "big", "prompt": "def f(x):", "max_tokens": 8, "temperature": 0},
        )
        completion_ok = r.status_code == 200 and len(r.json()["choices"][0]["text"]) >= 0
        peak_cached = cached_gb(ckpt)
    except RuntimeError as exc:
        error = str(exc).split(":", 1)[0]
    finally:
        server.stop()
    text = log_path.read_text(errors="replace")
    if error:
        tail = [ln for ln in text.splitlines() if "Error" in ln or "error" in ln][-6:]
        error += ": " + " | ".join(tail)[-1500:]
    return {
        "cmd_flags": flags,
        "healthy": healthy,
        "health_s": round(health_s, 2) if health_s else None,
        "completion_ok": completion_ok if healthy else None,
        "error": error,
        "ckpt_cached_gb_after_load": peak_cached,
        **parse_log(text),
        "phases_s": phases(text, start_hms),
    }


# ------------------------------------------------------------------------------------------ probe

PROBE = r"""
import json, sys
out = {}
try:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    p = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    opts = {o for a in p._actions for o in a.option_strings}
    for f in ["--safetensors-load-strategy", "--safetensors-prefetch-num-threads", "--safetensors-prefetch-block-size",
              "--model-loader-extra-config", "--enable-sleep-mode", "--weight-transfer-config", "--load-format",
              "--speculative-config", "--enforce-eager"]:
        out["flag " + f] = f in opts
    act = {o: a for a in p._actions for o in a.option_strings}
    a = act.get("--safetensors-load-strategy")
    out["choices --safetensors-load-strategy"] = list(a.choices) if a is not None and a.choices else None
except Exception as e:
    out["argparse_error"] = repr(e)
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
cases = {"lazy": ("lazy", {}), "eager": ("eager", {}), "prefetch": ("prefetch", {}), "torchao": ("torchao", {}),
         "bogus": ("bogus", {}), "mt8": (None, {"enable_multithread_load": True, "num_threads": 8}),
         "mt8+lazy": ("lazy", {"enable_multithread_load": True, "num_threads": 8}),
         "mt8+eager": ("eager", {"enable_multithread_load": True, "num_threads": 8}),
         "mt8+prefetch": ("prefetch", {"enable_multithread_load": True, "num_threads": 8})}
for name, (strategy, extra) in cases.items():
    try:
        DefaultModelLoader(LoadConfig(safetensors_load_strategy=strategy, model_loader_extra_config=extra))
        out["loader " + name] = "accepted"
    except Exception as e:
        out["loader " + name] = "refused: " + type(e).__name__ + ": " + str(e).splitlines()[0][:300]
import vllm
out["vllm"] = vllm.__version__
print("PROBE " + json.dumps(out))
"""


def probe() -> dict:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")), None)
    res = json.loads(line[6:]) if line else {"error": (r.stdout + r.stderr)[-2000:]}
    res["probe_s"] = round(time.perf_counter() - t0, 1)
    return res


# ------------------------------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="checkpoint and compile caches (kept between calls)")
    ap.add_argument("--out", type=Path, required=True, help="results: engine_load.jsonl and the servers' logs")
    ap.add_argument("--runs", nargs="+", default=["probe", "lazy/cold/fresh", "lazy/warm/kept"])
    ap.add_argument("--size-gb", type=float, default=26.0)
    ap.add_argument("--shard-gb", type=float, default=4.6)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--intermediate", type=int, default=13824)
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--kv-heads", type=int, default=40)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--tokenizer", type=Path, default=ROOT / "demo" / "target")
    ap.add_argument("--port", type=int, default=18631)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--start-timeout-s", type=float, default=420)
    ap.add_argument(
        "--budget-s",
        type=float,
        default=0,
        help="start no further run once this many seconds have passed less --run-estimate-s (0: no limit)",
    )
    ap.add_argument("--run-estimate-s", type=float, default=100)
    args = ap.parse_args()
    t_start = time.perf_counter()
    # A `timeout` (SIGTERM) still stops the server: SystemExit runs the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    jsonl = args.out / "engine_load.jsonl"
    ckpt = args.work / "ckpt"
    state_file = args.work / "state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {"n": 0, "kept": None}
    rows = []

    def emit(rec: dict) -> None:
        rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **rec}
        print(json.dumps(rec), flush=True)
        with open(jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")
        rows.append(rec)

    info = None
    for spec in args.runs:
        if spec == "probe":
            emit({"run": "probe", **probe()})
            continue
        if info is None:
            info = write_checkpoint(
                ckpt,
                args.size_gb,
                args.shard_gb,
                args.tokenizer,
                args.vocab,
                args.hidden,
                args.intermediate,
                args.heads,
                args.kv_heads,
            )
            emit({"run": "checkpoint", **info})
        if spec == "write":
            continue
        if args.budget_s and time.perf_counter() - t_start > args.budget_s - args.run_estimate_s:
            emit({"run": spec, "skipped": f"under {args.run_estimate_s} s left of --budget-s {args.budget_s}"})
            continue
        strategy, cache, comp = spec.split("/")
        state["n"] += 1
        n = state["n"]
        if comp == "fresh" or (comp == "kept" and not state["kept"]):
            cache_root = args.work / f"vllm-cache-{n}"
            shutil.rmtree(cache_root, ignore_errors=True)
            cache_root.mkdir(parents=True)
            kept_from = None
        elif comp == "kept":
            cache_root, kept_from = Path(state["kept"]), state["kept_run"]
        else:  # eager: nothing compiled, an empty cache root
            cache_root, kept_from = args.work / f"vllm-cache-{n}", None
            cache_root.mkdir(parents=True, exist_ok=True)
        wait_gpu_free()
        page = make_cold(ckpt) if cache == "cold" else make_warm(ckpt)
        res = start_server(args, ckpt, strategy, comp, cache_root, args.out / f"engine_load-{n}.log")
        if comp != "eager" and res.get("healthy"):
            state["kept"], state["kept_run"] = str(cache_root), n
        state_file.write_text(json.dumps(state))
        gb = info["bytes"] / GB
        w = res.get("weights_s")
        emit(
            {
                "run": spec,
                "n": n,
                "strategy": strategy,
                "page_cache": cache,
                "compile_cache": comp,
                "compile_cache_from_run": kept_from,
                "ckpt_gb": round(gb, 2),
                "page_cache_prep": page,
                **res,
                "weights_s_per_gb": round(w / gb, 3) if w else None,
                "weights_gb_s": round(gb / w, 2) if w else None,
            }
        )

    runs = [r for r in rows if "strategy" in r]
    if runs:
        print(
            "\n| # | strategy | page cache | compile cache | health s | weights s | s/GB | GB/s | model load s "
            "| torch.compile s | dynamo s | graph capture s | init engine s | cached GB before start |"
        )
        print("|" + "---|" * 14)
        for r in runs:

            def f(k, d=1, r=r):
                v = r.get(k)
                return "-" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))

            print(
                f"| {r['n']} | {r['strategy']} | {r['page_cache']} | {r['compile_cache']}"
                f"{'' if not r.get('compile_cache_from_run') else ' (run ' + str(r['compile_cache_from_run']) + ')'} "
                f"| {f('health_s')} | {f('weights_s', 2)} | {f('weights_s_per_gb', 3)} | {f('weights_gb_s', 2)} "
                f"| {f('model_load_s', 2)} | {f('torch_compile_s', 2)} | {f('dynamo_s', 2)} "
                f"| {f('graph_capture_s', 0)} | {f('init_engine_s', 2)} "
                f"| {r['page_cache_prep'].get('ckpt_cached_gb_after')} |"
                + (f" ERROR {r['error'][:300]}" if r.get("error") else "")
            )
    return 0 if all(r.get("healthy") or "+" in r.get("strategy", "") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
