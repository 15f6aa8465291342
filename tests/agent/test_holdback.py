"""Write-to-wire holdback (bpf/agent/hold.h) on real servers on 127.0.0.1: the agent's
per-response figures against what the client measured on the same clock.

A server that streams small chunks every 30 ms without TCP_NODELAY to a client in delayed-ACK
mode (it sets TCP_QUICKACK off before each read, as an interactive client's kernel is after
it sends: the 42/18 ms pairs measured on WebSocket frames) has its writes held by Nagle's
algorithm until the previous segment's delayed ACK; with TCP_NODELAY none is held. A client
that does not read for 300 ms makes a large write wait for send-buffer space (sndbuf).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.kernel.holdback import RAW_XMIT, XMIT_BTF_FN, XMIT_FN
from tests.agent.helpers import (
    PY,
    Agent,
    Proc,
    agent_progs,
    get_head,
    http_request,
    timing_log,
    wait_log,
)

pytestmark = pytest.mark.ebpf
GAP_MS = 30
CHUNKS = 24


# The departure hook's program as the agent loads it on this kernel (a BTF tracepoint, its
# name cut to the kernel's 15 bytes) and as a raw tracepoint, the fallback where tp_btf
# does not load.
HOOKS = {"btf": XMIT_BTF_FN[:15], "raw": XMIT_FN.decode()}


@pytest.fixture(scope="module", params=list(HOOKS))
def env(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp(f"holdback-{request.param}")
    logs = {name: tmp / f"{name}.jsonl" for name in ("nagle", "nodelay")}
    procs: dict[str, Proc] = {}
    ports: dict[str, int] = {}
    try:
        for name, extra in (("nagle", []), ("nodelay", ["--nodelay"])):
            procs[name] = Proc(
                [PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(logs[name]), *extra]
            )
            ports[name] = procs[name].port()
        if request.param == "raw":
            os.environ[RAW_XMIT] = "1"
        try:
            agent = Agent(tmp, list(ports.values()))
        finally:
            os.environ.pop(RAW_XMIT, None)
    except Exception:
        for p in procs.values():
            p.stop()
        raise
    try:
        progs = {str(p.get("name")) for p in agent_progs(agent)}
        assert HOOKS[request.param] in progs, progs
        # the first request makes the agent time blocking writes' starts (http.server blocks)
        http_request(ports["nagle"], get_head("/warm?n=10"))
        wait_log(agent, "timing write starts")
        yield {"agent": agent, "ports": ports, "logs": logs, "hook": HOOKS[request.param]}
    finally:
        rc = agent.stop()
        for p in procs.values():
            p.stop()
    assert rc == 0, agent.err.read_text()[-2000:]


def _stream(port: int, path: str) -> list[tuple[int, int]]:
    """One chunked response read by a delayed-ACK client: (CLOCK_MONOTONIC ns, bytes so far)
    after each read."""
    s = socket.create_connection(("127.0.0.1", port))
    try:
        s.sendall(get_head(path))
        got = 0
        tail = b""
        arrivals: list[tuple[int, int]] = []
        while not tail.endswith(b"0\r\n\r\n"):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)  # Linux resets it
            d = s.recv(65536)
            assert d, "server closed"
            got += len(d)
            tail = (tail + d)[-5:]
            arrivals.append((time.monotonic_ns(), got))
        return arrivals
    finally:
        s.close()


def _record(agent: Agent, port: int, path: str, before: int, chunks: int = 0) -> dict[str, Any]:
    """The newest record of ``path`` (with ``chunks`` body writes where given), once there
    are more than ``before``."""

    def match(r: dict[str, Any]) -> bool:
        return bool(r["local_port"] == port and r["path"] == path) and (
            not chunks or r["chunks"] == chunks
        )

    found = agent.wait_for(match, before + 1)
    assert len(found) > before, agent.err.read_text()[-2000:]
    return found[-1]


def _delays(arrivals: list[tuple[int, int]], writes_ns: list[int], ends: list[int]) -> list[int]:
    """Per body write: its last byte's arrival at the client − the server's write time
    (``ends``: the byte offset where each write ends), µs."""
    out = []
    for end, tw in zip(ends, writes_ns, strict=False):
        t_arr = next(t for t, got in arrivals if got >= end)
        out.append((t_arr - tw) // 1000)
    return out


def _chunk_ends(head_len: int, n: int) -> list[int]:
    ends = []
    pos = head_len
    for i in range(n):
        piece = len(f"token-{i}\n")
        pos += len(f"{piece:x}\r\n") + piece + 2
        ends.append(pos)
    return ends


def _head_len(port: int) -> int:
    """The response head's length, from a request read whole (its Date header's length
    does not vary)."""
    raw = http_request(port, get_head("/stream?n=1&gap_ms=0"))
    return raw.index(b"\r\n\r\n") + 4


def test_nagle_holds_writes_until_the_delayed_ack(env: dict[str, Any]) -> None:
    agent, port = env["agent"], env["ports"]["nagle"]
    path = "/stream"
    head_len = _head_len(port)
    before = len([r for r in agent.records() if r["local_port"] == port and r["chunks"] == CHUNKS])
    arrivals = _stream(port, f"{path}?n={CHUNKS}&gap_ms={GAP_MS}")
    rec = _record(agent, port, path, before, CHUNKS)
    srv = timing_log(env["logs"]["nagle"])[-1]
    ends = _chunk_ends(head_len, CHUNKS)
    client = _delays(arrivals, srv["t_writes_ns"][1:], ends)
    held = [d for d in client if d > 2000]
    # the client saw writes held: Nagle + its delayed ACK (the premise of the test)
    assert len(held) >= 3, client
    # The terminator is a write of the response too, written right after the last chunk:
    # where that chunk left at once, the terminator waits for its delayed ACK (~40 ms), and
    # the record's flush waits for the terminator's departure (bpf/agent/hold.h
    # px_hold_end). Its delay, from the last chunk's write (the server logs body writes
    # only), bounds the kernel's time of it from above.
    term = _delays(arrivals, srv["t_writes_ns"][-1:], [ends[-1] + len(b"0\r\n\r\n")])
    assert rec["wire_hold_reason"] == "nagle", rec
    assert rec["wire_hold_writes"] >= len(held) - 1, (rec, client)
    assert rec["wire_hold_untimed"] == 0, rec
    # the longest hold the kernel timed is never more than the longest delay the client saw
    # (which adds the delivery and the client's wake-up), and at least the typical delay of
    # the held chunks (a busy 2-core machine can delay one wake-up by more than a hold)
    assert 10_000 <= rec["wire_hold_max_us"] <= 60_000, rec
    typical = sorted(held)[len(held) // 2]
    assert typical - 2_000 <= rec["wire_hold_max_us"] <= max(client + term) + 500, (
        rec,
        client,
        term,
    )
    assert 0 < rec["wire_hold_bytes"] < 200, rec
    assert rec["wire_hold_sum_us"] >= rec["wire_hold_max_us"], rec


def test_tcp_nodelay_holds_nothing(env: dict[str, Any]) -> None:
    agent, port = env["agent"], env["ports"]["nodelay"]
    path = "/stream"
    head_len = _head_len(port)
    before = len([r for r in agent.records() if r["local_port"] == port and r["chunks"] == CHUNKS])
    arrivals = _stream(port, f"{path}?n={CHUNKS}&gap_ms={GAP_MS}")
    rec = _record(agent, port, path, before, CHUNKS)
    srv = timing_log(env["logs"]["nodelay"])[-1]
    client = _delays(arrivals, srv["t_writes_ns"][1:], _chunk_ends(head_len, CHUNKS))
    # chunks arrive as written (a busy machine delays the client's wake-up now and then)
    assert sorted(client)[len(client) // 2] < 2000, client
    # measured (the departure program is loaded), and nothing held: 0, not absent
    assert env["hook"] in {p.get("name") for p in agent_progs(agent)}
    assert rec["wire_hold_writes"] == 0, rec
    assert rec["wire_hold_max_us"] == 0, rec
    assert rec["wire_hold_reason"] is None, rec


def test_a_full_send_buffer_is_named(env: dict[str, Any]) -> None:
    """A 4 MiB body to a client that reads nothing for 300 ms: the write blocks on the send
    buffer, and its last byte leaves only once the client reads."""
    agent, port = env["agent"], env["ports"]["nagle"]
    path = "/plain"
    n = 4 << 20
    before = len([r for r in agent.records() if r["local_port"] == port and r["path"] == path])
    s = socket.create_connection(("127.0.0.1", port))
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.sendall(get_head(f"{path}?n={n}"))
        time.sleep(0.3)
        t_read = time.monotonic_ns()
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        got = len(head) - head.index(b"\r\n\r\n") - 4
        while got < n:  # the body to its last byte
            d = s.recv(1 << 20)
            assert d
            got += len(d)
        t_done = time.monotonic_ns()
    finally:
        s.close()
    rec = _record(agent, port, path, before)
    srv = timing_log(env["logs"]["nagle"])[-1]
    t_write = srv["t_writes_ns"][-1]
    assert rec["wire_hold_reason"] == "sndbuf", rec
    # from the body write to its last byte's departure: at least until the client began
    # reading, at most until it had read everything
    lo, hi = (t_read - t_write) // 1000, (t_done - t_write) // 1000 + 2000
    assert 250_000 <= lo <= rec["wire_hold_max_us"] <= hi, (rec, lo, hi)
    assert rec["wire_hold_writes"] >= 1, rec


def test_records_say_absent_when_unmeasured() -> None:
    """The record's fields without the measure (no PX_HOLDS): absent, not zero."""
    from agent import records
    from agent.kernel.clock import MonoClock
    from agent.protocols.exchange import Exchange
    from agent.records import ConnInfo

    ex = Exchange("GET", "/", "1.1", None, False, t1=1, t2=2)
    rec = records.build(ex, ConnInfo(1, "c", "s", "127.0.0.1", 80, "127.0.0.1", 5), MonoClock())
    assert rec["wire_hold_writes"] is None and rec["wire_hold_max_us"] is None
    assert "parallax.wire_hold.writes" not in records.span_attributes(rec)
    assert json.loads(json.dumps(rec))["wire_hold_reason"] is None


def test_holdback_off(tmp_path: Path) -> None:
    """``--holdback off``: the same Nagle stream, no departure hook attached, and the
    record's holdback fields absent (not measured), not zero."""
    log = tmp_path / "nagle.jsonl"
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(log)])
    port = srv.port()
    agent = Agent(tmp_path, [port], ["--holdback", "off"])
    try:
        http_request(port, get_head("/warm?n=10"))
        _stream(port, f"/stream?n=8&gap_ms={GAP_MS}")
        rec = _record(agent, port, "/stream", 0, 8)
        assert rec["wire_hold_writes"] is None and rec["wire_hold_max_us"] is None, rec
        assert not {p.get("name") for p in agent_progs(agent)} & set(HOOKS.values())
    finally:
        rc = agent.stop()
        srv.stop()
    assert rc == 0, agent.err.read_text()[-2000:]
