"""The flows' parameter models (flows.params): each typed field of the UI's form is one run config key,
a field left empty keeps the config's value, and a typed field wins over the same dotted override."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from eagleflow.config import ConfigError, given_on_command_line
from flows.params import FIELD_KEYS, BenchmarkParams, RetrainParams, RunParams, from_command_line
from tests.conftest import ROOT

DEMO = str(ROOT / "configs" / "demo.yaml")


def _value(config, dotted: str):
    node = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def test_every_typed_field_is_a_key_of_the_run_config():
    for field, dotted in FIELD_KEYS.items():
        assert field in RunParams.model_fields or field in BenchmarkParams.model_fields, field
        _value(RunParams(config_path=DEMO).load(), dotted)  # raises AttributeError for a key that is not there
    for cls in (RunParams, BenchmarkParams, RetrainParams):
        assert set(cls.typed) <= set(FIELD_KEYS) and set(cls.typed) <= set(cls.model_fields), cls
        names = list(cls.model_fields)
        assert names[0] == "config_path" and names.index("overrides") > max(names.index(f) for f in cls.typed), names
        assert all(cls.model_fields[f].description for f in names), cls


def test_empty_fields_keep_the_config_and_set_ones_reach_it():
    plain = RunParams(config_path=DEMO).load()
    assert RunParams(config_path=DEMO).config_overrides() == {}
    changed = RunParams(
        config_path=DEMO,
        epochs=2,
        num_samples=400,
        temperatures=[0.0, 1.0],
        overrides={"train.epochs": 9, "benchmark.max_tokens": 16},
    ).load()
    assert (changed.train.epochs, changed.generate.num_samples, changed.benchmark.temperatures) == (2, 400, [0.0, 1.0])
    assert changed.benchmark.max_tokens == 16 and plain.train.epochs != 2
    b = BenchmarkParams(config_path=DEMO, drafter="/srv/drafter").config_overrides()
    assert b == {"benchmark.drafter": "/srv/drafter"}


def test_a_bad_value_names_the_field():
    with pytest.raises(ConfigError, match="temperatures"):
        RunParams(config_path=DEMO, temperatures=[0.0, 5.0]).load()


def test_a_path_on_a_command_line_is_relative_to_the_shell_and_must_exist(tmp_path, monkeypatch):
    # issue 43: `--drafter runs/demo/export/...` typed in the checkout was read against configs/ (the config's dir)
    drafter = tmp_path / "runs" / "export" / "vllm"
    drafter.mkdir(parents=True)
    params, config = from_command_line(BenchmarkParams, DEMO, {"drafter": "runs/export/vllm"}, {}, cwd=str(tmp_path))
    assert params.drafter == str(drafter) and config.benchmark.drafter == str(drafter)
    # a --set path too; a path in the config file stays relative to the file
    _, config = from_command_line(
        BenchmarkParams, DEMO, {}, {"benchmark.current_drafter": "runs/export/vllm"}, cwd=str(tmp_path)
    )
    assert config.benchmark.current_drafter == str(drafter)
    assert config.target.model_path == str(ROOT / "demo" / "target")
    # before any run: a drafter that is not there is bad input, by key and path
    with pytest.raises(ConfigError, match=r"benchmark.drafter \S+/nowhere does not exist on host localhost"):
        from_command_line(BenchmarkParams, DEMO, {"drafter": "nowhere"}, {}, cwd=str(tmp_path))


def test_a_relative_path_is_refused_in_the_form_and_for_an_ssh_host(tmp_path):
    with pytest.raises(ValidationError, match="drafter 'runs/x' is relative"):
        BenchmarkParams(config_path=DEMO, drafter="runs/x")
    ssh = tmp_path / "ssh.yaml"
    data = yaml.safe_load(Path(DEMO).read_text())
    data["host"] = {"kind": "ssh", "name": "gpu1", "address": "10.0.0.1", "work_root": "/srv/runs"}
    ssh.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="benchmark.drafter 'runs/x' is relative, and host 'gpu1' is reached over"):
        given_on_command_line(ssh, {"benchmark.drafter": "runs/x"}, tmp_path)
