"""Production's health as a person watching it would see it: asked twice a second, with its down spells."""

from __future__ import annotations

import threading
import time

from eagleflow import httpget


def healthy(url: str) -> bool:
    return httpget.answers(url, 2)


class HealthLog(threading.Thread):
    """(time, answered) every half second until stopped."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.samples, self.done = url, [], threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.time(), healthy(self.url)))
            self.done.wait(0.5)

    def down_spells(self) -> list[tuple[float, float]]:
        spells, start = [], None
        for t, ok in self.samples:
            if not ok and start is None:
                start = t
            elif ok and start is not None:
                spells.append((start, t))
                start = None
        if start is not None:
            spells.append((start, float("inf")))
        return spells
