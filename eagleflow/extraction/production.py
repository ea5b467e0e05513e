"""Hidden states from production itself, while it serves (extract.backend 'production').

Production's engine runs eagleflow's capture plugin (eagleflow.engines.capture_plugin for vLLM, .sglang_capture for
SGLang), switched on by its launch: EAGLEFLOW_CAPTURE_DIR (here extract.capture_dir) and EAGLEFLOW_CAPTURE_LAYERS (the
aux and final layer ids). Each conversation is one `/v1/completions` request to production.url of its token ids with
`max_tokens: 1`, marked as a capture request (`vllm_xargs: {"eagleflow_capture": NAME}`, on SGLang `custom_params`)
and salted (`cache_salt: NAME`: production's prefix cache must not serve it, every position is computed); the plugin
writes the request's states, [T, n_layers, H],
to `<capture_dir>/NAME.safetensors` under the lock the `vllm` backend's reader waits on, so the rest is that
backend's: the states checked against the ids sent, into the shard in plan order, the file deleted.

Production keeps serving everyone else: at most extract.concurrency capture requests are in flight beside its own
traffic, each a prefill and one token. No production window, no engine of our own, no load.
"""

from __future__ import annotations

import itertools
import logging
import os
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import httpx

from eagleflow.config import RunConfig
from eagleflow.contracts.request import StageError
from eagleflow.engines.capture_plugin import DIR_ENV, LAYERS_ENV, LAYERS_META, XARG, capture_file
from eagleflow.engines.remote import RemoteServer
from eagleflow.engines.sglang import server_info_at, speculative_settings
from eagleflow.extraction.vllm import EngineStates

log = logging.getLogger("eagleflow.extract")


class PluginStates(EngineStates):
    """Capture requests to an engine that runs eagleflow's capture plugin, and the files the plugin writes back:
    production's engine (`ProductionStates`), or an SGLang engine of the stage's own (extract.backend 'sglang')."""

    def __init__(
        self,
        base_url: str,
        cfg: RunConfig,
        capture_dir: str | Path,
        where: str,
        fix: str,
    ) -> None:
        super().__init__(base_url, cfg.target.served_model_name, cfg.engine.request_timeout_s, cfg.extract.concurrency)
        self.where = where
        self.fix = fix  # what to do when the plugin writes nothing: the launch it needs
        self.capture_dir = Path(str(capture_dir))
        self.layers = ",".join(str(i) for i in [*cfg.target.aux_layer_ids, cfg.target.final_layer_id])
        self.run = uuid.uuid4().hex[:12]  # names no other stage's request, on any night
        # where the request names its file: vLLM's vllm_xargs (SamplingParams.extra_args), SGLang's custom_params
        self.mark = "custom_params" if cfg.engine.kind == "sglang" else "vllm_xargs"
        self.count = itertools.count()

    def check_file(self, path: str, metadata: dict[str, str]) -> None:
        """States of the run's layers only: an engine launched with other layers writes states of the same shape
        that would train the drafter on the wrong inputs."""
        wrote = metadata.get(LAYERS_META)
        if wrote != self.layers:
            raise StageError(
                f"{self.where}'s capture plugin wrote layers {wrote} to {path}; this run reads layers {self.layers} "
                f"(target.aux_layer_ids and target.final_layer_id)\n"
                f"{self.where}'s launch sets {LAYERS_ENV}={wrote}: restart it with {LAYERS_ENV}={self.layers}\n"
                "or set target.aux_layer_ids to the layers it captures"
            )

    def request(self, ids: Sequence[int]) -> str:
        name = f"eagleflow-{self.run}-{next(self.count)}"
        body = {
            "model": self.model,
            "prompt": [int(t) for t in ids],
            "max_tokens": 1,
            "temperature": 0.0,
            self.mark: {XARG: name},
            "cache_salt": name,
        }
        r = self.post(body)
        if r.status_code != 200:
            raise StageError(
                f"{self.where} refused a {len(ids)}-token capture request: HTTP {r.status_code} {r.text[:300]}"
            )
        path = capture_file(self.capture_dir, name)
        if not Path(f"{path}.lock").exists():
            raise StageError(
                f"{self.where} answered a capture request but its capture plugin wrote nothing to {self.capture_dir}\n"
                f"{self.fix}"
            )
        return str(path)


