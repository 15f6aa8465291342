"""The HTTP/1.x cutter and head parser, without a kernel (pure Python)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.kernel.events import WAGG_END
from agent.protocols import http1_head
from agent.protocols.exchange import Exchange
from agent.protocols.http1 import Conn
from agent.protocols.websocket import WsConn
from parallax_contracts import trace_context

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _req(method: str, path: str, tp: str | None = None, body: bytes = b"") -> bytes:
    h = f"{method} {path} HTTP/1.1\r\nHost: x\r\nCookie: secret=1\r\n"
    if tp:
        h += f"traceparent: {tp}\r\n"
    if body:
        h += f"Content-Length: {len(body)}\r\n"
    return h.encode() + b"\r\n" + body


def _resp(body: bytes = b"ok") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def _key(ex: Exchange) -> tuple[object, ...]:
    tp = ex.traceparent.header() if ex.traceparent else None
    return (ex.method, ex.path, tp, ex.status, ex.bytes_in, ex.bytes_out, ex.chunks)


requests = st.lists(
    st.tuples(
        st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
        st.from_regex(r"/[a-z0-9/]{0,20}", fullmatch=True),
        st.one_of(st.none(), st.just(TP), st.just("00-" + "0" * 32 + "-" + "1" * 16 + "-01")),
        st.binary(max_size=300),
    ),
    min_size=1,
    max_size=6,
)


def _run(stream: bytes, cuts: list[int], n_req: int, bodies: list[bytes]) -> list[Exchange]:
    c = Conn(window=4096)
    out: list[Exchange] = []
    pos, t = 0, 1000
    for cut in [*sorted(set(cuts)), len(stream)]:
        if cut <= pos:
            continue
        out += c.on_read(t, cut - pos, stream[pos:cut])
        pos, t = cut, t + 10
    for b in bodies[:n_req]:
        r = _resp(b)
        out += c.on_resp(t, len(r), r)
        t += 10
    out += c.on_close(t)
    return out


@settings(max_examples=150, deadline=None)
@given(requests, st.lists(st.integers(min_value=0, max_value=4000), max_size=12))
def test_any_split_of_a_pipelined_stream_gives_the_same_records(
    reqs: list[tuple[str, str, str | None, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(_req(m, p, tp, b) for m, p, tp, b in reqs)
    bodies = [b"resp%d" % i for i in range(len(reqs))]
    whole = _run(stream, [], len(reqs), bodies)
    split = _run(stream, [c % (len(stream) + 1) for c in cuts], len(reqs), bodies)
    assert [_key(e) for e in split] == [_key(e) for e in whole]
    assert [e.path for e in whole] == [p for _, p, _, _ in reqs]
    for e, (_, _, tp, _) in zip(whole, reqs, strict=True):
        # an all-zero traceparent is invalid: no parent, a fresh trace later
        assert (e.traceparent is not None) == (tp == TP)


def test_query_dropped_but_traceparent_param_read() -> None:
    h = http1_head.parse_request(
        f"GET /v1/stream?q=secret&traceparent={TP} HTTP/1.1\r\n\r\n".encode()
    )
    assert h is not None and h.path == "/v1/stream"
    assert h.traceparent == trace_context.parse(TP)


def test_chunked_stream_and_keepalive_after_it() -> None:
    c = Conn()
    r1 = _req("GET", "/s")
    assert c.on_read(100, len(r1), r1) == []
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert c.on_resp(200, len(head), head) == []
    out = c.on_writes(600_000, 300_000, (0, 100, 200), 3, 40, 100_000, 0)
    assert out == []
    out = c.on_writes(700_000, 0, (), 0, 5, 0, WAGG_END)  # the pure terminator write
    assert len(out) == 1 and out[0].chunks == 3 and out[0].t_tok == 300_000
    assert out[0].t_end == 700_000 and out[0].chunk_offs_us == [299, 399, 499]
    r2 = _req("GET", "/next")
    c.on_read(800, len(r2), r2)
    resp = _resp()
    [e] = c.on_resp(900, len(resp), resp)
    assert e.path == "/next" and e.t2 == 900 and e.t_tok == 900


def test_head_beyond_window_counts_traceparent_missed() -> None:
    c = Conn(window=256)
    raw = b"GET /big HTTP/1.1\r\nX-Pad: " + b"a" * 400 + f"\r\ntraceparent: {TP}\r\n\r\n".encode()
    c.on_read(100, len(raw), raw[:256])  # the kernel captured the first 256 bytes
    resp = _resp()
    [e] = c.on_resp(200, len(resp), resp)
    assert e.path == "/big" and e.traceparent is None and e.traceparent_missed
    assert c.stats.head_too_large == 1


def test_garbage_and_tls_make_no_record() -> None:
    for junk in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"\x00" * 64, b"SSH-2.0-x\r\n"):
        c = Conn()
        assert c.on_read(1, len(junk), junk) == []
        resp = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
        assert c.on_resp(2, len(resp), resp) == []
        assert c.on_close(3) == []
        assert c.stats.unparsed == 1


def test_disconnect_mid_stream_ends_the_record_as_aborted() -> None:
    c = Conn()
    r = _req("GET", "/s")
    c.on_read(1, len(r), r)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    c.on_resp(2, len(head), head)
    c.on_writes(5000, 3000, (0, 1, 2), 3, 30, 1000, 0)
    c.on_peer_fin(6)
    [e] = c.on_close(7)
    assert e.client_aborted and e.chunks == 3


def test_partial_record_at_stream_limit_then_final() -> None:
    from agent.kernel.events import WAGG_PARTIAL

    c = Conn()
    r = _req("GET", "/long")
    c.on_read(1, len(r), r)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    c.on_resp(2, len(head), head)
    [p] = c.on_writes(60_000, 10_000, (0, 50), 2, 20, 50_000, WAGG_PARTIAL)
    assert p.partial and p.chunks == 2
    [f] = c.on_writes(90_000, 80_000, (0,), 1, 10, 20_000, WAGG_END)
    assert not f.partial and f.chunks == 3 and f.t_end == 90_000


def test_lost_events_resynchronise_instead_of_mismatching() -> None:
    c = Conn()
    r1, r2 = _req("GET", "/one"), _req("GET", "/two")
    assert c.on_read(1_000, len(r1), r1) == []
    # the response to /one was lost in the kernel (ring full): the next event says so
    c.on_loss()
    assert c.stats.lost_exchanges == 1
    assert c.on_read(3_000, len(r2), r2) == []
    [ex] = c.on_resp(4_000, len(_resp()), _resp())
    assert ex.path == "/two" and ex.t1 == 3_000 and ex.t2 == 4_000
    # a read in the middle of a body after a loss is not taken for a request
    c.on_loss()
    assert c.on_read(5_000, 5, b"xx\r\n\r") == [] and c.mode == "resync"


_heads = st.one_of(
    st.builds(
        lambda m, p, hdrs: f"{m} {p} HTTP/1.1\r\n{''.join(hdrs)}\r\n".encode(),
        st.sampled_from(["GET", "POST", "HEAD", "BREW", "get", "GET /x"]),
        st.from_regex(r"/[a-z?=&0-9-]{0,30}", fullmatch=True),
        st.lists(
            st.sampled_from(
                [
                    "Host: x\r\n",
                    "Content-Length: 5\r\n",
                    "content-length: x\r\n",
                    "Transfer-Encoding: chunked\r\n",
                    "Upgrade: websocket\r\n",
                    f"traceparent: {TP}\r\n",
                    "Cookie: a=b\r\n",
                ]
            ),
            max_size=5,
        ),
    ),
    st.binary(max_size=60).map(lambda b: b + b"\r\n\r\n"),
)


def _slots(obj: object) -> dict[str, object]:
    return {k: getattr(obj, k) for k in type(obj).__slots__}  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(_heads, st.integers(min_value=1, max_value=200), st.booleans())
def test_a_head_alone_in_a_read_is_cut_as_when_it_comes_in_pieces(
    head: bytes, cut: int, first_request: bool
) -> None:
    """A read holding exactly one request head takes a shortcut past the buffer: the same
    exchanges, statistics and state as the buffered path (the head in two reads)."""
    cut = cut % len(head) or 1
    body = b"hello" if b"Content-Length: 5" in head else b""

    def run(parts: list[bytes]) -> tuple[object, ...]:
        c = Conn(window=4096)
        if not first_request:  # a keep-alive connection's later request (resync vs dead)
            first = b"GET /a HTTP/1.1\r\n\r\n"
            r0 = _resp()
            c.on_read(1, len(first), first)
            c.on_resp(2, len(r0), r0)
        for p in parts:
            c.on_read(10, len(p), p, t_arr=5, t_acc=3, t_est=1)
        if body:
            c.on_read(11, len(body), body)
        r = _resp()
        out = c.on_resp(20, len(r), r) + c.on_close(30)
        state = (c.mode, c.body_skip, c.requests, c.cur_t_arr, len(c.pending))
        return [_slots(e) for e in out], _slots(c.stats), state

    assert run([head]) == run([head[:cut], head[cut:]])


def _upgraded() -> WsConn:
    c = Conn(window=4096)
    up = b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    c.on_read(1, len(up), up)
    r = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
    assert [e.upgrade for e in c.on_resp(2, len(r), r)] == [True]  # the upgrade's record
    assert isinstance(c.upgraded, WsConn)  # the connection is WebSocket's from here on
    return c.upgraded


def test_websocket_frame_claiming_an_invalid_64_bit_length_hides_no_later_frame() -> None:
    """A client frame whose 64-bit length has the top bit set (invalid, RFC 6455 5.2) is
    not taken as 2^63 bytes to skip: the client's next message still starts an exchange."""
    c = _upgraded()
    bad = bytes([0x82, 0xFF]) + (1 << 63 | 5).to_bytes(8, "big") + b"mask" + b"x" * 5
    assert c.on_read(10, len(bad), bad) == []
    assert c.skip == 0 and c.seq == 0  # not a message: the server fails it
    ok = bytes([0x81, 0x85]) + b"mask" + b"hello"
    out = c.on_read(20, len(ok), ok)
    assert c.seq == 1 and c.cur is not None and c.cur.t1 == 20
    assert out == []  # the first exchange had no server write: nothing to emit
    # a valid large length is still skipped, as the server would read it
    big = bytes([0x82, 0xFF]) + (1 << 40).to_bytes(8, "big") + b"mask" + b"y" * 10
    c.on_read(30, len(big), big)
    assert c.skip == (1 << 40) + 14 - len(big)


