"""The extract stage's backends side by side: do the engine's states equal transformers' states?

    .hostenv/bin/python benchmarks/extract_backends.py [--config configs/demo.yaml] [--out DIR]
        [--backends hf vllm] [--storage bfloat16] [--max-samples N]

Runs the real stage (`python -m eagleflow.stages.extract request.json`) once per backend on the
config's finished generate stage (the newest under host.work_root, e.g. after `make demo`), then
compares the states of every sequence per layer:

    cos       cosine similarity per token, mean (and min) over tokens
    max rel   max |a - b| / max |b| over the layer: what separates right from wrong here (the
              final state before the norm against the normed one still has cosine 0.999, but
              max rel 2.8; a one-layer shift has cosine 0.94)

and prints each run's rate, bytes and peak memory. With `--max-samples` only the first N
conversations of the generate stage are used (a copy of its Parquet, cut).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, Path(__file__).parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from stage_run import run_stage  # noqa: E402

from eagleflow.config import load_config  # noqa: E402
from eagleflow.contracts.manifest import Manifest, read_manifest  # noqa: E402
from eagleflow.contracts.stage_records import ExtractMetrics, ExtractOutputs, GenerateOutputs  # noqa: E402
from eagleflow.drafter.data import SequenceStore, read_index  # noqa: E402


def newest(work_root: Path, stage: str) -> Manifest:
    found = sorted(work_root.glob(f"{stage}/*/manifest.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no finished {stage} stage under {work_root}: run `make demo` first")
    return read_manifest(found[-1])


def cut_generate(gen: Manifest, n: int, out: Path) -> Manifest:
    """The first n conversations of a generate stage (both splits kept in proportion), as a manifest."""
    out.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(gen.path(GenerateOutputs.of(gen).shards[0]))
    table = table.slice(0, min(n, table.num_rows))
    pq.write_table(table, out / "shard-00000.parquet")
    outputs = GenerateOutputs.of(gen).model_copy(update={"shards": ["shard-00000.parquet"]})
    return Manifest(stage="generate", key=f"{gen.key}-first{n}", dir=str(out), outputs=outputs.model_dump())


def run_extract(config_data: dict, gen: Manifest, stage_dir: Path) -> tuple[Manifest, float]:
    return run_stage("extract", config_data, {"generate": gen}, stage_dir)


def sequences(m: Manifest) -> dict[tuple[int, ...], torch.Tensor]:
    """Every sequence's states [T, 4, H] f32 as training reads them (fp8 dequantized), keyed by its token
    ids (each backend orders a shard its own way)."""
    index = read_index(m.path(ExtractOutputs.of(m).index), stage_dir=m.dir)
    out = {}
    for split in ("train", "holdout"):
        store = SequenceStore(index.split(split), max_seq_len=1 << 20)
        for i in range(len(store)):
            out[tuple(store.tokens(i)[0].tolist())] = store.hidden(i).float()
    return out


def compare(a: dict, b: dict, names: list[str]) -> list[dict]:
    """Per layer: cosine (mean, min over tokens) and max relative error of b against a."""
    common = [k for k in a if k in b]
    if len(common) != len(a) or len(a) != len(b):
        raise SystemExit(f"the runs hold different sequences ({len(a)} vs {len(b)}, {len(common)} shared)")
    x = torch.cat([a[k] for k in common])  # [N, 4, H]
    y = torch.cat([b[k] for k in common])
    rows = []
    for layer, name in enumerate(names):
        u, v = x[:, layer], y[:, layer]
        cos = torch.nn.functional.cosine_similarity(u, v, dim=-1)  # [N]
        rows.append(
            {
                "layer": name,
                "tokens": int(u.shape[0]),
                "cos_mean": cos.mean().item(),
                "cos_min": cos.min().item(),
                "max_rel_err": ((u - v).abs().max() / u.abs().max()).item(),
                "mean_rel_err": ((u - v).norm(dim=-1) / u.norm(dim=-1).clamp_min(1e-12)).mean().item(),
            }
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "extract-backends")
    p.add_argument("--backends", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    p.add_argument("--storage", nargs="+", default=["bfloat16"], choices=["bfloat16", "float8_e4m3fn"])
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument(
        "--generate",
        type=Path,
        default=None,
        help="a generate stage's manifest.json (default: the newest under the config's host.work_root)",
    )
    args = p.parse_args()
    out = args.out.resolve()
    config = load_config(args.config)
    gen = read_manifest(args.generate) if args.generate else newest(Path(config.host.work_root), "generate")
    if args.max_samples:
        gen = cut_generate(gen, args.max_samples, out / "generate")
    runs: dict[str, Manifest] = {}
    print(f"{'run':24}{'tok/s':>10}{'wall s':>9}{'GB':>8}{'peak RSS MiB':>14}")
    for backend in args.backends:
        for storage in args.storage:
            data = config.model_dump(mode="json")
            data["extract"].update(backend=backend, storage_dtype=storage)
            name = f"{backend}-{storage}"
            m, wall = run_extract(data, gen, out / name)
            metrics = ExtractMetrics.of(m)
            runs[name] = m
            print(
                f"{name:24}{metrics.tok_s or 0:>10.0f}{wall:>9.1f}{ExtractOutputs.of(m).num_bytes / 1e9:>8.3f}"
                f"{metrics.peak_rss_mib or 0:>14.0f}"
            )
    names = [f"aux {i}" for i in config.target.aux_layer_ids] + [f"final {config.target.final_layer_id} (pre-norm)"]
    ref_name = next(iter(runs))
    ref = sequences(runs[ref_name])
    report = {
        "runs": {k: {"metrics": m.metrics, "bytes": ExtractOutputs.of(m).num_bytes} for k, m in runs.items()},
        "parity": {},
    }
    for name, m in list(runs.items())[1:]:
        rows = compare(ref, sequences(m), names)
        report["parity"][f"{name} vs {ref_name}"] = rows
        print(f"\n{name} against {ref_name} ({rows[0]['tokens']} tokens)")
        print(f"{'layer':22}{'cos mean':>10}{'cos min':>10}{'max rel':>10}{'mean rel':>10}")
        for r in rows:
            print(
                f"{r['layer']:22}{r['cos_mean']:>10.6f}{r['cos_min']:>10.6f}{r['max_rel_err']:>10.2e}"
                f"{r['mean_rel_err']:>10.2e}"
            )
    (out / "extract_backends.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
