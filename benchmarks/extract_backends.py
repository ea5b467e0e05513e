"""The extract stage's backends side by side: do the engine's states equal transformers' states, and production's?

    .hostenv/bin/python benchmarks/extract_backends.py [--config configs/demo.yaml] [--set KEY=VALUE ...]
        [--out DIR] [--backends hf vllm production] [--storage bfloat16] [--max-samples N]
        [--train-seeds 0 1] [--train-device cpu] [--run-generate]

Runs the real stage (`python -m eagleflow.stages.extract request.json`) once per backend on the
config's finished generate stage (the newest under host.work_root, e.g. after `make demo`; with
`--run-generate` the real generate stage first, in DIR: a GPU host with nothing run yet), then
compares the states of every sequence per layer against the first backend's:

    cos       cosine similarity per token, mean (and min) over tokens
    max rel   max |a - b| / max |b| over the layer: what separates right from wrong here (the
              final state before the norm against the normed one still has cosine 0.999, but
              max rel 2.8; a one-layer shift has cosine 0.94)

and prints each run's rate, bytes and peak memory. With `--max-samples` only the first N
conversations of the generate stage are used (a copy of its Parquet, cut).

`production`: the target served as production (eagleflow's own launch of engine.*, its context long enough for
extract.max_seq_len) with eagleflow's capture plugin on, for that run; the stage sends it capture requests.
`--train-seeds`: the real train stage on each run's states, once per seed (train.seed; the config's train.*
otherwise): the drafters' simulated serving AL on the holdout, so a difference between backends reads against
the spread between seeds.
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

from eagleflow.config import load_config, parse_overrides  # noqa: E402
from eagleflow.contracts.manifest import Manifest, read_manifest  # noqa: E402
from eagleflow.contracts.stage_records import (  # noqa: E402
    ExtractMetrics,
    ExtractOutputs,
    GenerateOutputs,
    TrainMetrics,
)
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
    if config_data["extract"].get("backend") == "production":
        return extract_from_production(config_data, gen, stage_dir)
    return run_stage("extract", config_data, {"generate": gen}, stage_dir)


def extract_from_production(config_data: dict, gen: Manifest, stage_dir: Path) -> tuple[Manifest, float]:
    """The stage against the target served as production with the capture plugin on (stopped afterwards)."""
    from capture_gpu import entry_point_env, free_port

    from eagleflow.config import parse_config
    from eagleflow.engines import make_server
    from eagleflow.engines.capture_plugin import DIR_ENV, LAYERS_ENV
    from eagleflow.engines.launch import target_launch

    capture = stage_dir.parent / f"{stage_dir.name}-capture"
    data = json.loads(json.dumps(config_data))
    data["extract"]["capture_dir"] = str(capture)
    data["production"]["url"] = "http://127.0.0.1:1"  # production's own, once it serves
    cfg = parse_config(data)
    layers = ",".join(str(i) for i in [*cfg.target.aux_layer_ids, cfg.target.final_layer_id])
    spec = target_launch(cfg)
    longest = max(spec.engine.max_model_len, cfg.extract.max_seq_len + 1)
    spec.engine = spec.engine.model_copy(update={"max_model_len": longest, "port": free_port()})
    env = {**entry_point_env(stage_dir.parent), DIR_ENV: str(capture), LAYERS_ENV: layers}
    stage_dir.mkdir(parents=True, exist_ok=True)
    with make_server(spec, stage_dir.parent / f"{stage_dir.name}-production.log", env=env, name="production") as s:
        data["production"]["url"] = s.base_url
        return run_stage("extract", data, {"generate": gen}, stage_dir)


def train_al(config_data: dict, m: Manifest, seed: int, stage_dir: Path, device: str = "cpu") -> float:
    """The simulated serving AL on the holdout of a drafter trained on `m`'s states (the train stage's best)."""
    data = json.loads(json.dumps(config_data))
    data["train"].update(seed=seed, device=device)
    t, _ = run_stage("train", data, {"extract": m}, stage_dir)
    return float(TrainMetrics.of(t).best.acceptance_length or 0.0)


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
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE (YAML value) config overrides")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "extract-backends")
    p.add_argument("--backends", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm", "production"])
    p.add_argument("--storage", nargs="+", default=["bfloat16"], choices=["bfloat16", "float8_e4m3fn"])
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument("--train-seeds", type=int, nargs="*", default=[], help="train a drafter on each run, per seed")
    p.add_argument("--train-device", default="cpu", help="train.device of those drafters (cuda on a GPU host)")
    p.add_argument("--run-generate", action="store_true", help="run the generate stage first, in DIR/generate-run")
    p.add_argument(
        "--generate",
        type=Path,
        default=None,
        help="a generate stage's manifest.json (default: the newest under the config's host.work_root)",
    )
    args = p.parse_args()
    out = args.out.resolve()
    sets = parse_overrides(args.set)
    config = load_config(args.config, {"host.python": sys.executable, **sets})
    if args.run_generate:
        gen, wall = run_stage("generate", config.model_dump(mode="json"), {}, out / "generate-run")
        print(f"generate stage: {wall:.1f} s")
    elif args.generate:
        gen = read_manifest(args.generate)
    else:
        gen = newest(Path(config.host.work_root), "generate")
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
    if args.train_seeds:
        data = config.model_dump(mode="json")
        print(f"\nsimulated serving AL on the holdout of drafters trained on each run (train.seed {args.train_seeds})")
        report["holdout_al"] = {}
        for name, m in runs.items():
            als = [
                train_al(data, m, seed, out / f"train-{name}-seed{seed}", args.train_device)
                for seed in args.train_seeds
            ]
            report["holdout_al"][name] = als
            print(f"{name:24}" + "".join(f"{a:>8.3f}" for a in als) + f"   mean {sum(als) / len(als):.3f}")
    (out / "extract_backends.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
