"""Production's drafter as Prefect tasks: switch it, measure production with it (the canary), roll it back.

The files and the rules are the library's (`eagleflow.production.served` on the host, `eagleflow.nightly.promotion`'s
`judge_canary`); these tasks run them on the host and show the history as an artifact, so a person sees in the
UI what production serves, since when, on which figures, and what was rolled back and why.
"""

from __future__ import annotations

import json
import time
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.contracts.request import PRODUCTION_API_KEY_ENV
from eagleflow.hosts import Host
from eagleflow.nightly.promotion import promotion_record_path
from eagleflow.production.served import ServedDrafterError, served_dir, states
from tasks.generate import production_api_key
from tasks.naming import artifact_key, flow_run_owner

SERVED_CLI = "eagleflow.production.served"


def _served(host: Host, config: RunConfig, *args: str) -> dict[str, Any]:
    d = served_dir(config.host.work_root, config.name)
    rc, out, err = host.exec([config.host.python, "-m", SERVED_CLI, args[0], d, *args[1:]], timeout=600)
    lines = [x for x in out.splitlines() if x.startswith("{")]
    rec = json.loads(lines[-1]) if lines else {"error": (err or out)[-2000:] or f"exit status {rc}"}
    if rc != 0 or "error" in rec:
        raise ServedDrafterError(f"{SERVED_CLI} {args[0]} on {host.name} ({d}): {rec.get('error')}")
    return rec


@task(name="served-drafter", cache_policy=NO_CACHE)
def show_served(host: Host, config: RunConfig) -> dict[str, Any]:
    """What production's link names, and the history. The first time, production's present drafter
    (benchmark.current_drafter, when it is set) is adopted as the first good one: what a rollback returns to."""
    current = config.benchmark.current_drafter
    if current and host.exists(f"{current}/config.json"):
        return _served(host, config, "adopt", "--drafter", current)
    return _served(host, config, "show")


@task(name="switch-drafter", cache_policy=NO_CACHE)
def switch_drafter(
    host: Host, config: RunConfig, drafter_dir: str, window_dir: str, record: dict[str, Any] | None
) -> dict[str, Any]:
    """Point production's link at `drafter_dir` (copied in) inside the open window `window_dir`: production comes
    back with it when the window closes, and the window's guardian rolls it back if production does not."""
    out = _served(
        host,
        config,
        "switch",
        "--drafter",
        drafter_dir,
        "--run",
        flow_run_owner(),
        "--record",
        json.dumps(record),
        "--window",
        window_dir,
    )
    get_run_logger().info(
        "production's drafter link %s -> drafter %s (a copy of %s), pending its canary",
        out["link"],
        out["serving"],
        drafter_dir,
    )
    return out


@task(name="canary", cache_policy=NO_CACHE, task_run_name="canary: {label}")
def canary(host: Host, config: RunConfig, label: str) -> dict[str, Any]:
    """Production's own acceptance and speed on the held-out prompts, through its endpoint (a job on the host)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    d = f"{served_dir(config.host.work_root, config.name)}/canary/{stamp}-{label}"
    n, max_tokens = config.production.canary_prompts, config.production.canary_max_tokens or config.benchmark.max_tokens
    host.write_text(
        f"{d}/request.json", json.dumps({"config": config.model_dump(mode="json"), "n": n, "max_tokens": max_tokens})
    )
    key = production_api_key(config)
    logger = get_run_logger()
    host.run_job(
        d,
        [config.host.python, "-m", "eagleflow.production.canary", f"{d}/request.json", f"{d}/canary.json"],
        log=logger.info,
        owner=flow_run_owner(),
        secret_env={PRODUCTION_API_KEY_ENV: key} if key else None,
    )
    figures = json.loads(host.read_text(f"{d}/canary.json"))
    logger.info(
        "canary (%s): production's AL %.2f, %.1f output tok/s over %d requests",
        label,
        figures["mean_acceptance_length"],
        figures["output_tok_s"],
        figures["requests"],
    )
    return {**figures, "dir": d}


@task(name="confirm-drafter", cache_policy=NO_CACHE)
def confirm_drafter(
    host: Host, config: RunConfig, figures: dict[str, Any], record: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The serving drafter measured good on production: what a rollback returns to from now on."""
    return _served(host, config, "confirm", "--canary", json.dumps(figures), "--record", json.dumps(record))


