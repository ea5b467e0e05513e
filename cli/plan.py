"""The capacity plan alone: each stage's disk, GPU memory and time for a run config on its host, and beside
it a night of the nightly retrain (eagleflow.capacity.nightly).

    python -m cli.plan CONFIG [--set KEY=VALUE ...] [--json] [--host-facts FILE.json]

Without --host-facts it asks the real host (`eagleflow.hosts.make_host(config.host)`): there,
`host.python -m eagleflow.capacity.facts <the config as JSON>` prints `python -m eagleflow.hosts.facts`' facts
(GPUs, free disk under host.work_root) plus the target's shape (its config.json and the bytes of its
weight files), the prompts' length, what earlier runs on the host measured, and which of this run's
stages are already finished there (a finished generate makes the token count exact). The prompts are
counted as characters / 4 there (standard library only, seconds); the check stage, which runs before
every pipeline, counts them with the target's tokenizer and prints the same table.

With --host-facts it plans against stated facts (the same JSON shape; `configs/hosts/gpu-8xh200.json`
states an 8 x H200 host and Kimi-K2.5's shape): nothing is contacted. Exit status 0 when the run fits the
free disk, 1 when it does not (the plan says why), 2 for a bad config or facts file. No Prefect server
is needed: this is not a flow, only the plan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from eagleflow import EagleflowError
from eagleflow.capacity.nightly import plan_nightly
from eagleflow.capacity.planner import plan
from eagleflow.capacity.render import render_nightly, render_plan
from eagleflow.config import ConfigError, RunConfig, given_on_command_line, load_config, parse_overrides
from eagleflow.contracts.plan import CapacityPlan, FinishedStages, HostFacts
from eagleflow.hosts import HostError, make_host

FACTS_TIMEOUT_S = 300  # hostfacts imports torch (a few seconds); reading a few hundred manifests is quick


class PlanError(EagleflowError):
    """The host's facts could not be read; the message names the host and the command."""


def host_facts(config: RunConfig) -> dict:
    """Run `python -m eagleflow.capacity.facts` on the config's host and return its JSON object."""
    host = make_host(config.host)
    argv = [config.host.python, "-m", "eagleflow.capacity.facts", config.model_dump_json()]
    try:
        rc, out, err = host.exec(argv, timeout=FACTS_TIMEOUT_S)
    finally:
        host.close()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if rc != 0 or not lines:
        tail = "\n".join((err or out).splitlines()[-15:])
        raise PlanError(
            f"`{config.host.python} -m eagleflow.capacity.facts` failed on {host.label} (exit {rc}):\n{tail}\n"
            "is the host environment bootstrapped (python -m infra.bootstrap CONFIG)?"
        )
    return json.loads(lines[-1])


def make_plan(config: RunConfig, facts: dict) -> CapacityPlan:
    return plan(config, HostFacts.model_validate(facts), FinishedStages.model_validate(facts.get("progress") or {}))


def main(argv: list[str] | None = None, prog: str = "python -m cli.plan") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("config", help="run config (YAML)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. --set extract.storage_dtype=bfloat16 (VALUE is YAML)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of a table")
    parser.add_argument(
        "--host-facts",
        metavar="FILE.json",
        help="plan against these stated host facts instead "
        "of asking the host (the shape `python -m eagleflow.capacity.facts` prints)",
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, given_on_command_line(args.config, parse_overrides(args.set), os.getcwd()))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        facts = json.loads(Path(args.host_facts).read_text()) if args.host_facts else host_facts(config)
        result = make_plan(config, facts)
    except (OSError, ValueError, ValidationError) as exc:  # a missing or malformed facts file; no target facts
        print(f"error: {args.host_facts or config.host.name}: {exc}", file=sys.stderr)
        return 2
    except (PlanError, HostError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    nightly = plan_nightly(config, HostFacts.model_validate(facts), result)
    if args.json:
        print(json.dumps({**result.model_dump(mode="json"), "nightly": nightly.model_dump(mode="json")}, indent=2))
    else:
        print(render_plan(result) + "\n" + render_nightly(nightly, result))
    return 1 if result.refusal else 0


if __name__ == "__main__":
    sys.exit(main())
