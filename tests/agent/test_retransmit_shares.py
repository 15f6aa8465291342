"""A connection's retransmits shared out by request (agent.connections, agent.protocols):
the first request's share begins with the connection (its SYN-ACK retransmits), each
share ends where the next request begins or at the socket's end (EV_TAIL), and a record
waits for that at most TCP_HOLD_S. The shares add up to the connection's count. Records
packed as bpf/agent.c lays them out; pure Python, no kernel."""

from __future__ import annotations

import time
from typing import Any

from agent.connections import Connections
from agent.export.outputs import RecordQueue
from agent.kernel import events
from agent.kernel.clock import MonoClock

LA = bytes([10, 0, 0, 1]) + bytes(12)
RA = bytes([10, 0, 0, 2]) + bytes(12)
SK, IDENT, TGID = 0xFFFF_8880_0000_1000, 9, 4_194_001
MS = 1_000_000


def _hdr(typ: int, t: int, tcp: tuple[int, int, int]) -> bytes:
    retrans, wait_us, timed = tcp
    return events.HDR.pack(typ, TGID, TGID, 5, SK, IDENT, t, 50, retrans, 0, 0, wait_us, timed)


def _read(t: int, data: bytes, tcp: tuple[int, int, int]) -> bytes:
    n = len(data)
    body = events.READ.pack(0, 0, 0, n, n, 8080, 50000, events.AF_INET, 0, LA, RA)
    return _hdr(events.EV_READ, t, tcp) + body + data


def _resp(t: int, data: bytes, tcp: tuple[int, int, int]) -> bytes:
    return _hdr(events.EV_RESP, t, tcp) + events.RESP.pack(len(data), len(data)) + data


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def _table(**kw: Any) -> Connections:
    return Connections(
        4096,
        MonoClock(),
        RecordQueue(100),
        identity=lambda pid, lport: ("comm", "svc"),
        on_unparsed=lambda lport: None,
        on_traceparent_missed=lambda: None,
        **kw,
    )


def _records(a: Connections) -> dict[str, dict[str, Any]]:
    return {r["path"]: r for r in a.out.q}


def test_shares_end_at_the_next_request_and_at_the_socket_end() -> None:
    a = _table()
    # two SYN-ACKs sent again before the handshake ended (1 s and 3 s after the first)
    a.on_event(_read(10 * MS, _get("/one"), (2, 3_000_000, 2)))
    a.on_event(_resp(11 * MS, OK, (2, 3_000_000, 2)))
    assert not a.out.q  # finished, but its response may still be sent again
    # its response's last segment sent again 200 ms after its write, before /two
    a.on_event(_read(400 * MS, _get("/two"), (3, 3_200_000, 3)))
    one = _records(a)["/one"]
    assert one["retransmits"] == 3 and one["retransmit_wait_us"] == 3_200_000
    a.on_event(_resp(401 * MS, OK, (3, 3_200_000, 3)))
    # the app closes; its FIN is sent again, then a data segment whose write is too old to
    # be timed: two more, one timed
    a.on_event(_hdr(events.EV_CLOSE, 402 * MS, (3, 3_200_000, 3)))
    assert "/two" not in _records(a)
    a.on_event(_hdr(events.EV_TAIL, 900 * MS, (5, 3_450_000, 4)))
    two = _records(a)["/two"]
    assert two["retransmits"] == 2 and two["retransmit_wait_us"] == 250_000
    assert one["retransmits"] + two["retransmits"] == 5  # the connection's count
    assert not a.conns and not a.waiting


def test_no_retransmit_no_wait_and_untimed_ones_none() -> None:
    a = _table()
    a.on_event(_read(10 * MS, _get("/a"), (0, 0, 0)))
    a.on_event(_resp(11 * MS, OK, (0, 0, 0)))
    a.on_event(_read(20 * MS, _get("/b"), (1, 0, 0)))  # one retransmit, not timed
    a.on_event(_resp(21 * MS, OK, (1, 0, 0)))
    a.on_event(_hdr(events.EV_CLOSE, 22 * MS, (1, 0, 0)))
    a.on_event(_hdr(events.EV_TAIL, 23 * MS, (1, 0, 0)))
    recs = _records(a)
    assert recs["/a"]["retransmits"] == 1 and recs["/a"]["retransmit_wait_us"] is None
    assert recs["/b"]["retransmits"] == 0 and recs["/b"]["retransmit_wait_us"] is None


def test_a_record_waits_at_most_the_hold_then_takes_the_kernels_count() -> None:
    asked: list[tuple[int, int]] = []

    def tcp_now(sk: int, ident: int) -> tuple[int, int, int]:
        asked.append((sk, ident))
        return (4, 600_000, 1)  # the kernel's count now: a tail-loss probe after the response

    a = _table(tcp_now=tcp_now, hold_s=0.05)
    a.on_event(_read(10 * MS, _get("/k"), (0, 0, 0)))
    a.on_event(_resp(11 * MS, OK, (0, 0, 0)))
    a.sweep(None)
    assert not a.out.q and a.waiting  # (the main loop keeps sweeping while records wait)
    time.sleep(0.06)
    a.sweep(None)
    [rec] = list(a.out.q)
    assert asked == [(SK, IDENT)]
    assert rec["retransmits"] == 4 and rec["retransmit_wait_us"] == 600_000
    assert not a.waiting


def test_the_agent_stopping_lets_held_records_out() -> None:
    a = _table()
    a.on_event(_read(10 * MS, _get("/s"), (0, 0, 0)))
    a.on_event(_resp(11 * MS, OK, (1, 0, 0)))
    a.flush_all(None)
    [rec] = list(a.out.q)
    assert rec["path"] == "/s" and rec["retransmits"] == 1
