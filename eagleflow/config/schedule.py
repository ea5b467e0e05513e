"""When the nightly retrain runs by itself: the schedule its deployment is registered with (eagleflow deploy)."""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from eagleflow.config.base import _Strict


class ScheduleConfig(_Strict):
    """The nightly deployment's schedule. Inactive unless `active`: a worker left running on a laptop must not start
    a full retrain at 02:00 because a demo config was deployed; a production config says `active: true`."""

    cron: str = Field("0 2 * * *", description="Cron expression (minute hour day-of-month month day-of-week).")
    timezone: str = Field("UTC", description="IANA time zone the cron is read in, e.g. UTC or Europe/Berlin.")
    active: bool = Field(
        False,
        description="Deploy the schedule active (runs are created) or inactive (the deployment is Ready and runs "
        "when triggered; the schedule is shown off in the UI, turned on there or with "
        "`prefect deployment schedule resume`).",
    )

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        fields = v.split()
        if len(fields) != 5:
            raise ValueError(
                f"cron {v!r} has {len(fields)} fields; give 5: minute hour day-of-month month day-of-week, "
                "e.g. '0 2 * * *' for 02:00 every day"
            )
        return " ".join(fields)

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r}; give an IANA name such as UTC or Europe/Berlin") from None
        return v

    def describe(self) -> str:
        """One line: what runs when, and whether it will, in Prefect's words (a schedule is active or inactive; the
        deployment itself is never paused by eagleflow, so it runs when triggered)."""
        return f"cron '{self.cron}' ({self.timezone}), schedule {'active' if self.active else 'inactive'}"
