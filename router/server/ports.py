"""Listening ports checked before anything starts: a port in use is one `error:` line naming the
port and how to choose another, not a traceback from inside uvicorn after the demo's servers
have already started."""

from __future__ import annotations

import errno
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def listen_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port, or None. A bind test with the options the
    servers use (SO_REUSEADDR, so a port in TIME_WAIT is not reported as taken)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"port {port} on {host} is already in use"
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None
