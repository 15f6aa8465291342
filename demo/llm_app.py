"""An LLM-style streaming app: the demo's chat backend and the test suites' token server.

Paced like a real model — a first-token wait, then tokens at a steady gap — over the three
transports chat UIs use: chunked fetch (``POST /v1/chat``), Server-Sent Events
(``GET /v1/stream``) and WebSocket (``GET /v1/ws``), plus a non-streaming ``GET /v1/complete``.
It is a plain ASGI app served by uvicorn, so it is also "an async Python app under uvicorn"
for the agent's tests.

What the stream says is the query's ``dialect``: ``none`` (the default: bare words, one write
each — chunk semantics, no LLM in sight), ``openai`` (Chat Completions SSE: a role-only first
delta, content deltas, a chunk with ``finish_reason``, the ``usage`` chunk when the request
asks with ``stream_options.include_usage`` — or ``include_usage=1`` on a GET — and
``data: [DONE]``) or ``anthropic`` (Messages SSE: ``message_start`` … ``message_stop``), over
fetch and SSE alike, byte for byte as demo/sse_events.py builds them from the vendors'
documentation; over WebSocket ``none`` or ``frames`` (a chat server's JSON token frames,
``{"token": …}`` … ``{"type": "done"}``). ``POST /v1/chat/completions`` and
``POST /v1/messages`` are the vendors' own paths (OpenAI, Anthropic), so their SDKs can read
the app. Every event is one write: Anthropic's ``message_start`` and ``ping`` with the head,
as it accepts a request; the role-only delta and ``content_block_start`` just before the first
token, as the model starts answering; the rest on the model's pace.

With ``--engine URL`` the app is also a thin gateway to a real OpenAI-compatible engine:
``POST /v1/engine/chat/completions`` forwards the body and ``traceparent`` to
``URL/v1/chat/completions`` and streams its answer back one write per upstream read.

It keeps its own clock, the way an app's own monitoring would: with ``--timing-log`` each
exchange appends one JSON line with CLOCK_MONOTONIC nanoseconds (the clock
``bpf_ktime_get_ns`` reads) — when the app got the request (``t_start_ns``), before the
header write (``t_headers_ns``) and before each body write (``t_writes_ns``; those carrying a
token also in ``t_tokens_ns``) — plus the ``traceparent`` it received and the ``dialect``.
Tests compare the agent's and the probe's figures against it.

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

import httpx
import uvicorn

from demo import sse_events
from parallax_contracts import trace_context

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ROOT = Path(__file__).resolve().parent.parent
STATIC = Path(__file__).resolve().parent / "static"
PROBE_JS = ROOT / "js_probe" / "dist" / "parallax.min.js"
# the probe's token reader, which it imports from next to itself on the first LLM stream
READER_JS = PROBE_JS.with_name("parallax-llm.min.js")
STATIC_JS = {"/" + f.name: f for f in (PROBE_JS, READER_JS)}
_TEXT = (
    "Latency is what the user waits for, not what the server logs. Each token crosses the "
    "kernel, the network, a proxy or two, and the browser's event loop before it is painted."
)
WORDS = tuple(_TEXT.split(" "))
MAX_TOKENS = 10_000
MODEL = "parallax-demo"  # the model id the dialect streams name
HTTP_DIALECTS = ("none", "openai", "anthropic")
WS_DIALECTS = ("none", "frames")
# the vendors' own paths: their SDKs post there, and the path names the dialect
VENDOR_PATHS = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}
ENGINE_PATH = "/v1/engine/chat/completions"
STREAMS = {"/v1/chat": "POST", "/v1/stream": "GET", **dict.fromkeys(VENDOR_PATHS, "POST")}
MAX_BODY = 1 << 20  # a prompt larger than this is refused (413), not buffered


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


class RefusedError(ValueError):
    """A request the app refuses with 4xx; the message is the one-line answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Plan:
    """One answer's writes: ``lead`` with the head (what a server says as it accepts the
    request), ``first`` just before the first token (what it says as the model starts
    answering), one write per token on the pacing schedule, ``tail`` right after the last."""

    ctype: str
    lead: list[bytes]
    first: list[bytes]
    tokens: list[bytes]
    tail: list[bytes]


def plan(dialect: str, sse: bool, n: int, usage: bool, prompt_tokens: int) -> Plan:
    """The writes of an ``n``-token answer in ``dialect`` (``sse``: over EventSource)."""
    ctype = "text/event-stream; charset=utf-8"
    if dialect == "openai":
        ev = sse_events.openai_chat(n, usage, words=token, model=MODEL, prompt_tokens=prompt_tokens)
        # the role-only delta comes with the model's first output (llama.cpp: 0.2–1.5 ms
        # before the first content; issue 31)
        return Plan(ctype, [], ev[:1], ev[1 : 1 + n], ev[1 + n :])
    if dialect == "anthropic":
        ev = sse_events.anthropic(0, n, words=token, model=MODEL, input_tokens=prompt_tokens)
        # message_start and a ping as the request is accepted, the text block's start with
        # the first token
        return Plan(ctype, ev[:2], ev[2:3], ev[3 : 3 + n], ev[3 + n :])
    if sse:
        words = [f"data: {token(i)}\n\n".encode() for i in range(n)]
        return Plan("text/event-stream", [], [], words, [b"event: done\ndata: [DONE]\n\n"])
    return Plan("text/plain; charset=utf-8", [], [], [token(i).encode() for i in range(n)], [])


