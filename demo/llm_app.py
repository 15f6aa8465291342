"""An LLM-style streaming app: the demo's chat backend and the test suites' token server.

Paced like a real model — a first-token wait, then tokens at a steady gap — over the three
transports chat UIs use: chunked fetch (``POST /v1/chat``), Server-Sent Events
(``GET /v1/stream``) and WebSocket (``GET /v1/ws``), plus a non-streaming ``GET /v1/complete``.
It is a plain ASGI app served by uvicorn, so it is also "an async Python app under uvicorn"
for the agent's tests.

It keeps its own clock, the way an app's own monitoring would: with ``--timing-log`` each
exchange appends one JSON line with CLOCK_MONOTONIC nanoseconds (the clock
``bpf_ktime_get_ns`` reads) — when the app got the request (``t_start_ns``), before the
header write (``t_headers_ns``) and before each body write (``t_writes_ns``) — plus the
``traceparent`` it received. Tests compare the agent's and the probe's figures against it.

Injected faults for the latency-trap scenarios: ``--block-ms B --block-every-ms P`` blocks
the event loop for B ms every P ms (the "server logs say fast" trap: requests wait in the
kernel's receive queue while the app's own timings look unchanged).

    python -m demo.llm_app --port 8000 --first-token-ms 300 --token-gap-ms 40 --tokens 24
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qs

import uvicorn

from parallax_contracts import trace_context

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ROOT = Path(__file__).resolve().parent.parent
STATIC = Path(__file__).resolve().parent / "static"
PROBE_JS = ROOT / "js_probe" / "dist" / "parallax.min.js"
_TEXT = (
    "Latency is what the user waits for, not what the server logs. Each token crosses the "
    "kernel, the network, a proxy or two, and the browser's event loop before it is painted."
)
WORDS = tuple(_TEXT.split(" "))
MAX_TOKENS = 10_000


@dataclass(frozen=True, slots=True)
class Pacing:
    first_token_ms: float = 300.0
    token_gap_ms: float = 40.0
    tokens: int = 24

    def override(self, query: dict[str, list[str]]) -> Pacing:
        """Per-request pacing from the query string (tests choose their ground truth)."""
        p = self
        try:
            if "first_token_ms" in query:
                p = replace(p, first_token_ms=max(0.0, float(query["first_token_ms"][0])))
            if "token_gap_ms" in query:
                p = replace(p, token_gap_ms=max(0.0, float(query["token_gap_ms"][0])))
            if "tokens" in query:
                p = replace(p, tokens=max(0, min(MAX_TOKENS, int(query["tokens"][0]))))
        except ValueError:
            return self
        return p


def token(i: int) -> str:
    return WORDS[i % len(WORDS)] + " "


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k.lower() == name:
            return bytes(v).decode("latin-1")
    return None


class TimingLog:
    """Append-only JSONL, flushed per line so a test reading it never sees half a record."""

    def __init__(self, path: Path | None) -> None:
        self._f: TextIO | None = path.open("a", buffering=1) if path else None

    def write(self, record: dict[str, Any]) -> None:
        if self._f is not None:
            self._f.write(json.dumps(record, separators=(",", ":")) + "\n")


class LlmApp:
    def __init__(
        self,
        pacing: Pacing,
        timing_log: Path | None = None,
        block_ms: float = 0.0,
        block_every_ms: float = 0.0,
    ) -> None:
        self.pacing = pacing
        self.log = TimingLog(timing_log)
        self.block_ms = block_ms
        self.block_every_ms = block_every_ms
        self._blocker: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)

    # -- lifespan: the event-loop blocker ---------------------------------------------
    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                if self.block_ms > 0 and self.block_every_ms > 0:
                    self._blocker = asyncio.create_task(self._block_loop())
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self._blocker:
                    self._blocker.cancel()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _block_loop(self) -> None:
        while True:
            await asyncio.sleep(self.block_every_ms / 1000)
            time.sleep(self.block_ms / 1000)  # deliberately blocks the whole loop

    # -- HTTP --------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        t_start = time.monotonic_ns()
        path: str = scope["path"]
        method: str = scope["method"]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        traceparent = _header(scope, b"traceparent") or (query.get("traceparent") or [None])[0]
        origin = _header(scope, b"origin")
        rec: dict[str, Any] = {
            "kind": "http",
            "method": method,
            "path": path,
            "traceparent": traceparent,
            "t_start_ns": t_start,
            "t_writes_ns": [],
        }
        # Drain the request body (POST /v1/chat carries the prompt; its content is unused).
        more = method in ("POST", "PUT")
        while more:
            msg = await receive()
            more = msg.get("more_body", False) and msg["type"] == "http.request"
        pacing = self.pacing.override(query)
        if method == "OPTIONS":
            await self._respond(send, rec, 204, b"", "text/plain", origin, preflight=True)
        elif path == "/v1/chat" and method == "POST":
            await self._stream(send, receive, rec, pacing, origin, sse=False)
        elif path == "/v1/stream" and method == "GET":
            await self._stream(send, receive, rec, pacing, origin, sse=True)
        elif path == "/v1/complete" and method == "GET":
            await asyncio.sleep((pacing.first_token_ms + pacing.token_gap_ms * pacing.tokens) / 1e3)
            body = json.dumps({"text": "".join(token(i) for i in range(pacing.tokens))}).encode()
            await self._respond(send, rec, 200, body, "application/json", origin)
        elif path in ("/", "/index.html") and method == "GET":
            html = (STATIC / "chat.html").read_bytes()
            # the page load's trace, named as an instrumented app does (Server-Timing: the
            # browser sends no traceparent for a navigation; the probe reads this one)
            page_trace = trace_context.generate().header()
            await self._respond(
                send, rec, 200, html, "text/html; charset=utf-8", origin, page_trace=page_trace
            )
        elif path == "/parallax.min.js" and method == "GET" and PROBE_JS.exists():
            js = PROBE_JS.read_bytes()
            await self._respond(send, rec, 200, js, "text/javascript", origin)
        elif path == "/favicon.ico":
            await self._respond(send, rec, 204, b"", "image/x-icon", origin)
        else:
            await self._respond(send, rec, 404, b"not found\n", "text/plain", origin)
        rec["status"] = rec.get("status", 0)
        self.log.write(rec)

    @staticmethod
    def _headers(
        ctype: str, origin: str | None, extra: list[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        h = [
            (b"content-type", ctype.encode()),
            (b"cache-control", b"no-store"),
            # Cross-origin pages may send traceparent and read the timings (docs/probe.md).
            (b"timing-allow-origin", b"*"),
            *extra,
        ]
        if origin:
            h += [
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"vary", b"origin"),
            ]
        return h

    async def _respond(
        self,
        send: Send,
        rec: dict[str, Any],
        status: int,
        body: bytes,
        ctype: str,
        origin: str | None,
        preflight: bool = False,
        page_trace: str | None = None,
    ) -> None:
        extra = []
        if preflight:
            extra = [
                (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                (b"access-control-allow-headers", b"traceparent, content-type"),
                (b"access-control-max-age", b"86400"),  # pay the preflight once a day
            ]
        dur_ms = (time.monotonic_ns() - rec["t_start_ns"]) / 1e6
        timing = f"app;dur={dur_ms:.3f}"
        if page_trace:
            timing += f', traceparent;desc="{page_trace}"'
        extra.append((b"server-timing", timing.encode()))
        extra.append((b"content-length", str(len(body)).encode()))
        rec["status"] = status
        rec["t_headers_ns"] = time.monotonic_ns()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": self._headers(ctype, origin, extra),
            }
        )
        if body:
            rec["t_writes_ns"].append(time.monotonic_ns())
        await send({"type": "http.response.body", "body": body})

    async def _stream(
        self,
        send: Send,
        receive: Receive,
        rec: dict[str, Any],
        pacing: Pacing,
        origin: str | None,
        sse: bool,
    ) -> None:
        ctype = "text/event-stream" if sse else "text/plain; charset=utf-8"
        rec["status"] = 200
        rec["t_headers_ns"] = time.monotonic_ns()
        # Headers go out at once (as chat backends do); the body is paced like a model.
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": self._headers(ctype, origin, []),
            }
        )
        # After the request, the only message left is the client going away: stop
        # generating then, as a real backend cancels the model call.
        gone = asyncio.ensure_future(_until_disconnect(receive))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + pacing.first_token_ms / 1000
        for i in range(pacing.tokens):
            await asyncio.wait([gone], timeout=max(0.0, deadline - loop.time()))
            if gone.done():
                rec["client_gone"] = True
                return
            piece = f"data: {token(i)}\n\n" if sse else token(i)
            rec["t_writes_ns"].append(time.monotonic_ns())
            await send({"type": "http.response.body", "body": piece.encode(), "more_body": True})
            deadline += pacing.token_gap_ms / 1000
        gone.cancel()
        tail = b"event: done\ndata: [DONE]\n\n" if sse else b""
        if tail:
            rec["t_writes_ns"].append(time.monotonic_ns())
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    # -- WebSocket -----------------------------------------------------------------------
    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        traceparent = (query.get("traceparent") or [None])[0]
        pacing = self.pacing.override(query)
        msg = await receive()
        if msg["type"] != "websocket.connect" or scope["path"] != "/v1/ws":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "websocket.accept"})
        seq = 0
        loop = asyncio.get_running_loop()
        while True:
            msg = await receive()
            if msg["type"] == "websocket.disconnect":
                return
            if msg["type"] != "websocket.receive":
                continue
            seq += 1  # exchange numbering shared with the agent and the probe: 1, 2, 3, ...
            rec: dict[str, Any] = {
                "kind": "websocket",
                "path": scope["path"],
                "traceparent": traceparent,
                "ws_seq": seq,
                "t_start_ns": time.monotonic_ns(),
                "t_writes_ns": [],
            }
            deadline = loop.time() + pacing.first_token_ms / 1000
            for i in range(pacing.tokens):
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                rec["t_writes_ns"].append(time.monotonic_ns())
                await send({"type": "websocket.send", "text": token(i)})
                deadline += pacing.token_gap_ms / 1000
            rec["t_writes_ns"].append(time.monotonic_ns())
            await send({"type": "websocket.send", "text": "[DONE]"})
            self.log.write(rec)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only then, and
    # Nagle belongs to the twin that asks for it (--nagle), not to every demo route
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def keep_nagle() -> None:
    """Leave Nagle's algorithm on for every connection asyncio accepts, as many servers and
    proxies do. (asyncio sets TCP_NODELAY only on sockets made with proto IPPROTO_TCP; this
    app's listening socket was once made with proto 0, so on Python 3.11 every route ran with
    Nagle on — the agent found that in the demo: P95 6–15 ms held. :func:`bind` now asks for
    IPPROTO_TCP, and this turns Nagle back on for the twin only.) A token written while the
    previous one is unacknowledged waits for the client's ACK — delayed up to 40 ms by a
    client that has just sent (a WebSocket prompt) — and tokens leave in bursts (the demo's
    holdback trap)."""
    asyncio.base_events._set_nodelay = lambda sock: None  # type: ignore[attr-defined]


def serve(app: LlmApp, sock: socket.socket) -> None:
    config = uvicorn.Config(
        app,
        http="httptools",
        ws="websockets-sansio",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m demo.llm_app",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed)")
    ap.add_argument("--first-token-ms", type=float, default=300.0)
    ap.add_argument("--token-gap-ms", type=float, default=40.0)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--timing-log", type=Path, help="append one JSON line per exchange")
    ap.add_argument("--block-ms", type=float, default=0.0, help="block the event loop B ms ...")
    ap.add_argument("--block-every-ms", type=float, default=0.0, help="... every P ms")
    ap.add_argument(
        "--nagle", action="store_true", help="leave Nagle's algorithm on (no TCP_NODELAY)"
    )
    args = ap.parse_args(argv)
    if args.nagle:
        keep_nagle()
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        print(f"llm_app: cannot listen on {args.host}:{args.port}: {e.strerror}", file=sys.stderr)
        return 1
    app = LlmApp(
        Pacing(args.first_token_ms, args.token_gap_ms, args.tokens),
        args.timing_log,
        args.block_ms,
        args.block_every_ms,
    )
    host, port = sock.getsockname()[:2]
    print(f"llm_app: listening on http://{host}:{port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        serve(app, sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
