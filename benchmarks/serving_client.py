"""The benchmark stage's client against a plain client, on the same engine, under each engine flag.

    python3 benchmarks/serving_client.py --out DIR --drafter runs/demo/export/KEY/vllm \\
        --set engine.gpu_memory_utilization=0.2 --parallel-load \\
        --eager true false --clients stage plain plain-ignore-eos                        (GPU host)
    .hostenv/bin/python benchmarks/serving_client.py --quick --out DIR                   (CPU check)

Each engine is launched through eagleflow's own path (`make_server(target_launch(config, ...))`, the
config loaded from `--config` with `--set` overrides, as the benchmark stage launches its variants)
for every variant (baseline; drafter: EAGLE-3 with `--drafter`, benchmark.num_speculative_tokens) x
every `--eager` value (`engine.enforce_eager`, given as YAML; `config` leaves the config's value).
On each engine, after the stage's warm-up, the clients take turns over the same held-out prompts
(A B B A ...; every pass sends them all, temperature 0, concurrency 1; with `--interleave` the turns
are per request instead, A B on one prompt and B A on the next, so the engine's drift cancels):

    stage             the benchmark stage's client as the stage drives it: one
                      eagleflow.engines.chat.chat_all call per round of `concurrency` prompts (so
                      per prompt here), the stage's payload (whole answers, extra={"ignore_eos": True},
                      max_tokens = benchmark.max_tokens), the window's time the sum of the calls'
    stage-1call       the same payload, all prompts in one chat_all call (one HTTP client a pass)
    stage-eos         stage-1call without ignore_eos
    plain             a sequential httpx client streaming chat completions as `vllm bench serve`
                      does (stream_options.include_usage), no ignore_eos
    plain-ignore-eos  the same with ignore_eos: the stage's payload, streamed

`--stage` first runs the benchmark stage itself (`python -m eagleflow.stages.benchmark request.json`,
benchmarks/stage_run.py) on the same config, drafter and prompts, at temperature 0 and concurrency 1,
and puts its own figures beside the clients'.

Per client: output tokens over the passes' wall time (client tok/s), the engine's own TPOT,
inter-token latency and TTFT (histogram deltas of /metrics around each pass), the acceptance length
for the drafter, and the client's wall time per request beyond the engine's own end-to-end latency
(what a client adds; the engine's pace moves +-10% between passes on the H200 host, this does not). `--parallel-load`
starts every engine at once (GPU: set a small
engine.gpu_memory_utilization) and then measures them one after another; otherwise each is started,
measured and ended in turn, as the stage does. What ran beside a measurement: only the idle engines
of `--parallel-load`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, Path(__file__).parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from stage_run import run_stage  # noqa: E402

from eagleflow.config import RunConfig, load_config, parse_overrides  # noqa: E402
from eagleflow.contracts.manifest import read_manifest  # noqa: E402
from eagleflow.contracts.prompts import holdout_prompts  # noqa: E402
from eagleflow.contracts.stage_records import ExportOutputs  # noqa: E402
from eagleflow.engines import EngineServer, make_server, server_class  # noqa: E402
from eagleflow.engines.chat import ChatClient  # noqa: E402
from eagleflow.engines.launch import served_name, speculative, target_launch  # noqa: E402
from eagleflow.engines.metrics import latency_from_deltas  # noqa: E402

Messages = list[dict[str, Any]]
Client = Callable[[EngineServer, RunConfig, list[Messages]], tuple[int, float]]


# -- the clients: each sends every prompt once, returns (output tokens, wall seconds) ----------------


def stage_client(ignore_eos: bool, per_round: bool) -> Client:
    """The benchmark stage's `send` at temperature 0, concurrency 1 (eagleflow.stages.benchmark): one
    ChatClient per engine, as the stage keeps one per variant; with `per_round`, one call per round of one
    prompt, the seconds summed, as its window recorder does."""

    def send(server: EngineServer, cfg: RunConfig, prompts: list[Messages]) -> tuple[int, float]:
        tokens, seconds = 0, 0.0
        client = STAGE_CHAT.get(id(server))
        if client is None:
            client = STAGE_CHAT[id(server)] = ChatClient(
                server.base_url, served_name(cfg), max_concurrency=1, timeout_s=cfg.engine.request_timeout_s
            )
        for convs in [[m] for m in prompts] if per_round else [prompts]:
            results, s = client.chat(
                convs,
                max_tokens=cfg.benchmark.max_tokens,
                temperature=0.0,
                concurrency=1,
                extra={"ignore_eos": True} if ignore_eos else None,
                seed=None,
            )
            errors = [r.error for r in results if r.error]
            if errors:
                raise SystemExit(
                    f"stage client: {len(errors)} of {len(results)} requests failed; first: "
                    f"{errors[0]}\n{server.post_mortem()}"
                )
            tokens += sum(r.completion_tokens for r in results)
            seconds += s
        return tokens, seconds

    return send


STAGE_CHAT: dict[int, ChatClient] = {}  # by id(server): a later engine on the same port gets its own
PLAIN_HTTP: dict[str, httpx.Client] = {}


def plain_client(ignore_eos: bool) -> Client:
    """One request after another, streamed, the usage read from the last chunk (as `vllm bench serve`)."""

    def send(server: EngineServer, cfg: RunConfig, prompts: list[Messages]) -> tuple[int, float]:
        tokens = 0
        # one client per engine for the whole run: building one (its SSL context) costs ~25 ms on the H200 host
        client = PLAIN_HTTP.get(server.base_url)
        if client is None:
            client = PLAIN_HTTP[server.base_url] = httpx.Client(
                base_url=server.base_url, timeout=cfg.engine.request_timeout_s
            )
        start = time.perf_counter()
        for messages in prompts:
            payload = {
                "model": served_name(cfg),
                "messages": messages,
                "max_tokens": cfg.benchmark.max_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if ignore_eos:
                payload["ignore_eos"] = True
            usage = None
            with client.stream("POST", "/v1/chat/completions", json=payload) as r:
                if r.status_code != 200:
                    raise SystemExit(f"plain client: HTTP {r.status_code}: {r.read()[:300]!r}")
                for line in r.iter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    chunk = json.loads(line[len("data:") :])
                    usage = chunk.get("usage") or usage
            if not usage:
                raise SystemExit("plain client: the stream ended without a usage chunk")
            tokens += int(usage["completion_tokens"])
        return tokens, time.perf_counter() - start

    return send


CLIENTS: dict[str, Client] = {
    "stage": stage_client(ignore_eos=True, per_round=True),
    "stage-1call": stage_client(ignore_eos=True, per_round=False),
    "stage-eos": stage_client(ignore_eos=False, per_round=False),
    "plain": plain_client(ignore_eos=False),
    "plain-ignore-eos": plain_client(ignore_eos=True),
}


# -- engines -------------------------------------------------------------------------------------------


def resolve_drafter(path: str) -> str:
    """A drafter directory, or an export manifest.json (its outputs.vllm, relative to the manifest's folder)."""
    p = Path(path)
    if p.name == "manifest.json":
        vllm = ExportOutputs.of(read_manifest(p)).vllm
        if vllm is None:
            raise SystemExit(f"{p} names no vLLM drafter (outputs.vllm)")
        p = p.parent / vllm
    if not (p / "config.json").is_file():
        raise SystemExit(f"--drafter {path}: no config.json there")
    return str(p.absolute())


def add(total: dict[str, float], before: dict[str, float], after: dict[str, float]) -> None:
    for key in set(before) | set(after):
        total[key] = total.get(key, 0.0) + after.get(key, 0.0) - before.get(key, 0.0)


class Engine:
    """One launch: a variant under one engine.enforce_eager value, and what its clients measured."""

    def __init__(self, name: str, cfg: RunConfig, drafter: str | None, port_offset: int, logs: Path):
        self.name, self.cfg, self.drafter = name, cfg, drafter
        b = cfg.benchmark
        spec = target_launch(
            cfg,
            speculative(drafter, b.num_speculative_tokens, b.draft_attention_backend) if drafter else None,
            port_offset=port_offset,
        )
        self.argv = server_class(cfg.engine.kind).argv_for(spec)
        self.server = make_server(spec, logs / f"{name}.log", name=name)
        self.load_s = 0.0
        self.passes: list[dict[str, Any]] = []
        self.totals: dict[str, dict[str, Any]] = {}
        self.failed: str | None = None

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self.server.start()

    def wait(self) -> None:
        self.server.wait_healthy()
        self.load_s = time.perf_counter() - self._t0

    def measure(
        self, prompts: list[Messages], clients: list[str], rounds: int, warmup: int, interleave: bool = False
    ) -> None:
        cfg = self.cfg
        for name in dict.fromkeys(["stage", *clients]):  # the stage's warm-up, then one request of each client
            CLIENTS[name](self.server, cfg, prompts[: warmup if name == "stage" else 1])
        deltas = {c: {} for c in clients}
        sums = {c: [0, 0.0] for c in clients}
        for r in range(rounds):
            if interleave:  # every prompt by every client in turn (A B, then B A): the engine's drift cancels
                steps = [
                    (c, [m]) for i, m in enumerate(prompts) for c in (clients if (i + r) % 2 == 0 else clients[::-1])
                ]
            else:  # one whole pass per client (A B B A over rounds)
                steps = [(c, prompts) for c in (clients if r % 2 == 0 else clients[::-1])]
            round_sums = {c: [0, 0.0] for c in clients}
            round_deltas: dict[str, dict[str, float]] = {c: {} for c in clients}
            for c, batch in steps:
                before = self.server.snapshot()
                tokens, seconds = CLIENTS[c](self.server, cfg, batch)
                add(round_deltas[c], before, self.server.snapshot())
                round_sums[c][0] += tokens
                round_sums[c][1] += seconds
            for c in clients:
                tokens, seconds = round_sums[c]
                sums[c][0] += tokens
                sums[c][1] += seconds
                add(deltas[c], {}, round_deltas[c])
                self.passes.append(
                    {
                        "round": r,
                        "client": c,
                        "tokens": tokens,
                        "seconds": seconds,
                        "tok_s": tokens / seconds,
                        **latency_from_deltas({}, round_deltas[c], self.server.metric_prefix),
                    }
                )
                print(
                    f"  {self.name} round {r} {c:17} {tokens / seconds:8.1f} tok/s  {tokens} tokens  "
                    f"TPOT {fmt(self.passes[-1]['tpot_ms'], 3)} ms",
                    flush=True,
                )
        k = cfg.benchmark.num_speculative_tokens
        for c in clients:
            row: dict[str, Any] = {
                "tokens": sums[c][0],
                "seconds": sums[c][1],
                "tok_s": sums[c][0] / sums[c][1],
                **latency_from_deltas({}, deltas[c], self.server.metric_prefix),
            }
            # the client's wall time per request beyond the engine's own end-to-end latency
            row["overhead_ms"] = (
                1000 * row["seconds"] / (rounds * len(prompts)) - row["e2e_ms"] if row["e2e_ms"] is not None else None
            )
            if self.drafter:
                row.update(self.server.acceptance({}, deltas[c], k))
            self.totals[c] = row

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "drafter": self.drafter,
            "enforce_eager": self.cfg.engine.enforce_eager,
            "cuda_graphs": "--enforce-eager" not in self.argv,
            "argv": self.argv,
            "load_s": self.load_s,
            "passes": self.passes,
            "clients": self.totals,
        }


