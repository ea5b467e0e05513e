"""One pipeline at a time per GPU host, one connection to it per flow run, and no job left behind.

Two locks, because runs come from two places. Runs in Prefect queue on a strict global concurrency
limit named after the host (`eagleflow-host-<host.name>`, limit 1, created on first use). Anything
else, a run against another Prefect server or a stage started by hand, meets the lease on the host
itself (`<work_root>/.eagleflow/host.lock`), which fails fast and says who holds it. A run that queues
says in its log (the UI's run page) which run holds the host: the holder names itself in a Prefect
Variable, `eagleflow-host-<host.name>-holder`, while it holds it.

A holder that dies without letting go (killed outright, or the temporary Prefect server of `make demo` gone with
it, which takes the slot's lease with it: Prefect's repossessor then never frees the slot) would keep every later
run queued for ever. The host's own lease is the witness: its holder process exits with its run. A queued run
that finds the slot's named holder holding no lease on the host for GONE_LOOKS looks in a row (3 minutes) takes the
slot back and says so.

`host_slot` yields the flow run's one `Host`: every task of the run is given it, so an SSH host is
connected once per flow run, not once per stage.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import flow_run as current_run
from prefect.variables import Variable

from eagleflow.config import HostConfig, RunConfig, load_config
from eagleflow.hosts import Host, make_host
from tasks.naming import flow_run_owner

WAIT_NOTE_S = 30.0  # while queued, who holds the host is looked up again this often
# A slot's holder seen without the host lease this many looks in a row (WAIT_NOTE_S apart: 3 minutes) has gone. One
# look could fall between a live holder taking the slot and taking the lease, or letting go of each; and a live
# holder whose SSH link dropped has no lease on the host until its keeper takes it again (seconds, or as long as the
# link stays down): minutes of absence, against a slot otherwise held for ever.
GONE_LOOKS = 6


def limit_name(host: HostConfig) -> str:
    return f"eagleflow-host-{host.name}"


def ensure_limit(name: str) -> None:
    """Create the host's limit (1 slot) unless it exists; an operator may have raised or paused it."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another run created it meanwhile
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))


