"""A minimal keep-alive HTTP server that serves one pre-rendered exposition at every path and records
when each path was fetched (GET /-/stats returns {path: [monotonic times]}). Cheap enough to stand in for
hundreds of vLLM targets on one port: the sidecar sees N distinct URLs /metrics/0 … /metrics/N-1.

    python -m bench.static_server --file BODY --port PORT
    python -m bench.static_server --file BODY1 --file BODY2 … --port PORT   # a live target: each fetch the next
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import defaultdict, deque

MAX_TIMES = 2000  # per path, bounded


class StaticServer:
    def __init__(self, *bodies: bytes) -> None:
        self.bodies = bodies  # several: one after another, fetch after fetch (counters that move)
        self.fetches = 0
        self.times: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=MAX_TIMES))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode("latin-1")
                if path == "/-/stats":
                    payload = json.dumps({p: list(t) for p, t in self.times.items()}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
                else:
                    self.times[path].append(time.monotonic())
                    body = self.bodies[min(self.fetches, len(self.bodies) - 1)]
                    self.fetches += 1
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
                    writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


async def serve(bodies: list[bytes], port: int) -> None:
    server = StaticServer(*bodies)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", port, backlog=1024)
    async with srv:
        await srv.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--file", required=True, action="append")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    bodies = []
    for name in args.file:
        with open(name, "rb") as f:
            bodies.append(f.read())
    asyncio.run(serve(bodies, args.port))


if __name__ == "__main__":
    main()
