"""Names the Prefect side gives things: who owns a host's jobs, and artifact keys."""

from __future__ import annotations

import re
import uuid

from prefect.context import FlowRunContext

# Outside a flow run (a task called directly, a test): one owner for this whole process, so its
# host lease and its jobs agree on who they belong to.
_PROCESS_OWNER = f"cli-{uuid.uuid4().hex}"


def flow_run_owner() -> str:
    """The owner of the jobs and the host lease: the flow run's id, so a cancelled run's jobs can be
    found and ended (`Host.stop_owner`); outside a flow run, this process's own id."""
    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx and ctx.flow_run else _PROCESS_OWNER


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes only): 'eagleflow', 'My_Run.1',
    'benchmark' -> 'eagleflow-my-run-1-benchmark'."""
    return "-".join(re.sub(r"[^a-z0-9-]+", "-", p.lower()).strip("-") for p in parts if p)
