"""The delaying relay adds its configured one-way delay in each direction, in order."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest


def _start(args: list[str], ready: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert ready in line, line
    return p, line


@pytest.fixture
def echo_server() -> Iterator[int]:
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(10)
    port = srv.getsockname()[1]
    import threading

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield port
    srv.close()


def test_round_trip_pays_twice_the_one_way_delay(echo_server: int) -> None:
    relay, line = _start(
        [
            "demo.relay",
            "--upstream",
            f"127.0.0.1:{echo_server}",
            "--delay-ms",
            "30",
            "--jitter-ms",
            "5",
        ],
        "relay: listening on",
    )
    try:
        port = int(line.split()[3].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            rtts = []
            for i in range(5):
                t0 = time.monotonic()
                msg = f"ping {i}".encode()
                c.sendall(msg)
                got = b""
                while len(got) < len(msg):
                    got += c.recv(4096)
                rtts.append((time.monotonic() - t0) * 1000)
                assert got == msg
        # 2 × 30 ms one way, plus up to 2 × 5 ms jitter, plus scheduling slack on a busy box
        assert all(60 <= r <= 70 + 25 for r in rtts), rtts
    finally:
        relay.terminate()
        relay.wait(timeout=10)
