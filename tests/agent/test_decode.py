"""The agent's in-place decoding of ring-buffer records (Connections.on_event reads the
layouts of agent.kernel.events without building event objects): records packed as
bpf/agent.c lays them out give the fields agent.kernel.events.decode reads from them, and
the exported record they imply.
Pure Python: no kernel."""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Any

import h2.config
import h2.connection
import hypothesis
from hypothesis import strategies as st

from agent.connections import Connections
from agent.export.outputs import RecordQueue
from agent.kernel import events
from agent.kernel.clock import MonoClock

LA = bytes([127, 0, 0, 1]) + bytes(12)
RA = bytes([127, 0, 0, 2]) + bytes(12)
SK, IDENT, TGID = 0xFFFF_8880_1234_5678, 7, 4_194_000  # a pid no process has here


def _hdr(typ: int, t: int, lost: int = 0) -> bytes:
    return events.HDR.pack(typ, TGID, TGID + 1, 5, SK, IDENT, t, 55, 0, lost, 0, 0, 0)


def _read(t: int, data: bytes, t_arr: int = 0, t_acc: int = 0, t_est: int = 0) -> bytes:
    n = len(data)
    body = events.READ.pack(t_est, t_acc, t_arr, n, n, 8080, 50000, events.AF_INET, 0, LA, RA)
    return _hdr(events.EV_READ, t) + body + data


def _resp(t: int, data: bytes) -> bytes:
    return _hdr(events.EV_RESP, t) + events.RESP.pack(len(data), len(data)) + data


def _wagg(t_first: int, t_last: int, offs_us: list[int], nbytes: int, gap_ns: int) -> bytes:
    offs = struct.pack(f"<{events.CHUNKS}I", *offs_us, *[0] * (events.CHUNKS - len(offs_us)))
    agg = events.AGG.pack(t_first, t_last, nbytes, gap_ns, len(offs_us), events.WAGG_END)
    hold = events.HOLD.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)  # not measured
    return _hdr(events.EV_WAGG, t_last) + agg + hold + offs


def _table() -> Connections:
    """The connection table as the agent wires it, with a fixed identity for every pid."""
    return Connections(
        4096,
        MonoClock(),
        RecordQueue(100),
        identity=lambda pid, lport: ("comm", "svc" if lport == 8080 else "other"),
        on_unparsed=lambda lport: None,
        on_traceparent_missed=lambda: None,
    )


def test_a_streamed_response_from_packed_records() -> None:
    ms = 1_000_000
    req = b"GET /a?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    recs = [
        _read(10 * ms, req, 9 * ms, 8 * ms, 7 * ms),
        _resp(15 * ms, head),
        _wagg(20 * ms, 24 * ms, [0, 1000, 4000], 300, 3 * ms),
        _hdr(events.EV_CLOSE, 30 * ms),
        _hdr(events.EV_TAIL, 31 * ms),  # its socket's end: the record's retransmits final
    ]
    # what the reference decoder reads from the same bytes
    rd, rs, wg = (events.decode(r) for r in recs[:3])
    assert isinstance(rd, events.ReadEv) and rd.addrs() == ("127.0.0.1", "127.0.0.2")
    assert isinstance(rs, events.RespEv) and rs.n == len(head)
    assert isinstance(wg, events.WaggEv) and wg.times_ns() == [20 * ms, 21 * ms, 24 * ms]
    a = _table()
    a.clock.offset_ns = 0
    for r in recs[:-1]:
        a.on_event(r)
    assert not a.out.q  # closed by the app: its socket may still send its last bytes again
    a.on_event(recs[-1])
    [rec] = list(a.out.q)
    want: dict[str, Any] = {
        "method": "GET",
        "path": "/a",
        "status": 200,
        "pid": TGID,
        "service": "svc",
        "local_addr": "127.0.0.1",
        "local_port": 8080,
        "peer_addr": "127.0.0.2",
        "peer_port": 50000,
        "start_unix_ns": 10 * ms,
        "end_unix_ns": 24 * ms,
        "arrival_unix_ns": 9 * ms,
        "ttfb_us": 5000,
        "recv_queue_us": 1000,  # t1 - max(t_arr, t_acc)
        "accept_queue_us": 1000,  # t_acc - t_est
        "ttft_us": 10000,
        "chunk_offsets_us": [10000, 11000, 14000],
        "chunks": 3,
        "chunk_gap_max_us": 3000,
        "duration_us": 14000,
        "bytes_in": len(req),
        "bytes_out": len(head) + 300,
        "srtt_us": 55,
        "retransmits": 0,
        "retransmit_wait_us": None,
        "partial": False,
    }
    assert {k: rec[k] for k in want} == want
    assert a.n_events == 5 and not a.conns


def test_unknown_short_and_lost_records() -> None:
    a = _table()
    a.on_event(_hdr(99, 1))  # a type this agent does not know
    a.on_event(_hdr(events.EV_READ, 1)[:20])  # shorter than a header
    assert a.n_events == 2 and not a.conns
    a.on_event(_read(1000, b"GET /b HTTP/1.1\r\n\r\n"))
    # the next event says events of this connection were lost: the request in flight is
    # dropped (counted), not matched to a response it may not own
    a.on_event(_hdr(events.EV_RESP, 2000, lost=1) + events.RESP.pack(3, 3) + b"HTT")
    assert a.stats.lost_exchanges == 1 and not a.out.q


