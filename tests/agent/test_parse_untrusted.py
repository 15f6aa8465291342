"""Request and response bytes come from anyone: the head parser and the cutter must return
(None, a record, or nothing) for every input, never raise. A Content-Length of more than
4,300 digits once made int() raise and killed the agent (pure Python, no kernel)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.protocols import http1_head
from agent.protocols.http1 import Conn

WINDOW = 16384  # the largest --head-window

# header values a client may send where a number is expected: huge digit runs (past
# Python's 4,300-digit int-string limit), signs, spaces, hex, non-ASCII digits, nothing,
# any bytes but a line's end (a value with CR or LF ends its line: the bytes after it are
# another header, or past the head — Hypothesis once drew b"\r\n", and the head ended
# before the Content-Length the oracle below expected)
_numbers = st.one_of(
    st.integers(min_value=0, max_value=WINDOW).map(lambda n: b"9" * n),
    st.integers(min_value=0, max_value=10**40).map(lambda n: str(n).encode()),
    st.sampled_from([b"", b"-1", b"+5", b" 5 ", b"0x10", b"1e3", b"5, 5", "\u0665".encode()]),
    st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
)
_names = st.sampled_from(
    [b"Content-Length", b"content-length", b"Transfer-Encoding", b"traceparent", b"Upgrade"]
)
_headers = st.lists(st.tuples(_names, _numbers), max_size=4)


def _head(first: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    return first + b"".join(b"\r\n" + k + b": " + v for k, v in headers) + b"\r\n\r\n"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_parse_to_none_or_a_head(data: bytes) -> None:
    r = http1_head.parse_request(data)
    assert r is None or isinstance(r, http1_head.RequestHead)
    s = http1_head.parse_response(data)
    assert s is None or isinstance(s, http1_head.ResponseHead)
    http1_head.looks_like_request(data)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([b"GET /x HTTP/1.1", b"POST /a?b=c HTTP/1.0", b"HTTP/1.1 200 OK"]),
    _headers,
)
def test_untrusted_numbers_in_heads(first: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    head = _head(first, headers)
    req = http1_head.parse_request(head)
    resp = http1_head.parse_response(head)
    lengths = [v for k, v in headers if k.lower() == b"content-length"]
    valid = bool(lengths) and 0 < len(lengths[0].strip()) <= 19 and lengths[0].strip().isdigit()
    if req is not None:
        assert req.content_length == (int(lengths[0]) if valid else 0)
    if resp is not None:
        assert resp.content_length == (int(lengths[0]) if valid else None)


def test_content_length_is_1_to_19_ascii_digits() -> None:
    def req(v: bytes) -> int:
        r = http1_head.parse_request(_head(b"POST / HTTP/1.1", [(b"Content-Length", v)]))
        assert r is not None
        return r.content_length

    def resp(v: bytes) -> int | None:
        r = http1_head.parse_response(_head(b"HTTP/1.1 200 OK", [(b"Content-Length", v)]))
        assert r is not None
        return r.content_length

    assert req(b"9" * 19) == resp(b"9" * 19) == 10**19 - 1
    for bad in (b"1" * 20, b"1" * 5000, b"", b"-1", "\u0665".encode()):
        assert req(bad) == 0 and resp(bad) is None  # as any malformed value: unknown


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=300),
            st.tuples(_names, _numbers).map(lambda h: _head(b"GET / HTTP/1.1\r\nHost: x", [h])),
        ),
        max_size=6,
    ),
    st.lists(st.integers(min_value=0, max_value=WINDOW + 5000), max_size=8),
    st.lists(st.one_of(st.binary(max_size=200), st.tuples(_names, _numbers)), max_size=4),
)
def test_the_cutter_survives_any_stream_and_split(
    parts: list[bytes], cuts: list[int], resps: list[bytes | tuple[bytes, bytes]]
) -> None:
    stream = b"".join(parts)
    c = Conn(window=WINDOW)
    pos, t = 0, 1000
    for cut in [*sorted(set(cuts)), len(stream)]:
        if cut <= pos:
            continue
        chunk = stream[pos:cut]
        c.on_read(t, len(chunk), chunk[:WINDOW])  # the kernel captures the window only
        pos, t = cut, t + 10
    for r in resps:
        data = r if isinstance(r, bytes) else _head(b"HTTP/1.1 200 OK", [r])
        c.on_resp(t, len(data) + 7, data)
        c.on_writes(t + 1, t + 1, (0,), 1, 5, 0, 0)
        t += 10
    c.on_close(t)


def test_a_5000_digit_length_split_over_two_reads_is_survived() -> None:
    """The agent-killing case: the cutter joins the two reads into one 4.4 KB head."""
    head = _head(b"GET /big HTTP/1.1\r\nHost: x", [(b"Content-Length", b"1" * 5000)])
    c = Conn(window=4096)
    c.on_read(1000, 3000, head[:3000])
    c.on_read(1010, len(head) - 3000, head[3000:])
    nxt = b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n"
    c.on_read(1020, len(nxt), nxt)
    resp = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    out = c.on_resp(1030, len(resp), resp) + c.on_resp(1040, len(resp), resp)
    assert [e.path for e in out] == ["/big", "/next"]
