"""A gRPC-Web server-streaming endpoint over HTTP/1.1 (uvicorn, an ASGI app; what a browser
calls through Envoy's or a framework's gRPC-Web bridge): ``POST /parallax.test.Tokens/Stream``
with ``content-type: application/grpc-web+proto`` answers a chunked stream of length-prefixed
messages — one body write each, paced like a model — then the trailer frame
(``grpc-status:0``). Query: ``n`` messages, the first after ``first_ms``, then every
``gap_ms``. Logged on the server's CLOCK_MONOTONIC: ``t_start_ns``, ``t_headers_ns``,
``t_writes_ns`` (messages, then the trailer frame), ``traceparent``.

    python -m tests.agent.servers.grpc_web_app --timing-log PATH   # prints the port
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import uvicorn

from demo.llm_app import Receive, Scope, Send, TimingLog, bind


def frame(flag: int, payload: bytes) -> bytes:
    """gRPC's length-prefixed message (flag 0x80: the trailers)."""
    return bytes([flag]) + len(payload).to_bytes(4, "big") + payload


class GrpcWebApp:
    def __init__(self, log: TimingLog) -> None:
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        t_start = time.monotonic_ns()
        while (await receive()).get("more_body"):
            pass  # the request message
        q = parse_qs(scope["query_string"].decode())
        n = int(q.get("n", ["5"])[0])
        first, gap = float(q.get("first_ms", ["40"])[0]), float(q.get("gap_ms", ["20"])[0])
        tp = next((bytes(v).decode() for k, v in scope["headers"] if k == b"traceparent"), None)
        rec: dict[str, Any] = {"traceparent": tp, "t_start_ns": t_start, "t_writes_ns": []}
        rec["t_headers_ns"] = time.monotonic_ns()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/grpc-web+proto")],
            }
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + first / 1000
        for i in range(n):
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            rec["t_writes_ns"].append(time.monotonic_ns())
            await send(
                {
                    "type": "http.response.body",
                    "body": frame(0, f"token-{i}".encode()),
                    "more_body": True,
                }
            )
            deadline += gap / 1000
        rec["t_writes_ns"].append(time.monotonic_ns())
        await send({"type": "http.response.body", "body": frame(0x80, b"grpc-status:0\r\n")})
        self.log.write(rec)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timing-log", type=Path, required=True)
    a = ap.parse_args()
    sock = bind("127.0.0.1", 0)
    config = uvicorn.Config(
        GrpcWebApp(TimingLog(a.timing_log)),
        http="httptools",
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    print(sock.getsockname()[1], flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
