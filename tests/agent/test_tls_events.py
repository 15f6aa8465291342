"""The TLS event in user space (no kernel): EV_TLS records packed as bpf/agent/tls.h lays
them out mark their connection — its records say ``tls``, its process is reported once —
and a TLS connection whose plaintext never showed a request counts as unparsed, once. A
plaintext connection's process is reported too (its TLS probes, put on at the agent's
start, come off: agent.kernel.tls_probes). Records come out at the socket's end (EV_TAIL:
their retransmits are final)."""

from __future__ import annotations

from agent.connections import Connections
from agent.export.outputs import RecordQueue
from agent.kernel import events
from agent.kernel.clock import MonoClock
from tests.agent.test_decode import TGID, _hdr, _read, _resp

MS = 1_000_000


def _tls(t: int, lport: int = 8443) -> bytes:
    return _hdr(events.EV_TLS, t) + events.TLS.pack(lport, 0)


class Table:
    def __init__(self) -> None:
        self.tls: list[tuple[int, int]] = []
        self.unparsed: list[int] = []
        self.plain: list[int] = []
        self.c = Connections(
            4096,
            MonoClock(),
            RecordQueue(100),
            identity=lambda pid, lport: ("comm", "svc"),
            on_unparsed=self.unparsed.append,
            on_traceparent_missed=lambda: None,
            on_tls=lambda pid, lport: self.tls.append((pid, lport)),
            on_plain=self.plain.append,
        )


def test_decode_reads_the_port() -> None:
    ev = events.decode(_tls(5 * MS, 8443))
    assert isinstance(ev, events.TlsEv) and ev.lport == 8443 and ev.h.tgid == TGID


def test_a_tls_connections_records_say_so() -> None:
    t = Table()
    t.c.on_event(_tls(1 * MS))
    assert t.tls == [(TGID, 8443)]
    req = b"GET /v1/x HTTP/1.1\r\nHost: x\r\n\r\n"
    t.c.on_event(_read(10 * MS, req, 9 * MS))
    t.c.on_event(_resp(12 * MS, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
    t.c.on_event(_hdr(events.EV_CLOSE, 20 * MS))
    t.c.on_event(_hdr(events.EV_TAIL, 21 * MS))
    [rec] = list(t.c.out.q)
    assert t.plain == []  # (its plaintext came after EV_TLS)
    assert rec["tls"] is True and rec["path"] == "/v1/x" and rec["local_port"] == 8080
    assert rec["local_addr"] == "127.0.0.1"  # (the READ's addresses, though EV_TLS came first)
    assert rec["ttfb_us"] == 2000 and rec["recv_queue_us"] == 1000
    assert t.unparsed == []


def test_a_plain_connections_records_do_not() -> None:
    t = Table()
    t.c.on_event(_read(10 * MS, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
    t.c.on_event(_resp(12 * MS, b"HTTP/1.1 204 No Content\r\n\r\n"))
    t.c.on_event(_hdr(events.EV_CLOSE, 20 * MS))
    t.c.on_event(_hdr(events.EV_TAIL, 21 * MS))
    [rec] = list(t.c.out.q)
    assert rec["tls"] is False and t.tls == [] and t.plain == [TGID]


def test_tls_without_a_request_is_unparsed_at_close() -> None:
    """A handshake and nothing else, or a process without probes: counted when it ends."""
    t = Table()
    t.c.on_event(_tls(1 * MS, 9443))
    assert t.unparsed == []
    t.c.on_event(_hdr(events.EV_CLOSE, 20 * MS))
    assert t.unparsed == [9443] and not list(t.c.out.q)


def test_http2_over_tls_is_counted_once() -> None:
    """The plaintext is HTTP/2's preface: the cutter counts it at the read, not again at
    the close."""
    t = Table()
    t.c.on_event(_tls(1 * MS))
    t.c.on_event(_read(10 * MS, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
    t.c.on_event(_hdr(events.EV_CLOSE, 20 * MS))
    assert t.unparsed == [8080]
