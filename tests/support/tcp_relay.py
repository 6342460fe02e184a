"""A TCP relay between a client under test and a real server, that reports who hung up first.

It lets a test observe a connection being closed (e.g. the proxy cancelling its upstream request
when its own client hangs up) as an event to wait on, instead of inferring it from timings.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class TcpRelay:
    """Listens on a free loopback port and forwards each connection to (host, port)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.closed_by_client = 0  # connections the client side closed before the server did
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))  # the OS picks a free port
        self.port = int(self._listener.getsockname()[1])
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            ended: list[str] = []  # which side hung up first, once known
            for src, dst, side in ((client, server, "client"), (server, client, "server")):
                threading.Thread(
                    target=self._pipe, args=(src, dst, side, ended), daemon=True
                ).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, side: str, ended: list[str]) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with self._lock:
            first = not ended
            ended.append(side)
            if first and side == "client":
                self.closed_by_client += 1
        if first:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def __enter__(self) -> TcpRelay:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopping = True
        self._listener.close()
