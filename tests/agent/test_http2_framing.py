"""agent/protocols/http2.py without a kernel: byte streams built with the ``h2`` package's own
connection objects (a real client and a real server talking to each other in memory), cut
into reads and writes the way the kernel would send them — whole, split mid-frame, with a
capture window shorter than the write — and what is never guessed (desync reasons)."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import pytest
from hpack import Encoder
from hypothesis import event, given, settings
from hypothesis import strategies as st

from agent.protocols.exchange import Exchange
from agent.protocols.http2 import PREFACE, H2Conn, H2Stats
from parallax_contracts import trace_context

TP = trace_context.generate()


class Pair:
    """An h2 client and server; ``c2s``/``s2c`` take what each has to send."""

    def __init__(self) -> None:
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.server = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.client.initiate_connection()
        self.server.initiate_connection()

    def c2s(self) -> bytes:
        data = self.client.data_to_send()
        self.server.receive_data(data)
        return data

    def s2c(self) -> bytes:
        data = self.server.data_to_send()
        self.client.receive_data(data)
        return data

    def request(self, path: str, extra: list[tuple[str, str]] | None = None) -> int:
        sid = self.client.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":path", path),
            (":scheme", "http"),
            (":authority", "t"),
            ("content-type", "application/grpc"),
            ("traceparent", TP.header()),
            *(extra or []),
        ]
        self.client.send_headers(sid, headers, end_stream=True)
        return sid


def _feed(conn: H2Conn, t: int, data: bytes, write: bool, window: int = 1 << 20) -> list[Exchange]:
    if write:
        return conn.on_write(t, len(data), data[:window])
    return conn.on_read(t, len(data), data[:window])


def test_a_grpc_stream_whole_frames() -> None:
    p, stats = Pair(), H2Stats()
    conn = H2Conn(stats)
    assert _feed(conn, 1, p.c2s(), False) == []  # preface and SETTINGS
    sid = p.request("/svc.Tokens/Stream?x=1", [("cookie", "secret"), ("authorization", "b")])
    assert _feed(conn, 10, p.c2s(), False) == []
    _feed(conn, 11, p.s2c(), True)  # the server's SETTINGS and its ACK
    p.server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
    p.server.send_data(sid, b"\0\0\0\0\x02hi")
    _feed(conn, 20, p.s2c(), True)
    for i in range(3):
        p.server.send_data(sid, b"\0\0\0\0\x02hi")
        assert _feed(conn, 30 + i, p.s2c(), True) == []
    p.server.send_headers(sid, [("grpc-status", "0"), ("grpc-message", "")], end_stream=True)
    [ex] = _feed(conn, 40, p.s2c(), True)
    assert (ex.method, ex.path, ex.version, ex.status) == ("POST", "/svc.Tokens/Stream", "2", 200)
    assert ex.traceparent == TP and ex.rpc_system == "grpc" and ex.grpc_status == 0
    assert (ex.t1, ex.t2, ex.t_tok, ex.t_end) == (10, 20, 20, 40)
    assert len(ex.chunk_offs_us) == 4 and ex.chunks == 4 and ex.t_last_chunk == 32
    assert stats.streams == 1 and not stats.desync
    # nothing of the other headers is kept anywhere on the exchange
    assert "secret" not in repr(ex)


def test_frames_split_across_reads_and_writes() -> None:
    """A frame header split between two events, a HEADERS payload spanning three: the
    remainder is carried over; times are those of the event each frame header came in."""
    p = Pair()
    conn = H2Conn(H2Stats())
    first = p.c2s()
    sid = p.request("/a/b", [("x-pad", "p" * 300)])
    req = first + p.c2s()
    cuts = [5, 30, len(first) + 4, len(first) + 100, len(first) + 200]
    prev = 0
    for i, c in enumerate([*cuts, len(req)]):
        _feed(conn, 100 + i, req[prev:c], False)
        prev = c
    assert sid in conn.streams and conn.streams[sid].t1 == 102  # its header: in the 3rd read
    p.s2c()
    p.server.send_headers(sid, [(":status", "200")])
    p.server.send_data(sid, b"x" * 50, end_stream=True)
    resp = p.s2c()
    out = []
    for i in range(0, len(resp), 7):
        out += _feed(conn, 200 + i, resp[i : i + 7], True)
    [ex] = out
    assert ex.status == 200 and ex.chunks == 1 and ex.ended and not conn.dead


def test_concurrent_streams_and_a_client_reset() -> None:
    p, stats = Pair(), H2Stats()
    conn = H2Conn(stats)
    _feed(conn, 1, p.c2s(), False)
    a, b = p.request("/s/A"), p.request("/s/B")
    _feed(conn, 2, p.c2s(), False)
    p.s2c()
    p.server.send_headers(a, [(":status", "200")])
    p.server.send_headers(b, [(":status", "200")])
    p.server.send_data(b, b"tok")
    p.server.send_data(a, b"tok")
    assert _feed(conn, 3, p.s2c(), True) == []
    p.client.reset_stream(a)
    [ex_a] = _feed(conn, 4, p.c2s(), False)
    assert ex_a.path == "/s/A" and ex_a.client_aborted and ex_a.t_end == 3
    p.server.send_data(b, b"", end_stream=True)
    [ex_b] = _feed(conn, 5, p.s2c(), True)
    assert ex_b.path == "/s/B" and ex_b.chunks == 1 and not ex_b.client_aborted


def test_dynamic_table_kept_across_streams() -> None:
    """HPACK's dynamic table: the second request's headers are indexed references to the
    first's; decoding every block in order keeps them right."""
    p = Pair()
    conn = H2Conn(H2Stats())
    _feed(conn, 1, p.c2s(), False)
    p.s2c()
    for i in range(3):
        sid = p.request("/same/path")
        data = p.c2s()
        _feed(conn, 10 + i, data, False)
        if i:
            assert len(data) < 40  # indexed: the block is a few bytes
        assert conn.streams[sid].traceparent == TP and conn.streams[sid].path == "/same/path"


