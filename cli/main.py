"""`eagleflow`: one command line for the operator (a console script of the control environment).

    eagleflow run CONFIG [--set KEY=VALUE ...]                 the full pipeline, then its report
    eagleflow benchmark CONFIG [--drafter PATH] [--set ...]    the benchmark alone
    eagleflow plan CONFIG [--json] [--host-facts FILE] [--set ...]   the capacity plan, nothing run
    eagleflow deploy CONFIG [CONFIG ...] [--pool NAME] [--set ...]   register each config's deployments on the Prefect
    server
    eagleflow trigger KIND CONFIG [--drafter PATH] [--set ...] [--wait]   run a deployment through its worker, as the
    UI does
    eagleflow status [CONFIG] [--set ...] [--limit N]          runs by config: verdicts, causes, stages, stage dirs
    eagleflow bootstrap CONFIG [...]                           create or update the host environment
    eagleflow promote CONFIG --drafter DIR [--set ...]         put a drafter into production (canary, rollback)
    eagleflow rollback CONFIG [--why TEXT] [--set ...]         production back to its last good drafter

Exit status: 0 done, 1 a stage (or the run) failed, 2 bad input (a config field, a path, a flag).
`python -m flows.pipeline`, `flows.benchmark`, `flows.bootstrap`, `deployments.deploy`, `cli.plan`, `cli.status`
and `cli.trigger` are the same commands; this only puts them under one name.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

USAGE = __doc__.split("\n\n")[1]
Command = Callable[[list[str], str], int]


# Each command imports what it runs when chosen (an import statement the architecture test reads), so
# `eagleflow plan` does not pay for Prefect's import and `--help` for none.
def _run(argv: list[str], prog: str) -> int:
    from flows.pipeline import main

    return main(argv, prog)


def _benchmark(argv: list[str], prog: str) -> int:
    from flows.benchmark import main

    return main(argv, prog)


def _plan(argv: list[str], prog: str) -> int:
    from cli.plan import main

    return main(argv, prog)


def _deploy(argv: list[str], prog: str) -> int:
    from deployments.deploy import main

    return main(argv, prog)


def _trigger(argv: list[str], prog: str) -> int:
    from cli.trigger import main

    return main(argv, prog)


def _status(argv: list[str], prog: str) -> int:
    from cli.status import main

    return main(argv, prog)


def _bootstrap(argv: list[str], prog: str) -> int:
    from flows.bootstrap import main

    return main(argv, prog)


def _promote(argv: list[str], prog: str) -> int:
    from flows.promote import promote_main

    return promote_main(argv, prog)


def _rollback(argv: list[str], prog: str) -> int:
    from flows.promote import rollback_main

    return rollback_main(argv, prog)


COMMANDS: dict[str, Command] = {
    "run": _run,
    "benchmark": _benchmark,
    "plan": _plan,
    "deploy": _deploy,
    "trigger": _trigger,
    "status": _status,
    "bootstrap": _bootstrap,
    "promote": _promote,
    "rollback": _rollback,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: eagleflow {{{','.join(COMMANDS)}}} ...\n\n{USAGE}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; one of: {', '.join(COMMANDS)} (eagleflow --help)", file=sys.stderr)
        return 2
    try:
        return COMMANDS[name](rest, f"eagleflow {name}")
    except SystemExit as exc:  # argparse: --help is 0, a bad flag 2
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
