"""The metrics listener (`monitoring.metrics_listen`): a second socket of the same uvicorn server,
serving `/metrics` and nothing else.

One server, one app, two sockets: uvicorn puts the socket's own address of each connection in
the ASGI scope (`server`), so the front tells the two listeners apart by its port. A connection
to the metrics port may ask for `GET /metrics` only (anything else is a 404 there, so the API
never leaks onto the operators' network); its requests are marked, and the `/metrics` route
(router/endpoints/ops.py) answers on the API port only when no metrics listener is configured.
"""

from __future__ import annotations

import socket

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from router.endpoints.ops import METRICS_LISTENER
from router.http.errors import RouterError, error_response
from router.server.asgi_front import FastPath

METRICS_PATH = "/metrics"


class MetricsListenerFront(FastPath):
    """FastPath, plus: requests arriving on `metrics_port` reach `GET /metrics` only."""

    def __init__(self, app: FastAPI, metrics_port: int) -> None:
        super().__init__(app)
        self.metrics_port = metrics_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _local_port(scope) == self.metrics_port:
            if scope["path"] != METRICS_PATH:
                err = RouterError(
                    404,
                    "not_found",
                    "this listener (monitoring.metrics_listen) serves /metrics only",
                )
                await error_response(err)(scope, receive, send)
                return
            scope[METRICS_LISTENER] = True
        await super().__call__(scope, receive, send)


def _local_port(scope: Scope) -> int | None:
    server = scope.get("server")
    return int(server[1]) if server is not None and len(server) > 1 else None


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket (SO_REUSEADDR, the API socket's backlog); OSError when it cannot."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(4096)
    except OSError:
        sock.close()
        raise
    return sock
