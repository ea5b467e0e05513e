"""Hidden states from an SGLang engine of the stage's own (extract.backend 'sglang'): the `vllm` backend's
counterpart for a team that serves with SGLang.

The target is served by SGLang as production serves it (engine.*), with eagleflow's SGLang capture plugin switched
on (eagleflow.engines.sglang_capture: EAGLEFLOW_CAPTURE_DIR a spool directory of the stage's, EAGLEFLOW_CAPTURE_LAYERS
the aux and final layer ids). The requests, files and checks are production capture's (`PluginStates`): each
conversation one prefill-only `/v1/completions` request marked in `custom_params` and salted against the prefix
cache; the plugin writes its states [T, n_layers, H] under the lock the reader waits on.

The plugin takes the final layer's state at its norm's call, which a replayed prefill CUDA graph does not make, so
the engine runs prefill without CUDA graphs (`--disable-prefill-cuda-graph`; decode graphs stay, and a capture
request decodes one token). The plugin reaches SGLang through its entry point (`sglang.srt.plugins`), which
installing eagleflow in the host environment declares; a host environment with eagleflow only on its path gets a
declaration of its own in the stage directory.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from eagleflow.config import RunConfig
from eagleflow.engines import make_server
from eagleflow.engines.capture_plugin import DIR_ENV, LAYERS_ENV
from eagleflow.extraction.production import PluginStates
from eagleflow.extraction.vllm import capture_launch, capture_spool

log = logging.getLogger("eagleflow.extract")

PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "eagleflow_capture"
PLUGIN_TARGET = "eagleflow.engines.sglang_capture:register"
NO_PREFILL_GRAPH = "--disable-prefill-cuda-graph"


def plugin_declared() -> bool:
    """Whether this interpreter's installed distributions declare eagleflow's SGLang plugin (eagleflow installed
    here: pyproject.toml's entry point)."""
    return any(ep.name == PLUGIN_NAME for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP))


def plugin_path(stage_dir: Path) -> dict[str, str]:
    """The engine's PYTHONPATH with a declaration of the plugin in front, where no installed eagleflow declares it:
    a dist-info SGLang's plugin loader finds like an installed one's. Empty where eagleflow is installed (a second
    declaration would register the hooks twice)."""
    if plugin_declared():
        return {}
    site = stage_dir / "sglang-plugin"
    info = site / "eagleflow_sglang_capture-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: eagleflow-sglang-capture\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\n{PLUGIN_NAME} = {PLUGIN_TARGET}\n")
    here = str(Path(__file__).resolve().parents[2])  # the checkout eagleflow runs from: the plugin's own code
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), here, os.environ.get("PYTHONPATH", "")) if p)}


# Production's flags that would turn the plugin off in an engine of ours (eagleflow.engines.sglang_capture), with how
# many values each takes: data-parallel attention and its DP size (each DP rank holds its own requests' states), and
# prefill-graph settings that win over --disable-prefill-cuda-graph. A capture engine only prefills: TP attention
# and SGLang's default decode graphs serve it.
NOT_FOR_CAPTURE = {
    "--enable-dp-attention": 0,
    "--dp-size": 1,
    "--data-parallel-size": 1,
    "--cuda-graph-backend-prefill": 1,
    "--cuda-graph-config": 1,
}


def capture_args(extra_args: list[str], enforce_eager: bool) -> list[str]:
    """engine.extra_args without the flags that turn the plugin off (NOT_FOR_CAPTURE, `--flag value` or
    `--flag=value`), with prefill out of CUDA graphs, as the plugin needs (eager engines have no graphs)."""
    kept: list[str] = []
    skip = 0
    for arg in extra_args:
        if skip:
            skip -= 1
        elif arg.split("=", 1)[0] in NOT_FOR_CAPTURE:
            skip = 0 if "=" in arg else NOT_FOR_CAPTURE[arg]
        else:
            kept.append(arg)
    if enforce_eager or NO_PREFILL_GRAPH in kept:
        return kept
    return [*kept, NO_PREFILL_GRAPH]


@contextmanager
def serving_for_sglang_capture(
    cfg: RunConfig, stage_dir: Path, hidden_size: int, env: dict[str, str] | None = None, name: str = "target-capture"
) -> Iterator[PluginStates]:
    """The target served by SGLang with the capture plugin on; its spool directory removed on the way out, and at
    the start when an earlier attempt was killed before it could."""
    layers = [*cfg.target.aux_layer_ids, cfg.target.final_layer_id]
    spec = capture_launch(cfg)
    spec.engine = spec.engine.model_copy(
        update={"extra_args": capture_args(list(spec.engine.extra_args), spec.engine.enforce_eager)}
    )
    log_path = stage_dir / "engine.log"
    with capture_spool(cfg, stage_dir, hidden_size) as spool:
        engine_env = {
            **(env or {}),
            DIR_ENV: str(spool),
            LAYERS_ENV: ",".join(str(i) for i in layers),
            **plugin_path(stage_dir),
        }
        with make_server(spec, log_path, env=engine_env, name=name) as server:
            yield PluginStates(
                server.base_url,
                cfg,
                spool,
                where="the SGLang engine",
                fix=f"its log ({log_path}) says whether eagleflow_capture loaded: it needs SGLang's plugin entry "
                f"point ({PLUGIN_GROUP}) and prefill without CUDA graphs ({NO_PREFILL_GRAPH})\n"
                "or set extract.backend to 'hf'",
            )


def open_sglang(cfg: RunConfig, stage_dir: Path, stack: ExitStack, hidden_size: int) -> PluginStates:
    """The `sglang` backend opened (eagleflow.extraction.backends): the target served by SGLang with the capture
    plugin on, until `stack` closes."""
    engine = stack.enter_context(serving_for_sglang_capture(cfg, stage_dir, hidden_size))
    stack.callback(engine.close)
    log.info("states from an SGLang engine of ours with eagleflow's capture plugin (%s)", engine.layers)
    return engine
