"""The pydantic parameter models of the flows (validation, and a form in the Prefect UI)."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from pydantic import BaseModel, Field

from eagleflow.config import ConfigError, load_config, parse_overrides


class RunParams(BaseModel):
    config_path: str = Field("configs/demo.yaml", description="Run config (YAML) on the machine running the flow.")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description='Dotted overrides, e.g. {"benchmark.max_tokens": 64, "train.epochs": 2}.'
    )


def main_cli(flow_fn: Callable[[Any], Any], doc: str | None, params_cls: type[RunParams] = RunParams,
             extra_args: dict[str, str] | None = None) -> int:
    """`python -m flows.<flow> CONFIG [--set a.b=value ...]`: validate first, then run the flow.

    The config is validated before Prefect starts, so a bad field fails in a second, by name.
    `extra_args` ({"--drafter": help}) become string fields of `params_cls`.
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default="configs/demo.yaml", help="run config (YAML)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. --set benchmark.max_tokens=64 (VALUE is YAML)")
    for flag, help_text in (extra_args or {}).items():
        parser.add_argument(flag, default=None, help=help_text)
    args = parser.parse_args()
    extra = {flag.lstrip("-").replace("-", "_"): getattr(args, flag.lstrip("-").replace("-", "_"))
             for flag in (extra_args or {})}
    try:
        overrides = parse_overrides(args.set)
        load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    state = flow_fn(params_cls(config_path=args.config, overrides=overrides, **extra), return_state=True)
    if not state.is_completed():
        print(f"error: the flow run ended {state.name}: {state.message}")
        return 1
    report = state.result()
    print(f"report: {report.path}")  # the last line: where the run's report.json is
    return 0