def holder_variable(limit: str) -> str:
    """The Prefect Variable that names the flow run holding the host's slot (Variables take letters, digits,
    dashes and underscores)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", limit) + "-holder"


def _held_by(holder: Any) -> str:
    if not isinstance(holder, dict):
        return ""
    return (
        f": held by flow run {holder.get('flow_run')!r} ({holder.get('flow_run_id')}) for {holder.get('what')} "
        f"since {holder.get('since')}"
    )


def _let_go(variable: str, run_id: str) -> None:
    """Unset the holder Variable if it still names this run (a later holder may have written it)."""
    try:
        holder = Variable.get(variable, default=None)
        if isinstance(holder, dict) and holder.get("flow_run_id") == run_id:
            Variable.unset(variable)
    except Exception as exc:  # noqa: BLE001 - the run's own outcome must not be replaced by this
        print(f"could not clear {variable}: {exc} (the next holder overwrites it)")


class _QuietTimeouts(logging.Filter):
    """Drops the slot service's "failed to process item" record of an acquisition that timed out: Prefect's
    service thread logs it at ERROR each time `concurrency(timeout_seconds=...)` gives up, and the same
    exception reaches `host_slot`, which waits on (a queued run would otherwise show an ERROR line every
    WAIT_NOTE_S). Any other failure of that service is kept (it reaches `host_slot` as an exception too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        item = record.args[1] if isinstance(record.args, tuple) and len(record.args) > 1 else None
        return not (
            record.msg.startswith("Service %r failed to process item")
            and isinstance(item, tuple)
            and "TimeoutError" in repr(item)
        )


@contextlib.contextmanager
def _quiet_slot_timeouts() -> Iterator[None]:
    service_log, quiet = logging.getLogger("prefect._internal.concurrency"), _QuietTimeouts()
    service_log.addFilter(quiet)
    try:
        yield
    finally:
        service_log.removeFilter(quiet)


def _tag_host(host: HostConfig) -> None:
    """The run's `host:` tag names the host it runs on. The deployment tags its runs with its config's host; a run
    sent to another host (`host.name` overridden in the form) would otherwise show the wrong one in the UI."""
    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(current_run.id)
            tags = [t for t in run.tags if not t.startswith("host:")] + [f"host:{host.name}"]
            if sorted(tags) != sorted(run.tags):
                client.update_flow_run(run.id, tags=tags)
    except Exception as exc:  # noqa: BLE001 - a label; the run goes on without it
        print(f"could not tag the run with host:{host.name}: {exc}")


def _holders(variables: list[str]) -> list[Any]:
    return [Variable.get(v, default=None) for v in variables]


def _holder_gone(host: HostConfig, holder: Any) -> bool:
    """Whether the run named as holding the host's slot holds nothing on the host: its lease there is free. A host
    that cannot say (no lease kept, unreachable, an older eagleflow) never counts as free."""
    if not isinstance(holder, dict) or not holder.get("flow_run_id"):
        return False
    try:
        with make_host(host) as h:
            return h.lease_holder() is None
    except Exception:  # noqa: BLE001 - not knowing is not gone
        return False


def _take_back(limit: str, variable: str, holder: dict, log: Any) -> None:
    """Free the slot a gone holder left. Two queued runs may both do it; the host lease still admits one."""
    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(limit, GlobalConcurrencyLimitUpdate(active_slots=0))
    _let_go(variable, holder["flow_run_id"])
    log.warning(
        "took back the slot of %s from flow run %r (%s), holding it since %s: it holds no lease on the host, so "
        "it ended without letting go (killed outright, or its Prefect server stopped with it)",
        limit,
        holder.get("flow_run"),
        holder["flow_run_id"],
        holder.get("since"),
    )


@contextlib.contextmanager
def host_slot(config: RunConfig, what: str) -> Iterator[Host]:
    """Queue for the host's concurrency slot, then take the lease on the host; yield the run's host.

    While it queues, the run's log names the run that holds the host (and each next one): the holder
    writes itself into a Prefect Variable (`holder_variable`) once it has the slot. A config that trains
    across hosts (`train_nodes`) takes every node's slot with its host's, all at once (Prefect takes a list
    of limits whole or not at all: two runs that share two hosts never hold one each), and every node's
    lease for the run."""
    logger = get_run_logger()
    hosts = [config.host, *config.train_nodes.hosts]
    names = [limit_name(h) for h in hosts]
    variables = [holder_variable(n) for n in names]
    for name in names:
        ensure_limit(name)
    _tag_host(config.host)
    start, said = time.monotonic(), object()  # nothing said yet
    gone, last_gone = 0, None  # looks in a row that found the slot's holder (the same one) gone from the host
    with contextlib.ExitStack() as stack:
        # For the run, not one attempt: the service thread logs a timeout just after our thread has it.
        stack.enter_context(_quiet_slot_timeouts())
        while True:
            holders = _holders(variables)
            if holders != said:
                for h, name, holder in zip(hosts, names, holders):
                    if holder is not None or h is config.host:
                        logger.info(
                            "waiting for host %s (Prefect global concurrency limit %r)%s",
                            h.name,
                            name,
                            _held_by(holder),
                        )
                said = holders
            try:
                stack.enter_context(concurrency(names, occupy=1, strict=True, timeout_seconds=WAIT_NOTE_S))
                break
            except TimeoutError:
                # the run's own host only (a train node's slot is taken with it; that node's own runs look at it)
                looked = holders[0] if _holder_gone(config.host, holders[0]) else None
                gone = gone + 1 if looked is not None and looked == last_gone else int(looked is not None)
                last_gone = looked
                if gone >= GONE_LOOKS and Variable.get(variables[0], default=None) == looked:
                    _take_back(names[0], variables[0], looked, logger)
                    gone, last_gone, said = 0, None, object()
                continue
        me = {
            "flow_run_id": flow_run_owner(),
            "flow_run": current_run.name,
            "what": what,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        for variable in variables:
            Variable.set(variable, me, overwrite=True)
        held = time.monotonic()
        stack.callback(lambda: logger.info("released host %s after %.0f s", config.host.name, time.monotonic() - held))
        for variable in variables:
            stack.callback(_let_go, variable, me["flow_run_id"])
        host = stack.enter_context(make_host(config.host))
        stack.enter_context(host.lease(flow_run_owner(), what, log=logger.warning))
        for node in config.train_nodes.hosts:  # held on a connection of its own for the run
            other = stack.enter_context(make_host(node))
            stack.enter_context(other.lease(flow_run_owner(), what, log=logger.warning))
        logger.info("holding host %s for %s (waited %.0f s)", config.host.name, what, held - start)
        yield host


def stop_jobs_of_run(flow: Any, flow_run: Any, state: Any) -> None:
    """on_cancellation / on_crashed hook: end every job this flow run still has on its host.

    The dispatch already ends the job it follows when the flow is interrupted; this is the net for a
    flow process that was killed outright (the runner calls the hook after killing it).
    """
    params = (flow_run.parameters or {}).get("params") or {}
    try:
        config = load_config(params.get("config_path", "configs/demo.yaml"), params.get("overrides") or {})
    except Exception as exc:  # noqa: BLE001 - a hook must not raise; say why nothing was stopped
        print(f"cannot stop the jobs of flow run {flow_run.id}: its config does not load: {exc}")
        return
    with make_host(config.host) as host:
        stopped = host.stop_owner(str(flow_run.id))
        released = release_windows(host, config, str(flow_run.id))
    for node in config.train_nodes.hosts:  # the other nodes of a training across hosts
        try:
            with make_host(node) as other:
                stopped += [f"{node.name}:{d}" for d in other.stop_owner(str(flow_run.id))]
        except Exception as exc:  # noqa: BLE001 - one unreachable node must not keep the others' jobs alive
            print(f"cannot stop the jobs of flow run {flow_run.id} on {node.name}: {exc}")
    print(
        f"flow run {flow_run.id} ended {state.name}: stopped {len(stopped)} job(s) on {config.host.name}: {stopped}"
        + (f"; production windows given back: {released}" if released else "")
    )


def release_windows(host: Host, config: RunConfig, owner: str) -> list[str]:
    """Ask the host's open production windows of this flow run to give production back now (the
    guardian would, once the host lease has been gone for production.orphan_grace_s)."""
    if config.production.kind == "none":
        return []
    rc, out, err = host.exec(
        [config.host.python, "-m", "eagleflow.production.window", "release-owner", config.host.work_root, owner],
        timeout=60,
    )
    if rc != 0:
        print(f"could not release the production windows of {owner} on {config.host.name}: {(err or out)[-500:]}")
        return []
    return json.loads(out.strip().splitlines()[-1])["released"]