def test_a_page_load_joins_the_trace_its_server_timing_names() -> None:
    """A navigation carries no traceparent; the app's Server-Timing header names the trace
    and its span, which the probe's navigation entry reports: the record joins that trace
    as the span's child. A request that carried its own traceparent keeps it; the header's
    other metrics and malformed values are ignored."""
    named = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for header, want in (
        (f'Server-Timing: db;dur=53, traceparent;desc="{named}"', named),
        (f"server-timing: traceparent;desc={named}", named),
        ('Server-Timing: traceparent;desc="00-zz"', None),
        ("Server-Timing: cache;desc=hit", None),
    ):
        c = Conn()
        c.on_read(1, 40, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        head = f"HTTP/1.1 200 OK\r\n{header}\r\nContent-Length: 2\r\n\r\nok".encode()
        [ex] = c.on_resp(2, len(head), head)
        got = ex.traceparent.header() if ex.traceparent else None
        assert got == want, header
    own = "00-11111111111111111111111111111111-2222222222222222-01"
    c = Conn()
    c.on_read(1, 60, f"GET /a HTTP/1.1\r\ntraceparent: {own}\r\n\r\n".encode())
    st = f"Server-Timing: traceparent;desc={named}"
    resp = f"HTTP/1.1 200 OK\r\n{st}\r\nContent-Length: 0\r\n\r\n".encode()
    [ex] = c.on_resp(2, len(resp), resp)
    assert ex.traceparent is not None and ex.traceparent.header() == own
