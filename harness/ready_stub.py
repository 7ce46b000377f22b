"""A dependency that is only ready: an HTTP server on loopback answering every GET with 200.

A FeatureRunner started alone for its own routes (``/features`` never calls the model runner)
still names its model runner with ``--depends``, and BentoML's ``/readyz`` asks that URL; this
stands in for it. The server runs in a daemon thread until ``stop`` (or the process ends).
"""

from __future__ import annotations

import http.server
import threading

from harness.ports import free_port


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        return None


class ReadyStub:
    def __init__(self) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Ready)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
