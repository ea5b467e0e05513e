"""What every section of the run config shares: strict models (an unknown key is an error), and the error a
bad config raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from eagleflow import EagleflowError


class ConfigError(EagleflowError, ValueError):
    """A run config that cannot be used; the message names the field or path and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
