"""The stage's side of production downtime (eagleflow.production.downtime) where there is nothing to
stop: kind 'none' starts no guardian and writes no record. With a real production server, and every
way a benchmark can end, see tests/integration/production/test_downtime.py."""

from __future__ import annotations

from pathlib import Path

from eagleflow.config import ProductionConfig
from eagleflow.production import production_stopped


def test_kind_none_is_a_no_op(tmp_path: Path) -> None:
    with production_stopped(ProductionConfig(), tmp_path / "bench", work_root=tmp_path) as downtime:
        assert downtime.engine_env() == {"EAGLEFLOW_TOKEN": downtime.token}
    assert downtime.result and downtime.result["ok"] and not downtime.result["started"]
    assert list((tmp_path / "bench").iterdir()) == []  # no guardian, no records
