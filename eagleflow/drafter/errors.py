"""What the drafter package raises; each message names the file or field and what to do."""

from __future__ import annotations

from eagleflow import EagleflowError


class FormatError(EagleflowError, ValueError):
    """A checkpoint or target directory that cannot be used; the message names the file."""


class DataError(EagleflowError, ValueError):
    """Extracted data that cannot be trained on; the message names the file."""


class TrainError(EagleflowError):
    """Training cannot proceed; the message says why and what to change."""
