"""The agent against what it does not anticipate, on a real kernel and server: a request
whose 5,000-digit Content-Length once killed it (int() raised on the head the cutter joins
from two reads), an exception while handling one event (injected: counted, logged once
without request bytes, that connection resynchronises, the agent goes on), and an exception
in the main loop (injected: in-flight records flushed, exit 1 with one line)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.helpers import PY, ROOT, Agent, Proc, http_request

pytestmark = pytest.mark.ebpf

FAULTS = ROOT / "tests" / "agent" / "faults"


def _faulty_agent(tmp: Path, port: int) -> Agent:
    env = [f"PYTHONPATH={FAULTS}{os.pathsep}{ROOT}", f"PARALLAX_TEST_FAULT_DIR={tmp}"]
    return Agent(tmp, [port], wrapper=["env", *env])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[int]:
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t")])
    try:
        yield srv.port()
    finally:
        srv.stop()


def test_huge_content_length_and_an_event_error_leave_the_agent_running(
    tmp_path: Path, server: int
) -> None:
    port = server
    agent = _faulty_agent(tmp_path, port)
    try:
        # one head over two writes: the cutter joins them past the 4 KB window
        head = b"GET /big HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"1" * 5000 + b"\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            s.sendall(head[:3000])
            time.sleep(0.3)
            s.sendall(head[3000:])
            time.sleep(0.5)
        http_request(port, b"GET /after-big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert agent.wait_for(lambda r: r["path"] == "/after-big"), agent.err.read_text()
        assert agent.p.poll() is None

        # an injected exception in the cutter, twice, on one keep-alive connection
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            for i in range(2):
                http_request(port, b"GET /boom HTTP/1.1\r\nCookie: s3cret-cookie\r\n\r\n", s)
                http_request(port, f"GET /after-boom-{i} HTTP/1.1\r\n\r\n".encode(), s)
        # that connection resynchronised at the request after each failed one
        got = agent.wait_for(lambda r: r["path"].startswith("/after-boom"), count=2)
        assert sorted(r["path"] for r in got) == ["/after-boom-0", "/after-boom-1"]
        name = "parallax_agent_event_errors_total"
        assert agent.wait_metric(name, lambda v: v >= 2) == 2
        assert agent.p.poll() is None
    finally:
        rc = agent.stop()
    err = agent.err.read_text()
    assert rc == 0, err[-2000:]
    assert err.count("could not be handled (ValueError at sitecustomize.py:") == 1, err
    assert "s3cret" not in err and "/boom" not in err and "Traceback" not in err, err
    assert not [r for r in agent.records() if r["path"] in ("/boom", "/big")]


def test_an_error_in_the_main_loop_flushes_and_exits_1_with_one_line(
    tmp_path: Path, server: int
) -> None:
    port = server
    agent = _faulty_agent(tmp_path, port)
    try:
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            s.settimeout(5)
            s.sendall(b"GET /stream?n=100&gap_ms=100 HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while b"token-0" not in got:  # the head and the first token: one recv or two
                chunk = s.recv(65536)
                assert chunk, got
                got += chunk
            time.sleep(0.3)
            (tmp_path / "fail-loop").touch()
            rc = agent.p.wait(15)
    finally:
        agent.stop()
    err = agent.err.read_text()
    assert rc == 1, err[-2000:]
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("parallax-agent: stopped by an internal error (RuntimeError at"), err
    assert last.endswith("the records in flight were flushed"), err
    [rec] = [r for r in agent.records() if r["path"] == "/stream"]
    assert rec["partial"] is True and rec["chunks"] >= 1, rec
