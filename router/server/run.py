"""Runs the app on uvicorn with the fast stack (uvloop + httptools, one worker).

SIGTERM/SIGINT drain: uvicorn stops accepting connections, lets in-flight requests and streams
finish (up to server.drain_timeout_s), then runs the app's shutdown, which settles budgets and
flushes traces of the last requests before closing backends.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from classifiers.inference import ModelLoadError
from router.config import RouterConfig
from router.http.protocol import limited_protocol
from router.proxy.scorers import load_scorers
from router.server.app import create_app
from router.server.asgi_front import FastPath

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def uvicorn_config(
    config: RouterConfig, host: str | None = None, port: int | None = None, **app_kwargs: object
) -> uvicorn.Config:
    server = config.server
    return uvicorn.Config(
        FastPath(create_app(config, **app_kwargs)),
        host=host or server.host,
        port=server.port if port is None else port,
        loop="uvloop",
        # httptools with the head limits and HTTP/1.0 framing uvicorn lacks there.
        http=limited_protocol(server.max_header_bytes, server.max_headers, server.body_timeout_s),
        workers=1,
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=max(1, round(server.drain_timeout_s)),
        timeout_keep_alive=30,
        backlog=4096,
        proxy_headers=False,  # we never trust X-Forwarded-*; skips a middleware per request
    )


def run_server(
    config: RouterConfig,
    host: str | None = None,
    port: int | None = None,
    on_listening: Callable[[str], None] | None = None,
    config_path: str | Path | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. `on_listening(url)` is called once the socket is bound.
    config_path: the file `config` came from; its routing part reloads on change or SIGHUP."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    # httpx logs every upstream request at INFO: noise, and measurable cost on the hot path.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # Load the classifier before listening: a bad model file is a one-line error, not a
    # failed-startup traceback from inside uvicorn.
    try:
        scorers = load_scorers(config)
    except ModelLoadError as exc:
        print(f"cost-router: cannot start: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    ucfg = uvicorn_config(config, host, port, config_path=config_path, scorers=scorers)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((ucfg.host, ucfg.port))
    sock.listen(4096)  # connections queue from now on, even before uvicorn has started
    url = f"http://{ucfg.host}:{sock.getsockname()[1]}"
    print(f"cost-router listening on {url}", flush=True)
    if on_listening is not None:
        on_listening(url)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # uvicorn re-raises the SIGTERM it drained on; a completed drain is a clean exit.
        signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.Server(ucfg).run(sockets=[sock])


def _exit_cleanly(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)
