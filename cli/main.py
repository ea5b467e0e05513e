"""`eagleflow`: one command line for the operator (a console script of the control environment).

    eagleflow run CONFIG [--set KEY=VALUE ...]                 the full pipeline, then its report
    eagleflow benchmark CONFIG [--drafter PATH] [--set ...]    the benchmark alone
    eagleflow plan CONFIG [--json] [--host-facts FILE] [--set ...]   the capacity plan, nothing run
    eagleflow deploy CONFIG [CONFIG ...] [--pool NAME] [--set ...]   register each config's deployments on the Prefect server
    eagleflow trigger KIND CONFIG [--drafter PATH] [--set ...] [--wait]   run a deployment through its worker, as the UI does
    eagleflow status [CONFIG] [--set ...] [--limit N]          runs by config: verdicts, causes, stages, stage dirs
    eagleflow bootstrap CONFIG [...]                           create or update the host environment
    eagleflow promote CONFIG --drafter DIR [--set ...]         deploy a drafter to production (canary, rollback)
    eagleflow rollback CONFIG [--why TEXT] [--set ...]         production back to its last good drafter

Exit status: 0 done, 1 a stage (or the run) failed, 2 bad input (a config field, a path, a flag).
`python -m flows.pipeline`, `flows.benchmark`, `flows.plan`, `flows.bootstrap` and `deployments.deploy`
stay the same commands; this only puts them under one name.
"""

from __future__ import annotations

import importlib
import sys

USAGE = __doc__.split("\n\n")[1]


# command -> the module whose `main(argv, prog)` it is (or module:function); imported when chosen, so `eagleflow plan`
# does not pay for Prefect's import and `--help` for none.
COMMANDS = {"run": "flows.pipeline", "benchmark": "flows.benchmark", "plan": "flows.plan",
            "deploy": "deployments.deploy", "trigger": "flows.trigger", "status": "flows.status", "bootstrap": "flows.bootstrap",
            "promote": "flows.deploy:promote_main", "rollback": "flows.deploy:rollback_main"}


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
        module, _, func = COMMANDS[name].partition(":")
        return getattr(importlib.import_module(module), func or "main")(rest, f"eagleflow {name}")
    except SystemExit as exc:  # argparse: --help is 0, a bad flag 2
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
