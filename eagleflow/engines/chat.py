"""An async client for an OpenAI-compatible chat API: many requests, bounded concurrency.

Answers are read whole, not streamed: the benchmark takes TTFT and inter-token latency from the
engine's own histograms, and a Python client parsing one event per token on a busy host falls
behind the engine (the engine then coalesces output, and the client's clock measures itself).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import httpx

from eagleflow.util import http

# The server may close a kept-alive connection just as the client reuses it (uvicorn's keep-alive
# timeout is 5 s, httpx's pool expiry was 5 s too): the request then fails before the server read it.
# Pooled connections are dropped sooner than the server drops them, and such a failure (the request
# never reached the engine, or its connection broke) is retried a few times. A timeout is not.
KEEPALIVE_EXPIRY_S = 2.0
RETRIES = 2
RETRY_DELAY_S = 0.5
RETRYABLE = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
# A server error: a server shutting down answers 500 ("cannot schedule new futures after shutdown"),
# one restarting or behind a proxy 502/503/504. The request was not served; later it may be.
SERVER_ERROR = 500


def sampling_extra(temperature: float, top_p: float) -> dict[str, float]:
    """The request fields beyond temperature for production's sampling: top_p only where the request samples
    (greedy ignores it, and a greedy request stays as it was) and only below 1 (1 is the server's default)."""
    return {"top_p": top_p} if temperature > 0 and top_p < 1 else {}


@lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context (certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR), built once per
    process. Building it parses the CA bundle: 25 ms on the H200 host, 47 ms here; the benchmark stage once
    made one client per round (per request at concurrency 1) and paid that inside every measured request
    (it read 10-15% under a plain client on the same engine)."""
    return httpx.create_ssl_context()


@dataclass
class ChatResult:
    """One answer, or why there is none."""

    index: int
    content: str | None = None
    reasoning: str | None = None
    completion_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    latency_s: float | None = None  # request sent -> whole answer read, on the client
    attempts: int = 1  # > 1: the connection broke and the request was sent again
    transient: bool = False  # the server was unreachable or unavailable: the request may be sent again later

    @property
    def truncated(self) -> bool:
        """Cut at max_tokens (often mid-reasoning): still the target's own tokens, so still data."""
        return self.finish_reason == "length"


def parse_choice(index: int, body: dict[str, Any]) -> ChatResult:
    """Pull content and reasoning out of a chat completion.

    vLLM's reasoning parsers put the thinking in `reasoning` (newer) or `reasoning_content` (older,
    and most other servers); an answer with neither content nor reasoning is an error. One cut at
    max_tokens mid-reasoning has reasoning only: an answer (`truncated`), not an error.
    """
    try:
        choice = body["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError):
        return ChatResult(index, error=f"answer has no choices[0].message: {str(body)[:200]}", raw=body)
    reasoning = msg.get("reasoning") or msg.get("reasoning_content")
    content = msg.get("content")
    usage = body.get("usage") or {}
    result = ChatResult(
        index,
        content=content,
        reasoning=reasoning,
        completion_tokens=int(usage.get("completion_tokens") or 0),
        finish_reason=choice.get("finish_reason"),
        raw=body,
    )
    if not content and not reasoning:
        result.error = f"answer with neither reasoning nor content (finish_reason={result.finish_reason!r})"
    return result


async def post_chat(
    client: httpx.AsyncClient, base_url: str, index: int, payload: dict[str, Any], retries: int = RETRIES
) -> ChatResult:
    """One chat completion; a broken connection is tried again `retries` times. A server that was not
    reached or could not serve it gives a `transient` result: the request may be sent again, there or
    elsewhere."""
    for attempt in range(1, retries + 2):
        start = time.perf_counter()
        try:
            r = await client.post("/v1/chat/completions", json=payload)
            break
        except RETRYABLE as exc:
            if attempt > retries:
                return ChatResult(
                    index,
                    error=f"request to {base_url} failed {attempt} times: {type(exc).__name__}: {exc}",
                    attempts=attempt,
                    transient=True,
                )
            await asyncio.sleep(RETRY_DELAY_S)
        except httpx.HTTPError as exc:
            return ChatResult(index, error=f"request to {base_url} failed: {type(exc).__name__}: {exc}")
    latency = time.perf_counter() - start
    if r.status_code != 200:
        return ChatResult(
            index,
            error=f"HTTP {r.status_code} from {base_url}: {r.text[:300]}",
            attempts=attempt,
            transient=r.status_code >= SERVER_ERROR,
        )
    try:
        body = r.json()
    except ValueError:
        return ChatResult(index, error=f"non-JSON answer from {base_url}: {r.text[:200]}", attempts=attempt)
    result = parse_choice(index, body)
    result.latency_s, result.attempts = latency, attempt
    return result


class ChatClient:
    """One HTTP client and one event loop for many calls: the benchmark sends every round of every window
    through it, so connections stay open between rounds and no round pays for a new event loop, client and
    TCP connection (about 6 ms a request on the H200 host, inside the measured window: 3 % of a demo
    request). Close it (or use it as a context manager) when its server goes."""

    def __init__(
        self, base_url: str, model: str, *, max_concurrency: int, timeout_s: float = 600.0, api_key: str | None = None
    ) -> None:
        self.base_url, self.model = base_url, model
        self._runner = asyncio.Runner()
        limits = httpx.Limits(
            max_connections=max_concurrency,
            max_keepalive_connections=max_concurrency,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        # The key lives in this client's headers only: httpx never puts headers in its exceptions or logs.
        headers = http.bearer(api_key)
        self._client = self._runner.run(self._make(limits, headers, timeout_s))

    async def _make(self, limits: httpx.Limits, headers: dict[str, str] | None, timeout_s: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout_s, limits=limits, headers=headers, verify=tls_context()
        )

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._runner is not None:
            self._runner.run(self._client.aclose())
            self._runner.close()
            self._runner = None  # type: ignore[assignment]

    def chat(
        self,
        conversations: list[list[dict[str, Any]]],
        *,
        max_tokens: int,
        temperature: float,
        concurrency: int,
        extra: dict[str, Any] | None = None,
        seed: int | Sequence[int] | None = None,
        on_result: Callable[[ChatResult], None] | None = None,
    ) -> tuple[list[ChatResult], float]:
        """Send every conversation, at most `concurrency` in flight; the results in order and the wall
        time in seconds. `seed`: request i gets seed + i, or seed[i] for a sequence. `on_result`: called
        with each result as it comes (progress), in the order they finish."""
        start = time.perf_counter()
        results = self._runner.run(
            self._all(
                conversations,
                max_tokens=max_tokens,
                temperature=temperature,
                concurrency=concurrency,
                extra=extra,
                seed=seed,
                on_result=on_result,
            )
        )
        return results, time.perf_counter() - start

    async def _all(
        self,
        conversations: list[list[dict[str, Any]]],
        *,
        max_tokens: int,
        temperature: float,
        concurrency: int,
        extra: dict[str, Any] | None,
        seed: int | Sequence[int] | None,
        on_result: Callable[[ChatResult], None] | None = None,
    ) -> list[ChatResult]:
        sem = asyncio.Semaphore(concurrency)
        client, base_url = self._client, self.base_url

        async def one(i: int, messages: list[dict[str, Any]]) -> ChatResult:
            payload = {
                "model": self.model,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": temperature,
                **(extra or {}),
            }
            if seed is not None:  # sampled runs repeat: the same seed per prompt in every variant
                payload["seed"] = seed + i if isinstance(seed, int) else seed[i]
            async with sem:
                return await post_chat(client, base_url, i, payload)

        async def reported(i: int, messages: list[dict[str, Any]]) -> ChatResult:
            result = await one(i, messages)
            if on_result is not None:
                on_result(result)
            return result

        return await asyncio.gather(*(reported(i, m) for i, m in enumerate(conversations)))


def chat_all(
    base_url: str,
    model: str,
    conversations: list[list[dict[str, Any]]],
    *,
    max_tokens: int,
    temperature: float,
    concurrency: int,
    timeout_s: float = 600.0,
    extra: dict[str, Any] | None = None,
    seed: int | Sequence[int] | None = None,
    api_key: str | None = None,
    on_result: Callable[[ChatResult], None] | None = None,
) -> tuple[list[ChatResult], float]:
    """Send every conversation through a client of its own; return the results in order and the wall time
    in seconds (the client's set-up included). `seed`: see `ChatClient.chat`. `api_key`: sent as a bearer
    token (production's server). `on_result`: see `ChatClient.chat`."""
    start = time.perf_counter()
    with ChatClient(base_url, model, max_concurrency=concurrency, timeout_s=timeout_s, api_key=api_key) as client:
        results, _ = client.chat(
            conversations,
            max_tokens=max_tokens,
            temperature=temperature,
            concurrency=concurrency,
            extra=extra,
            seed=seed,
            on_result=on_result,
        )
    return results, time.perf_counter() - start
