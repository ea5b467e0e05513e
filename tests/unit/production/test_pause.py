"""Pausing production instead of stopping it (eagleflow.production.pause, .swap): the sleep level from the host's
memory, the API root, which drafter can be swapped into a running engine, the config's rules and the lines a
report shows. With a real vLLM server: tests/integration/production/test_downtime.py (the CPU build) and
benchmarks/pause_gpu.py (an H200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import save_file

from eagleflow.config import ProductionConfig
from eagleflow.config.production import LEVEL1_RAM_HEADROOM
from eagleflow.config.production import choose_sleep_level as choose_level
from eagleflow.production.downtime import Downtime
from eagleflow.production.pause import base_url, judge, preflight
from eagleflow.production.service import settings_dict
from eagleflow.production.swap import incompatible


def test_level_1_only_where_host_ram_holds_what_production_has_on_its_gpus() -> None:
    assert choose_level(None, 70_000, int(70_000 * LEVEL1_RAM_HEADROOM))[0] == 1
    level, why = choose_level(None, 70_000, 70_000)
    assert level == 2 and "cannot hold" in why and "70,000" in why
    level, why = choose_level(None, None, 10**7)  # no nvidia-smi: level 1 is not risked
    assert level == 2 and "unknown" in why
    assert choose_level(1, 70_000, 10)[0] == 1  # the operator's word wins


def test_the_api_root_is_production_url_or_the_health_urls_origin() -> None:
    assert base_url("http://h:8000/", None) == "http://h:8000"
    assert base_url(None, "http://127.0.0.1:8000/health") == "http://127.0.0.1:8000"
    assert base_url(None, None) is None


def test_the_preflight_says_why_production_is_stopped_instead() -> None:
    assert preflight("stop", None, None, "http://127.0.0.1:9/health").why == "production.pause is 'stop'"
    plan = preflight("sleep", None, None, "http://127.0.0.1:9/health")  # nothing listens on port 9
    assert not plan.ok and "did not answer the sleep preflight" in plan.why and "127.0.0.1:9" in plan.why


def drafter(d: Path, hidden: int = 8, arch: str = "LlamaForCausalLMEagle3") -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "hidden_size": hidden, "draft_vocab_size": 32}))
    save_file(
        {
            "fc.weight": torch.zeros(hidden, 3 * hidden, dtype=torch.bfloat16),
            "lm_head.weight": torch.zeros(32, hidden, dtype=torch.bfloat16),
            "d2t": torch.zeros(32, dtype=torch.int64),
        },
        str(d / "model.safetensors"),
    )
    return d


def test_only_a_drafter_of_the_served_ones_tensors_is_swapped_in(tmp_path: Path) -> None:
    served = drafter(tmp_path / "a")
    assert incompatible(served, drafter(tmp_path / "b")) is None
    assert "another architecture" in incompatible(served, drafter(tmp_path / "wide", hidden=16))
    assert "another architecture" in incompatible(served, drafter(tmp_path / "mla", arch="DeepseekV3Eagle3"))
    odd = drafter(tmp_path / "odd")
    save_file({"fc.weight": torch.zeros(8, 24, dtype=torch.float16)}, str(odd / "model.safetensors"))
    why = incompatible(served, odd)
    assert why and "differ" in why and "fc.weight" in why
    assert "not known" in incompatible(None, served)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no safetensors" in incompatible(served, empty)


def test_a_swap_needs_production_asleep_and_the_record_carries_the_pause_settings() -> None:
    base = dict(kind="command", start_command=["s"], stop_command=["t"], health_url="http://h/health")
    with pytest.raises(ValidationError, match="swap_drafter .* needs production.pause 'sleep'"):
        ProductionConfig(**base, swap_drafter=True)
    rec = settings_dict(ProductionConfig(**base, pause="sleep", sleep_level=1, swap_drafter=True))
    assert (rec["pause"], rec["sleep_level"], rec["swap_drafter"], rec["drafter_link"]) == ("sleep", 1, True, None)


def test_the_reports_line_says_woken_or_why_it_was_stopped_instead(tmp_path: Path) -> None:
    d = Downtime(tmp_path, "t", was_running=True, kind="command")
    d.result = {
        "ok": True,
        "was_running": True,
        "started": False,
        "healthy_after_s": 7.9,
        "resumed": {"level": 1, "swap_s": 3.8, "swapped_in": "/p/drafters/1", "probe_al": 3.38},
    }
    assert d.summary() == (
        "production woken from sleep level 1, healthy after 7.9 s, drafter /p/drafters/1 swapped "
        "in (3.8 s), its drafter drafts (probe AL 3.38)"
    )
    d.result = {
        "ok": True,
        "was_running": True,
        "started": True,
        "healthy_after_s": 70.1,
        "pause_fallback": "production's drafter accepts nothing after the wake",
    }
    assert d.summary() == (
        "production restored, healthy after 70.1 s (stopped and started: production's drafter "
        "accepts nothing after the wake)"
    )


def test_the_wake_is_judged_against_the_probe_before_the_sleep() -> None:
    before = {"probe_answers": ["a", "b", "c", "d"], "probe_al": 2.7, "probe_per_position": [0.7, 0.5, 0.4]}
    assert judge(dict(before), before) is None
    assert judge({**before, "probe_answers": ["a", "b", "x", "y"]}, before) is None  # greedy noise: half still holds
    why = judge({**before, "probe_answers": ["a", "x", "y", "z"]}, before)
    assert why and "1 of 4 greedy answers as before" in why  # a reload that went wrong (a quantized one included)
    lost = {**before, "probe_al": 1.0, "probe_per_position": [0.0, 0.0, 0.0]}
    assert "vllm#52479" in judge(lost, before)  # drafted before the sleep, nothing after: the level-2 fault
    assert "swapped in does not draft" in judge(lost, before, swapped=True)
    assert judge(lost, lost) is None  # it drafted nothing before either: the wake lost nothing
    assert judge({"probe": "skipped: wants a key"}, {"probe": "skipped: wants a key"}) is None
