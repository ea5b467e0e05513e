"""Production's health as a person watching it would see it: asked twice a second, with its down spells."""

from __future__ import annotations

import threading
import time

import httpx

from eagleflow.util import http


def healthy(url: str) -> bool:
    return http.answers(url, 2)


def probe(url: str) -> bool | None:
    """True: answered 200; False: down (refused, or an error status); None: no answer within 2 s. A busy
    server on a loaded 2-core machine can be slow to answer without ever having gone down: a person would
    wait for the page, so a slow answer neither starts nor ends a down spell."""
    try:
        return http.get(url, timeout=2).status_code == 200
    except httpx.TimeoutException:
        return None
    except httpx.HTTPError:
        return False


class HealthLog(threading.Thread):
    """(time, answered: True/False/None as `probe` says) every half second until stopped."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.samples, self.done = url, [], threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.time(), probe(self.url)))
            self.done.wait(0.5)

    def down_spells(self) -> list[tuple[float, float]]:
        spells, start = [], None
        for t, ok in self.samples:
            if ok is None:
                continue
            if not ok and start is None:
                start = t
            elif ok and start is not None:
                spells.append((start, t))
                start = None
        if start is not None:
            spells.append((start, float("inf")))
        return spells
