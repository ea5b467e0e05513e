"""Chat requests spread over production's replicas (`production.replicas`), each of them bounded.

Each replica gets `per_replica` slots; a free slot takes the next waiting conversation, so work follows
load: a replica busy with its own users answers slower and takes fewer. A replica that cannot be reached
or answers a server error is left (its slots stop taking work) and the conversation goes back to the
queue for the others; its /health is polled, and once it answers the replica is taken back. Every
conversation is answered exactly once: it is in the queue or in one slot, never both, and only a slot
that got an answer (or an error that sending again would not mend) records it.

When no replica has answered for `wait_s`, the conversations still waiting come back as `transient`
failures: the caller keeps what was answered and says what to do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from eagleflow.engines.chat import KEEPALIVE_EXPIRY_S, ChatResult, post_chat, tls_context
from eagleflow.util import http

log = logging.getLogger("eagleflow.generate")
HEALTH_POLL_S = 2.0
HEALTH_TIMEOUT_S = 5.0


@dataclass
class ReplicaCounts:
    """What one replica did for this stage."""

    sent: int = 0  # requests sent to it
    answered: int = 0  # of those, the ones it answered (an answer, or an error sending again would not mend)
    moved: int = 0  # of those, the ones that found it gone and were sent to another replica
    down: int = 0  # times it was left
    back: int = 0  # times it was taken back


@dataclass
class _State:
    """What is known of one replica between calls (a stage sends shard after shard)."""

    counts: ReplicaCounts = field(default_factory=ReplicaCounts)
    up: bool | None = None  # None: not asked yet
    down_since: float | None = None


class Replicas:
    """Production's replicas for one stage: their state and counts carry over from one batch of
    conversations to the next, so a replica left in one shard is taken back in a later one."""

    def __init__(self, urls: list[str], api_key: str | None = None):
        self.state = {u.rstrip("/"): _State() for u in urls}
        self.api_key = api_key

    @property
    def counts(self) -> dict[str, ReplicaCounts]:
        return {url: st.counts for url, st in self.state.items()}

    def chat(
        self,
        model: str,
        conversations: list[list[dict[str, Any]]],
        *,
        max_tokens: int,
        temperature: float,
        per_replica: int,
        timeout_s: float,
        wait_s: float,
        on_result: Callable[[ChatResult], None] | None = None,
        extra: dict[str, Any] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> tuple[list[ChatResult], float]:
        """Every conversation answered once by some replica: the results in order and the wall seconds.
        `extra`: more fields of every request; `seeds`: conversation i's seed, whichever replica answers it."""
        start = time.perf_counter()
        results = asyncio.run(
            self._spread(
                model,
                conversations,
                max_tokens=max_tokens,
                temperature=temperature,
                per_replica=per_replica,
                timeout_s=timeout_s,
                wait_s=wait_s,
                on_result=on_result,
                extra=extra,
                seeds=seeds,
            )
        )
        return results, time.perf_counter() - start

    def _went_up(self, url: str) -> None:
        st = self.state[url]
        if st.down_since is not None:
            st.counts.back += 1
            log.info("replica %s answers again after %.0f s: taken back", url, time.monotonic() - st.down_since)
        st.up, st.down_since = True, None

    def _went_down(self, url: str, why: str) -> None:
        st = self.state[url]
        if st.up is False:
            return
        if st.up is None:  # never up: not left, and not counted as taken back when it comes
            log.warning("replica %s does not answer (%s); it takes requests once its /health answers", url, why)
            st.up = False
            return
        st.counts.down += 1
        log.warning("replica %s left (%s); its requests go to the others until its /health answers", url, why)
        st.up, st.down_since = False, time.monotonic()

    async def _spread(
        self,
        model: str,
        conversations: list[list[dict[str, Any]]],
        *,
        max_tokens: int,
        temperature: float,
        per_replica: int,
        timeout_s: float,
        wait_s: float,
        on_result: Callable[[ChatResult], None] | None,
        extra: dict[str, Any] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[ChatResult]:
        n = len(conversations)
        results: list[ChatResult | None] = [None] * n
        waiting: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            waiting.put_nowait(i)
        finished = asyncio.Event()
        left = {"n": n}
        headers = http.bearer(self.api_key)
        limits = httpx.Limits(
            max_connections=per_replica, max_keepalive_connections=per_replica, keepalive_expiry=KEEPALIVE_EXPIRY_S
        )
        clients = {
            url: httpx.AsyncClient(
                base_url=url, timeout=timeout_s, limits=limits, headers=headers, verify=tls_context()
            )
            for url in self.state
        }
        up = {url: asyncio.Event() for url in self.state}  # a slot takes work only while its replica's is set
        if not n:
            finished.set()

        def record(i: int, result: ChatResult) -> None:
            results[i] = result
            left["n"] -= 1
            if on_result is not None:
                on_result(result)
            if left["n"] == 0:
                finished.set()

        async def watch(url: str) -> None:
            """Whenever the replica is out: poll its /health; take it (back) once it answers."""
            while True:
                if not up[url].is_set():
                    if await _healthy(clients[url]):
                        self._went_up(url)
                        up[url].set()
                        continue
                    self._went_down(url, "its /health does not answer")
                await asyncio.sleep(HEALTH_POLL_S)

        async def slot(url: str) -> None:
            counts = self.state[url].counts
            while True:
                await up[url].wait()
                i = await waiting.get()
                if not up[url].is_set():  # left while this slot waited for work
                    waiting.put_nowait(i)
                    continue
                payload = {
                    "model": model,
                    "messages": conversations[i],
                    "max_tokens": max_tokens,
                    "temperature": temperature,
                    **(extra or {}),
                    **({"seed": seeds[i]} if seeds is not None else {}),
                }
                counts.sent += 1
                # No retry on the same replica: another one can take the request at once.
                result = await post_chat(clients[url], url, i, payload, retries=0)
                if result.transient:
                    counts.moved += 1
                    up[url].clear()
                    self._went_down(url, result.error or "no answer")
                    waiting.put_nowait(i)
                    continue
                counts.answered += 1
                record(i, result)

        tasks = [asyncio.create_task(watch(u)) for u in self.state]
        tasks += [asyncio.create_task(slot(u)) for u in self.state for _ in range(per_replica)]
        try:
            none_since = time.monotonic()
            while not finished.is_set():
                try:
                    await asyncio.wait_for(finished.wait(), timeout=1.0)
                except asyncio.TimeoutError:
                    pass
                if any(e.is_set() for e in up.values()):
                    none_since = time.monotonic()
                elif time.monotonic() - none_since > wait_s:
                    why = (
                        f"no replica of production answered for {wait_s:.0f} s (generate.server_wait_s): "
                        + ", ".join(self.state)
                    )
                    for i in range(n):
                        if results[i] is None:
                            results[i] = ChatResult(i, error=why, transient=True)
                    break
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for c in clients.values():
                await c.aclose()
        return [r for r in results if r is not None]


def counts_record(counts: dict[str, ReplicaCounts]) -> dict[str, dict[str, int]]:
    return {url: asdict(c) for url, c in counts.items()}


async def _healthy(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/health", timeout=HEALTH_TIMEOUT_S)).status_code == 200
    except httpx.HTTPError:
        return False
