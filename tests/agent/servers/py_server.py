"""Test server on Python's http.server (HTTP/1.1, keep-alive), with its own clock.

Each request appends one JSON line to the timing log: CLOCK_MONOTONIC when the read of the
request line returned (``t_read_ns``), before each write (``t_writes_ns``: the header write
first, then each body write), the path and the traceparent it received.

Routes: ``/plain?n=BYTES&delay_ms=D`` (Content-Length; with ``phase_ms=P&slow_ms=S`` the
delay alternates between D and S every P ms, on the monotonic clock),
``/stream?n=K&gap_ms=G`` (chunked, one write per chunk), ``/fetch?port=P`` (fetches
/plain from 127.0.0.1:P first: an outbound connection; ``&tls=1`` over TLS),
``/file?n=BYTES`` (the body by ``os.sendfile``, each call timed as a write). ``--nodelay``
sets TCP_NODELAY. ``--accept-delay-ms`` sleeps before each accept() (accept-queue test).
``--tls-cert``/``--tls-key``: HTTPS (each connection's handshake in its own thread; the
reads and writes go through OpenSSL's socket BIO, inside SSL_read_ex/SSL_write_ex).

    python -m tests.agent.servers.py_server --port 0 --timing-log PATH   # prints the port
"""

from __future__ import annotations

import argparse
import json
import socketserver
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

LOCK = threading.Lock()
LOG: Any = None
ACCEPT_DELAY_S = 0.0
TLS: ssl.SSLContext | None = None  # --tls-cert/--tls-key


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        if TLS is not None:  # the handshake here, in the connection's thread
            self.request = TLS.wrap_socket(self.request, server_side=True)
        super().setup()

    def handle_one_request(self) -> None:
        # stdlib's method, with the clock read right after the request line is read
        try:
            self.raw_requestline = self.rfile.readline(65537)
            self.t_read_ns = time.monotonic_ns()
            self.t_writes: list[int] = []
            if len(self.raw_requestline) > 65536:
                self.requestline = ""
                self.request_version = ""
                self.command = ""
                self.send_error(414)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
            self.do_any()
            self.wfile.flush()
        except TimeoutError:
            self.close_connection = True

    def _write(self, data: bytes) -> None:
        self.t_writes.append(time.monotonic_ns())
        self.wfile.write(data)

    def _headers(self, code: int, headers: list[tuple[str, str]]) -> None:
        self.send_response_only(code)
        for k, v in headers:
            self.send_header(k, v)
        # one write for the whole head, timed like the body writes
        buffered: list[bytes] = self._headers_buffer
        buffered.append(b"\r\n")
        data = b"".join(buffered)
        self._headers_buffer: list[bytes] = []
        self._write(data)

    def do_any(self) -> None:
        u = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        delay = float(q.get("delay_ms", 0)) / 1000
        if "phase_ms" in q:  # latency in phases: delay_ms, then slow_ms, each phase_ms long
            phase = float(q["phase_ms"]) / 1000
            if int(time.monotonic() / phase) % 2:
                delay = float(q.get("slow_ms", 0)) / 1000
        if delay:
            time.sleep(delay)
        if u.path == "/fetch":
            # a client of another server (as an app is of its database or LLM backend):
            # the agent must not follow this outbound connection
            import socket

            with socket.create_connection(("127.0.0.1", int(q["port"])), 5) as raw:
                up = raw
                if q.get("tls"):  # the app's own HTTPS call (a client SSL object)
                    client = ssl.create_default_context()
                    client.check_hostname = False
                    client.verify_mode = ssl.CERT_NONE
                    up = client.wrap_socket(raw)
                up.sendall(b"GET /plain?n=5 HTTP/1.0\r\nHost: x\r\n\r\n")
                got = b""
                try:
                    while d := up.recv(65536):
                        got += d
                except ssl.SSLEOFError:  # a peer that closes without close_notify
                    pass
            body = got.partition(b"\r\n\r\n")[2]
            self._headers(200, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            self._write(body)
        elif u.path == "/file":
            import os
            import tempfile

            n = int(q.get("n", 1 << 20))
            with tempfile.TemporaryFile() as f:
                f.write(b"f" * n)
                f.flush()
                self._headers(200, [("Content-Type", "text/plain"), ("Content-Length", str(n))])
                sent = 0
                while sent < n:
                    self.t_writes.append(time.monotonic_ns())
                    sent += os.sendfile(self.connection.fileno(), f.fileno(), sent, n - sent)
        elif u.path == "/stream":
            n, gap = int(q.get("n", 5)), float(q.get("gap_ms", 20)) / 1000
            self._headers(200, [("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked")])
            for i in range(n):
                if i:
                    time.sleep(gap)
                piece = f"token-{i}\n".encode()
                self._write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")  # the terminator carries no body
        else:
            body = b"x" * int(q.get("n", 10))
            self._headers(200, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            self._write(body)
        rec = {
            "path": u.path,
            "traceparent": self.headers.get("traceparent"),
            "t_read_ns": self.t_read_ns,
            "t_writes_ns": self.t_writes,
        }
        with LOCK:
            LOG.write(json.dumps(rec) + "\n")
            LOG.flush()


class Server(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True

    def get_request(self) -> Any:
        if ACCEPT_DELAY_S:
            time.sleep(ACCEPT_DELAY_S)
        return super().get_request()


def main() -> None:
    global LOG, ACCEPT_DELAY_S, TLS  # noqa: PLW0603  (a test server: module state is simplest)
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--timing-log", required=True)
    ap.add_argument("--accept-delay-ms", type=float, default=0)
    # load tests: without it, the head and body writes meet Nagle and the client's delayed
    # ACK (~25 requests/s per keep-alive connection)
    ap.add_argument("--nodelay", action="store_true")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    a = ap.parse_args()
    if a.tls_cert:
        TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        TLS.load_cert_chain(a.tls_cert, a.tls_key)
    Handler.disable_nagle_algorithm = a.nodelay
    LOG = open(a.timing_log, "a")  # noqa: SIM115
    ACCEPT_DELAY_S = a.accept_delay_ms / 1000
    srv = Server(("127.0.0.1", a.port), Handler)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
