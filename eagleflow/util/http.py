"""One HTTP client per process for the small requests eagleflow polls with: health checks and /metrics.

`httpx.get()` builds a client, and with it an SSL context that loads the CA bundle, on every call: about
50 ms of CPU each (0.3 ms through a kept client). Polled four times a second, a guardian took a fifth of a
core while production restarted beside the engine it was waiting for. The client keeps no connection
alive between requests: a health poll must reach the server that answers now, not a pooled connection to
the one that was stopped.
"""

from __future__ import annotations

import threading

import httpx

_client: httpx.Client | None = None
_lock = threading.Lock()


def client() -> httpx.Client:
    """This process's client (made on first use; httpx clients are safe to share between threads)."""
    global _client
    with _lock:
        if _client is None:
            _client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
        return _client


def get(url: str, **kw) -> httpx.Response:
    """`httpx.get(url, **kw)` through this process's client."""
    return client().get(url, **kw)


def bearer(api_key: str | None) -> dict[str, str] | None:
    """The Authorization header of an OpenAI-compatible server's API key (None: the server has none)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else None


def answers(url: str, timeout_s: float) -> bool:
    """Whether `url` answers 200 within `timeout_s` (a health check: any transport error is a no)."""
    try:
        return get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False