class ProductionStates(PluginStates):
    """Capture requests to production, and the files its plugin writes back."""

    def __init__(self, cfg: RunConfig) -> None:
        remote = RemoteServer(cfg)
        layers = ",".join(str(i) for i in [*cfg.target.aux_layer_ids, cfg.target.final_layer_id])
        super().__init__(
            remote.base_url,
            cfg,
            str(cfg.extract.capture_dir),
            where="production",
            fix=f"production's engine must run eagleflow's capture plugin: launch it with "
            f"{DIR_ENV}={cfg.extract.capture_dir} and {LAYERS_ENV}={layers} (docs/production.md, Capture from "
            f"production)\nor set extract.backend to {cfg.engine.kind!r} (a capture engine of our own, in a production "
            "window)",
        )
        if remote.api_key:
            self.client.headers["Authorization"] = f"Bearer {remote.api_key}"
        self.remote = remote
        self.wait_s = cfg.generate.server_wait_s
        self.own_backend = cfg.engine.kind  # the backend of a capture engine of our own: 'vllm' or 'sglang'

    def before_retry(self) -> None:
        self.remote.wait_answering(self.wait_s)  # a restart of production: ask again once it answers


def fits_production(states: ProductionStates, max_seq_len: int, reserved: int = 0) -> None:
    """A conversation of extract.max_seq_len tokens and the one token it asks for must fit production's context
    (its /v1/models says how long; a server that does not say is taken at its word when a request is refused), with
    `reserved` tokens more a request: SGLang serving EAGLE keeps room for a step's drafts in every request
    (tokenizer_manager.py: max(topk x steps, draft tokens), k + 1 at topk 1) and refuses one that leaves none."""
    try:
        r = states.client.get("/v1/models")
        cards = [m for m in r.json().get("data") or [] if m.get("id") == states.model] if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError, AttributeError):
        cards = []
    longest = cards[0].get("max_model_len") if cards else None
    if longest is not None and max_seq_len + 1 + reserved > int(longest):
        held = f" and the {reserved} tokens SGLang keeps for a step's drafts" if reserved else ""
        raise StageError(
            f"extract.max_seq_len {max_seq_len} and the one token a capture request asks for{held} do not fit "
            f"production's context of {longest} tokens ({states.remote.base_url}/v1/models)\n"
            f"set extract.max_seq_len to {int(longest) - 1 - reserved} or less (longer conversations are cut there)\n"
            f"or set extract.backend to {states.own_backend!r} (an engine of our own, launched for the run's "
            "max_seq_len)"
        )


def drafts_reserved(cfg: RunConfig, base_url: str, api_key: str | None) -> int:
    """The tokens production keeps in each request for a step's drafts: none on vLLM; on SGLang as its /server_info
    says (speculative_settings), else k + 1 at the benchmark's k (benchmark.num_speculative_tokens, topk 1)."""
    if cfg.engine.kind != "sglang":
        return 0
    info = server_info_at(base_url, api_key)
    return speculative_settings(info)[1] if info else cfg.benchmark.num_speculative_tokens + 1


def open_production(cfg: RunConfig, stack: ExitStack, wait_s: float | None = None) -> ProductionStates:
    """The `production` backend opened (eagleflow.extraction.backends): production answering (waited for up to
    `wait_s`, generate.server_wait_s by default), its capture directory there; the client closed with `stack`."""
    states = ProductionStates(cfg)
    stack.callback(states.close)
    log.info(
        "states from production at %s while it serves (%d capture requests in flight at most); production is not "
        "stopped",
        states.remote.base_url,
        cfg.extract.concurrency,
    )
    states.remote.wait_answering(cfg.generate.server_wait_s if wait_s is None else wait_s)
    reserved = drafts_reserved(cfg, states.remote.base_url, states.remote.api_key)
    fits_production(states, cfg.extract.max_seq_len, reserved)
    if not os.path.isdir(states.capture_dir):
        raise StageError(
            f"extract.capture_dir {states.capture_dir} does not exist on this host: production's capture plugin "
            f"creates it at production's start when launched with {DIR_ENV}={states.capture_dir}\n"
            "start production with eagleflow's capture plugin on (docs/production.md, Capture from production), "
            f"or set extract.backend to {states.own_backend!r}"
        )
    return states


PROBE_WAIT_S = 30.0  # production should be serving when the night starts; a restart under way gets this long


def capture_problem(cfg: RunConfig, ids: Sequence[int]) -> str | None:
    """Whether production captures now, asked before the night's work (the check stage): one capture request of
    `ids` must come back as a file of the run's layers. None when it does; else what stands in the
    way, why, and what to do, in three lines."""
    with ExitStack() as stack:
        try:
            states = open_production(cfg, stack, wait_s=PROBE_WAIT_S)
            got = states.collect(states.request(ids), ids)  # [T, n_layers, H]
        except (StageError, httpx.HTTPError) as exc:
            return str(exc)
    log.info("production captures: %d tokens of layers %s, hidden size %d", got.shape[0], states.layers, got.shape[2])
    return None
