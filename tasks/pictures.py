"""The stages' pictures on the control side: read from the host, inlined in Prefect's markdown."""

from __future__ import annotations

import base64

from prefect import get_run_logger

from eagleflow.hosts import Host
from eagleflow.reporting.report import PLOT_TITLES

MAX_IMAGE_BYTES = 2_000_000  # a picture larger than this stays on the host (it is not one of ours)


def data_uri(png: bytes) -> str:
    """A PNG as an image link Prefect's markdown shows inline (the UI has no files of the host)."""
    return "data:image/png;base64," + base64.b64encode(png).decode()


def fetch_images(host: Host, plots: dict[str, str]) -> dict[str, bytes]:
    """The pictures the stages drew, read from the host, in the order a reader wants them; one that is
    missing or unreadable is left out with a warning (the figures stand without it)."""
    images: dict[str, bytes] = {}
    for name in sorted(plots, key=lambda n: list(PLOT_TITLES).index(n) if n in PLOT_TITLES else len(PLOT_TITLES)):
        try:
            data = host.read_bytes(plots[name])
        except Exception as exc:  # noqa: BLE001 - a picture is never worth the report
            get_run_logger().warning("picture %s not shown: %s", plots[name], exc)
            continue
        if len(data) <= MAX_IMAGE_BYTES:
            images[name] = data
    return images
