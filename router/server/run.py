"""Runs the app on uvicorn with the fast stack (uvloop + httptools, one worker).

SIGTERM/SIGINT drain: uvicorn stops accepting connections, lets in-flight requests and streams
finish (up to server.drain_timeout_s), then runs the app's shutdown, which settles budgets and
flushes traces of the last requests before closing backends.

With `monitoring.metrics_listen` the same server listens on a second socket that serves only
/metrics (router/server/listeners.py).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import NoReturn

import uvicorn

from classifiers.inference import ModelLoadError
from router.config import RouterConfig
from router.http.protocol import limited_protocol
from router.proxy.scorers import load_scorers
from router.server.app import create_app
from router.server.asgi_front import FastPath
from router.server.listeners import MetricsListenerFront, bind_listener

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def uvicorn_config(
    config: RouterConfig,
    host: str | None = None,
    port: int | None = None,
    metrics_port: int | None = None,
    **app_kwargs: object,
) -> uvicorn.Config:
    """metrics_port: the bound port of the metrics listener's socket, when there is one."""
    server = config.server
    app = create_app(config, **app_kwargs)
    front = FastPath(app) if metrics_port is None else MetricsListenerFront(app, metrics_port)
    return uvicorn.Config(
        front,
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
    listen_host = host or config.server.host
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((listen_host, config.server.port if port is None else port))
    sock.listen(4096)  # connections queue from now on, even before uvicorn has started
    api_port = int(sock.getsockname()[1])
    metrics_sock = _metrics_socket(config)
    metrics_port = None if metrics_sock is None else int(metrics_sock.getsockname()[1])
    if metrics_port == api_port:
        # The front tells the listeners apart by port: one port for both (on two addresses)
        # would serve the API on the metrics listener.
        _cannot_start(f"monitoring.metrics_listen uses the API's port {api_port}")
    ucfg = uvicorn_config(
        config, listen_host, api_port, metrics_port, config_path=config_path, scorers=scorers
    )
    url = f"http://{listen_host}:{api_port}"
    print(f"cost-router listening on {url}", flush=True)
    if metrics_sock is not None:
        metrics_host = str(metrics_sock.getsockname()[0])
        shown = f"[{metrics_host}]" if ":" in metrics_host else metrics_host
        print(f"cost-router metrics on http://{shown}:{metrics_port}/metrics", flush=True)
    if on_listening is not None:
        on_listening(url)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # uvicorn re-raises the SIGTERM it drained on; a completed drain is a clean exit.
        signal.signal(signal.SIGTERM, _exit_cleanly)
    sockets = [sock] if metrics_sock is None else [sock, metrics_sock]
    uvicorn.Server(ucfg).run(sockets=sockets)


def _metrics_socket(config: RouterConfig) -> socket.socket | None:
    """The metrics listener's socket, bound before anything starts; and the metrics token
    checked present: a proxy whose token is missing would refuse every scrape."""
    monitoring = config.monitoring
    name = monitoring.metrics_token_env
    if name is not None and not os.environ.get(name):
        _cannot_start(f"monitoring.metrics_token_env names {name}, which is unset or empty")
    address = monitoring.metrics_address
    if address is None:
        return None
    try:
        return bind_listener(*address)
    except OSError as exc:
        _cannot_start(
            f"monitoring.metrics_listen {monitoring.metrics_listen}: {exc.strerror or exc}"
        )


def _cannot_start(why: str) -> NoReturn:
    print(f"cost-router: cannot start: {why}", file=sys.stderr)
    raise SystemExit(1)


def _exit_cleanly(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)
