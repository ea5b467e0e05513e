"""Spreading chat requests over production's replicas (eagleflow.engines.replicas), against loopback HTTP
servers that answer slowly and count what they hold: each replica's requests in flight stay bounded, a
slower replica takes fewer, one that goes down is left and its requests answered elsewhere, one that comes
back is taken back in the next batch, and every conversation is answered exactly once. The same with two
real vLLM servers: tests/integration/production/test_window.py."""

from __future__ import annotations

import json
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from eagleflow.engines.replicas import Replicas
from tests.helpers.http import JsonHandler


class Replica:
    """A chat server on loopback: answers after `delay_s`, 503 while `down`, and records how many requests it
    held at once and which conversations it answered."""

    def __init__(self, delay_s: float):
        self.delay_s, self.down = delay_s, False
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.answered: list[str] = []
        replica = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:  # /health
                self._reply(503 if replica.down else 200, b"{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if replica.down:
                    return self._reply(503, b"{}")
                with replica.lock:
                    replica.in_flight += 1
                    replica.max_in_flight = max(replica.max_in_flight, replica.in_flight)
                time.sleep(replica.delay_s)
                with replica.lock:
                    replica.in_flight -= 1
                    if replica.down:  # went down while answering: the request was not served
                        return self._reply(503, b"{}")
                    replica.answered.append(body["messages"][0]["content"])
                answer = {
                    "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"completion_tokens": 1},
                }
                self._reply(200, json.dumps(answer).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def replicas():
    made: list[Replica] = []
    yield lambda delay_s: made.append(Replica(delay_s)) or made[-1]
    for r in made:
        r.server.shutdown()
        r.server.server_close()


def _convs(n: int, tag: str = "") -> list[list[dict]]:
    return [[{"role": "user", "content": f"{tag}{i}"}] for i in range(n)]


def _chat(spread: Replicas, convs: list, per_replica: int = 2, wait_s: float = 30):
    return spread.chat("m", convs, max_tokens=4, temperature=0, per_replica=per_replica, timeout_s=30, wait_s=wait_s)


def test_each_replica_holds_at_most_its_share_and_a_slower_one_takes_fewer(replicas):
    fast, slow = replicas(0.02), replicas(0.12)
    spread = Replicas([fast.url, slow.url])
    results, _ = _chat(spread, _convs(60), per_replica=3)
    assert [r.index for r in results] == list(range(60)) and not any(r.error for r in results)
    assert fast.max_in_flight <= 3 and slow.max_in_flight <= 3
    assert fast.max_in_flight == 3  # the bound is used, not only kept
    assert len(fast.answered) > 2 * len(slow.answered) > 0  # work follows load
    assert sorted(fast.answered + slow.answered, key=int) == [str(i) for i in range(60)]  # each once
    counts = spread.counts
    assert counts[fast.url].answered == len(fast.answered) and counts[slow.url].answered == len(slow.answered)


def test_a_replica_that_goes_down_is_left_and_taken_back_in_a_later_batch(replicas):
    a, b = replicas(0.05), replicas(0.05)
    spread = Replicas([a.url, b.url])
    threading.Timer(0.3, lambda: setattr(b, "down", True)).start()
    results, _ = _chat(spread, _convs(60, "x"))
    assert not any(r.error for r in results) and len(results) == 60
    assert sorted(a.answered + b.answered) == sorted(f"x{i}" for i in range(60))  # nothing lost or doubled
    cb = spread.counts[b.url]
    assert cb.down == 1 and cb.moved >= 1 and cb.sent == cb.answered + cb.moved and cb.back == 0
    b.down = False
    before = len(b.answered)
    results, _ = _chat(spread, _convs(20, "y"))
    assert not any(r.error for r in results)
    assert spread.counts[b.url].back == 1 and len(b.answered) > before  # taken back, and it serves


def test_a_replica_down_from_the_start_is_taken_in_when_it_answers_and_not_counted_as_back(replicas):
    a, b = replicas(0.05), replicas(0.01)
    b.down = True
    spread = Replicas([a.url, b.url])
    threading.Timer(0.5, lambda: setattr(b, "down", False)).start()
    results, _ = _chat(spread, _convs(80, "z"))
    assert not any(r.error for r in results) and len(b.answered) > 0
    cb = spread.counts[b.url]
    assert (cb.down, cb.back) == (0, 0) and cb.sent == cb.answered + cb.moved


def test_no_replica_answering_for_wait_s_gives_transient_failures(replicas):
    a = replicas(0.01)
    a.down = True
    spread = Replicas([a.url])
    t0 = time.monotonic()
    results, _ = _chat(spread, _convs(4), wait_s=1.5)
    assert time.monotonic() - t0 < 20
    assert len(results) == 4 and all(r.transient and "generate.server_wait_s" in r.error for r in results)
