"""Production's drafter: deploy one (with its canary and the automatic rollback), or roll back by hand.

    eagleflow promote CONFIG --drafter DIR [--set ...]     deploy DIR to production, measure, keep or roll back
    eagleflow rollback CONFIG [--why TEXT] [--set ...]     production back to the last good drafter

Both need `production.promote: serve` (production's launch reads <work_root>/production/<name>/drafter). The
nightly retrain (flows.retrain) switches the same way, inside the night's production window, so the one engine
load that gives production back is also the new drafter's measurement (the benchmark then runs on production),
and rolls back through `roll_back` when its gate refuses the drafter on those figures.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar

from prefect import flow, get_run_logger
from pydantic import Field

from eagleflow import EagleflowError
from eagleflow.config import ConfigError, RunConfig
from eagleflow.contracts.failure import split_message, three_lines
from eagleflow.hosts import Host
from eagleflow.nightly.promotion import PromotionGate, judge_canary, judge_restored
from flows.host_slot import host_slot, stop_jobs_of_run
from flows.params import CONFIG_PATH, OVERRIDES, ConfigParams, main_cli
from tasks.production import Windows, production_windows
from tasks.served import (
    canary,
    confirm_drafter,
    previous_canary,
    publish_history,
    rollback_drafter,
    show_served,
    switch_drafter,
)


class RolledBack(EagleflowError):
    """The deployed drafter did not serve; production is back on the last good one (the message says why)."""


@dataclass
class SwitchOutcome:
    """What a deploy ended with: the new drafter serving, or rolled back and why."""

    serving: bool
    deployed: dict[str, Any]
    canary: dict[str, Any] | None = None
    reasons: list[str] = field(default_factory=list)


def try_canary(host: Host, config: RunConfig, label: str) -> tuple[dict[str, Any] | None, str | None]:
    """Production's figures through the canary, or None and why it could not measure (production unreachable at
    production.url, an API key that cannot be read, the job failing): a drafter nobody measured must not stay."""
    try:
        return canary(host, config, label), None
    except EagleflowError as exc:  # a failed job reads as three lines: its cause is what to say
        lines = str(exc).splitlines()
        cause = next((x.removeprefix("cause: ") for x in lines if x.startswith("cause: ")), None)
        return None, cause or split_message(str(exc))[0]


def measure_restored(host: Host, config: RunConfig, history: str, why: str) -> dict[str, Any]:
    """The canary on the drafter a rollback restored; when it cannot measure, production serves that drafter (the
    last good one) unmeasured: the history says so and the flow fails in three lines with the canary's cause."""
    restored, failure = try_canary(host, config, "restored drafter")
    if restored is not None:
        return restored
    after = show_served(host, config)
    publish_history(config, after, f"{history}; the restored drafter is unmeasured")
    raise RolledBack(
        three_lines(
            f"production on {host.name} serves drafter {after['serving']} again, unmeasured",
            f"{why} the canary could not measure the restored drafter: {failure}".strip(),
            "check that production answers at production.url with its API key (production.api_key_secret or "
            "production.api_key_env), then measure it again: eagleflow rollback CONFIG (the link stays where it is)",
            [],
        )
    )


def switch_in_window(
    host: Host, config: RunConfig, windows: Windows, drafter_dir: str, record: dict[str, Any] | None
) -> dict[str, Any]:
    """Switch production's drafter inside the (open or new) window and give production back with it: this load
    is the new drafter's, and its measurement's. Returns what was deployed before. When production does not
    come back with it, the window's guardian has rolled it back (production healthy): RolledBack, saying why. When
    production was not serving before the window, nothing can measure the new drafter: the link goes back to the last
    good one at once (production is left as it was, down) and RolledBack says so."""
    before = show_served(host, config)
    switch_drafter(host, config, drafter_dir, windows.hold("switch"), record)
    windows.close()
    back = windows.records[-1]
    if not back.was_running and config.production.kind != "none":
        why = "production was not serving when the switch began, so nothing could measure the new drafter"
        rollback_drafter(host, config, why, None, windows.hold("rollback"))
        windows.close()
        after = show_served(host, config)
        publish_history(config, after, f"Rolled back: production was down, {drafter_dir} was never measured")
        raise RolledBack(
            three_lines(
                f"{drafter_dir} was not put into production on {host.name}",
                f"{why}; its link is back on drafter {after['serving']} ({after['source']})",
                "start production (its own unit or command), check it answers at production.url, then promote again",
                [f"{host.name}:{back.dir}"] if back.dir else [],
            )
        )
    if back.rolled_back:
        after = show_served(host, config)
        publish_history(config, after, f"Rolled back: production did not come back with {drafter_dir}")
        raise RolledBack(
            f"production on {host.name} did not come back with the drafter {drafter_dir}; the guardian "
            f"rolled it back to drafter {after['serving']} and production is healthy. Cause: "
            f"{back.rolled_back}. Logs on the host: {back.dir}/production-guardian.log and "
            f"production-commands.log"
        )
    return before


