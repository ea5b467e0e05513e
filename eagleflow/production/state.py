"""The production state files in the benchmark's stage dir (see eagleflow.production), shared by the
stage's side and the guardian."""

from __future__ import annotations

from pathlib import Path

from eagleflow.util.locks import is_held

HOLD = "production.hold"  # flock held by the stage for the block (transient)
RECORD = "production.json"  # the stage's record: config, was_running, stage pid/pgid, token, times (kept)
RESULT = "production.restored.json"  # the guardian's result (kept)
WATCHING = "production.watching"  # flock held by the guardian for its life, {pid, token} (transient)
GUARDIAN_LOG = "production-guardian.log"
COMMANDS_LOG = "production-commands.log"  # output of every stop/start/systemctl command run

POLL_S = 0.25


def guardian_alive(state_dir: Path) -> bool:
    return is_held(state_dir / WATCHING)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({path} does not exist)"
