"""SGLang: the launch command (EAGLE3 flags), /health, and acceptance from its own reports.

SGLang is not installed on the CPU machines this project is tested on, so this adapter is covered
by tests of its command line and of its parsers on outputs read from SGLang 0.5.15's source, not by a
live server. What it relies on (0.5.15):
- `python -m sglang.launch_server` with `--speculative-algorithm EAGLE3`,
  `--speculative-draft-model-path`, `--speculative-num-steps k`, `--speculative-eagle-topk 1` and
  `--speculative-num-draft-tokens k+1` (a chain of k drafts, as vLLM's EAGLE-3 drafts), and
  `--max-running-requests`: with speculation on SGLang caps it at 48 unless told, so the benchmark's
  concurrencies above that would queue, and no speculation would batch otherwise than the drafter;
- `/metrics` (with `--enable-metrics`): per finished request `sglang:generation_tokens_total`,
  `sglang:num_requests_total` and `sglang:spec_verify_calls_total`; the window's acceptance length is
  (generated tokens - requests) / verify steps, each request's first token coming from its prefill, not a
  verify step; and the latency histograms `sglang:time_to_first_token_seconds`, ... named as vLLM's (no
  time-per-output-token one: that latency stays empty);
- else the scheduler's decode log lines "Decode batch, ... accept len: 3.12, ..." (one per 40 decode
  steps on the first rank, each that interval's own ratio), averaged over the window;
- else `/server_info` (`/get_server_info` is its deprecated alias): `internal_states[0].avg_spec_accept_length`,
  absent until one log interval has passed.
Sampled drafts (benchmark.draft_sample_method 'probabilistic') are `--speculative-use-rejection-sampling`: the
drafter's temperature-scaled probabilities in the acceptance test, which 0.5.15 allows only for a drafter over the
target's whole vocabulary (`rejection_sampling_problem`); without it SGLang tests the drafter's argmax as a point
mass, exactly at any temperature and top_p: vLLM's greedy drafts.
The counters carry no per-position acceptance; each whole answer's meta_info does (`return_meta_info`: its
verify steps, accepted drafts and `spec_correct_drafts_histogram`), and the benchmark's answers are whole, so a
window's acceptance, per round and per position, comes from its answers (`acceptance_from_answers`); the counters
and the log lines are what is left where no answer carries them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from eagleflow.contracts.request import StageError
from eagleflow.engines.base import EngineServer
from eagleflow.engines.chat import ChatResult
from eagleflow.engines.launch import LaunchSpec
from eagleflow.engines.metrics import parse_metrics
from eagleflow.util import http

_ACCEPT_LEN = re.compile(r"accept len: ([\d.]+)")
# Requests one engine holds at once: vLLM's own default (max_num_seqs), so both engines batch alike; SGLang would
# take 48 with speculation on and more without, and the baseline and the drafter would batch differently.
MAX_RUNNING_REQUESTS = 256
# engine.reasoning_parser names vLLM's parsers; SGLang 0.5.15 spells some of the same parsers otherwise
# (parser/reasoning_parser.py: ReasoningParser.DetectorMap) and its launch refuses a name it does not know.
REASONING_PARSERS = {"deepseek_r1": "deepseek-r1", "deepseek_v3": "deepseek-v3", "openai_gptoss": "gpt-oss"}
# and the tool-call parsers (function_call/function_call_parser.py); Kimi's kimi_k2 is the same on both
TOOL_CALL_PARSERS = {"deepseek_v3": "deepseekv3", "deepseek_v31": "deepseekv31", "llama3_json": "llama3"}


GRPC_OFFSET = 10000  # SGLang's default gRPC port: --port + 10000 (server_args.py)


def grpc_port_env(port: int, env: dict[str, str] | None, named: dict[str, str] | None = None) -> dict[str, str] | None:
    """`env` with SGLANG_GRPC_PORT named where SGLang's default would not be a port. SGLang checks its gRPC port at
    every start, gRPC served or not, and its default (--port + 10000) stops a launch on any port above 55535: the
    free port a benchmark engine is given is often one (seen on a GPU host: 56733). Where neither the caller nor the
    environment names one (`named`: engine.env too), --port - 10000 (a port, and not --port)."""
    given = {**(named or {}), **(env or {}), **os.environ}
    if port + GRPC_OFFSET <= 65535 or "SGLANG_GRPC_PORT" in given:
        return env
    return {**(env or {}), "SGLANG_GRPC_PORT": str(port - GRPC_OFFSET)}


class SglangServer(EngineServer):
    metric_prefix = "sglang:"  # its Prometheus histograms, exported with --enable-metrics
    # Each whole (not streamed) answer then carries its verify steps, accepted drafts and their histogram: the
    # per-position acceptance SGLang's counters do not have (serving_chat.py: choices[i].meta_info)
    request_extra = {"return_meta_info": True}

    def __init__(self, spec: LaunchSpec, log_path: Path, env: dict[str, str] | None = None, name: str | None = None):
        named = {**spec.engine.env, **(env or {})}  # engine.env and the caller's: either may name a gRPC port
        super().__init__(spec, log_path, env=grpc_port_env(spec.port, env, named), name=name)

    @classmethod
    def argv_for(cls, spec: LaunchSpec) -> list[str]:
        if spec.capture:
            raise ValueError(
                "SGLang has no hidden-states capture in an engine of ours here; use extract.backend 'production' "
                "(eagleflow's SGLang capture plugin in production's server) or 'hf'"
            )
        e = spec.engine
        argv = [
            spec.python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            spec.model,
            "--served-model-name",
            spec.served_model_name,
            "--host",
            e.host,
            "--port",
            str(spec.port),
            "--dtype",
            spec.dtype,
            "--context-length",
            str(e.max_model_len),
            "--tp-size",
            str(e.tensor_parallel_size),
            "--enable-metrics",
            "--max-running-requests",
            str(MAX_RUNNING_REQUESTS),
        ]
        if e.enforce_eager:  # 0.5.15's names; its --disable-cuda-graph is a deprecated alias of both
            argv += ["--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"]
        if e.trust_remote_code:
            argv.append("--trust-remote-code")
        if e.gpu_memory_utilization is not None:
            argv += ["--mem-fraction-static", str(e.gpu_memory_utilization)]
        if e.kv_cache_gib is not None:
            raise ValueError(
                "engine.kv_cache_gib is vLLM's --kv-cache-memory-bytes; SGLang sizes its KV cache by "
                "--mem-fraction-static (engine.gpu_memory_utilization) or --max-total-tokens (engine.extra_args): "
                "unset engine.kv_cache_gib"
            )
        if e.reasoning_parser:
            argv += ["--reasoning-parser", REASONING_PARSERS.get(e.reasoning_parser, e.reasoning_parser)]
        if e.tool_call_parser:
            argv += ["--tool-call-parser", TOOL_CALL_PARSERS.get(e.tool_call_parser, e.tool_call_parser)]
        if spec.speculative:
            s = spec.speculative
            if s.get("method") != "eagle3":
                raise ValueError(f"SGLang adapter: only method 'eagle3' is supported, got {s.get('method')!r}")
            k = int(s["num_speculative_tokens"])
            if s.get("draft_sample_method") == "probabilistic":
                # the drafter's probabilities in the acceptance test (min(1, p/q)); SGLang's default tests the
                # drafter's argmax as a point mass, what vLLM calls greedy drafts
                argv.append("--speculative-use-rejection-sampling")
                problem = rejection_sampling_problem(spec.model, str(s["model"]))
                if problem:
                    raise ValueError(problem)
            argv += [
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                str(s["model"]),
                "--speculative-num-steps",
                str(k),
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                str(k + 1),
            ]
            if s.get("attention_backend"):  # benchmark.draft_attention_backend, in SGLang's names (triton, fa3, ...)
                argv += ["--speculative-draft-attention-backend", str(s["attention_backend"])]
        return argv + list(e.extra_args)

    def server_info(self) -> dict[str, Any]:
        info = server_info_at(self.base_url, None, timeout_s=10.0)
        if info is None:
            raise StageError(f"SGLang at {self.base_url} answers neither /get_server_info nor /server_info")
        return info

    def snapshot(self) -> dict[str, float]:
        # The log offset marks the window; the server's own average is the fallback.
        info = self.server_info()
        states = info.get("internal_states") or [{}]
        avg = states[0].get("avg_spec_accept_length")
        return {
            **parse_metrics(http.get(f"{self.base_url}/metrics", timeout=10.0).text),
            "log_offset": float(self.log_path.stat().st_size),
            "avg_spec_accept_length": float(avg) if avg is not None else float("nan"),
        }

    def answers_acceptance(self, results: list[ChatResult], k: int) -> dict[str, Any] | None:
        return acceptance_from_answers([r.raw for r in results], k)

    def acceptance(self, before: dict[str, float], after: dict[str, float], k: int) -> dict[str, Any]:
        counted = acceptance_from_counters(before, after, k)
        if counted is not None:
            return counted
        with open(self.log_path, "rb") as f:
            f.seek(int(before["log_offset"]))
            window = f.read(int(after["log_offset"] - before["log_offset"])).decode("utf-8", errors="replace")
        return acceptance_from_log(window, after.get("avg_spec_accept_length"), k)


def rejection_sampling_problem(target_dir: str, drafter_dir: str) -> str | None:
    """Why SGLang 0.5.15 would refuse to start with `--speculative-use-rejection-sampling` for this drafter, or None.
    It needs the drafter's vocabulary to be the target's (eagle_worker_v2.py: "requires the draft and target to share
    one vocab"); eagleflow's drafters draft over train.draft_vocab_size tokens."""
    from eagleflow.engines.preflight.configs import text_config  # at launch only: not the preflight package at import

    try:
        target = json.loads((Path(target_dir) / "config.json").read_text())
        drafter = json.loads((Path(drafter_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # the preflight says what is wrong with the files
    vocab = text_config(target).get("vocab_size")
    draft_vocab = drafter.get("draft_vocab_size") or drafter.get("vocab_size")
    if vocab and draft_vocab and int(draft_vocab) != int(vocab):
        return (
            f"{drafter_dir}/config.json: draft_vocab_size {draft_vocab} is not the target's vocab_size {vocab}, and "
            "SGLang tests sampled drafts against their probabilities (benchmark.draft_sample_method 'probabilistic', "
            "--speculative-use-rejection-sampling) only for a drafter over the whole vocabulary. Fix: train with "
            f"train.draft_vocab_size: {vocab}, or set benchmark.draft_sample_method to 'greedy' (SGLang's default: "
            "the drafter's argmax tested as a point mass)"
        )
    return None


def acceptance_from_counters(before: dict[str, float], after: dict[str, float], k: int) -> dict[str, Any] | None:
    """The window's acceptance length from SGLang's per-request counters (parse_metrics' names, `_total` dropped):
    the tokens the window's finished requests generated, less each one's first (its prefill's), over their verify
    steps; each step yields its accepted drafts and one token of the target's. None when no request verified."""

    def delta(name: str) -> float:
        return after.get(f"sglang:{name}", 0.0) - before.get(f"sglang:{name}", 0.0)

    verify = delta("spec_verify_calls")
    if verify <= 0:
        return None
    al = (delta("generation_tokens") - delta("num_requests")) / verify
    return {
        "mean_acceptance_length": al,
        "acceptance_rate": (al - 1.0) / k,
        "num_drafts": verify,  # drafting steps: one verify each
        "num_accepted_tokens": (al - 1.0) * verify,
        "per_position_acceptance": None,
        "source": f"sglang:generation_tokens, num_requests and spec_verify_calls over the window ({verify:.0f} steps)",
    }


def server_info_at(base_url: str, api_key: str | None, timeout_s: float = 30.0) -> dict[str, Any] | None:
    """An SGLang server's /server_info (its ServerArgs, its schedulers' states), or None where it answers none (not
    SGLang, or a proxy in front); a server that cannot be reached raises (httpx), as its /metrics would."""
    for path in ("/server_info", "/get_server_info"):
        r = http.get(f"{base_url.rstrip('/')}{path}", headers=http.bearer(api_key), timeout=timeout_s)
        if r.status_code == 200:
            try:
                return r.json()
            except ValueError:
                return None
    return None


def speculative_settings(info: dict[str, Any]) -> tuple[int, int]:
    """(k, reserved) of an SGLang server from its /server_info (its ServerArgs at the top level): the drafts a step
    (speculative_num_steps; eagleflow serves topk 1) and the tokens each request keeps for them
    (tokenizer_manager.py: max(topk x steps, draft tokens)); (0, 0) where it does not decode speculatively."""
    if not info.get("speculative_algorithm"):
        return 0, 0
    steps = int(info.get("speculative_num_steps") or 0)
    topk = int(info.get("speculative_eagle_topk") or 1)
    return steps, max(topk * steps, int(info.get("speculative_num_draft_tokens") or 0))


def drafts_per_step(bodies: list[dict[str, Any]]) -> int:
    """The most drafts any step of these answers accepted (SGLang's histograms count the steps that accepted 0, 1,
    ... drafts, and grow only as far as the most accepted): a lower bound of the drafts a step, k. 0 where no answer
    carries a histogram (no drafter)."""
    k = 0
    for body in bodies:
        try:
            hist = body["choices"][0].get("meta_info", {}).get("spec_correct_drafts_histogram") or []
        except (KeyError, IndexError, TypeError, AttributeError):
            continue
        k = max(k, len(hist) - 1)
    return k


def acceptance_from_answers(bodies: list[dict[str, Any]], k: int) -> dict[str, Any] | None:
    """Acceptance over whole answers from each one's own meta_info (requested with return_meta_info): its verify
    steps (`spec_verify_ct`), accepted drafts (`spec_num_correct_drafts`) and how many steps accepted 0..k drafts
    (`spec_correct_drafts_histogram`). Position i (1-based) is accepted in a step that accepted at least i drafts,
    so its rate is the histogram's tail from i over the steps: vLLM's accepted-at-position / drafts. None when no
    answer carries them (no drafter, or an SGLang that does not report them)."""
    steps = accepted = 0
    hist = [0] * (k + 1)
    for body in bodies:
        try:
            meta = body["choices"][0].get("meta_info") or {}
        except (KeyError, IndexError, TypeError, AttributeError):
            continue
        if not meta.get("spec_verify_ct"):
            continue
        steps += int(meta["spec_verify_ct"])
        accepted += int(meta.get("spec_num_correct_drafts") or 0)
        for j, n in enumerate(meta.get("spec_correct_drafts_histogram") or []):
            hist[min(j, k)] += int(n)
    if steps == 0:
        return None
    counted = sum(hist)
    return {
        "mean_acceptance_length": 1.0 + accepted / steps,
        "acceptance_rate": accepted / (steps * k) if k else 0.0,
        "num_drafts": float(steps),
        "num_accepted_tokens": float(accepted),
        # the histogram counts the same steps as spec_verify_ct; without it, no per-position figure
        "per_position_acceptance": [sum(hist[i:]) / counted for i in range(1, k + 1)] if counted else None,
        "source": f"each answer's meta_info ({steps} verify steps)",
    }


def acceptance_from_log(window_text: str, fallback_avg: float | None, k: int) -> dict[str, Any]:
    """Mean acceptance length over the window's decode log lines (SGLang counts the bonus token,
    as vLLM's 1 + accepted/drafts does); acceptance rate = (AL - 1) / k."""
    values = [float(m.group(1)) for m in _ACCEPT_LEN.finditer(window_text)]
    if values:
        al, source = sum(values) / len(values), f"mean of {len(values)} decode log lines"
    elif fallback_avg is not None and fallback_avg == fallback_avg:  # not NaN
        al, source = float(fallback_avg), "server_info avg_spec_accept_length"
    else:
        raise StageError(
            "SGLang reported no acceptance during the benchmark (no 'accept len' decode line, no "
            "avg_spec_accept_length): the drafter was not used; check the engine log for the EAGLE3 flags"
        )
    return {
        "mean_acceptance_length": al,
        "acceptance_rate": (al - 1.0) / k,
        "per_position_acceptance": None,
        "source": source,
    }
