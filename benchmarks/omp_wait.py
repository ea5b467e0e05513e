"""Side-by-side CPU training processes under OpenMP's default (spinning) and passive wait policies.

    .hostenv/bin/python benchmarks/omp_wait.py --copies 3 --steps 6        (the figures in docs/benchmarks.md)
    .hostenv/bin/python benchmarks/omp_wait.py --copies 2 --steps 1 --seq-len 64   (the suite's tiny run)

`make test` runs three pytest processes side by side on 2 cores; each starts trainers, extractors and CPU
engines with OMP_NUM_THREADS=2 (the demo's host.env). An OpenMP thread that waits at a barrier spins by
default, holding a core the other processes need. This script measures what that costs: eagleflow's own
training step (`eagleflow.drafter.step.train_step`, benchmarks/train_gpu.py's `eagleflow_step`) at the
demo target's drafter shape, first one process alone, then `--copies` processes at once, under each policy
(`OMP_WAIT_POLICY` unset, then PASSIVE), each with 2 threads. Per run: wall and CPU seconds of each copy.
The policies run one after the other in one invocation, alone on the machine as far as the script knows:
run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(steps: int, seq_len: int) -> None:
    """One copy: `steps` training steps at the demo drafter's shape; prints its wall and CPU seconds."""
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks.train_gpu import Shape, eagleflow_step, synthetic_data

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    demo = Shape(
        hidden=192, heads=3, kv_heads=1, head_dim=64, intermediate=512, vocab=2048, draft_vocab=512, rope_theta=10000.0
    )  # demo/target/config.json; draft vocabulary as configs/demo.yaml
    step, _ = eagleflow_step(demo, synthetic_data(demo, 2, seq_len, torch.device("cpu")), 3, torch.device("cpu"))
    step()  # first-call costs out of the timing
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}))


def run(copies: int, policy: str, steps: int, seq_len: int) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--one", "--steps", str(steps), "--seq-len", str(seq_len)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(copies)
    ]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a copy failed under {policy}: {outs}")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=3, help="processes side by side")
    ap.add_argument("--steps", type=int, default=6, help="timed training steps a copy")
    ap.add_argument("--seq-len", type=int, default=1024, help="tokens a sequence (2 sequences a step)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args.steps, args.seq_len)
        return 0
    alone = run(1, "default", args.steps, args.seq_len)[0]
    print(f"alone (default policy): wall {alone['wall_s']:.1f} s, cpu {alone['cpu_s']:.1f} s")
    slowest = {}
    for policy in ("default", "PASSIVE"):
        res = run(args.copies, policy, args.steps, args.seq_len)
        slowest[policy] = max(r["wall_s"] for r in res)
        print(
            f"{args.copies} at once, OMP_WAIT_POLICY={policy}: wall "
            + ", ".join(f"{r['wall_s']:.1f}" for r in res)
            + " s; cpu "
            + ", ".join(f"{r['cpu_s']:.1f}" for r in res)
            + " s"
        )
    print(
        f"slowest copy, default over PASSIVE: {slowest['default'] / slowest['PASSIVE']:.2f}x; the work of "
        f"{args.copies} copies done one after another would take {args.copies * alone['wall_s']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
