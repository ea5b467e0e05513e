"""The pydantic parameter models of the flows: validation, and the form of the Prefect UI's custom run.

The settings an operator changes between runs are typed fields, each the same as one dotted key of
the run config (`FIELD_KEYS`); everything else goes in `overrides`. A field left empty keeps the
config's value. `deployments.deploy` shows the chosen config's values as the form's defaults.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field, ValidationError, model_validator

from eagleflow.config import PATH_KEYS, ConfigError, RunConfig, given_on_command_line, load_config, parse_overrides
from eagleflow.hosts import make_host
from eagleflow.hosts.base import HostError

# Typed field -> the run config key it sets. One table, so a form value and `--set` are one thing.
FIELD_KEYS: dict[str, str] = {
    "epochs": "train.epochs",
    "num_samples": "generate.num_samples",
    "temperatures": "benchmark.temperatures",
    "drafter": "benchmark.drafter",
    "current_drafter": "benchmark.current_drafter",
    "host_address": "host.address",
}

# The paths an operator names for a run to measure, serve or start from: they must exist on the host before a run is
# created (a path in the config file is the check stage's to judge).
MUST_EXIST: tuple[str, ...] = ("benchmark.drafter", "benchmark.current_drafter", "train.warm_start")

# A config's deployments (deployments.deploy): kind -> the flow it runs; each named `<config name>-<kind>`.
FLOW_OF = {"pipeline": "pipeline", "nightly": "retrain", "benchmark": "benchmark", "bootstrap": "bootstrap"}


def deployment_name(config_name: str, kind: str) -> str:
    """The deployment of `kind` (pipeline, nightly, benchmark, bootstrap) for the config named `config_name`."""
    if kind not in FLOW_OF:
        raise ValueError(f"unknown deployment kind {kind!r}; one of {', '.join(FLOW_OF)}")
    return f"{config_name}-{kind}"


def full_name(config_name: str, kind: str) -> str:
    """`flow/deployment`, as `prefect deployment run` and `read_deployment_by_name` take it."""
    return f"{FLOW_OF[kind]}/{deployment_name(config_name, kind)}"


CONFIG_PATH = Field(
    "configs/demo.yaml",
    description="Run config (YAML) on the machine running the flow; the fields below default to its values.",
)
OVERRIDES = Field(
    default_factory=dict,
    description="Any other setting, as dotted keys of the run config: "
    '{"benchmark.max_tokens": 64, "train.lr": 2e-4}. A typed field above wins over the same key here.',
)


class ConfigParams(BaseModel):
    """A run config and how this run changes it. Each flow's model declares `config_path` first and
    `overrides` after its typed fields: the order the form shows them in."""

    typed: ClassVar[tuple[str, ...]] = ()  # the FIELD_KEYS fields this flow's form shows
    if TYPE_CHECKING:
        config_path: str
        overrides: dict[str, Any]

    @model_validator(mode="after")
    def _paths_absolute(self) -> ConfigParams:
        """A path typed into the form is absolute: a form has no directory to be relative to (a command line makes
        its relative paths absolute against the shell's directory before it gets here)."""
        for field in self.typed:
            value = getattr(self, field, None)
            if FIELD_KEYS.get(field) in PATH_KEYS and isinstance(value, str) and value and not os.path.isabs(value):
                raise ValueError(f"{field} {value!r} is relative: give the path absolute, as it is on the host")
        return self

    def config_overrides(self) -> dict[str, Any]:
        """`overrides` with the typed fields that were set laid over them."""
        typed = {FIELD_KEYS[f]: getattr(self, f) for f in self.typed if getattr(self, f, None) is not None}
        return {**self.overrides, **typed}

    def load(self, extra: dict[str, Any] | None = None) -> RunConfig:
        """The run config this run uses (`extra` first: the flow's own defaults, such as a nightly seed)."""
        return load_config(self.config_path, {**(extra or {}), **self.config_overrides()})


def from_command_line(
    params_cls: type[ConfigParams],
    config_path: str,
    typed: dict[str, Any],
    overrides: dict[str, Any],
    registered: dict[str, Any] | None = None,
    cwd: str | None = None,
) -> tuple[ConfigParams, RunConfig]:
    """The parameters of a run asked for on a command line, and its config. Paths typed there (a flag or a `--set`)
    are relative to the shell's directory `cwd`; the paths it names to measure, serve or start from must exist on
    the host. `registered`: a deployment's own overrides, laid under ours, as they are (not typed here)."""
    keyed = {FIELD_KEYS.get(f, f): v for f, v in typed.items()}
    given = given_on_command_line(config_path, {**overrides, **keyed}, cwd or os.getcwd())
    typed = {f: given[FIELD_KEYS.get(f, f)] for f in typed}
    params = params_cls(
        config_path=config_path, overrides={**(registered or {}), **{k: given[k] for k in overrides}}, **typed
    )
    config = params.load()
    check_paths_exist(config, [k for k in MUST_EXIST if given.get(k)])
    return params, config


def check_paths_exist(config: RunConfig, keys: list[str]) -> None:
    """Each of the config's `keys` (dotted, holding a path) exists on its host: one stat each (over SSH, one
    connection). A host that cannot be reached is not bad input: the run's own check says why it fails."""
    if not keys:
        return
    try:
        host = make_host(config.host)
        try:
            for key in keys:
                value: Any = config
                for part in key.split("."):
                    value = getattr(value, part)
                if not host.exists(str(value)):
                    raise ConfigError(
                        f"{key} {value} does not exist on host {config.host.name}: give the path of one that is there "
                        "(a relative path on a command line is relative to the shell's directory)"
                    )
        finally:
            host.close()
    except HostError:
        return


class PlainParams(ConfigParams):
    """A run config and dotted overrides, nothing typed (bootstrap)."""

    config_path: str = CONFIG_PATH
    overrides: dict[str, Any] = OVERRIDES


class RunParams(ConfigParams):
    """A full run: what an operator changes most, typed; the rest as dotted overrides."""

    typed: ClassVar[tuple[str, ...]] = ("epochs", "num_samples", "temperatures", "current_drafter", "host_address")

    config_path: str = CONFIG_PATH
    epochs: int | None = Field(
        None, ge=1, le=1000, description="Training epochs over the generated data (train.epochs)."
    )
    num_samples: int | None = Field(
        None, ge=2, description="Prompts to answer, held-out ones included (generate.num_samples)."
    )
    temperatures: list[float] | None = Field(
        None, description="Sampling temperatures the benchmark measures, 0 greedy (benchmark.temperatures)."
    )
    current_drafter: str | None = Field(
        None,
        description="Production's drafter to compare the new one with: a "
        "directory or export manifest.json on the host (benchmark.current_drafter).",
    )
    host_address: str | None = Field(
        None,
        description="The GPU host to run on, for an SSH host: its name or IP "
        "(host.address; its key must be in host.known_hosts).",
    )
    overrides: dict[str, Any] = OVERRIDES


class BenchmarkParams(ConfigParams):
    """The benchmark again: which drafter, against what, where; the rest as dotted overrides."""

    typed: ClassVar[tuple[str, ...]] = ("drafter", "temperatures", "current_drafter", "host_address")

    config_path: str = CONFIG_PATH
    drafter: str | None = Field(
        None,
        description="Drafter to measure: a directory on the host (engine format) or an export manifest.json; "
        "empty: the run config's finished export (benchmark.drafter).",
    )
    temperatures: list[float] | None = RunParams.model_fields["temperatures"]
    current_drafter: str | None = RunParams.model_fields["current_drafter"]
    host_address: str | None = RunParams.model_fields["host_address"]
    overrides: dict[str, Any] = OVERRIDES


class RetrainParams(RunParams):
    """The nightly retrain: a full run's fields and the promotion gate's bars."""

    min_speedup: float = Field(1.0, ge=0, description="Promote only at or above this speedup over no speculation.")
    min_acceptance_length: float = Field(1.5, ge=1, description="Promote only at or above this mean acceptance length.")


def main_cli(
    flow_fn: Callable[[Any], Any],
    doc: str | None,
    params_cls: type[ConfigParams] = RunParams,
    extra_args: dict[str, str] | None = None,
    argv: list[str] | None = None,
    prog: str | None = None,
    check: Callable[[RunConfig], None] | None = None,
    show: Callable[[Any], None] | None = None,
) -> int:
    """`python -m flows.<flow> CONFIG [--set a.b=value ...]`: validate first, then run the flow.

    The config is validated before Prefect starts, so a bad field fails in a second, by name (exit 2);
    a flow run that ends other than Completed exits 1. `extra_args` ({"--drafter": help}) become fields
    of `params_cls` when given. `check` refuses a valid config this flow cannot run (ConfigError, exit 2);
    `show` prints the flow's result (by default: the report's path, or why there is none).
    """
    # No abbreviations: a flag added later must not change what a command written today means
    # (`--temperature` would read as `--temperatures` until a `--temperature-floor` arrives).
    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("config", nargs="?", default="configs/demo.yaml", help="run config (YAML)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. --set benchmark.max_tokens=64 (VALUE is YAML)",
    )
    for flag, help_text in (extra_args or {}).items():
        parser.add_argument(flag, default=None, help=help_text)
    args = vars(parser.parse_args(argv))
    extra = {k: v for k, v in args.items() if k not in ("config", "set") and v is not None}
    try:
        params, cfg = from_command_line(params_cls, args["config"], extra, parse_overrides(args["set"]))
        if check is not None:
            check(cfg)
    except (ConfigError, ValidationError) as exc:
        print(f"error: {exc}")
        return 2
    state = flow_fn(params, return_state=True)
    if not state.is_completed():
        print(f"error: the flow run ended {state.name}: {state.message}")
        return 1
    result = state.result()
    if result is None and state.message:  # a nightly with nothing new: its state message says so
        print(state.message)
        return 0
    (show or _show_report)(result)
    return 0


def _show_report(report: Any) -> None:
    if report is None:  # a nightly with nothing new to train on: its log says why
        print("no report: nothing ran past the selection of new prompts")
        return
    print(f"report: {report.path}")  # the last line: where the run's report.json is
