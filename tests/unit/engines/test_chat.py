"""The chat client (eagleflow.engines.chat): an answer with neither content nor reasoning is an error;
content and reasoning are read from either field name the servers use."""

from __future__ import annotations

from eagleflow.engines.chat import parse_choice, sampling_extra


def test_answer_without_content_is_an_error():
    assert parse_choice(0, {"choices": [{"message": {"content": None}, "finish_reason": "length"}]}).error
    assert parse_choice(0, {"oops": 1}).error
    r = parse_choice(
        0, {"choices": [{"message": {"content": "x", "reasoning_content": "r"}}], "usage": {"completion_tokens": 3}}
    )
    assert (r.error, r.content, r.reasoning, r.completion_tokens) == (None, "x", "r", 3)
    assert parse_choice(0, {"choices": [{"message": {"content": None, "reasoning": "r"}}]}).reasoning == "r"


def _server(replies: list[bytes | None]) -> tuple[int, list[int]]:
    """A loopback HTTP server answering one request per connection with the next of `replies`; None
    closes the connection without an answer (what a server closing a kept-alive connection does)."""
    import socket
    import threading

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    seen: list[int] = []

    def serve() -> None:
        for reply in replies:
            conn, _ = sock.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                while len(body) < length:
                    body += conn.recv(65536)
                seen.append(len(body))
                if reply is not None:
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(reply), reply)
                    )
        sock.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock.getsockname()[1], seen


def test_a_connection_closed_before_the_answer_is_retried():
    import json

    from eagleflow.engines.chat import chat_all

    ok = json.dumps(
        {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], "usage": {"completion_tokens": 1}}
    ).encode()
    port, seen = _server([None, ok])
    results, _ = chat_all(
        f"http://127.0.0.1:{port}",
        "m",
        [[{"role": "user", "content": "hi"}]],
        max_tokens=4,
        temperature=0,
        concurrency=1,
        timeout_s=10,
    )
    assert (results[0].error, results[0].content, results[0].attempts) == (None, "hi", 2)
    assert len(seen) == 2 and seen[0] == seen[1]  # the same request, sent again


def test_a_connection_that_keeps_breaking_fails_after_the_retries():
    from eagleflow.engines.chat import RETRIES, chat_all

    port, _ = _server([None] * (RETRIES + 1))
    results, _ = chat_all(
        f"http://127.0.0.1:{port}",
        "m",
        [[{"role": "user", "content": "hi"}]],
        max_tokens=4,
        temperature=0,
        concurrency=1,
        timeout_s=10,
    )
    assert results[0].attempts == RETRIES + 1 and f"failed {RETRIES + 1} times" in results[0].error


def test_sampling_extra_sends_top_p_only_where_the_request_samples():
    assert sampling_extra(1.0, 0.95) == {"top_p": 0.95}
    assert sampling_extra(0.0, 0.95) == {}  # greedy: top_p changes nothing, the request stays as it was
    assert sampling_extra(0.6, 1.0) == {}  # 1 is the server's default
