"""Bootstrap the host of a run config: its environment created or updated, and what it has reported.

    python -m flows.bootstrap CONFIG [--set KEY=VALUE ...] [--package SPEC ...] [--no-packages]
                                     [--base-python PYTHON]

The same as `python -m infra.bootstrap`, run as a Prefect flow: the log in the run, the facts as a
Markdown artifact (`bootstrap-<host>`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from prefect import flow
from pydantic import Field

from eagleflow.config import ConfigError, given_on_command_line, load_config, parse_overrides
from flows.params import PlainParams
from infra.bootstrap import build_parser
from infra.summary import render_text
from tasks.bootstrap import bootstrap_host


class BootstrapParams(PlainParams):
    packages: list[str] | None = Field(
        None, description="pip requirements to install; empty: only the eagleflow wheel; unset: the project's pins."
    )
    base_python: str = Field("python3", description="Interpreter on the host that creates a missing venv.")


@flow(name="bootstrap", log_prints=True)
def bootstrap(params: BootstrapParams = BootstrapParams()) -> dict[str, Any]:
    config = params.load()
    return bootstrap_host(config, params.packages, params.base_python)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = build_parser(__doc__)
    if prog:
        parser.prog = prog
    args = parser.parse_args(argv)
    if args.no_packages and args.packages:
        parser.error("--package and --no-packages exclude each other")
    try:
        overrides = given_on_command_line(args.config, parse_overrides(args.set), os.getcwd())
        load_config(args.config, overrides)  # a bad field fails here, in a second, before Prefect starts
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    params = BootstrapParams(
        config_path=args.config,
        overrides=overrides,
        packages=[] if args.no_packages else args.packages,
        base_python=args.base_python,
    )
    state = bootstrap(params, return_state=True)
    if not state.is_completed():
        print(f"error: the flow run ended {state.name}: {state.message}")
        return 1
    print(render_text(state.result()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
