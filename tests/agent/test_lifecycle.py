"""Connection and process life cycle against the real kernel: a server killed mid-stream,
the agent stopped mid-stream, a traced pid reused by another process, streams whose kernel
aggregate spans longer than its offset range, outbound connections of a traced process,
and peers of connections older than the agent."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from demo.stack import free_port
from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, Proc, http_request, timing_log

pytestmark = pytest.mark.ebpf


def _server(tmp: Path, name: str = "t") -> tuple[Proc, int]:
    srv = Proc(
        [PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp / f"{name}.jsonl")]
    )
    return srv, srv.port()


def _app_log(path: Path, pred: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """The test server's own records (it appends after its last write: poll briefly)."""
    deadline = time.monotonic() + 5
    while True:
        found = [x for x in timing_log(path) if pred(x)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_server_started_after_the_agent_is_traced_from_its_first_request(
    tmp_path: Path,
) -> None:
    """The agent on a --port nothing listens on yet (a pod restarted under a running
    DaemonSet agent); then a server takes the port and is asked at once: every request is
    recorded, its first included. The kernel traces the process in its listen() call
    (bpf/agent/tcp.h px_trace_listener); user space finds it at its next rescan, up to a
    second later, and the requests before that were lost."""
    port = free_port()
    agent = Agent(tmp_path, [port])
    log = str(tmp_path / "t.jsonl")
    srv = Proc(
        [PY, "-m", "tests.agent.servers.py_server", "--port", str(port), "--timing-log", log]
    )
    try:
        assert srv.port() == port
        ctxs = [trace_context.generate() for _ in range(3)]
        for ctx in ctxs:  # within milliseconds of the listen(), before any rescan
            head = f"GET /plain HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n\r\n"
            assert http_request(port, head.encode()).startswith(b"HTTP/1.1 200")
        ids = {c.trace_id for c in ctxs}
        recs = agent.wait_for(lambda r: r["trace_id"] in ids, count=3)
        assert sorted(r["trace_id"] for r in recs) == sorted(ids), agent.err.read_text()
        assert all(r["path"] == "/plain" and r["status"] == 200 for r in recs), recs
    finally:
        assert agent.stop() == 0
        srv.stop()


def test_server_killed_mid_stream_ends_with_a_partial_record_and_frees_its_state(
    tmp_path: Path,
) -> None:
    srv, port = _server(tmp_path)
    agent = Agent(tmp_path, [port])
    try:
        ctx = trace_context.generate()
        s = socket.create_connection(("127.0.0.1", port), 5)
        s.sendall(
            f"GET /stream?n=100&gap_ms=30 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n\r\n".encode()
        )
        got = b""
        while got.count(b"token-") < 5:
            got += s.recv(4096)
        conns = agent.wait_metric('parallax_agent_map_entries{map="px_conns"}', lambda v: v >= 1)
        assert conns >= 1
        srv.p.kill()  # no close() of the app: the kernel closes its sockets at exit
        srv.p.wait(5)
        [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id, timeout=5)
        assert r["partial"] is True and r["client_aborted"] is False, r
        assert 5 <= r["chunks"] < 100
        s.close()
        # the kernel maps and the user-space table are empty again
        assert (
            agent.wait_metric('parallax_agent_map_entries{map="px_conns"}', lambda v: v == 0) == 0
        )
        assert agent.wait_metric('parallax_agent_map_entries{map="px_aggs"}', lambda v: v == 0) == 0
        assert agent.wait_metric("parallax_agent_connections", lambda v: v == 0) == 0
    finally:
        rc = agent.stop()
        srv.stop()
    assert rc == 0


def test_sigterm_mid_stream_flushes_a_partial_record_and_exits_0(tmp_path: Path) -> None:
    srv, port = _server(tmp_path)
    agent = Agent(tmp_path, [port])
    try:
        done = trace_context.generate()
        # a complete response still held in the kernel's write aggregate (a keep-alive
        # Content-Length body written after the head) and a stream in progress
        keep = socket.create_connection(("127.0.0.1", port), 5)
        http_request(
            port,
            f"GET /plain?n=100 HTTP/1.1\r\ntraceparent: {done.header()}\r\n\r\n".encode(),
            sock=keep,
        )
        live = trace_context.generate()
        s = socket.create_connection(("127.0.0.1", port), 5)
        s.sendall(
            f"GET /stream?n=200&gap_ms=20 HTTP/1.1\r\ntraceparent: {live.header()}\r\n\r\n".encode()
        )
        got = b""
        while got.count(b"token-") < 5:
            got += s.recv(4096)
        rc = agent.stop()
        assert rc == 0, agent.err.read_text()[-2000:]
        recs = agent.records()
        [d] = [r for r in recs if r["trace_id"] == done.trace_id]
        assert d["partial"] is False and d["bytes_out"] > 100
        [r] = [r for r in recs if r["trace_id"] == live.trace_id]
        assert r["partial"] is True and r["chunks"] >= 5 and r["ttfb_us"] is not None, r
        # the records leave before the attachments are waited for (a uprobe's close takes
        # ~0.1 s, serialised: seconds where many processes carry TLS probes)
        err = agent.err.read_text()
        assert 0 <= err.index("stopped:") < err.index("parallax-agent: detached in "), err
        s.close()
        keep.close()
    finally:
        agent.stop()
        srv.stop()


def test_with_every_process_traced_the_agent_is_not(tmp_path: Path) -> None:
    """No --port, no --pid: every server on the node is traced, but not the agent: its
    /metrics (scraped by Prometheus, its health probes by the kubelet) is no record of its
    own, and its own libraries get no probes."""
    srv, port = _server(tmp_path)
    agent = Agent(tmp_path, [])
    try:
        for _ in range(3):
            agent.metrics()
        ctx = trace_context.generate()
        head = f"GET /plain?n=10 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n\r\n"
        assert http_request(port, head.encode()).startswith(b"HTTP/1.1 200")
        assert agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)  # tracing works
        agent.metrics()
        time.sleep(0.5)  # a drain or more after the last scrape
        mine = [r for r in agent.records() if r["local_port"] == agent.metrics_port]
        assert mine == [], mine[:2]
        assert f"TLS: probes on pid {agent.p.pid} " not in agent.err.read_text()
    finally:
        assert agent.stop() == 0
        srv.stop()