@task(name="rollback-drafter", cache_policy=NO_CACHE)
def rollback_drafter(
    host: Host, config: RunConfig, why: str, figures: dict[str, Any] | None, window_dir: str
) -> dict[str, Any]:
    """Point production's link back at the last good drafter inside the open window `window_dir`, and the
    promoted record with it: the next night continues from what production serves, not from the rejected one."""
    out = _served(host, config, "rollback", "--why", why, "--canary", json.dumps(figures), "--window", window_dir)
    restore_promoted_record(host, config, out)
    get_run_logger().warning("production's drafter rolled back to drafter %s: %s", out["serving"], why)
    return out


def restore_promoted_record(host: Host, config: RunConfig, deployed: dict[str, Any]) -> None:
    """The promoted record follows production's link: the serving drafter's record, or none for an adopted one."""
    path = promotion_record_path(config.host.work_root, config.name)
    record = deployed.get("record")
    if record:
        host.write_text(path, json.dumps(record, indent=2))
    elif host.exists(path):
        host.write_text(path + ".rolled-back", host.read_text(path))
        host.exec(["rm", "-f", path])


def previous_canary(deployed: dict[str, Any], seq: int | None) -> dict[str, Any] | None:
    """The last canary figures of drafter `seq` (the last good one): the bar a new drafter is held to."""
    figures = [e.get("canary") for e in deployed["events"] if e["seq"] == seq and e["action"] == "confirm"]
    return figures[-1] if figures and figures[-1] else None


@task(name="deployed-history", cache_policy=NO_CACHE)
def publish_history(config: RunConfig, deployed: dict[str, Any], headline: str) -> None:
    create_markdown_artifact(
        history_markdown(deployed, headline),
        key=artifact_key("eagleflow", config.name, "deployed"),
        description="production's drafter: what was deployed, confirmed, rolled back and why",
    )


def history_markdown(deployed: dict[str, Any], headline: str) -> str:
    """The artifact: the headline, what production serves, then every event, newest first."""
    st = states(deployed["events"])
    lines = [
        f"# {headline}",
        "",
        f"Production serves drafter **{deployed['serving']}** ({st.get(deployed['serving'], 'none')}): "
        f"`{deployed['drafter']}`, a copy of `{deployed['source']}`; its launch reads `{deployed['link']}`.",
        f"A rollback returns to drafter {deployed['last_good']}."
        if deployed["last_good"] is not None
        else "No earlier good drafter: nothing to roll back to.",
        "",
        "| when | event | drafter | figures | why |",
        "|---|---|---|---|---|",
    ]
    for e in reversed(deployed["events"]):
        figures = e.get("canary") or {}
        rec = e.get("record") or {}
        fig = (
            f"production AL {figures['mean_acceptance_length']:.2f}, {figures['output_tok_s']:.1f} tok/s"
            if figures.get("mean_acceptance_length") is not None
            else f"benchmark AL {rec['mean_acceptance_length']:.2f}, {rec['speedup']:.2f}x"
            if rec
            else ""
        )
        what = {
            "adopt": "adopted",
            "promote": "promoted",
            "confirm": "measured good on production",
            "reject": "rejected",
            "rollback": "rolled back to",
        }[e["action"]]
        source = f" ({e['source']})" if e.get("source") else ""
        lines.append(f"| {e['at']} | {what} | {e['seq']}{source} | {fig} | {e.get('why') or ''} |")
    return "\n".join(lines)
