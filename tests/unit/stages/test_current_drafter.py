"""The benchmark's current drafter is what production serves (eagleflow.stages.benchmark.current_drafter): a night
with nothing promoted yet is held to the drafter production's link names, not to no speculation."""

from __future__ import annotations

import json
from pathlib import Path

from eagleflow.config import load_config
from eagleflow.production import served
from eagleflow.stages.benchmark import current_drafter
from tests.conftest import ROOT


def drafter(tmp: Path, name: str) -> Path:
    d = tmp / "exports" / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": name}))
    return d


def test_with_nothing_promoted_the_bar_is_the_good_drafter_production_serves(tmp_path):
    production = {
        "production.promote": "serve",
        "production.kind": "command",
        "production.start_command": ["true"],
        "production.stop_command": ["true"],
        "production.health_url": "http://127.0.0.1:9/health",
        "production.url": "http://127.0.0.1:9",
    }
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"host.work_root": str(tmp_path / "work"), **production})
    assert current_drafter(cfg) is None  # nothing managed: production serves no speculation
    d = Path(served.served_dir(cfg.host.work_root, cfg.name))
    served.adopt(d, drafter(tmp_path, "public"))
    assert current_drafter(cfg) == str(d / "drafters" / "0")
    # tonight's drafter switched in and waiting for its canary: the bar stays the drafter it replaces
    served.switch(d, drafter(tmp_path, "night1"), run="r1")
    assert current_drafter(cfg) == str(d / "drafters" / "0")
    served.confirm(d, {"mean_acceptance_length": 2.4})
    assert current_drafter(cfg) == str(d / "drafters" / "1")
    # production.promote 'record': production's drafter is not eagleflow's to read; it names none
    assert (
        current_drafter(cfg.model_copy(update={"production": cfg.production.model_copy(update={"promote": "record"})}))
        is None
    )
