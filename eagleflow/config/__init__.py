"""One typed config for a run. A bad config fails here, before any work starts, naming the field.

Paths under `target`, `generate` and `host` are paths *on the host*. For a local host, relative
paths are resolved against the directory of the config file, so `configs/demo.yaml` works from any
working directory.

The reference of every setting a run has: one section a class, every field with its description, in modules
named after what they configure (host: host, target, engine; data: generate, extract, nightly; measure: export,
benchmark, triage; production; schedule), all importable from here. The drafter's own settings are apart, in
eagleflow.config.train, because the trainer reads them without the rest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from eagleflow.config.base import ConfigError, _Strict
from eagleflow.config.data import ExtractConfig, GenerateConfig, NightlyConfig
from eagleflow.config.host import EngineConfig, HostConfig, TargetConfig, TrainNodesConfig
from eagleflow.config.measure import BenchmarkConfig, ExportConfig, TriageConfig, TriageProbe
from eagleflow.config.production import ProductionConfig
from eagleflow.config.schedule import ScheduleConfig
from eagleflow.config.train import TrainConfig

__all__ = [
    "BenchmarkConfig",
    "ConfigError",
    "EngineConfig",
    "ExportConfig",
    "ExtractConfig",
    "GenerateConfig",
    "HostConfig",
    "NightlyConfig",
    "ProductionConfig",
    "RunConfig",
    "ScheduleConfig",
    "TargetConfig",
    "TrainConfig",
    "TrainNodesConfig",
    "TriageConfig",
    "TriageProbe",
    "load_config",
    "parse_config",
    "parse_overrides",
]


class RunConfig(_Strict):
    """Everything one pipeline run needs."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="Run name (letters, digits, . _ -).")
    host: HostConfig
    target: TargetConfig
    engine: EngineConfig = Field(default_factory=EngineConfig)
    generate: GenerateConfig
    extract: ExtractConfig = Field(default_factory=ExtractConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    train_nodes: TrainNodesConfig = Field(
        default_factory=TrainNodesConfig, description="Training across several hosts: the other nodes (default: none)."
    )
    export: ExportConfig = Field(default_factory=ExportConfig)
    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig)
    production: ProductionConfig = Field(default_factory=ProductionConfig)
    nightly: NightlyConfig = Field(default_factory=NightlyConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="When the nightly deployment runs.")
    report_dir: str = Field(
        "reports", description="Where the control side writes report.json (relative: to the config file)."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return v.strip()

    @model_validator(mode="after")
    def _cross(self) -> RunConfig:
        if self.benchmark.num_prompts > self.generate.holdout:
            raise ValueError(
                f"benchmark.num_prompts ({self.benchmark.num_prompts}) exceeds generate.holdout "
                f"({self.generate.holdout}): the benchmark only uses held-out prompts; raise holdout or lower "
                f"num_prompts"
            )
        if self.train.max_seq_len > self.extract.max_seq_len:
            raise ValueError(
                f"train.max_seq_len ({self.train.max_seq_len}) exceeds extract.max_seq_len ({self.extract.max_seq_len})"
            )
        if self.generate.server == "production" and not (self.production.url or self.production.replicas):
            raise ValueError(
                "generate.server is 'production' but neither production.url nor production.replicas is set: give the "
                "base URL of production's OpenAI-compatible API, e.g. http://127.0.0.1:8000, or its replicas' URLs"
            )
        if self.benchmark.drafter_on == "production" and not self.production.url:
            raise ValueError(
                "benchmark.drafter_on 'production' needs production.url: the drafter is measured through "
                "production's endpoint (vLLM's /metrics counters, SGLang's answers)"
            )
        self._train_nodes()
        self._follow_traffic()
        self._sglang_layout()
        self._sglang_production()
        self._sglang_draft_backend()
        if self.engine.kind == "sglang" and self.extract.backend == "vllm":
            raise ValueError(
                "extract.backend is 'vllm' but engine.kind is 'sglang': the vllm backend is vLLM's own capture in an "
                "engine of ours; with SGLang set extract.backend to 'sglang' (an SGLang engine of ours with "
                "eagleflow's capture plugin), 'production' (the plugin in production's server) or 'hf'"
            )
        if self.engine.kind == "vllm" and self.extract.backend == "sglang":
            raise ValueError(
                "extract.backend is 'sglang' but engine.kind is 'vllm': the sglang backend serves the target with "
                "SGLang; with vLLM set extract.backend to 'vllm' (its own capture), 'production' or 'hf'"
            )
        if self.extract.backend == "production" and self.extract.fallback == {"sglang": "vllm", "vllm": "sglang"}.get(
            self.engine.kind
        ):
            raise ValueError(
                f"extract.fallback is {self.extract.fallback!r} but engine.kind is {self.engine.kind!r}: the night's "
                f"fallback would launch the other engine; set extract.fallback to {self.engine.kind!r}, 'hf' or 'none'"
            )
        if self.extract.backend == "production" and not (self.production.url and self.extract.capture_dir):
            raise ValueError(
                "extract.backend 'production' needs production.url (where the capture requests go) and "
                "extract.capture_dir (where production's capture plugin writes, its EAGLEFLOW_CAPTURE_DIR); "
                "or set extract.backend to 'vllm' or 'hf'"
            )
        return self

    def _sglang_layout(self) -> None:
        """A drafter SGLang serves as it was trained. SGLang 0.5.15's EAGLE-3 layers carry fc's output un-normed as the
        residual and have no norm over the concatenated target states (an MLA drafter's per-state norms, its fc_norm,
        they have); its loaders drop weights they do not know without a word, so such a drafter would serve with
        wrong drafts. With engine.kind 'sglang' the two fields default to off; set on, they are refused."""
        if self.engine.kind != "sglang":
            return
        t = self.train
        for field in ("norm_before_fc", "norm_before_residual"):
            if field == "norm_before_fc" and t.drafter_arch == "mla":
                continue  # an MLA drafter's norm_before_fc is its per-state fc_norm, which SGLang's MLA layer has
            if not getattr(t, field):
                continue
            if field in t.model_fields_set:
                raise ValueError(
                    f"train.{field} is true but engine.kind is 'sglang': SGLang's EAGLE-3 layer has no such norm and "
                    "drops its weight, so the drafter would serve with wrong drafts. Fix: remove train."
                    f"{field} (it defaults to false with SGLang), or serve with vLLM"
                )
            setattr(t, field, False)

    def _sglang_draft_backend(self) -> None:
        """benchmark.draft_attention_backend reaches SGLang as --speculative-draft-attention-backend, which takes its
        own lower-case names: a vLLM one (TRITON_MLA) would stop the launch after the target's load."""
        backend = self.benchmark.draft_attention_backend
        if self.engine.kind == "sglang" and backend and backend != backend.lower():
            raise ValueError(
                f"benchmark.draft_attention_backend is {backend!r}, a vLLM name, but engine.kind is 'sglang', whose "
                "--speculative-draft-attention-backend takes its own lower-case names (triton, flashinfer, fa3, ...): "
                "set one of those, or unset it and let SGLang choose"
            )

    def _sglang_production(self) -> None:
        """Production served by SGLang is stopped for the window and started again with the night's drafter.
        production.pause 'sleep' is vLLM's sleep mode and production.swap_drafter its swap over CUDA IPC; SGLang
        0.5.15 has a memory release (not wired here) but no way to change a running server's drafter: its
        update_weights_from_disk loads the path it is given into the target and the drafter alike."""
        if self.engine.kind != "sglang" or self.production.pause != "sleep":
            return
        raise ValueError(
            "production.pause is 'sleep' but engine.kind is 'sglang': the sleep and the drafter swap "
            "(production.swap_drafter) are vLLM's, and SGLang cannot change a running server's drafter, so "
            "production restarts with the night's drafter. Fix: production.pause: stop (and no "
            "production.swap_drafter); the plan counts the restart as an engine load"
        )

    def _follow_traffic(self) -> None:
        """With production.traffic, the benchmark measures its cells: temperatures, concurrencies and top_p come from
        it unless given (measured largest share first), temperature 0 besides, where the drafter's offline estimate
        applies (the verdict's acceptance check, its headline setting and the triage read it there); given, they must
        cover it."""
        traffic, b = self.production.traffic, self.benchmark
        if not traffic:
            return
        ordered = sorted(traffic, key=lambda c: -c.share)
        temps = list(dict.fromkeys(c.temperature for c in ordered))
        concs = list(dict.fromkeys(c.concurrency for c in ordered))
        top_p = next((c.top_p for c in ordered if c.temperature > 0), 1.0)
        for name, want, extra in (("temperatures", temps, [0.0]), ("concurrencies", concs, [])):
            if name not in b.model_fields_set:
                setattr(b, name, list(dict.fromkeys(want + extra)))
            elif missing := [x for x in want if x not in getattr(b, name)]:
                raise ValueError(
                    f"benchmark.{name} {getattr(b, name)} leaves out {missing} of production.traffic: add them, or "
                    f"drop benchmark.{name} to measure the traffic's own"
                )
        if "top_p" not in b.model_fields_set:
            b.top_p = top_p
        elif b.top_p != top_p:
            raise ValueError(f"benchmark.top_p {b.top_p} is not production.traffic's {top_p}: drop it or make them one")

    def _train_nodes(self) -> None:
        nodes = self.train_nodes.hosts
        if not nodes:
            return
        if self.host.kind != "ssh" or any(n.kind != "ssh" for n in nodes):
            raise ValueError(
                "train_nodes: training across hosts runs a detached job on each over SSH: host.kind and "
                "every train_nodes.hosts[].kind must be 'ssh'"
            )
        names = [self.host.name] + [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(
                f"train_nodes.hosts: host names {names} must differ from each other and from host.name "
                "(each names a Prefect concurrency limit and a lease)"
            )
        shared = self.host.work_root.rstrip("/")
        for i, n in enumerate(nodes):
            own = n.work_root.rstrip("/")
            if own == shared or own.startswith(shared + "/"):
                raise ValueError(
                    f"train_nodes.hosts[{i}].work_root {n.work_root!r} lies in host.work_root {self.host.work_root!r}: "
                    "a node keeps its jobs' pids and locks under its own work_root, which must not be on the "
                    "filesystem it shares with node 0 (a pid there would name a process of another machine)"
                )


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid run config {source}:"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}")
    return "\n".join(lines)


def parse_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a config dict; raise ConfigError naming every bad field."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


# Every config key that holds a path on the host: relative in a config file, relative to that file (a local host);
# given on a command line, relative to the shell's directory (`given_on_command_line`).
PATH_KEYS: tuple[str, ...] = (
    "host.work_root",
    "host.python",
    "target.model_path",
    "generate.prompts_path",
    "train.warm_start",
    "benchmark.current_drafter",
    "benchmark.drafter",
    "extract.spool_dir",
    "nightly.source",
    "report_dir",
)


def _resolve_local_paths(data: dict[str, Any], base: Path) -> None:
    """Relative host paths of a local host are relative to the config file, not the caller's cwd."""
    for dotted in PATH_KEYS:
        *parents, leaf = dotted.split(".")
        sec: Any = data
        for p in parents:
            sec = sec.get(p) if isinstance(sec, dict) else None
        if isinstance(sec, dict) and isinstance(sec.get(leaf), str) and not Path(sec[leaf]).is_absolute():
            # normpath, not resolve(): a venv's bin/python is a symlink that must stay one.
            sec[leaf] = os.path.normpath(os.path.join(base, sec[leaf]))


def given_on_command_line(config_path: str | Path, overrides: dict[str, Any], cwd: str | Path) -> dict[str, Any]:
    """`overrides` typed on a command line with every relative path made absolute against the shell's directory
    `cwd`: a person means the directory they stand in, not the config file's. On an SSH host a relative path means
    nothing the shell can know: refused, naming the key."""
    paths = {k: v for k, v in overrides.items() if k in PATH_KEYS and isinstance(v, str) and v}
    relative = {k: v for k, v in paths.items() if not Path(v).is_absolute()}
    if not relative:
        return dict(overrides)
    try:
        raw = read_config_data(config_path)
    except ConfigError:
        raw = {}  # load_config names the file's own fault
    host = {**(raw.get("host") or {}), **{k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("host.")}}
    if host.get("kind", "local") != "local":
        key, value = next(iter(relative.items()))
        raise ConfigError(
            f"{key} {value!r} is relative, and host {host.get('name', '?')!r} is reached over SSH: give the path "
            "absolute, as it is on that host"
        )
    return {**overrides, **{k: os.path.normpath(os.path.join(cwd, v)) for k, v in relative.items()}}


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`--set a.b=VALUE` command-line items (VALUE is YAML) as load_config's dotted overrides."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set benchmark.max_tokens=64")
        try:
            overrides[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML: {exc}") from None
    return overrides


def read_config_data(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A run config file's mapping, with the config its `base:` names (a path relative to this file) underneath:
    this file's sections are merged into the base's key by key, a list or a value replaces the base's, and `null`
    takes a key back to its default. One config per engine or host, each saying only how it differs. Relative
    paths are read against the directory of the file loaded, so a base lives beside the configs that extend it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"run config {path} does not exist; pass the path of a YAML file such as configs/demo.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"run config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"run config {path} must be a YAML mapping at the top level")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: base must be the path of the run config this one extends, e.g. kimi-k25.yaml")
    base_path = (path.parent / base).resolve()
    if base_path in _seen or base_path == path.resolve():
        raise ConfigError(f"{path}: base {base!r} leads back to a config it extends: remove the loop")
    return _merged(read_config_data(base_path, (*_seen, path.resolve())), data)


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config (and the one its `base:` extends), apply dotted overrides ({"benchmark.max_tokens":
    64}), validate."""
    path = Path(path)
    data = read_config_data(path)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    host = data.get("host")
    if isinstance(host, dict) and host.get("kind", "local") == "local":
        _resolve_local_paths(data, path.parent.absolute())
    return parse_config(data, str(path))