def roll_back(
    host: Host,
    config: RunConfig,
    windows: Windows,
    drafter_dir: str,
    why: str,
    figures: dict[str, Any] | None,
) -> dict[str, Any]:
    """Production back on the last good drafter (one more load), measured again by the canary and held to its own
    earlier canary (`judge_restored`)."""
    get_run_logger().warning("%s serves below the bar on production: %s; rolling back", drafter_dir, why)
    back = rollback_drafter(host, config, why, figures, windows.hold("rollback"))
    windows.close()
    earlier = previous_canary(back, back["serving"])
    restored = measure_restored(host, config, f"Rolled back: {drafter_dir} ({why})", f"{why}; and")
    after = confirm_drafter(host, config, restored, back.get("record"))
    publish_history(config, after, f"Rolled back: {drafter_dir} served below the bar on production")
    if earlier is None:
        get_run_logger().warning(
            "drafter %s has no earlier canary on production to be held to (adopted, never measured): its figures "
            "now are its first (AL %.2f)",
            back["serving"],
            float(restored.get("mean_acceptance_length") or 0),
        )
    still = judge_restored(restored, earlier, config.production.canary_tolerance)
    if still:
        raise RolledBack(
            f"production is back on the last good drafter, but it too serves below the bar now: "
            f"{'; '.join(still)}. The engine side is suspect (a wake that left the draft weights "
            f"unloaded, a changed launch): check production's launch and log"
        )
    return after


def switch_and_verify(
    host: Host,
    config: RunConfig,
    windows: Windows,
    drafter_dir: str,
    record: dict[str, Any] | None,
    gate: PromotionGate,
) -> SwitchOutcome:
    """Deploy, measure production with the canary, keep the drafter or roll back (`eagleflow promote`)."""
    before = switch_in_window(host, config, windows, drafter_dir, record)
    bar = previous_canary(before, before["good"])
    figures, failure = try_canary(host, config, "new drafter")
    if figures is None:
        why = f"its canary could not measure it: {failure}"
        after = roll_back(host, config, windows, drafter_dir, why, None)
        raise RolledBack(
            three_lines(
                f"{drafter_dir} was not kept in production on {host.name}: rolled back to drafter {after['serving']}",
                why,
                "check that production answers at production.url with its API key (production.api_key_secret or "
                "production.api_key_env), then promote again",
                [],
            )
        )
    reasons = judge_canary(figures, bar, gate, config.production.canary_tolerance)
    if not reasons:
        after = confirm_drafter(host, config, figures, record)
        publish_history(
            config,
            after,
            f"Deployed: production serves {drafter_dir} (AL {figures['mean_acceptance_length']:.2f} on production)",
        )
        return SwitchOutcome(True, after, figures)
    after = roll_back(host, config, windows, drafter_dir, "; ".join(reasons), figures)
    return SwitchOutcome(False, after, figures, reasons)


def require_switchable(config: RunConfig) -> None:
    if config.production.promote != "serve":
        raise ConfigError(
            "production.promote is 'record': production's launch is not eagleflow's to switch. Set "
            "production.promote: serve and point production's launch at the link (docs/production.md)"
        )


class PromoteParams(ConfigParams):
    """Deploy a drafter to production by hand: the canary decides whether it stays."""

    typed: ClassVar[tuple[str, ...]] = ("drafter",)

    config_path: str = CONFIG_PATH
    drafter: str | None = Field(None, description="The drafter to deploy: its engine-format directory on the host.")
    min_acceptance_length: float = Field(1.5, ge=1, description="Roll back below this acceptance length on production.")
    overrides: dict[str, Any] = OVERRIDES


class RollbackParams(ConfigParams):
    config_path: str = CONFIG_PATH
    why: str = Field("rolled back by hand", description="Why: kept in production's drafter history.")
    overrides: dict[str, Any] = OVERRIDES


@flow(name="promote-drafter", log_prints=True, on_cancellation=[stop_jobs_of_run], on_crashed=[stop_jobs_of_run])
def promote_drafter(params: PromoteParams) -> dict[str, Any]:
    config = params.load()
    require_switchable(config)
    if not config.benchmark.drafter:
        raise ConfigError("give the drafter to deploy (--drafter DIR)")
    gate = PromotionGate(min_acceptance_length=params.min_acceptance_length)
    with host_slot(config, f"promote-drafter {config.name}") as host:
        with production_windows(host, config) as windows:
            done = switch_and_verify(host, config, windows, config.benchmark.drafter, None, gate)
    return {"serving": done.serving, "reasons": done.reasons, "canary": done.canary, "deployed": done.deployed}


@flow(name="rollback", log_prints=True, on_cancellation=[stop_jobs_of_run], on_crashed=[stop_jobs_of_run])
def rollback(params: RollbackParams) -> dict[str, Any]:
    config = params.load()
    require_switchable(config)
    with host_slot(config, f"rollback {config.name}") as host:
        show_served(host, config)
        with production_windows(host, config) as windows:
            back = rollback_drafter(host, config, params.why, None, windows.hold("rollback"))
        restored = measure_restored(host, config, f"Rolled back by hand: {params.why}", "")
        after = confirm_drafter(host, config, restored, back.get("record"))
        publish_history(config, after, f"Rolled back by hand: {params.why}")
    return {"serving": True, "canary": restored, "deployed": after}


def _show(out: dict) -> None:
    d = out["deployed"]
    if out["serving"]:
        print(
            f"production serves drafter {d['serving']} ({d['source']}): AL "
            f"{out['canary']['mean_acceptance_length']:.2f}, "
            f"{out['canary']['output_tok_s']:.1f} output tok/s on production"
        )
    else:
        print(f"rolled back to drafter {d['serving']} ({d['source']}): {'; '.join(out['reasons'])}")


def promote_main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return main_cli(
        promote_drafter,
        __doc__,
        PromoteParams,
        {
            "--drafter": "the drafter's directory on the host",
            "--min-acceptance-length": "roll back below this acceptance length on production (default 1.5)",
        },
        argv,
        prog,
        check=require_switchable,
        show=_show,
    )


def rollback_main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return main_cli(
        rollback,
        __doc__,
        RollbackParams,
        {"--why": "why (kept in the history)"},
        argv,
        prog,
        check=require_switchable,
        show=_show,
    )


if __name__ == "__main__":
    sys.exit(promote_main())
