"""A production served by SGLang, measured where it serves: the canary (eagleflow.engines.acceptance.measure) and the
night's benchmark on production (eagleflow.engines.remote.ProductionEndpoint). SGLang exports none of vLLM's
speculative counters, and its /metrics only with --enable-metrics; each answer carries its own counts when asked
(`return_meta_info`). The server here answers as SGLang 0.5.15's chat endpoint does (serving_chat.py: meta_info on
each choice; schedule_batch.py: the histogram grows only as far as the most drafts a step accepted), on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from eagleflow.config import load_config
from eagleflow.contracts.request import PRODUCTION_API_KEY_ENV, StageError
from eagleflow.engines import acceptance
from eagleflow.engines.chat import ChatClient
from eagleflow.engines.remote import ProductionEndpoint
from eagleflow.nightly.pool import benchmark_on
from tests.conftest import ROOT
from tests.helpers.http import JsonHandler

# per answer: verify steps, accepted drafts, steps that accepted 0, 1, 2 drafts (none all 3: the histogram stops at 2)
ANSWERS = [(10, 12, [2, 4, 4]), (8, 6, [3, 3, 2])]


class SglangProduction:
    """Loopback chat server: meta_info only when asked for, /metrics 404 (no --enable-metrics); records the
    requests' bodies and the paths it was asked for."""

    def __init__(self, drafter: bool = True, steps: int | None = None, meta: bool = True, metrics: bool = False):
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        served = self
        # /server_info: its ServerArgs at the top level (http_server.py), with speculative decoding at `steps`
        info = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": steps, "speculative_eagle_topk": 1}
        info["speculative_num_draft_tokens"] = (steps or 0) + 1

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                served.paths.append(self.path)
                if self.path == "/server_info" and steps:
                    self._reply(200, json.dumps(info).encode())
                elif self.path == "/metrics" and metrics:  # --enable-metrics: 10 verify steps, 16 tokens an answer
                    n = len(served.bodies)
                    page = (
                        f"sglang:spec_verify_calls_total {10 * n}\nsglang:generation_tokens_total {16 * n}\n"
                        f"sglang:num_requests_total {n}\n"
                    )
                    self._reply(200, page.encode())
                else:
                    self._reply(200 if self.path == "/health" else 404, b"{}")

            def do_POST(self) -> None:
                req = json.loads(self.rfile.read(int(self.headers["content-length"])))
                served.bodies.append(req)
                steps, accepted, hist = ANSWERS[(len(served.bodies) - 1) % len(ANSWERS)]
                choice: dict = {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}
                if req.get("return_meta_info") and meta:
                    choice["meta_info"] = (
                        {
                            "spec_verify_ct": steps,
                            "spec_num_correct_drafts": accepted,
                            "spec_correct_drafts_histogram": hist,
                        }
                        if drafter
                        else {"completion_tokens": 16}
                    )
                answer = {"choices": [choice], "usage": {"completion_tokens": 16}}
                self._reply(200, json.dumps(answer).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def production() -> Iterator[type[SglangProduction]]:
    made: list[SglangProduction] = []
    yield lambda **kw: made.append(SglangProduction(**kw)) or made[-1]  # type: ignore[misc]
    for p in made:
        p.server.shutdown()
        p.server.server_close()


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": str(i)}] for i in range(n)]


def test_the_canary_reads_sglang_productions_acceptance_from_its_answers(production):
    served = production()
    m = acceptance.measure(served.url, "kimi", prompts(2), 16, engine="sglang", k=3)
    # the warm-up answer (ANSWERS[0]) is not counted; the two measured are ANSWERS[1] and ANSWERS[0]
    assert m["mean_acceptance_length"] == round(1 + (6 + 12) / (8 + 10), 4)
    # position i: the steps that accepted at least i drafts; k = 3 though no step accepted 3
    assert m["per_position_acceptance"] == [round(13 / 18, 4), round(6 / 18, 4), 0.0]
    assert all(b["return_meta_info"] for b in served.bodies)  # and its /metrics 404 (no --enable-metrics): no error
    # production's own k, from its /server_info, over the config's: 4 positions though k = 3 was given
    four = production(steps=4)
    m = acceptance.measure(four.url, "kimi", prompts(2), 16, engine="sglang", k=3)
    assert len(m["per_position_acceptance"]) == 4 and m["per_position_acceptance"][-1] == 0.0
    # a proxy that drops meta_info, before an SGLang with --enable-metrics: its counters (15 tokens / 10 steps)
    proxied = production(meta=False, metrics=True)
    m = acceptance.measure(proxied.url, "kimi", prompts(2), 16, engine="sglang", k=3)
    assert m["mean_acceptance_length"] == 1.5 and "spec_verify_calls" in m["note"]
    # vLLM's reading of the same production (the canary before this) saw no counters: AL 1.0, a rollback
    none = production(drafter=False)  # not even counters: no drafter, said so
    m = acceptance.measure(none.url, "kimi", prompts(2), 16, engine="sglang", k=3)
    assert m["mean_acceptance_length"] == 1.0 and "no answer carried" in m["note"]


def test_the_nights_benchmark_on_an_sglang_production_reads_its_answers(production, monkeypatch):
    monkeypatch.setenv(PRODUCTION_API_KEY_ENV, "key")  # the flow hands the Secret block's key over so
    served = production()
    cfg = load_config(ROOT / "configs" / "kimi-k25-sglang.yaml", {"production.url": served.url})
    cfg = benchmark_on(cfg, "production")  # refused while only vLLM's counters were read: every promoted night
    end = ProductionEndpoint(cfg)
    assert end.request_extra == {"return_meta_info": True} and end.snapshot() == {}  # no /metrics: not an error
    with ChatClient(served.url, "kimi", max_concurrency=1) as client:
        results, _ = client.chat(prompts(2), max_tokens=16, temperature=1.0, concurrency=1, extra=end.request_extra)
    got = end.answers_acceptance(results, 3)
    assert got is not None and got["num_drafts"] == 18.0 and got["num_accepted_tokens"] == 18.0
    with pytest.raises(StageError, match="reported no acceptance"):
        end.acceptance({}, {}, 3)  # neither its answers nor its counters: said so, not AL 1.0
    vllm = ProductionEndpoint(load_config(ROOT / "configs" / "kimi-k25.yaml", {"production.url": served.url}))
    assert vllm.request_extra == {} and vllm.answers_acceptance(results, 3) is None  # vLLM: its counters


def test_sglangs_own_speculative_settings_give_k_and_the_room_each_request_keeps():
    from eagleflow.engines.sglang import speculative_settings

    assert speculative_settings({"speculative_algorithm": None}) == (0, 0)
    eagle = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_num_draft_tokens": 4}
    assert speculative_settings({**eagle, "speculative_eagle_topk": 1}) == (3, 4)
    assert speculative_settings({**eagle, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}) == (3, 12)
