"""The demo's LLM app (demo/llm_app.py: SSE, chunked, its own CLOCK_MONOTONIC timing log)
served by uvicorn over TLS (``--ssl-keyfile``/``--ssl-certfile``, as a Python inference
server terminating TLS itself does): asyncio's SSL transport, a memory BIO — the event loop
reads the socket, then decrypts with SSL_read_ex on the same thread.

One route more, ``/upstream?port=P``: the app's own HTTPS call (asyncio, a memory BIO too,
on the server's thread) to 127.0.0.1:P before it answers — the agent must record the
request it serves, and nothing of the call it makes. Logged like the app's routes
(``t_start_ns``, ``t_headers_ns``, ``t_writes_ns``, ``traceparent``).

    python -m tests.agent.servers.tls_app --cert C --key K --timing-log PATH   # prints the port
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import time
from pathlib import Path
from typing import Any

import uvicorn

from demo.llm_app import LlmApp, Pacing, Receive, Scope, Send, TimingLog, bind


class TlsApp:
    def __init__(self, inner: LlmApp, log: TimingLog) -> None:
        self.inner = inner
        self.log = log
        self.client = ssl.create_default_context()
        self.client.check_hostname = False
        self.client.verify_mode = ssl.CERT_NONE

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/upstream":
            await self.inner(scope, receive, send)
            return
        t_start = time.monotonic_ns()
        query = dict(
            kv.split("=", 1) for kv in scope["query_string"].decode().split("&") if "=" in kv
        )
        tp = next((bytes(v).decode() for k, v in scope["headers"] if k == b"traceparent"), None)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", int(query["port"]), ssl=self.client
        )
        writer.write(b"GET /plain?n=64 HTTP/1.1\r\nHost: up\r\nConnection: close\r\n\r\n")
        try:
            got = await reader.read()
        except ssl.SSLError:  # a peer that closes without close_notify
            got = b""
        writer.close()
        body = str(len(got)).encode()
        rec: dict[str, Any] = {"path": "/upstream", "traceparent": tp, "t_start_ns": t_start}
        rec["t_headers_ns"] = time.monotonic_ns()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
        )
        rec["t_writes_ns"] = [time.monotonic_ns()]
        await send({"type": "http.response.body", "body": body})
        self.log.write(rec)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--timing-log", type=Path, required=True)
    a = ap.parse_args()
    sock = bind("127.0.0.1", 0)
    log = TimingLog(a.timing_log)
    app = TlsApp(LlmApp(Pacing(60, 25, 8), a.timing_log), log)
    config = uvicorn.Config(
        app,
        http="httptools",
        lifespan="off",
        log_level="warning",
        access_log=False,
        ssl_certfile=a.cert,
        ssl_keyfile=a.key,
        timeout_graceful_shutdown=1,
    )
    print(sock.getsockname()[1], flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
