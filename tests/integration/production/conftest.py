"""Production for the package's cases (test_downtime.py, test_window.py), behind the operator's scripts
(tests/prodservice.py), each started once for both modules, not once for each: `prod`, a real vLLM CPU server of
the demo target, for the cases that need the engine itself; `standin`, a stand-in server that answers its health
LOAD_S seconds after its start, for the cases where production is only stopped and given back (an engine start
is about 17 CPU-seconds here, a stand-in's none).

test_downtime's case 5 takes production down for good (the operator stopped it before the benchmark); it runs
after every other case of the package, so no case after it pays for a start. Both fixtures start their server again
if a case left it down, so the cases hold in any order.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.production.test_downtime import TIMES, Prod, healthy, standin_prod, vllm_prod, wait_healthy

PACKAGE = Path(__file__).resolve().parent
LAST = "test_5_production_not_running_before_is_not_started_after"  # leaves production down


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Case 5 after the package's last case (its other cases keep their order)."""

    def here(item: pytest.Item) -> bool:
        return PACKAGE in Path(item.path).resolve().parents

    last = [it for it in items if here(it) and it.name == LAST]
    if not last:
        return
    rest = [it for it in items if it not in last]
    at = max((i for i, it in enumerate(rest) if here(it)), default=len(rest) - 1) + 1
    items[:] = rest[:at] + last + rest[at:]


@pytest.fixture(scope="package")
def prod_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prod]:
    p = vllm_prod(tmp_path_factory.mktemp("production"))
    port = p.port
    subprocess.run(p.start_command, check=True)
    try:
        p.first_start_s = wait_healthy(p.health_url, 600)
        print(f"\nproduction on port {port} healthy after {p.first_start_s:.1f} s (first start)")
        yield p
    finally:
        subprocess.run(p.stop_command, check=False)
        print("\nrestore times (s): " + json.dumps({k: round(v, 1) for k, v in TIMES.items()}))


@pytest.fixture(scope="package")
def standin_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prod]:
    p = standin_prod(tmp_path_factory.mktemp("standin"))
    subprocess.run(p.start_command, check=True)
    try:
        p.first_start_s = wait_healthy(p.health_url, 120)
        yield p
    finally:
        subprocess.run(p.stop_command, check=False)


def serving(p: Prod) -> Prod:
    """p serving at the start of a case, whatever an earlier one left: case 5 takes it down for good, so the cases
    hold in any order (run as collected, it is the package's last and nothing restarts)."""
    if not healthy(p.health_url):
        subprocess.run(p.start_command, check=True)
        print(f"\nproduction started again, healthy after {wait_healthy(p.health_url, 600):.1f} s")
    return p


@pytest.fixture
def prod(prod_server: Prod) -> Prod:
    return serving(prod_server)


@pytest.fixture
def standin(standin_server: Prod) -> Prod:
    return serving(standin_server)
