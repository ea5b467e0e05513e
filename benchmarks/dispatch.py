"""Dispatch overhead of a no-op remote stage over SSH on loopback (issue 3: at most 1 s).

    .venv/bin/python benchmarks/dispatch.py [--rounds 20]

Starts a real sshd on 127.0.0.1 (tests/sshd.py), then times, round-robin so drift hits all alike:
  local   the no-op stage command run as a local subprocess: the floor every host pays
  warm    SshHost.run_job on an open connection: job start, detached supervisor, log follow, exit status
  cold    what a stage task pays: connect + authenticate, write request.json (SFTP), run_job, read the
          manifest the stage wrote (SFTP), close
The no-op stage is the host Python writing a manifest, so interpreter start-up is in every column.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagleflow.config import HostConfig  # noqa: E402
from eagleflow.hosts.ssh import SshHost  # noqa: E402
from tests.sshd import start_sshd  # noqa: E402

HOST_PY = str(ROOT / ".hostenv" / "bin" / "python")
NOOP = "import sys; open(sys.argv[1], 'w').write('{}')"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-dispatch-"))
    sshd = start_sshd(base / "sshd")
    cfg = HostConfig(
        kind="ssh",
        name="loopback",
        address="127.0.0.1",
        port=sshd.port,
        key_path=str(sshd.user_key),
        known_hosts=str(sshd.known_hosts),
        work_root=str(base / "work"),
        python=HOST_PY,
    )
    times: dict[str, list[float]] = {"local": [], "warm": [], "cold": []}
    try:
        warm = SshHost(cfg)
        for i in range(args.rounds + 1):  # round 0 warms caches and is dropped
            d = f"{cfg.work_root}/local-{i}"
            Path(d).mkdir(parents=True)
            t = time.perf_counter()
            subprocess.run([HOST_PY, "-c", NOOP, f"{d}/manifest.json"], check=True)
            local = time.perf_counter() - t

            d = f"{cfg.work_root}/warm-{i}"
            t = time.perf_counter()
            warm.run_job(d, [HOST_PY, "-c", NOOP, f"{d}/manifest.json"], log=lambda s: None)
            warm_s = time.perf_counter() - t

            d = f"{cfg.work_root}/cold-{i}"
            t = time.perf_counter()
            with SshHost(cfg) as host:
                host.write_text(f"{d}/request.json", '{"stage": "noop"}')
                host.run_job(d, [HOST_PY, "-c", NOOP, f"{d}/manifest.json"], log=lambda s: None)
                host.read_text(f"{d}/manifest.json")
            cold = time.perf_counter() - t
            if i:
                times["local"].append(local)
                times["warm"].append(warm_s)
                times["cold"].append(cold)
        warm.close()
    finally:
        sshd.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"no-op stage over SSH on loopback, {args.rounds} rounds, medians (min-max):")
    for k, v in times.items():
        print(f"  {k:<6} {med[k] * 1000:7.0f} ms  ({min(v) * 1000:.0f}-{max(v) * 1000:.0f})")
    print(f"dispatch overhead, warm connection: {(med['warm'] - med['local']) * 1000:.0f} ms")
    print(f"dispatch overhead, per task (cold): {(med['cold'] - med['local']) * 1000:.0f} ms  (goal: <= 1000 ms)")


if __name__ == "__main__":
    main()