@pytest.mark.serial  # another worker's forks would take the pid it waits for
def test_a_reused_pid_is_not_traced(tmp_path: Path) -> None:
    srv, port = _server(tmp_path, "a")
    pid = srv.p.pid
    agent = Agent(tmp_path, [], ["--pid", str(pid)])
    other: Proc | None = None
    try:
        ctx = trace_context.generate()
        http_request(
            port,
            f"GET /first HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n"
            "Connection: close\r\n\r\n".encode(),
        )
        assert agent.wait_for(lambda r: r["path"] == "/first")
        srv.p.kill()
        srv.p.wait(5)
        time.sleep(1.5)  # one /proc rescan
        other = Proc.with_pid(
            [PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "b.jsonl")],
            pid,
        )
        if other is None:
            pytest.skip("could not obtain the same pid again (busy machine)")
        port2 = other.port()
        http_request(port2, b"GET /second HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert _app_log(tmp_path / "b.jsonl", lambda x: x["path"] == "/second")  # served
        assert not agent.wait_for(lambda r: r["path"] == "/second", timeout=1.5)
    finally:
        rc = agent.stop()
        srv.stop()
        if other is not None:
            other.stop()
    assert rc == 0


def test_aggregate_longer_than_its_offset_range_keeps_exact_offsets(tmp_path: Path) -> None:
    # --offset-span-ms 250 stands in for the ~71 min a u32 of microseconds holds
    srv, port = _server(tmp_path)
    agent = Agent(tmp_path, [port], ["--stream-limit-s", "0", "--offset-span-ms", "250"])
    try:
        ctx = trace_context.generate()
        http_request(
            port,
            f"GET /stream?n=10&gap_ms=100 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n"
            "Connection: close\r\n\r\n".encode(),
        )
        [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
        [app] = _app_log(tmp_path / "t.jsonl", lambda x: x["traceparent"] == ctx.header())
        assert r["partial"] is False and r["chunks"] == 10
        want = [(t - app["t_read_ns"]) // 1000 for t in app["t_writes_ns"][1:]]
        got = r["chunk_offsets_us"]
        assert len(got) == 10
        # Each chunk after the first, from the first: exact across the aggregates' flushes.
        # The first from the request's read: the app stamps its read after the syscall
        # returned, so a preempted app stamps late (a fresh clone's run: 2.35 ms, every
        # offset by the same).
        assert all(
            abs((g - got[0]) - (w - want[0])) < 1000 for g, w in zip(got, want, strict=True)
        ), (got, want)
        assert -1000 < got[0] - want[0] < 25_000, (got, want)
        assert r["duration_us"] >= 900_000
    finally:
        agent.stop()
        srv.stop()


def test_outbound_connections_of_a_traced_process_are_not_followed(tmp_path: Path) -> None:
    backend, bport = _server(tmp_path, "backend")
    front, fport = _server(tmp_path, "front")
    agent = Agent(tmp_path, [], ["--pid", str(front.p.pid)])
    try:
        for i in range(3):
            http_request(
                fport,
                f"GET /fetch?port={bport}&i={i} HTTP/1.1\r\nConnection: close\r\n\r\n".encode(),
            )
        recs = agent.wait_for(lambda r: r["path"] == "/fetch", count=3)
        assert len(recs) == 3 and all(r["local_port"] == fport for r in recs)
        time.sleep(1.2)
        m = agent.metrics()
        unparsed = [k for k in m if k.startswith("parallax_agent_unparsed_connections_total")]
        assert not unparsed, unparsed  # the backend's responses were not taken for requests
        assert all(r["local_port"] == fport for r in agent.records())
    finally:
        agent.stop()
        front.stop()
        backend.stop()


def test_connection_older_than_the_agent_has_its_real_peer(tmp_path: Path) -> None:
    srv, port = _server(tmp_path)
    old = socket.create_connection(("127.0.0.1", port), 5)
    http_request(port, b"GET /before HTTP/1.1\r\nHost: x\r\n\r\n", sock=old)
    # without tcp_probe the connection is known only from the /proc seed
    agent = Agent(tmp_path, [port], ["--disable-tracepoint", "tcp:tcp_probe"])
    try:
        http_request(port, b"GET /wake HTTP/1.1\r\nHost: x\r\n\r\n", sock=old)
        http_request(port, b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n", sock=old)
        [r] = agent.wait_for(lambda r: r["path"] == "/after")
        assert r["peer_addr"] == "127.0.0.1" and r["peer_port"] == old.getsockname()[1], r
        assert r["local_addr"] == "127.0.0.1" and r["local_port"] == port
    finally:
        old.close()
        agent.stop()
        srv.stop()


def test_worker_forked_later_is_traced(tmp_path: Path) -> None:
    """A worker forked after the agent started inherits the listener without any listening
    socket opening or closing: the agent finds it among the traced processes' children."""
    go = tmp_path / "fork"
    srv = Proc([PY, "-m", "tests.agent.servers.prefork_server", "--fork-when", str(go)])
    port = srv.port()
    agent = Agent(tmp_path, [port])
    worker = 0
    try:
        # after the agent's first full scan: the children scan finds it (or a full scan that
        # a listener opened or closed elsewhere on the machine triggers)
        time.sleep(2.5)
        go.touch()
        worker = srv.port()  # the next line it prints: the worker's pid
        ctx = trace_context.generate()
        head = f"GET /w HTTP/1.1\r\ntraceparent: {ctx.header()}\r\nConnection: close\r\n\r\n"
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20  # the children are looked at every 5 s
        while not found and time.monotonic() < deadline:
            http_request(port, head.encode())
            found = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id, timeout=1.0)
        assert found, agent.err.read_text()
        assert found[0]["pid"] == worker and found[0]["path"] == "/w"
    finally:
        agent.stop()
        srv.stop()
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)


def test_children_of_a_process() -> None:
    from agent.identity import procinfo

    p = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"])
    try:
        assert p.pid in procinfo.children({os.getpid()})
        assert procinfo.children({p.pid}) == set()
    finally:
        p.kill()
        p.wait(5)


@pytest.mark.skipif(not shutil.which("node"), reason="needs node (make setup)")
def test_cluster_workers_handed_their_connections_are_traced(tmp_path: Path) -> None:
    """Node's cluster module (round-robin, as PM2's cluster mode): the primary holds the
    listener and accepts; the workers serve each connection it hands them and hold no
    listener. They are traced as the primary's children on the same executable."""
    srv = Proc(["node", "tests/agent/servers/node_cluster.mjs"])
    port = srv.port()
    agent = Agent(tmp_path, [port])

    def ask(path: str) -> tuple[str, int]:
        """(trace id, the worker that answered)"""
        ctx = trace_context.generate()
        resp = http_request(
            port,
            f"GET {path} HTTP/1.1\r\nHost: x\r\ntraceparent: {ctx.header()}\r\n"
            "Connection: close\r\n\r\n".encode(),
        )
        return ctx.trace_id, int(resp.split(b"x-worker: ")[1].split(b"\r\n")[0])

    try:
        # until both workers are traced (the agent's first rescan, a second after its
        # start, finds them): two requests in a row, one per worker, both recorded
        deadline = time.monotonic() + 20
        while True:
            probes = {ask("/probe")[0] for _ in range(2)}
            time.sleep(1.0)  # the records of traced workers reach the file
            if probes <= {r["trace_id"] for r in agent.records()}:
                break
            assert time.monotonic() < deadline, "the workers were never traced"
        asked = [ask(f"/w{i}") for i in range(6)]
        ids = [t for t, _ in asked]
        workers = {w for _, w in asked}
        recs = agent.wait_for(lambda r: r["trace_id"] in ids, count=6)
        assert sorted(r["path"] for r in recs) == [f"/w{i}" for i in range(6)], recs
        assert {r["pid"] for r in recs} == workers and srv.p.pid not in workers
        assert len(workers) == 2  # round-robin: both workers served
        for r in recs:
            # accepted by the primary: no accept time of the worker's own; the hand-off
            # over IPC is in the receive-queue wait, before the worker's read
            assert r["ttfb_us"] is not None and r["accept_queue_us"] is None, r
            assert r["recv_queue_us"] is not None and r["recv_queue_us"] >= 0, r
    finally:
        agent.stop()
        srv.stop()
