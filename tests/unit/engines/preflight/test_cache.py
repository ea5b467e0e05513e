"""The preflight's kept findings (eagleflow.engines.preflight.cache): keyed by what the engine checks read, the
same for a drafter of the same layout at another path, another for anything the checks read, never kept with an
error, and read back naming this run's paths. The disk and GPU checks run every time."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from eagleflow.config import EngineConfig
from eagleflow.engines.preflight import cache, run
from eagleflow.engines.preflight.findings import Finding


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file of zeros: the header (8 bytes of length, JSON) and the data it describes."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = 4
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def drafter(root: Path, hidden: int = 64, validation_al: float = 2.5) -> Path:
    root.mkdir(parents=True)
    cfg = {"architectures": ["Eagle3LlamaForCausalLM"], "hidden_size": hidden, "eagle_aux_hidden_state_layer_ids": [1]}
    cfg["eagleflow"] = {"validation": {"acceptance_length": validation_al}, "checkpoint": str(root)}
    (root / "config.json").write_text(json.dumps(cfg))
    write_safetensors(root / "model.safetensors", {"fc.weight": ("F32", [hidden, 3 * hidden])})
    return root


@pytest.fixture
def target(tmp_path: Path) -> Path:
    t = tmp_path / "target"
    t.mkdir()
    (t / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4}))
    write_safetensors(t / "model.safetensors", {"w": ("F32", [4, 4])})
    return t


def key(target: Path, drafters: dict[str, str], engine: EngineConfig | None = None, temps=(0.0,)) -> str:
    return cache.preflight_key(engine or EngineConfig(), str(target), drafters, {"new": [1]}, None, list(temps))


def test_the_key_is_the_layout_not_the_path_nor_the_training_record(tmp_path, target):
    a = drafter(tmp_path / "night-1", validation_al=2.5)
    b = drafter(tmp_path / "night-2", validation_al=3.1)  # tonight's drafter: other weights, other record
    assert key(target, {"new": str(a)}) == key(target, {"new": str(b)})
    assert key(target, {"new": str(a)}, EngineConfig(port=9001)) == key(target, {"new": str(a)}, EngineConfig())


def test_what_no_engine_check_reads_is_the_same_key(tmp_path, target):
    a = drafter(tmp_path / "a")
    base = key(target, {"new": str(a)})
    # where and how long to wait, and the host-state thresholds (checked every run): no engine check reads them
    waits = EngineConfig(startup_timeout_s=60, stall_timeout_s=30, request_timeout_s=5, fatal_patterns=["x"])
    assert key(target, {"new": str(a)}, waits) == base
    assert key(target, {"new": str(a)}, EngineConfig(min_free_disk_gib=9, min_free_gpu_fraction=0.5)) == base
    # which sampled temperatures: the sampled verify check asks only whether one samples
    assert key(target, {"new": str(a)}, temps=(0.7,)) == key(target, {"new": str(a)}, temps=(0.0, 0.6, 1.0))
    assert set(cache.NOT_CHECKED) < set(EngineConfig.model_fields)  # a renamed field must not slip into the key


def test_anything_the_checks_read_is_another_key(tmp_path, target, monkeypatch):
    a = drafter(tmp_path / "a")
    base = key(target, {"new": str(a)})
    wider = drafter(tmp_path / "wider", hidden=128)
    assert key(target, {"new": str(wider)}) != base  # a tensor shape
    assert key(target, {"new": str(a)}, EngineConfig(env={"VLLM_PLUGINS": "x"})) != base  # the engine's settings
    assert key(target, {"new": str(a)}, temps=(0.0, 0.7)) != base  # a sampled temperature measured
    assert key(target, {"new": str(a)}, EngineConfig(extra_args=["--x"])) != base  # the launch's arguments
    assert key(target, {"new": str(a)}, EngineConfig(max_model_len=512)) != base
    assert key(target, {"other": str(a)}) != base  # the variant's name (expected ids are per name)
    monkeypatch.setenv("VLLM_SOMETHING", "1")
    assert key(target, {"new": str(a)}) != base  # a VLLM_* variable of this process
    monkeypatch.delenv("VLLM_SOMETHING")
    assert key(target, {"new": str(a)}) == base
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 5}))
    assert key(target, {"new": str(a)}) != base  # the target's config


def test_kept_findings_name_the_paths_of_the_run_that_reads_them(tmp_path, target):
    a, b = drafter(tmp_path / "a"), drafter(tmp_path / "b")
    found = [Finding("dimensions[new]", "ok", f"{a}/config.json fits {target}/config.json")]
    assert cache.store(tmp_path / "c", "k", found, str(target), {"new": str(a)}, "then")
    assert str(a) not in (tmp_path / "c" / "k.json").read_text()
    got, computed = cache.load(tmp_path / "c", "k", str(target), {"new": str(b)})
    assert computed == "then" and got == [
        Finding("dimensions[new]", "ok", f"{b}/config.json fits {target}/config.json")
    ]


def test_findings_with_an_error_are_not_kept(tmp_path, target):
    bad = [Finding("engine", "ok", "vllm"), Finding("aux_layer_ids[new]", "error", "id 9 of 4 layers")]
    assert not cache.store(tmp_path / "c", "k", bad, str(target), {}, "now")
    assert cache.load(tmp_path / "c", "k", str(target), {}) is None


def test_a_second_preflight_reads_the_engine_checks_and_measures_the_disk_again(tmp_path, target, monkeypatch):
    calls = []

    def engine_checks(*args):  # the part that imports the engine, counted
        calls.append(args)
        return [Finding("engine", "ok", f"vllm x, target {args[1]}")]

    monkeypatch.setattr(run, "engine_findings", engine_checks)
    a = drafter(tmp_path / "a")
    kw = dict(expected_aux_layer_ids={"new": [1]}, free_disk_path=str(tmp_path), check_gpu=False, cache=tmp_path / "c")
    first = run.run_preflight(EngineConfig(), str(target), {"new": str(a)}, **kw)
    second = run.run_preflight(EngineConfig(), str(target), {"new": str(a)}, **kw)
    assert len(calls) == 1
    assert [f.check for f in first] == ["engine", "disk"]
    assert [f.check for f in second] == ["preflight_cache", "engine", "disk"] and second[1] == first[0]
    # without a cache directory every preflight checks from scratch
    run.run_preflight(EngineConfig(), str(target), {"new": str(a)}, **{**kw, "cache": None})
    assert len(calls) == 2
    # a target copied elsewhere: the same key, its own path in the messages
    moved = shutil.copytree(target, tmp_path / "moved")
    third = run.run_preflight(EngineConfig(), str(moved), {"new": str(a)}, **kw)
    assert len(calls) == 2 and third[1].message == f"vllm x, target {moved}"
