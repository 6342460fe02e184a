"""Slow-body clients against the proxy: N connections that each send a request head, then drip
one body byte every 2 s (issue 12, finding 13). With `server.body_timeout_s` set, every one must
be answered 408 and closed at about that time; without a deadline they stay open indefinitely.

    .venv/bin/python -m benchmarks.slow_clients [--connections 300] [--body-timeout-s 5]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from tests.support.proxy import ProxyThread, make_config, tier

HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"content-length: 1000\r\n\r\n"
)


async def drip(host: str, port: int, results: list[tuple[float, bytes]]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    t0 = time.monotonic()
    writer.write(HEAD)
    await writer.drain()
    answer = asyncio.ensure_future(reader.read(65536))
    while not answer.done():
        try:
            writer.write(b" ")
            await writer.drain()
        except OSError:
            break
        await asyncio.wait([answer], timeout=2)
    data = await answer
    results.append((time.monotonic() - t0, data[:12]))
    writer.close()


async def run(url: str, connections: int) -> None:
    host, port = url.removeprefix("http://").split(":")
    results: list[tuple[float, bytes]] = []
    t0 = time.monotonic()
    await asyncio.gather(*(drip(host, int(port), results) for _ in range(connections)))
    print(
        f"{len(results)} connections; all closed after {time.monotonic() - t0:.1f} s; "
        f"longest {max(r[0] for r in results):.1f} s; "
        f"status lines {sorted({r[1].decode(errors='replace') for r in results})}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--body-timeout-s", type=float, default=5.0)
    a = parser.parse_args()
    # The upstream is never reached: every request is cut while its body is still arriving.
    cfg = make_config(
        [tier("main", "http://127.0.0.1:1/v1")],
        Path(tempfile.mkdtemp()),
        server={"body_timeout_s": a.body_timeout_s},
    )
    with ProxyThread(cfg) as proxy:
        asyncio.run(run(proxy.url, a.connections))


if __name__ == "__main__":
    main()
