"""The socket-hook path, the default on x86-64 from Linux 6.3: what it attaches (no syscall
tracepoint: those slow every syscall of every process on the node), and what it sees that
the syscall path saw from the syscall itself (accept times from libc, sendfile pieces)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import (
    PY,
    Agent,
    Proc,
    http_request,
    tracepoints,
    uprobes,
    wait_log,
)

pytestmark = pytest.mark.ebpf


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Agent, Path]]:
    tmp = tmp_path_factory.mktemp("hooks")
    log = tmp / "t.jsonl"
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(log)])
    port = srv.port()
    try:
        agent = Agent(tmp, [port])
    except Exception:
        srv.stop()
        raise
    yield port, agent, log
    rc = agent.stop()
    srv.stop()
    assert rc == 0


@pytest.mark.skipif(not shutil.which("node"), reason="needs node (make setup)")
def test_event_loop_server_gets_no_write_start_hook(tmp_path: Path) -> None:
    """Node's sockets are non-blocking: its writes never wait for buffer space, so the hook
    that would run for every TCP write on the node is never attached — and its records
    are complete without it."""
    srv = Proc(["node", "tests/agent/servers/node_server.mjs", "0", str(tmp_path / "t.jsonl")])
    port = srv.port()
    agent = Agent(tmp_path, [port])
    try:
        ctx = trace_context.generate()
        for _ in range(3):
            http_request(
                port,
                f"GET /plain?n=5 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n"
                "Connection: close\r\n\r\n".encode(),
            )
        recs = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id, count=3)
        assert len(recs) == 3 and all(r["ttft_us"] is not None for r in recs)
        time.sleep(1.5)  # the agent looks at the kernel's counters each second
        assert "tcp_sendmsg_locked" not in tracepoints(agent)
        assert "timing write starts" not in agent.err.read_text()
    finally:
        agent.stop()
        srv.stop()


def _server_log(log: Path, traceparent: str) -> dict[str, object]:
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        if rec["traceparent"] == traceparent:
            return dict(rec)
    raise AssertionError(f"server logged no request with {traceparent}")


def test_no_syscall_tracepoint_is_attached(stack: tuple[int, Agent, Path]) -> None:
    port, agent, _ = stack
    ready = next(ln for ln in agent.err.read_text().splitlines() if "attached" in ln)
    assert "socket hooks" in ready
    names = tracepoints(agent)
    assert {"sock_recv_length", "sock_send_length", "inet_sock_set_state"} <= names
    assert not [n for n in names if n.startswith(("sys_enter", "sys_exit"))]
    # srtt comes from the socket at each request (its offset from the kernel's BTF), not
    # from tcp_probe, which would run for every segment of every socket on the node
    assert "tcp_probe" not in names
    # accept times come from return probes on the server's libc (accept, accept4), nothing
    # node-wide (the server maps libssl too: its TLS probes, on from the start, are its own)
    accept = [n for n in uprobes(agent) if n[1] == "px_uret_accept"]
    assert accept == [("uretprobe", "px_uret_accept")] * 2
    ctx = trace_context.generate()
    head = f"GET /plain?n=5 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\nConnection: close\r\n\r\n"
    http_request(port, head.encode())
    [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
    assert r["accept_queue_us"] is not None and r["ttfb_us"] is not None
    assert r["srtt_us"] is not None and 0 < r["srtt_us"] < 100_000  # loopback


def test_sendfile_body_is_one_chunk_per_call(stack: tuple[int, Agent, Path]) -> None:
    """One sendfile() reaches the socket in pipe-sized pieces (64 KiB): the record counts
    the server's calls, not the pieces, and every byte."""
    port, agent, log = stack
    n = 4 << 20
    ctx = trace_context.generate()
    head = f"GET /file?n={n} HTTP/1.1\r\ntraceparent: {ctx.header()}\r\nConnection: close\r\n\r\n"
    resp = http_request(port, head.encode())
    assert resp.startswith(b"HTTP/1.1 200") and resp.endswith(b"f" * 100)
    [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
    srv = _server_log(log, ctx.header())
    writes = srv["t_writes_ns"]
    assert isinstance(writes, list)
    head_len = len(resp) - n
    assert r["bytes_out"] == len(resp) and head_len > 0
    assert r["chunks"] == len(writes) - 1  # the head write is not a chunk
    assert r["partial"] is False


@pytest.mark.parametrize(
    ("release", "hazard"),
    [
        ("6.10.14", False),
        ("6.11.0", True),
        ("6.13.12-200.fc41", True),
        ("6.14.0", False),
        ("6.18.44-fc-v669", False),
        ("5.15.0-105-generic", False),
        ("weird", False),
    ],
)
def test_uretprobe_kept_off_where_seccomp_would_kill(release: str, hazard: bool) -> None:
    from agent.kernel.uprobes import uretprobe_hazard

    assert uretprobe_hazard(release) is hazard


def test_reused_fd_and_abortive_close(tmp_path: Path) -> None:
    """No close() is seen on the socket path: a seeded fd whose number an outbound
    connection reuses is not followed as a served one (the socket's local port, from BTF,
    tells them apart), and a server's own abortive close (reset on unread data) is not the
    client's abort."""
    back = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "b")])
    srv = Proc([PY, "-m", "tests.agent.servers.fd_reuse_server", str(back.port())])
    try:
        port = srv.port()
        early = socket.create_connection(("127.0.0.1", port), 5)
        assert srv.p.stdout is not None and srv.p.stdout.readline().strip() == "ready"
        agent = Agent(tmp_path, [port])
        try:
            time.sleep(1.2)  # seeded, rescanned
            srv.p.send_signal(signal.SIGUSR1)
            assert srv.p.stdout.readline().strip() == "reused True"
            with socket.create_connection(("127.0.0.1", port), 5) as c:
                c.sendall(b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
                c.sendall(b"x" * 100000)
                assert srv.p.stdout.readline().strip() == "done"
            [r] = agent.wait_for(lambda r: r["path"] == "/up")
            assert r["status"] == 200 and r["client_aborted"] is False
            time.sleep(1.2)  # metrics refresh
            assert not [k for k in agent.metrics() if k.startswith("parallax_agent_unparsed")]
            assert [r["path"] for r in agent.records()] == ["/up"]
        finally:
            rc = agent.stop()
            early.close()
        assert rc == 0
    finally:
        srv.stop()
        back.stop()


def test_a_blocked_write_is_timed_at_its_start(stack: tuple[int, Agent, Path]) -> None:
    """A blocking write larger than the socket buffers waits for the slow client; its time
    is when the server began it (tcp_sendmsg_locked), not when the copy ended a second later."""
    port, agent, log = stack
    # The write-start hook is attached once a followed connection turns out to block (this
    # server's sockets do): any request shows it, then the agent says so within a second.
    http_request(port, b"GET /plain?n=1 HTTP/1.1\r\nConnection: close\r\n\r\n")
    wait_log(agent, "timing write starts")
    assert "tcp_sendmsg_locked" in tracepoints(agent)
    ctx = trace_context.generate()
    n = 16 << 20
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.sendall(f"GET /plain?n={n} HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n\r\n".encode())
        time.sleep(1.0)  # the server's body write blocks on the full buffers meanwhile
        got = 0
        while got < n:
            d = s.recv(1 << 20)
            assert d
            got += len(d)
    [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
    srv = _server_log(log, ctx.header())
    t_read, writes = srv["t_read_ns"], srv["t_writes_ns"]
    assert isinstance(t_read, int) and isinstance(writes, list) and len(writes) == 2
    body_start_us = (writes[1] - t_read) / 1000
    assert abs(r["ttft_us"] - body_start_us) < 5_000, (r["ttft_us"], body_start_us)
    assert r["duration_us"] > 500_000  # the write itself lasted until the client read
