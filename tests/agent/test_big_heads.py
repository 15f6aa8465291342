"""Response heads larger than a few hundred bytes (Set-Cookie, CSP) are common; a server
that writes head and body in one write (Node, Go, nginx) must still give a complete record."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.helpers import Agent, http_request

pytestmark = pytest.mark.ebpf

BIG = "x" * 1500  # a 1.5 KB header, as a long Content-Security-Policy would be
RESPONSES = {
    b"/cl": (f"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Policy: {BIG}\r\n\r\nhello".encode()),
    b"/chunked": (
        f"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Policy: {BIG}\r\n\r\n"
        "5\r\nhello\r\n0\r\n\r\n".encode()
    ),
}


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """Keep-alive server answering each request with ONE write of head and body."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(30)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while True:
                    data = conn.recv(65536)
                    if not data:
                        break
                    buf += data
                    while b"\r\n\r\n" in buf:
                        head, buf = buf.split(b"\r\n\r\n", 1)
                        path = head.split(b" ", 2)[1]
                        conn.sendall(RESPONSES.get(path, RESPONSES[b"/cl"]))

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def test_big_head_in_one_write(server: int, tmp_path: Path) -> None:
    agent = Agent(tmp_path, [server])
    try:
        with socket.create_connection(("127.0.0.1", server), 5) as s:
            for path in ("/cl", "/chunked", "/cl"):
                req = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
                http_request(server, req, sock=s)
            # the connection stays open: each record must end by its own framing
            recs = agent.wait_for(lambda r: r["local_port"] == server, 3)
            assert [r["path"] for r in recs] == ["/cl", "/chunked", "/cl"], recs
            for r in recs:
                assert r["status"] == 200
                assert r["chunks"] == 1 and r["ttft_us"] is not None, r
                assert not r.get("client_aborted"), r
    finally:
        agent.stop()
