"""A real HTTP server for the backends tests: serves vLLM-format metrics from the fixture files.

`/metrics` serves `server.metrics` (None -> 404, as llama-cpp-python's server answers),
`/v1/models` answers 200, and POST `/v1/chat/completions` gives a fixed OpenAI answer with usage,
so the router can use it as a tier. Runs http.server on a free port in a daemon thread.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from backends.signal_endpoints import Endpoint

FIXTURES = Path(__file__).resolve().parents[1] / "backends" / "fixtures"
FIRST = (FIXTURES / "vllm_metrics.txt").read_text()
LATER = (FIXTURES / "vllm_metrics_later.txt").read_text()


def chat_answer(model: str) -> dict[str, object]:
    return {
        "id": "chatcmpl-fixture",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


class MetricsServer:
    """A real HTTP server: /metrics serves `metrics` (None -> 404); /v1/models answers 200."""

    def __init__(self) -> None:
        self.metrics: str | None = FIRST
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path == "/metrics" and state.metrics is not None:
                    self._send(200, state.metrics.encode(), "text/plain; version=0.0.4")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": []}).encode(), "json")
                else:
                    self._send(404, b"not found", "text/plain")

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/v1/chat/completions":
                    answer = json.dumps(chat_answer(body.get("model", "m"))).encode()
                    self._send(200, answer, "application/json")
                else:
                    self._send(404, b"not found", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def endpoint(self, tier: str = "large") -> Endpoint:
        root = f"http://127.0.0.1:{self.port}"
        return Endpoint(tier, f"{root}/v1", f"{root}/metrics")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