def ws_messages(dialect: str, n: int) -> tuple[list[str], str]:
    """A WebSocket answer: one text message per token, then the end marker."""
    if dialect == "frames":
        dump = json.dumps
        return [dump({"token": token(i)}) for i in range(n)], dump({"type": "done"})
    return [token(i) for i in range(n)], "[DONE]"


def choose_dialect(query: dict[str, list[str]], allowed: tuple[str, ...], path: str) -> str:
    d = VENDOR_PATHS.get(path) or (query.get("dialect") or ["none"])[0]
    if d not in allowed:
        raise RefusedError(400, f"unknown dialect {d!r} here (one of: {', '.join(allowed)})")
    return d


def request_fields(body: bytes, query: dict[str, list[str]]) -> tuple[bool, int]:
    """(the usage chunk asked for, the prompt's tokens counted as words) from a JSON body
    (OpenAI's ``stream_options.include_usage``; the prompt from ``messages`` or ``prompt``)
    or, on a GET, the query (``include_usage=1``, ``prompt``)."""
    usage = (query.get("include_usage") or ["0"])[0] in ("1", "true")
    prompt = (query.get("prompt") or [""])[0]
    if body:
        try:
            doc = json.loads(body)
        except ValueError:
            raise RefusedError(400, "the request body is not JSON") from None
        if isinstance(doc, dict):
            opts = doc.get("stream_options")
            usage = usage or (isinstance(opts, dict) and opts.get("include_usage") is True)
            msgs = doc.get("messages")
            parts = [m.get("content") for m in msgs if isinstance(m, dict)] if msgs else []
            prompt = " ".join(p for p in [doc.get("prompt"), *parts] if isinstance(p, str))
    return usage, len(prompt.split())


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
        engine: str | None = None,
    ) -> None:
        self.pacing = pacing
        self.log = TimingLog(timing_log)
        self.block_ms = block_ms
        self.block_every_ms = block_every_ms
        self.engine = engine.rstrip("/") if engine else None
        self._blocker: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None

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
                if self.engine:
                    # an engine's answer may wait long in its queue: no read timeout
                    timeout = httpx.Timeout(None, connect=5.0)
                    self._client = httpx.AsyncClient(timeout=timeout)
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self._blocker:
                    self._blocker.cancel()
                if self._client:
                    await self._client.aclose()
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
        try:
            body = await _read_body(receive) if method in ("POST", "PUT") else b""
            await self._route(send, receive, rec, query, body, origin)
        except RefusedError as e:
            await self._respond(send, rec, e.status, f"{e}\n".encode(), "text/plain", origin)
        rec["status"] = rec.get("status", 0)
        self.log.write(rec)

    async def _route(
        self,
        send: Send,
        receive: Receive,
        rec: dict[str, Any],
        query: dict[str, list[str]],
        body: bytes,
        origin: str | None,
    ) -> None:
        path, method = rec["path"], rec["method"]
        pacing = self.pacing.override(query)
        if method == "OPTIONS":
            await self._respond(send, rec, 204, b"", "text/plain", origin, preflight=True)
        elif STREAMS.get(path) == method:
            dialect = choose_dialect(query, HTTP_DIALECTS, path)
            rec["dialect"] = dialect
            # bare words read nothing from the body: any client's bytes will do there
            usage, prompt_tokens = request_fields(body, query) if dialect != "none" else (False, 0)
            answer = plan(dialect, method == "GET", pacing.tokens, usage, prompt_tokens)
            await self._stream(send, receive, rec, pacing, origin, answer)
        elif path == ENGINE_PATH and method == "POST":
            await self._proxy(send, receive, rec, body, origin)
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
        elif path in STATIC_JS and method == "GET" and STATIC_JS[path].exists():
            js = STATIC_JS[path].read_bytes()
            await self._respond(send, rec, 200, js, "text/javascript", origin)
        elif path == "/favicon.ico":
            await self._respond(send, rec, 204, b"", "image/x-icon", origin)
        else:
            await self._respond(send, rec, 404, b"not found\n", "text/plain", origin)

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
        answer: Plan,
    ) -> None:
        rec["status"] = 200
        rec["t_headers_ns"] = time.monotonic_ns()
        rec["t_tokens_ns"] = []
        # Headers go out at once (as chat backends do); the body is paced like a model.
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": self._headers(answer.ctype, origin, []),
            }
        )
        for event in answer.lead:
            await self._write(send, rec, event)
        # After the request, the only message left is the client going away: stop
        # generating then, as a real backend cancels the model call.
        gone = asyncio.ensure_future(_until_disconnect(receive))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + pacing.first_token_ms / 1000
        # a dialect's empty answer still starts (its first events); bare words' has nothing
        steps = answer.tokens or ([b""] if answer.first else [])
        for i, piece in enumerate(steps):
            await asyncio.wait([gone], timeout=max(0.0, deadline - loop.time()))
            if gone.done():
                rec["client_gone"] = True
                return
            for event in answer.first if i == 0 else ():
                await self._write(send, rec, event)
            if piece:
                await self._write(send, rec, piece, token=True)
            deadline += pacing.token_gap_ms / 1000
        gone.cancel()
        for i, event in enumerate(answer.tail, 1):
            # the last event and the chunked coding's end leave in one write
            await self._write(send, rec, event, more=i < len(answer.tail))
        if not answer.tail:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _write(
        send: Send, rec: dict[str, Any], data: bytes, token: bool = False, more: bool = True
    ) -> None:
        """One body write, its time logged just before it (``t_tokens_ns`` too for a token)."""
        t = time.monotonic_ns()
        rec["t_writes_ns"].append(t)
        if token:
            rec["t_tokens_ns"].append(t)
        await send({"type": "http.response.body", "body": data, "more_body": more})

    async def _proxy(
        self, send: Send, receive: Receive, rec: dict[str, Any], body: bytes, origin: str | None
    ) -> None:
        """The thin gateway: the request to the engine as it came (body, ``traceparent``),
        its answer back one write per upstream read, so the engine's pacing reaches the user
        as the engine made it (plus this app's event loop, stalls included)."""
        if self._client is None or self.engine is None:
            raise RefusedError(503, "no engine behind this app (start it with --engine URL)")
        rec["upstream"] = self.engine
        headers = {"content-type": "application/json"}
        if rec["traceparent"]:
            headers["traceparent"] = rec["traceparent"]  # forwarded unchanged, as nginx does
        url = f"{self.engine}/v1/chat/completions"
        gone = asyncio.ensure_future(_until_disconnect(receive))
        try:
            async with self._client.stream("POST", url, content=body, headers=headers) as up:
                rec["status"] = up.status_code
                rec["t_headers_ns"] = time.monotonic_ns()
                ctype = up.headers.get("content-type", "application/octet-stream")
                await send(
                    {
                        "type": "http.response.start",
                        "status": up.status_code,
                        "headers": self._headers(ctype, origin, []),
                    }
                )
                async for data in up.aiter_raw():
                    if gone.done():
                        rec["client_gone"] = True  # leaving closes the engine's connection
                        return
                    await self._write(send, rec, data)
        except httpx.HTTPError as e:
            if "t_headers_ns" in rec:  # the head went out: all that is left is to stop
                rec["upstream_error"] = str(e) or type(e).__name__
                return
            raise RefusedError(502, f"the engine at {self.engine} failed: {e}") from None
        finally:
            gone.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # -- WebSocket -----------------------------------------------------------------------
    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        traceparent = (query.get("traceparent") or [None])[0]
        pacing = self.pacing.override(query)
        msg = await receive()
        try:
            dialect = choose_dialect(query, WS_DIALECTS, scope["path"])
        except RefusedError as e:
            # refused at the handshake: uvicorn answers 403; the reason goes to stderr
            print(f"llm_app: {e}", file=sys.stderr, flush=True)
            dialect = ""
        if msg["type"] != "websocket.connect" or scope["path"] != "/v1/ws" or not dialect:
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
                "dialect": dialect,
                "ws_seq": seq,
                "t_start_ns": time.monotonic_ns(),
                "t_writes_ns": [],
                "t_tokens_ns": [],
            }
            tokens, end = ws_messages(dialect, pacing.tokens)
            deadline = loop.time() + pacing.first_token_ms / 1000
            for text in tokens:
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                t = time.monotonic_ns()
                rec["t_writes_ns"].append(t)
                rec["t_tokens_ns"].append(t)
                await send({"type": "websocket.send", "text": text})
                deadline += pacing.token_gap_ms / 1000
            rec["t_writes_ns"].append(time.monotonic_ns())
            await send({"type": "websocket.send", "text": end})
            self.log.write(rec)


async def _read_body(receive: Receive) -> bytes:
    """The request body, whole (a prompt), refused past MAX_BODY."""
    parts: list[bytes] = []
    size, more = 0, True
    while more:
        msg = await receive()
        if msg["type"] != "http.request":
            break
        parts.append(msg.get("body", b""))
        size += len(parts[-1])
        if size > MAX_BODY:
            raise RefusedError(413, f"the request body is over {MAX_BODY} bytes")
        more = msg.get("more_body", False)
    return b"".join(parts)


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
    ap.add_argument(
        "--engine",
        metavar="URL",
        help=f"an OpenAI-compatible engine that {ENGINE_PATH} forwards to (http://host:port)",
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
        args.engine,
    )
    host, port = sock.getsockname()[:2]
    print(f"llm_app: listening on http://{host}:{port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        serve(app, sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
