"""A server that replays each LLM dialect's documented event sequence (demo/sse_events.py)
as the vendors' endpoints stream it, for their real client libraries: POST
/v1/chat/completions (OpenAI chat), /v1/responses (OpenAI Responses), /v1/messages
(Anthropic), /api/chat (Ollama NDJSON), /generate_stream (TGI), /csv (a plain chunked
download), and WebSocket /v1/realtime (OpenAI Realtime messages; permessage-deflate when the
client offers it). One write per event, paced; the query string shapes a stream:
``tokens``, ``gap_ms``, ``stall_at`` + ``stall_ms`` (one long gap before that event),
``reasoning``,
``error`` (Anthropic: an error event instead of the end), ``cut`` (close without the final
event), ``first_ms`` (the wait before the first event). For a page on another origin (the
probe's browser tests) it answers CORS preflights and sends ``Access-Control-Allow-Origin``
and ``Timing-Allow-Origin: *``; GET /v1/chat/completions streams the chat dialect too (an
EventSource cannot POST). Each stream's write times
(CLOCK_MONOTONIC ns) go to the timing log named on the command line, with the request's
traceparent; prints its ports (HTTP, WebSocket), one per line."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from demo import sse_events as ev

LOG_LOCK = threading.Lock()
LOG: list[Path] = []  # the timing log, when one is named


def log(rec: dict[str, Any]) -> None:
    if not LOG:
        return
    with LOG_LOCK, LOG[0].open("a") as f:
        f.write(json.dumps(rec) + "\n")


def _int(q: dict[str, list[str]], k: str, default: int) -> int:
    return int(q[k][0]) if k in q else default


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_OPTIONS(self) -> None:
        """A CORS preflight from a page on another origin (the SDKs send their own headers)."""
        self.send_response(204)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Access-Control-Allow-Methods", "GET, POST")
        asked = self.headers.get("Access-Control-Request-Headers")
        self.send_header("Access-Control-Allow-Headers", asked or "*")
        self.send_header("Access-Control-Max-Age", "86400")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        t_read = time.monotonic_ns()
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}") if n else {}
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        tokens = _int(q, "tokens", 20)
        path = url.path
        if path == "/v1/chat/completions":
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = ev.openai_chat(tokens, usage, _int(q, "reasoning", 0))
            self._stream("text/event-stream", events, q, t_read)
        elif path == "/v1/responses":
            events = ev.responses(_int(q, "reasoning", 0), tokens, failed="failed" in q)
            self._stream("text/event-stream", events, q, t_read)
        elif path == "/v1/messages":
            err = q.get("error", [None])[0]
            events = ev.anthropic(_int(q, "reasoning", 0), tokens, error=err)
            self._stream("text/event-stream", events, q, t_read)
        elif path == "/api/chat":
            events = [line + b"\n" for line in ev.ollama(tokens)]
            self._stream("application/x-ndjson", events, q, t_read)
        elif path == "/generate_stream":
            self._stream("text/event-stream", ev.tgi(tokens), q, t_read)
        else:
            self.send_error(404)

    def do_GET(self) -> None:
        t_read = time.monotonic_ns()
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        if url.path == "/csv":
            rows = [b"id,value\n"] + [b"%d,%d\n" % (i, i * i) for i in range(_int(q, "rows", 20))]
            self._stream("text/csv", rows, q, t_read)
        elif url.path == "/v1/chat/completions":  # an EventSource's GET
            events = ev.openai_chat(_int(q, "tokens", 20), "usage" in q, _int(q, "reasoning", 0))
            self._stream("text/event-stream", events, q, t_read)
        else:
            self.send_error(404)

    def _stream(
        self, ctype: str, events: list[bytes], q: dict[str, list[str]], t_read: int
    ) -> None:
        gap = _int(q, "gap_ms", 5) / 1000
        stall_at, stall = _int(q, "stall_at", -1), _int(q, "stall_ms", 0) / 1000
        cut = "cut" in q
        if cut:
            events = events[: max(1, len(events) - 3)]
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Timing-Allow-Origin", "*")
        self.end_headers()
        self.wfile.flush()
        time.sleep(_int(q, "first_ms", 0) / 1000)
        writes = []
        try:
            for i, e in enumerate(events):
                if i:
                    time.sleep(stall if i == stall_at else gap)
                writes.append(time.monotonic_ns())
                self.wfile.write(b"%x\r\n%s\r\n" % (len(e), e))
                self.wfile.flush()
            if not cut:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except OSError:
            pass  # the client left
        finally:
            log(
                {
                    "path": self.path,
                    "traceparent": self.headers.get("traceparent"),
                    "t_read_ns": t_read,
                    "t_writes_ns": writes,
                }
            )
        if cut:
            self.close_connection = True


async def realtime(ws: Any) -> None:
    """Each client message starts a response: the Realtime events for it."""
    async for msg in ws:
        req = json.loads(msg)
        tokens = int(req.get("tokens", 5))
        writes = []
        for m in ev.realtime(tokens):
            writes.append(time.monotonic_ns())
            await ws.send(m.decode())
            await asyncio.sleep(0.005)
        log({"path": "/v1/realtime", "t_writes_ns": writes})


def main() -> None:
    if len(sys.argv) > 1:
        LOG.append(Path(sys.argv[1]))
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    # TCP_NODELAY as real servers set it: one segment per event
    srv.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    import websockets.asyncio.server as wss

    async def serve_ws() -> None:
        async with wss.serve(realtime, "127.0.0.1", 0) as server:
            port = next(iter(server.sockets)).getsockname()[1]
            print(srv.server_address[1], flush=True)
            print(port, flush=True)
            await asyncio.Future()

    threading.Thread(target=srv.serve_forever, daemon=True).start()
    asyncio.run(serve_ws())


if __name__ == "__main__":
    main()