def run_benchmark_stage(cfg: RunConfig, drafter: str | None, num_prompts: int, out: Path) -> list[dict[str, Any]]:
    """The stage at temperature 0, concurrency 1 on this config: its headline rows (baseline, drafter)."""
    data = cfg.model_dump(mode="json")
    data["benchmark"].update(temperatures=[0.0], concurrencies=[1], num_prompts=num_prompts, drafter=drafter)
    t0 = time.perf_counter()
    manifest, wall = run_stage("benchmark", data, {}, out / "stage")
    rows = [w for w in manifest.metrics["windows"] if w["temperature"] == 0.0 and w["concurrency"] == 1]
    print(
        f"benchmark stage: {wall:.0f} s; " + ", ".join(f"{w['variant']} {w['output_tok_s']:.1f} tok/s" for w in rows),
        flush=True,
    )
    return [{**w, "wall_s": time.perf_counter() - t0} for w in rows]


def fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.yaml")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides, as the flows take them (VALUE is YAML)",
    )
    p.add_argument("--out", type=Path, required=True, help="engine logs and serving_client.json go here")
    p.add_argument("--drafter", default=None, help="the drafter's vLLM directory or its export manifest.json")
    p.add_argument(
        "--variants",
        nargs="+",
        default=None,
        choices=["baseline", "drafter"],
        help="default: baseline, and drafter when --drafter is given",
    )
    p.add_argument(
        "--eager",
        nargs="+",
        default=["true", "false"],
        help="engine.enforce_eager values (YAML), one engine each; 'config' keeps the config's value",
    )
    p.add_argument(
        "--attention-backends",
        nargs="+",
        default=["config"],
        help="the target's --attention-backend, one engine each ('auto': the platform's choice; 'config': "
        "engine.extra_args as configured)",
    )
    p.add_argument("--clients", nargs="+", default=["stage", "plain"], choices=sorted(CLIENTS))
    p.add_argument("--rounds", type=int, default=2, help="passes of each client on each engine, in A B B A order")
    p.add_argument(
        "--interleave",
        action="store_true",
        help="alternate clients per request (A B, B A ...) instead of per whole pass",
    )
    p.add_argument("--num-prompts", type=int, default=None, help="default: benchmark.num_prompts")
    p.add_argument("--parallel-load", action="store_true", help="start every engine at once, then measure in turn")
    p.add_argument(
        "--stage",
        action="store_true",
        help="first run the benchmark stage itself on the same config (its figures join the table)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a CPU check: baseline, the config's enforce_eager, 3 prompts x 16 tokens, one round",
    )
    args = p.parse_args()

    if args.quick:
        args.variants, args.eager, args.rounds, args.num_prompts = ["baseline"], ["config"], 1, args.num_prompts or 3
        args.overrides = ["benchmark.max_tokens=16", *args.overrides]
    variants = args.variants or (["baseline", "drafter"] if args.drafter else ["baseline"])
    drafter = resolve_drafter(args.drafter) if "drafter" in variants else None
    if "drafter" in variants and drafter is None:
        raise SystemExit("--variants drafter needs --drafter")
    args.out.mkdir(parents=True, exist_ok=True)
    base = parse_overrides(args.overrides)
    base.setdefault("host.work_root", str(args.out.absolute() / "work"))
    base["host.python"] = sys.executable

    engines: list[Engine] = []
    for variant in variants:
        for eager in args.eager:
            for backend in args.attention_backends:
                overrides = dict(base)
                if eager != "config":
                    overrides["engine.enforce_eager"] = yaml.safe_load(eager)
                if backend != "config":
                    overrides["engine.extra_args"] = [] if backend == "auto" else ["--attention-backend", backend]
                cfg = load_config(args.config, overrides)
                name = f"{variant}-eager_{eager}" + (f"-{backend}" if backend != "config" else "")
                engines.append(
                    Engine(
                        name,
                        cfg,
                        drafter if variant == "drafter" else None,
                        port_offset=len(engines) if args.parallel_load else 0,
                        logs=args.out,
                    )
                )
    cfg0 = engines[0].cfg
    g = cfg0.generate
    prompts = holdout_prompts(
        g.prompts_path, g.num_samples, g.holdout, g.seed, args.num_prompts or cfg0.benchmark.num_prompts
    )
    print(
        f"{len(engines)} engines, {len(prompts)} held-out prompts x {cfg0.benchmark.max_tokens} tokens, "
        f"clients {' '.join(args.clients)}, {args.rounds} rounds",
        flush=True,
    )

    result: dict[str, Any] = {
        "config": str(args.config),
        "overrides": args.overrides,
        "num_prompts": len(prompts),
        "max_tokens": cfg0.benchmark.max_tokens,
        "rounds": args.rounds,
        "interleave": args.interleave,
        "parallel_load": args.parallel_load,
        "stage": [],
        "engines": [],
        "failed": {},
    }

    def save() -> None:  # after each step: a run cut short keeps what it measured
        result["engines"] = [e.record() for e in engines if e.totals]
        (args.out / "serving_client.json").write_text(json.dumps(result, indent=1))

    if args.stage:
        result["stage"] = run_benchmark_stage(cfg0, drafter, len(prompts), args.out)
        save()
    try:
        groups = [engines] if args.parallel_load else [[e] for e in engines]
        for group in groups:
            for e in group:
                e.start()
            for e in group:
                try:
                    e.wait()
                except Exception as exc:  # noqa: BLE001 - e.g. a backend this build lacks: the others still run
                    e.failed = f"{type(exc).__name__}: {exc}"[:2000]
                    print(f"{e.name}: did not start: {e.failed}", flush=True)
                    result["failed"][e.name] = e.failed
                    e.server.stop()
                    continue
                print(
                    f"{e.name}: healthy after {e.load_s:.0f} s; cuda graphs: {'--enforce-eager' not in e.argv}",
                    flush=True,
                )
            for e in (e for e in group if not e.failed):
                e.measure(prompts, args.clients, args.rounds, cfg0.benchmark.warmup_requests, args.interleave)
                if not args.parallel_load:
                    e.server.stop()
                save()
    finally:
        for e in engines:
            e.server.stop()

    print(
        f"\n{len(prompts)} prompts x {cfg0.benchmark.max_tokens} max tokens, temperature 0, concurrency 1; "
        "TPOT/ITL/TTFT: the engine's own histograms"
    )
    print(
        "| engine | cuda graphs | client | tok/s | tokens | engine TPOT ms | ITL ms | TTFT ms | AL | client ms/request "
        "over engine e2e | vs plain (round range) |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    stage_graphs = "no" if "--enforce-eager" in engines[0].argv else "yes"  # the stage's flags are engine 0's
    for w in result["stage"]:
        print(
            f"| stage run: {w['variant']} | {stage_graphs} | the stage itself | "
            f"{w['output_tok_s']:.1f} | {w['output_tokens']} | {fmt(w['tpot_ms'], 3)} | {fmt(w['itl_ms'], 3)} | "
            f"{fmt(w['ttft_ms'])} | {fmt(w.get('mean_acceptance_length'))} | "
            f"{fmt(1000 * w['seconds'] / w['requests'] - w['e2e_ms'], 1)} | - |"
        )
    for e in engines:
        plain = e.totals.get("plain")
        for c, row in e.totals.items():
            ratio = f"{row['tok_s'] / plain['tok_s']:.3f}" if plain else "-"
            if plain:  # the same ratio round by round: its spread says how far the total can be trusted
                per_round = sorted(
                    a["tok_s"] / b["tok_s"]
                    for a in e.passes
                    if a["client"] == c
                    for b in e.passes
                    if b["client"] == "plain" and b["round"] == a["round"]
                )
                ratio += f" ({per_round[0]:.3f}-{per_round[-1]:.3f})"
            print(
                f"| {e.name} | {'yes' if '--enforce-eager' not in e.argv else 'no'} | {c} | {row['tok_s']:.1f} | "
                f"{row['tokens']} | {fmt(row['tpot_ms'], 3)} | {fmt(row['itl_ms'], 3)} | {fmt(row['ttft_ms'])} | "
                f"{fmt(row.get('mean_acceptance_length'))} | {fmt(row['overhead_ms'], 1)} | {ratio} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
