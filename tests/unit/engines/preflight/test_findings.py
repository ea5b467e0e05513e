"""A preflight's verdict (eagleflow.engines.preflight.findings): printed errors first."""

from __future__ import annotations

import pytest

from eagleflow.engines.preflight.findings import Finding, format_findings, has_errors


@pytest.mark.parametrize("level", ["ok", "warning", "error"])
def test_format_findings_puts_errors_first(level):
    text = format_findings([Finding("a", "ok", "fine"), Finding("b", level, "x")])
    assert text.splitlines()[0].startswith("ERROR" if level == "error" else ("WARNING" if level == "warning" else "OK"))
    assert has_errors([Finding("a", "ok", "fine"), Finding("b", level, "x")]) == (level == "error")
