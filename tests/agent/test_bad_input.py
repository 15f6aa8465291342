"""Bad input and odd connections against a real server with the agent attached: garbage,
non-HTTP, a 64 KB request line, malformed traceparents, a client gone mid-stream, and a
connection opened before the agent started. No crash, no false record; the stream's record
ends. Also the agent's own surfaces: /metrics, /readyz, SIGTERM → exit 0."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import PY, ROOT, Agent, Proc, http_request, tracepoints

pytestmark = pytest.mark.ebpf


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[int, Agent, socket.socket]]:
    tmp = tmp_path_factory.mktemp("bad")
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp / "t.jsonl")])
    port = srv.port()
    # a keep-alive connection (with one request served) that exists before the agent starts
    old = socket.create_connection(("127.0.0.1", port), 5)
    http_request(port, b"GET /before HTTP/1.1\r\nHost: x\r\n\r\n", sock=old)
    try:
        agent = Agent(
            tmp, [port], ["--service-name", f"{port}=bad-input-svc", "--stream-limit-s", "1"]
        )
    except Exception:
        srv.stop()
        raise
    yield port, agent, old
    old.close()
    rc = agent.stop()
    stray = [r for r in agent.records() if r["local_port"] != port]
    assert not stray, stray[:3]  # only the traced server, nothing else on the node
    srv.stop()
    assert rc == 0, agent.err.read_text()[-2000:]
    assert "Traceback" not in agent.err.read_text()


def _send_raw(port: int, data: bytes, wait: float = 0.3) -> bytes:
    with socket.create_connection(("127.0.0.1", port), 5) as s:
        s.settimeout(2)
        s.sendall(data)
        time.sleep(wait)
        s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while d := s.recv(65536):
                out += d
        except OSError:
            pass
        return out


def test_connection_from_before_the_agent_is_picked_up(
    env: tuple[int, Agent, socket.socket],
) -> None:
    port, agent, old = env
    # The server thread was already blocked in recv() when the probes attached. The socket
    # hooks see that read as it completes (sock_recv_length fires inside it), so its request
    # is recorded; on the syscall hooks its entry was never seen and the connection is
    # picked up from its next read on.
    http_request(port, b"GET /in-flight HTTP/1.1\r\nHost: x\r\n\r\n", sock=old)
    ctx = trace_context.generate()
    http_request(
        port,
        f"GET /after HTTP/1.1\r\nHost: x\r\ntraceparent: {ctx.header()}\r\n\r\n".encode(),
        sock=old,
    )
    [r] = agent.wait_for(lambda r: r["path"] == "/after")
    assert r["trace_id"] == ctx.trace_id and r["ttfb_us"] is not None
    assert r["service"] == "bad-input-svc"
    mine = [x for x in agent.records() if x["peer_port"] == old.getsockname()[1]]
    syscalls = any(t.startswith("sys_e") for t in tracepoints(agent))
    assert [x["path"] for x in mine] == (["/after"] if syscalls else ["/in-flight", "/after"])
    assert all(x["accept_queue_us"] is None for x in mine)  # accepted before the agent


def test_garbage_non_http_and_huge_request_line_make_no_record(
    env: tuple[int, Agent, socket.socket],
) -> None:
    port, agent, _ = env
    before = len(agent.records())
    _send_raw(port, os.urandom(2000))
    _send_raw(port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(500))  # TLS
    _send_raw(port, b"SSH-2.0-OpenSSH_9.2\r\n")
    _send_raw(port, b"GET /" + b"a" * 65536 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    ctx = trace_context.generate()
    http_request(
        port,
        f"GET /sentinel HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n"
        "Connection: close\r\n\r\n".encode(),
    )
    agent.wait_for(lambda r: r["path"] == "/sentinel")
    new = agent.records()[before:]
    assert [r["path"] for r in new] == ["/sentinel"], new
    metrics = (
        urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=5)
        .read()
        .decode()
    )
    label = f'parallax_agent_unparsed_connections_total{{port="{port}"}}'
    unparsed = [ln for ln in metrics.splitlines() if ln.startswith(label)]
    assert unparsed and float(unparsed[0].split()[-1]) >= 3, metrics


@pytest.mark.parametrize(
    "tp",
    [
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",
        "zz-not-a-traceparent",
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
    ],
)
def test_malformed_traceparent_gives_a_fresh_trace(
    env: tuple[int, Agent, socket.socket], tp: str
) -> None:
    port, agent, _ = env
    path = f"/tp{abs(hash(tp)) % 10**8}"
    http_request(
        port, f"GET {path} HTTP/1.1\r\ntraceparent: {tp}\r\nConnection: close\r\n\r\n".encode()
    )
    [r] = agent.wait_for(lambda r: r["path"] == path)
    assert r["parent_span_id"] is None
    assert trace_context.is_valid_trace_id(r["trace_id"])
    assert r["trace_id"] not in tp.lower()


def test_client_gone_mid_stream_ends_the_record(env: tuple[int, Agent, socket.socket]) -> None:
    port, agent, _ = env
    ctx = trace_context.generate()
    s = socket.create_connection(("127.0.0.1", port), 5)
    s.sendall(
        f"GET /stream?n=40&gap_ms=20 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n\r\n".encode()
    )
    s.recv(200)
    time.sleep(0.1)
    s.close()  # the server notices at a later write and closes
    [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id, timeout=10)
    assert r["client_aborted"] is True
    assert 1 <= r["chunks"] < 40


def test_readyz_healthz(env: tuple[int, Agent, socket.socket]) -> None:
    _, agent, _ = env
    for path in ("/readyz", "/healthz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}{path}", timeout=5) as r:
            assert r.status == 200


def test_not_root_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            PY,
            "-m",
            "agent.cli",
            "run",
            "--port",
            "1",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "root" in lines[0], p.stderr


def test_stream_over_the_limit_gives_a_partial_then_the_final_record(
    env: tuple[int, Agent, socket.socket],
) -> None:
    port, agent, _ = env  # this module's agent runs with --stream-limit-s 1
    ctx = trace_context.generate()
    head = f"GET /stream?n=8&gap_ms=250 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n"
    resp = http_request(port, (head + "Connection: close\r\n\r\n").encode())
    assert resp.endswith(b"0\r\n\r\n")
    recs = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id, count=2)
    partial = [r for r in recs if r["partial"]]
    final = [r for r in recs if not r["partial"]]
    assert len(partial) >= 1 and len(final) == 1, recs
    assert 1 <= partial[0]["chunks"] < 8 and final[0]["chunks"] == 8
    assert partial[0]["duration_us"] >= 1_000_000 > final[0]["duration_us"] - 1_700_000
    assert partial[0]["span_id"] != final[0]["span_id"]


# A server that answers before any request: what Node's HTTP server does when a
# connection's request does not come in time (408), and others on an idle connection.
_GREETER = """
import socket
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(16)
print(ls.getsockname()[1], flush=True)
while True:
    c, _ = ls.accept()
    c.sendall(b"HTTP/1.1 408 Request Timeout\\r\\nContent-Length: 0\\r\\n\\r\\n")
    c.close()
"""


def test_a_response_without_its_request_is_counted_not_recorded(tmp_path: Path) -> None:
    srv = Proc([PY, "-c", _GREETER])
    try:
        port = srv.port()
        agent = Agent(tmp_path, [port])
        try:
            for _ in range(3):
                assert _send_raw(port, b"", wait=0.05).startswith(b"HTTP/1.1 408")
            name = 'parallax_agent_http1_unframed_total{reason="unmatched_response"}'
            got = agent.wait_metric(name, lambda v: v >= 3)
            assert got == 3, agent.metrics()
            assert agent.metrics()['parallax_agent_http1_unframed_total{reason="desync"}'] == 0
        finally:
            rc = agent.stop()
    finally:
        srv.stop()
    assert rc == 0, agent.err.read_text()[-2000:]
    assert agent.records() == []