@pytest.mark.parametrize("window", [20, 60])
def test_a_frame_header_beyond_the_capture_desyncs(window: int) -> None:
    """A write longer than the window whose next frame header lies beyond the captured
    bytes: the connection stops recording (counted), never guesses."""
    p, stats = Pair(), H2Stats()
    conn = H2Conn(stats)
    _feed(conn, 1, p.c2s(), False)
    sid = p.request("/a/b")
    _feed(conn, 2, p.c2s(), False)
    p.s2c()
    p.server.send_headers(sid, [(":status", "200")])
    p.server.send_data(sid, b"y" * 100)
    p.server.send_data(sid, b"z", end_stream=True)
    assert _feed(conn, 3, p.s2c(), True, window=window) == []
    assert conn.dead in ("header_beyond_capture", "payload_beyond_capture")
    assert sum(stats.desync.values()) == 1 and stats.lost_streams == 1
    assert _feed(conn, 4, b"\0\0\0\4\0\0\0\0\0", True) == []  # dead: nothing more


def test_frame_headers_the_kernel_walked_past_the_capture() -> None:
    """The kernel's walk (bpf/agent/proto/http2.h) sends the frame headers past the copied bytes
    by offset: framing goes on through them."""
    p = Pair()
    conn = H2Conn(H2Stats())
    _feed(conn, 1, p.c2s(), False)
    sid = p.request("/a/b")
    _feed(conn, 2, p.c2s(), False)
    p.s2c()
    p.server.send_headers(sid, [(":status", "200")])
    p.server.send_data(sid, b"y" * 100)
    p.server.send_data(sid, b"y" * 100)
    p.server.send_data(sid, b"z", end_stream=True)
    w = p.s2c()
    hlen = 9 + int.from_bytes(w[0:3], "big")
    offs = [hlen + 109, hlen + 218]  # the second and third DATA frames' headers
    past = {o: w[o : o + 9] for o in offs}
    [ex] = conn.on_write(3, len(w), w[: hlen + 20], past)
    assert ex.chunks == 3 and ex.body_out == 201 and ex.ended and not conn.dead


def test_a_long_data_payload_beyond_the_capture_is_fine() -> None:
    """The window covers the DATA frame's header; its payload need not be captured."""
    p = Pair()
    conn = H2Conn(H2Stats())
    _feed(conn, 1, p.c2s(), False)
    sid = p.request("/a/b")
    _feed(conn, 2, p.c2s(), False)
    p.s2c()
    p.server.send_headers(sid, [(":status", "200")])
    _feed(conn, 3, p.s2c(), True)
    p.server.send_data(sid, b"y" * 5000, end_stream=True)
    [ex] = _feed(conn, 4, p.s2c(), True, window=64)
    assert ex.chunks == 1 and ex.body_out == 5000 and not conn.dead


def test_an_undecodable_header_block_desyncs() -> None:
    stats = H2Stats()
    conn = H2Conn(stats)
    conn.on_read(1, len(PREFACE), PREFACE)
    block = b"\xbf\xff\xff\xff\x0f"  # an index far beyond both tables
    frame = len(block).to_bytes(3, "big") + b"\x01\x05\0\0\0\x01" + block
    assert conn.on_read(2, len(frame), frame) == []
    assert conn.dead == "hpack" and stats.desync["hpack"] == 1


