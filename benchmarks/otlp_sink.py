"""A do-nothing OTLP/HTTP collector for benchmarks: accepts every `POST /v1/traces` (200, body
read and dropped) and counts them, so a proxy with tracing on pays for building and exporting
its spans, not for a collector's speed. Raw ASGI on uvicorn, like benchmarks/echo_upstream.py.

    python -m benchmarks.otlp_sink --port 4318      # GET /stats: {"exports", "bytes"}
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import uvicorn

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Sink:
    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan: nothing to start
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        status, out, kind = 200, b"", b"application/x-protobuf"
        if scope["path"] == "/v1/traces" and scope["method"] == "POST":
            self.exports += 1
            self.bytes += len(body)
        elif scope["path"] in ("/stats", "/healthz"):
            out = orjson.dumps({"exports": self.exports, "bytes": self.bytes})
            kind = b"application/json"
        else:
            status = 404
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]}
        )
        await send({"type": "http.response.body", "body": out})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=4318)
    a = ap.parse_args()
    uvicorn.run(
        Sink(), host=a.host, port=a.port, log_level="warning", access_log=False, lifespan="off"
    )


if __name__ == "__main__":
    main()
