"""The browser tests' fixtures: one headless Debian Chromium a module (Playwright drives it), a tall page a test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.e2e.ui.pages import CHROMIUM, CHROMIUM_ARGS, SHOTS


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make browser` installs it"
    SHOTS.mkdir(parents=True, exist_ok=True)  # `make test` empties it first; modules run side by side
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture()
def page(browser: Browser) -> Iterator[Page]:
    # Tall: Prefect's pages scroll inside a container of their own, which a full-page screenshot does not
    # unroll, so what a screenshot should show must fit the window.
    ctx = browser.new_context(viewport={"width": 1400, "height": 2400})
    ctx.set_default_timeout(30_000)
    pg = ctx.new_page()
    yield pg
    ctx.close()
