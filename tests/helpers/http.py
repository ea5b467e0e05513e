"""A loopback HTTP handler for the test servers that stand in for a chat server: quiet, JSON replies."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler


class JsonHandler(BaseHTTPRequestHandler):
    """Subclass with do_GET / do_POST; `_reply` sends a JSON body with its length."""

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
