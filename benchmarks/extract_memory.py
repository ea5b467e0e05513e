"""Does the extract stage's memory stay flat as the data grows? Peak RSS at 1x and 4x the samples.

    .hostenv/bin/python benchmarks/extract_memory.py [--config configs/demo.yaml] [--out DIR] [--samples N]
    .hostenv/bin/python benchmarks/extract_memory.py --tiny --out DIR     (the suite's run: a toy target)

Runs the real stage (`python -m eagleflow.stages.extract`, backend hf, CPU) on one generate shard of
N conversations and on one of 4N (the config's finished generate stage, its conversations repeated),
and prints tokens, bytes written and the stage process's peak resident memory (ru_maxrss). Before
the streaming writer, a generate shard's states were held whole in memory: at the demo's size
(hidden 192) that is 2.4 KiB a token, at Kimi-K2.5's (hidden 7168) 57 KiB, so 4x the samples in a
shard meant about 4x the memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, Path(__file__).parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from extract_backends import newest, run_extract  # noqa: E402

from eagleflow.config import load_config  # noqa: E402
from eagleflow.contracts.manifest import Manifest  # noqa: E402
from eagleflow.contracts.stage_records import ExtractMetrics, ExtractOutputs, GenerateOutputs  # noqa: E402


def grown_generate(gen: Manifest, n: int, out: Path) -> Manifest:
    """One generate shard of n train conversations: the source's, repeated as often as needed."""
    out.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(gen.path(GenerateOutputs.of(gen).shards[0]), columns=["split", "input_ids", "loss_mask"])
    ids, masks = table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()
    rows = [(ids[i % len(ids)], masks[i % len(ids)]) for i in range(n)]
    pq.write_table(
        pa.table({"split": ["train"] * n, "input_ids": [r[0] for r in rows], "loss_mask": [r[1] for r in rows]}),
        out / "shard-00000.parquet",
    )
    outputs = GenerateOutputs(
        shards=["shard-00000.parquet"], num_train=n, num_holdout=0, num_tokens=sum(len(r[0]) for r in rows)
    )
    return Manifest(stage="generate", key=f"x{n}", dir=str(out), outputs=outputs.model_dump())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "extract-memory")
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--tiny", action="store_true", help="a toy target and random data (benchmarks/extract_gpu.py)")
    args = p.parse_args()
    out = args.out.resolve()
    if args.tiny:
        import torch
        from extract_gpu import SHAPES, build_generate, build_target, config_for

        target = out / "target-tiny"
        build_target(target, SHAPES["tiny"], torch.device("cpu"))
        source = build_generate(out / "source", 16, 128, SHAPES["tiny"]["vocab_size"])
        data = config_for(out, target, 2048, 128)
        data["extract"].update(device="cpu")
    else:
        config = load_config(args.config)
        source = newest(Path(config.host.work_root), "generate")
        data = config.model_dump(mode="json")
        data["extract"].update(backend="hf", device="cpu")
    data["extract"]["shard_bytes"] = 64 << 20  # several shards at 4x: the cut by bytes is exercised too
    results = {}
    print(f"{'samples':>8}{'tokens':>10}{'GB written':>12}{'shards':>8}{'peak RSS MiB':>14}")
    for n in (args.samples, 4 * args.samples):
        gen = grown_generate(source, n, out / f"generate-{n}")
        m, _ = run_extract(data, gen, out / f"extract-{n}")
        metrics, outputs = ExtractMetrics.of(m), ExtractOutputs.of(m)
        results[n] = {
            "tokens": metrics.tokens_extracted,
            "bytes": outputs.num_bytes,
            "shards": len(outputs.shards),
            "peak_rss_mib": metrics.peak_rss_mib,
        }
        print(
            f"{n:>8}{metrics.tokens_extracted:>10}{outputs.num_bytes / 1e9:>12.3f}{len(outputs.shards):>8}"
            f"{metrics.peak_rss_mib:>14.0f}"
        )
    small, big = results[args.samples], results[4 * args.samples]
    ratio = big["peak_rss_mib"] / small["peak_rss_mib"]
    print(f"4x the samples: {big['bytes'] / small['bytes']:.2f}x the bytes, {ratio:.2f}x the peak memory")
    (out / "extract_memory.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
