"""Production stopped and started through the operator's means (eagleflow.production.service): the
systemd commands that would run. No systemd in this container (PID 1 is not systemd): only the argv
is checked; the command kind runs for real in tests/integration/production/test_downtime.py."""

from __future__ import annotations

from eagleflow.config import ProductionConfig
from eagleflow.production import ProductionService


def test_systemd_argv_is_what_would_run() -> None:
    cfg = ProductionConfig(kind="systemd", unit="vllm-kimi.service", health_url="http://127.0.0.1:8000/health")
    svc = ProductionService(cfg)
    assert svc.stop_argv() == ["systemctl", "stop", "vllm-kimi.service"]
    assert svc.start_argv() == ["systemctl", "start", "vllm-kimi.service"]
    assert svc.is_active_argv() == ["systemctl", "is-active", "vllm-kimi.service"]
    user = ProductionService(cfg.model_copy(update={"user_unit": True}))
    assert user.stop_argv() == ["systemctl", "--user", "stop", "vllm-kimi.service"]