def test_a_wrong_preface_desyncs() -> None:
    conn = H2Conn(H2Stats())
    conn.on_read(1, 24, b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
    assert conn.dead == "preface"


def test_the_server_encoder_may_grow_its_table_when_the_client_allows_it() -> None:
    """The client's SETTINGS_HEADER_TABLE_SIZE bounds the server's encoder: its table size
    update, beyond HPACK's 4096 default, decodes."""
    conn = H2Conn(H2Stats())
    settings = (6).to_bytes(3, "big") + b"\x04\0\0\0\0\0" + b"\0\x01\0\x01\0\0"  # 65536
    conn.on_read(1, 24 + len(settings), PREFACE + settings)
    enc = Encoder()
    req = enc.encode([(":method", "GET"), (":path", "/x"), (":scheme", "http")])
    frame = len(req).to_bytes(3, "big") + b"\x01\x05\0\0\0\x01" + req
    conn.on_read(2, len(frame), frame)
    senc = Encoder()
    senc.header_table_size = 65536
    block = senc.encode([(":status", "200")])
    frame = len(block).to_bytes(3, "big") + b"\x01\x05\0\0\0\x01" + block
    [ex] = conn.on_write(3, len(frame), frame)
    assert ex.status == 200 and not conn.dead


@st.composite
def _answers(draw: st.DrawFn) -> tuple[bytes, bytes, bytes, int]:
    """A few concurrent streams answered by a real h2 server, their frames interleaved:
    heads, DATA of drawn sizes (empty, small, and longer than a capture window), PINGs,
    ends by END_STREAM or by gRPC trailers. Returns the client's bytes (preface, requests),
    the server's preamble (its SETTINGS and ACK), its answers, and the number of streams."""
    p = Pair()
    reqs = p.c2s()
    sids = [p.request(f"/s/{i}") for i in range(draw(st.integers(1, 4)))]
    reqs += p.c2s()
    preamble = p.s2c()
    for sid in sids:
        p.server.send_headers(sid, [(":status", "200")])
    open_ = list(sids)
    while open_:
        sid = draw(st.sampled_from(open_))
        op = draw(st.sampled_from(["end", "trailers", "ping", "data", "data", "data"]))
        if op == "data":
            size = draw(st.sampled_from([0, 1, 7, 40, 300, 2000]))
            if size <= p.server.local_flow_control_window(sid):
                p.server.send_data(sid, b"t" * size)
        elif op == "ping":
            p.server.ping(b"12345678")
        elif op == "end":
            p.server.send_data(sid, b"", end_stream=True)
            open_.remove(sid)
        else:
            p.server.send_headers(sid, [("grpc-status", "0")], end_stream=True)
            open_.remove(sid)
    return reqs, preamble, p.server.data_to_send(), len(sids)


def _frames(w: bytes) -> list[tuple[int, int, int, int]]:
    """The frames of ``w`` by a walk of their headers alone: (offset, length, type, stream
    id)."""
    out, pos = [], 0
    while pos < len(w):
        ln = int.from_bytes(w[pos : pos + 3], "big")
        out.append((pos, ln, w[pos + 3], int.from_bytes(w[pos + 5 : pos + 9], "big")))
        pos += 9 + ln
    return out


@settings(max_examples=300, deadline=None)
@given(
    answers=_answers(),
    cuts=st.lists(st.integers(1, 1 << 14), max_size=12),
    window=st.sampled_from([9, 16, 64, 256, 1 << 20]),
)
def test_any_cut_into_writes_gives_the_frames_times_or_a_counted_desync(
    answers: tuple[bytes, bytes, bytes, int], cuts: list[int], window: int
) -> None:
    """The server's answers cut into writes anywhere, each captured up to ``window`` bytes
    with the frame headers beyond it given as the kernel's walk gives them: each stream's
    head time and chunk times are those of the write its frame header began in, its byte
    counts its frames'. A frame header cut by the window's edge, or a header block beyond
    it, may desync the connection (counted), never give other figures; a whole capture
    never desyncs."""
    reqs, preamble, w, n_streams = answers
    frames = _frames(w)
    bounds = sorted({c % len(w) for c in cuts} - {0} | {len(w)})
    stats = H2Stats()
    conn = H2Conn(stats)
    conn.on_read(1000, len(reqs), reqs)
    conn.on_write(2000, len(preamble), preamble)
    out: list[Exchange] = []
    t_of: dict[int, int] = {}  # a frame's offset → the time of the write it began in
    start = 0
    for i, end in enumerate(bounds):
        t = 1_000_000 * (i + 1)
        starts = [f[0] for f in frames if start <= f[0] < end]
        t_of.update(dict.fromkeys(starts, t))
        # (the walk reads a header past the copy only where the write holds all 9 bytes)
        past = {o - start: w[o : o + 9] for o in starts if o - start + 9 > window and o + 9 <= end}
        ev = w[start:end]
        out += conn.on_write(t, len(ev), ev[:window], past)
        start = end
    event(f"desync: {conn.dead}" if conn.dead else "framed")
    if conn.dead is not None:
        assert window < 1 << 20 and sum(stats.desync.values()) == 1, stats
        return
    assert sorted(ex.path for ex in out) == sorted(f"/s/{i}" for i in range(n_streams))
    for ex in out:
        sid = 1 + 2 * int(ex.path.rsplit("/", 1)[1])  # the client's streams: 1, 3, 5, ...
        mine = [f for f in frames if f[3] == sid]
        data = [f for f in mine if f[2] == 0]
        heads = [f for f in mine if f[2] == 1]
        assert ex.t2 == t_of[heads[0][0]] and ex.status == 200 and ex.ended, ex
        assert ex.chunk_offs_us == [(t_of[f[0]] - ex.t1) // 1000 for f in data if f[1]]
        assert ex.chunks == sum(1 for f in data if f[1])
        assert ex.body_out == sum(f[1] for f in data)
        assert ex.bytes_out == sum(9 + f[1] for f in mine)
        assert ex.grpc_status == (0 if len(heads) == 2 else None)
