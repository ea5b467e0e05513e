"""The contract between the control side and a host-side stage: the request it reads, the error it raises.

The control side writes `<stage_dir>/request.json` (a `StageRequest`) before the stage starts; the
stage, `python -m eagleflow.stages.<stage> <stage_dir>/request.json`, writes its outputs under the
stage directory and `manifest.json` last. Imports neither torch nor production control, so the
Prefect side reads it cheaply.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from eagleflow import EagleflowError
from eagleflow.config import RunConfig
from eagleflow.contracts.manifest import Manifest

# Where the flow run hands production's API key to a stage: in the stage process's environment only,
# never in request.json, a job spec, a log or a Prefect parameter.
PRODUCTION_API_KEY_ENV = "EAGLEFLOW_PRODUCTION_API_KEY"
# A stage run on several hosts at once (training across hosts) learns its node from the control side here:
# {"rank": k, "count": n, "master": "addr:port"} (eagleflow.hosts.nodes sets it, eagleflow.stages.train reads it).
NODE_ENV = "EAGLEFLOW_TRAIN_NODE"


class StageError(EagleflowError):
    """A failure whose message already says what is wrong and what to do; printed without a traceback."""


class StageRequest(BaseModel):
    """Written by the control side into the stage directory before the stage starts."""

    stage: str = Field(
        description="The stage to run (check, select, generate, extract, pool, train, export, benchmark)."
    )
    run: str = Field(
        "", description="The flow run that asked for it (select: a retry of that run takes the same batch)."
    )
    key: str = Field(description="The stage key: hash of its settings, upstream keys and code version.")
    dir: str = Field(description="The stage directory on the host.")
    config: RunConfig = Field(description="The whole validated run config.")
    upstream: dict[str, Manifest] = Field(default_factory=dict, description="Upstream stage -> its manifest.")

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def manifest(
        self,
        outputs: BaseModel | dict,
        metrics: BaseModel | dict | None = None,
        hashes: dict[str, str] | None = None,
        seconds: float = 0.0,
        content_key: str | None = None,
    ) -> Manifest:
        """The stage's manifest; `outputs` and `metrics` are its typed records (eagleflow.contracts)."""
        return Manifest(
            stage=self.stage,
            key=self.key,
            dir=self.dir,
            upstream={s: m.key for s, m in self.upstream.items()},
            outputs=_as_dict(outputs),
            metrics=_as_dict(metrics),
            hashes=hashes or {},
            seconds=seconds,
            content_key=content_key,
        )


def _as_dict(record: BaseModel | dict | None) -> dict:
    return record.model_dump(mode="json") if isinstance(record, BaseModel) else dict(record or {})