def _h2(
    t: int, data: bytes, direction: int, cap: int, past: dict[int, bytes], tail: int = 0
) -> bytes:
    """An EV_H2 record as bpf/agent/proto/http2.h lays it out: READ's fields (``skipped`` = the
    direction), the frame walk (in step, the headers past the copy), the copied bytes and
    the last ``tail`` bytes."""
    n = len(data)
    body = events.READ.pack(0, 0, 0, n, cap, 8080, 50000, events.AF_INET, direction, LA, RA)
    offs = list(past)
    pad = [0] * (events.H2_HDRS - len(offs))
    walk = events.H2_WALK.pack(1, len(offs), tail, *offs, *pad)
    hdrs = b"".join(h + bytes(3) for h in past.values()) + bytes(12 * (events.H2_HDRS - len(offs)))
    return _hdr(events.EV_H2, t) + body + walk + hdrs + data[:cap] + data[n - tail : n]


def test_an_h2_stream_from_packed_records() -> None:
    """Reads and writes of an HTTP/2 connection (bytes from the ``h2`` package's own
    client and server), one write's later frame headers past its copy: one record."""
    ms = 1_000_000
    cli = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    srv = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    cli.initiate_connection()
    srv.initiate_connection()
    cli.send_headers(
        1,
        [
            (":method", "POST"),
            (":path", "/pkg.Svc/Gen"),
            (":scheme", "http"),
            (":authority", "x"),
            ("content-type", "application/grpc"),
        ],
        end_stream=True,
    )
    req = cli.data_to_send()
    srv.receive_data(req)
    srv.send_headers(1, [(":status", "200")])
    srv.send_data(1, b"a" * 5000)
    srv.send_data(1, b"b" * 10)
    srv.send_headers(1, [("grpc-status", "0")], end_stream=True)
    out = srv.data_to_send()
    # the frames (the server's SETTINGS and ACK, HEADERS, DATA 5000, DATA 10, trailers):
    # the copy ends inside the big DATA frame, the walk gives the headers after it, the
    # write's last 256 bytes hold the trailers' header block
    pos, offs = 0, []
    while pos < len(out):
        offs.append(pos)
        pos += 9 + int.from_bytes(out[pos : pos + 3], "big")
    big = next(i for i, o in enumerate(offs) if int.from_bytes(out[o : o + 3], "big") == 5000)
    cap = offs[big] + 9 + 100
    past = {o: out[o : o + 9] for o in offs[big + 1 :]}
    a = _table()
    a.clock.offset_ns = 0
    a.on_event(_h2(10 * ms, req, 0, len(req), {}))
    a.on_event(_h2(12 * ms, out, 1, cap, past, tail=256))
    [rec] = list(a.out.q)
    assert (rec["method"], rec["path"], rec["version"], rec["status"]) == (
        "POST",
        "/pkg.Svc/Gen",
        "2",
        200,
    )
    assert rec["rpc_system"] == "grpc" and rec["grpc_status"] == 0
    assert rec["ttfb_us"] == 2000 and rec["chunks"] == 2 and rec["sample_th"] == "0"
    assert not a.h2_stats.desync


def test_an_open_h2_stream_counts_as_in_flight() -> None:
    """open_requests (the GPU side's requests in flight): an HTTP/2 stream answered and not
    ended is in flight on its service; ended, it is not."""
    ms = 1_000_000
    cli = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    srv = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    cli.initiate_connection()
    srv.initiate_connection()
    cli.send_headers(
        1, [(":method", "GET"), (":path", "/s"), (":scheme", "http"), (":authority", "x")]
    )
    req = cli.data_to_send()
    srv.receive_data(req)
    srv.send_headers(1, [(":status", "200")])
    head = srv.data_to_send()
    srv.send_data(1, b"tok", end_stream=True)
    end = srv.data_to_send()
    a = _table()
    a.on_event(_h2(10 * ms, req, 0, len(req), {}))
    assert a.open_requests("svc") == []  # read, not answered yet
    a.on_event(_h2(11 * ms, head, 1, len(head), {}))
    assert a.open_requests("svc") == [10 * ms] and a.open_requests("other") == []
    a.on_event(_h2(12 * ms, end, 1, len(end), {}))
    assert a.open_requests("svc") == [] and len(a.out.q) == 1


@hypothesis.settings(max_examples=3000, deadline=None)
@hypothesis.given(
    raw=st.one_of(
        st.binary(min_size=16, max_size=16),
        st.binary(min_size=4, max_size=4).map(lambda a: bytes(10) + b"\xff\xff" + a),
        st.binary(min_size=4, max_size=4).map(lambda a: bytes(12) + a),
        st.lists(st.sampled_from([0, 0, 0, 1, 0xFF]), min_size=16, max_size=16).map(bytes),
    ),
    v4=st.booleans(),
)
def test_addresses_are_written_as_ipaddress_writes_them(raw: bytes, v4: bool) -> None:
    """addr_text (inet_ntop, once per connection) against ipaddress, the reference: zero
    runs compressed alike, a v4-mapped address as IPv4, the IPv4-compatible form in hex."""
    if v4:
        want = str(ipaddress.IPv4Address(raw[:4]))
        assert events.addr_text(events.AF_INET, raw) == want
        return
    a = ipaddress.IPv6Address(raw)
    assert events.addr_text(socket.AF_INET6, raw) == str(a.ipv4_mapped or a)
