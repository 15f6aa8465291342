"""The compiled HTTP/1 head parser (agent/protocols/_http1_fast.c) against its Python reference
(http1_head._parse_request_py, _parse_response_py): on drawn heads — the fields the agent
reads in any case, with and without their values' edge cases (19 and 20 digits, signs,
tabs, a bare "\\n" before the line's end, a query traceparent, ";" parameters, absolute
targets, Server-Timing's metric) — on arbitrary bytes, and on the bytes the real kernel
program captured (tests/agent/test_kernel_records.py drives the agent with them end to end;
here the heads of a real nginx exchange).

Wherever the two answer, they answer the same named tuple with fields of the same types;
the compiled one never raises on bytes. Without a C toolchain the module is skipped (the
agent then runs the reference); a toolchain whose build fails is a failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.protocols import http1_head
from parallax_contracts import compiled, trace_context
from tests.agent.helpers import build_compiled, fresh_value

Parse = Callable[[bytes], Any]


@pytest.fixture(scope="module")
def fast() -> tuple[Parse, Parse]:
    build_compiled(compiled.HTTP1_SOURCE, "agent.protocols._http1_fast")
    req, resp, said = http1_head._load_compiled()
    assert "compiled" in said and "Python" not in said, said
    return req, resp


def _same(a: Any, b: Any) -> None:
    assert a == b
    if a is not None:
        assert type(a) is type(b)
        for x, y in zip(a, b, strict=True):
            assert type(x) is type(y), (a, b)


TP = trace_context.generate().header()
_case = st.sampled_from([str.lower, str.upper, str.title, lambda s: s])
_names = st.sampled_from(
    ["traceparent", "content-length", "transfer-encoding", "upgrade", "server-timing",
     "content-type", "sec-websocket-extensions", "host", "cookie", "content-lengthx",
     "traceparentx", "x-traceparent"]
)  # fmt: skip
# header values at the edges of what is read (each also tried under every name: below)
EDGE_VALUES = [
    b"", b"0", b"5", b"12345", b"9" * 19, b"9" * 20, b"18446744073709551615", b"-1",
    b"+5", b" 5 ", b"\t7\t", b"0x10", "\u0665".encode(), b"chunked", b"gzip, Chunked",
    b"CHUNKED", b"chunke", b"hunked", b"websocket", b"WebSocket", b" websocket ", b"websockets",
    b"websocke", TP.encode(), (" " + TP.upper() + " ").encode(), b"00-zz",
    b'traceparent;desc="' + TP.encode() + b'"', b"app;dur=5, traceparent;desc=" + TP.encode(),
    b"Text/Event-Stream; charset=UTF-8", b"permessage-deflate; client_max_window_bits",
]  # fmt: skip
_values = st.one_of(
    st.sampled_from(
        [b"5", b"chunked", b"websocket", TP.encode(), b"traceparent;desc=" + TP.encode()]
    ),
    st.sampled_from(EDGE_VALUES),
    st.binary(max_size=30),
)


# Mostly what servers see (so that most drawn heads parse and their fields are compared),
# the rest near misses and noise.
def _mostly(common: list[bytes], rare: list[bytes], noise: int = 0) -> st.SearchStrategy[bytes]:
    near = st.sampled_from(rare)
    return st.one_of(st.sampled_from(common), st.sampled_from(common), st.sampled_from(common),
                     near, *([st.binary(max_size=noise)] if noise else []))  # fmt: skip


_seps = _mostly([b":", b": ", b":\t", b":  "], [b" :"])
# what follows a header's value before the next "\r\n": a bare "\n" or "\r" is a near miss
_tails = _mostly([b""], [b"\n", b"\r", b"\r\n", b"\n\r\n"])
_header = st.tuples(_names, _case, _seps, _values, _tails).map(
    lambda h: b"\r\n" + h[1](h[0]).encode() + h[2] + h[3] + h[4]
)
_targets = st.one_of(
    st.sampled_from(
        ["/", "/v1/chat", "/v1/chat?model=m", "/a;jsessionid=1/b;x?y=1", "http://h:1/p?q",
         "https://h", "/x?traceparent=" + TP, "/x?a=1&traceparent=" + TP + "&b",
         "/x?traceparent=%20" + TP, "/x?Traceparent=" + TP, "/x?traceparent",
         "/é", "/a:/b", "*"]
    ).map(lambda s: s.encode("latin-1")),
    st.binary(max_size=20),
)  # fmt: skip
_methods = _mostly(
    [b"GET", b"POST", b"HEAD", b"PROPPATCH"], [b"get", b"GE", b"PROPPATCHX", b"BREW"], 12
)
_versions = _mostly([b"HTTP/1.1", b"HTTP/1.0"], [b"HTTP/1.2", b"HTTP/2.0", b"http/1.1", b""])
_ends = _mostly([b"\r\n\r\n"], [b"\n\r\n", b"\r\n", b"", b" \r\n\r\n", b"\r\n\r\nbody"])


@st.composite
def _requests(draw: st.DrawFn) -> bytes:
    sp = draw(_mostly([b" "], [b"  ", b"\t"]))
    line = draw(_methods) + b" " + draw(_targets) + sp + draw(_versions)
    return line + b"".join(draw(st.lists(_header, max_size=6))) + draw(_ends)


_statuses = st.one_of(
    st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.0 101 Switching Protocols", b"HTTP/1.1 204"]),
    st.sampled_from(
        [b"HTTP/1.1 200\n", b"HTTP/1.1 200 \n", b"HTTP/1.1 200 a\nb", b"HTTP/1.1 2000",
         b"HTTP/1.1 20", b"HTTP/1.1 200x", b"HTTP/1.2 200 OK", b"HTTP/2 200", b"HTTP/1.1  200",
         b"HTTP/1.1 200 \xff\r"]
    ),
    st.binary(max_size=20),
)  # fmt: skip


@st.composite
def _responses(draw: st.DrawFn) -> bytes:
    head = draw(_statuses) + b"".join(draw(st.lists(_header, max_size=6)))
    return head + draw(_mostly([b"\r\n\r\n", b"\r\n\r\ndata: x\r\n\r\n"], [b"\r\n", b"", b"\n"]))


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(_requests())
def test_drawn_requests_parse_as_the_reference(fast: tuple[Parse, Parse], head: bytes) -> None:
    _same(fast[0](head), http1_head._parse_request_py(head))


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(_responses())
def test_drawn_responses_parse_as_the_reference(fast: tuple[Parse, Parse], data: bytes) -> None:
    _same(fast[1](data), http1_head._parse_response_py(data))


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=300), st.sampled_from([b"", b"GET / HTTP/1.1\r\n", b"HTTP/1.1 200\r\n"]))
def test_arbitrary_bytes_parse_as_the_reference(
    fast: tuple[Parse, Parse], data: bytes, prefix: bytes
) -> None:
    data = prefix + data
    _same(fast[0](data), http1_head._parse_request_py(data))
    _same(fast[1](data), http1_head._parse_response_py(data))


def test_every_name_with_every_edge_value(fast: tuple[Parse, Parse]) -> None:
    """Each wanted name (and near misses) in three cases, with each edge value, in a
    request and a response: drawing leaves some of these 1,200 out of a run."""
    names = [
        "traceparent", "content-length", "transfer-encoding", "upgrade", "server-timing",
        "content-type", "sec-websocket-extensions", "content-lengthx", "x-traceparent",
    ]  # fmt: skip
    for name in names:
        for case in (str.lower, str.upper, str.title):
            for value in EDGE_VALUES:
                line = case(name).encode() + b": " + value
                req = b"POST /a?b HTTP/1.1\r\nHost: h\r\n" + line + b"\r\n\r\n"
                resp = b"HTTP/1.1 200 OK\r\nServer: s\r\n" + line + b"\r\n\r\nbody"
                _same(fast[0](req), http1_head._parse_request_py(req))
                _same(fast[1](resp), http1_head._parse_response_py(resp))


def test_the_fields_a_real_exchange_gives(fast: tuple[Parse, Parse]) -> None:
    """Heads as nginx and Chromium write them: every field the agent exports, by value."""
    req = (
        b"POST /v1/chat/completions;jsessionid=abc?stream=1 HTTP/1.1\r\nHost: a\r\n"
        b"Cookie: s=1\r\nContent-Length: 120\r\nTraceparent: " + TP.encode() + b"\r\n\r\n"
    )
    r = fast[0](req)
    assert r == http1_head.RequestHead(
        "POST", "/v1/chat/completions", "1.1", trace_context.parse(TP), True, 120, False, False,
        len(req),
    )  # fmt: skip
    resp = (
        b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/event-stream\r\n"
        b'Transfer-Encoding: chunked\r\nServer-Timing: app;dur=3, traceparent;desc="'
        + TP.encode()
        + b'"\r\n\r\n5\r\ndata:\r\n'
    )
    s = fast[1](resp)
    assert s == http1_head.ResponseHead(
        200, "1.1", resp.index(b"\r\n\r\n") + 4, None, True, trace_context.parse(TP),
        b"text/event-stream", b"",
    )  # fmt: skip
    assert fast[1](b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                   b"Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n").ws_extensions == (
        b"permessage-deflate"
    )  # fmt: skip


def test_the_agent_uses_it_unless_turned_off(fast: tuple[Parse, Parse]) -> None:
    """The module-level parsers are the compiled ones once built; PARALLAX_HTTP1_FAST=0 gives
    the references, and says so (the agent's attach line carries http1_head.PARSER)."""

    on = fresh_value("agent.protocols.http1_head", "PARSER", {})
    assert on.startswith("HTTP/1 heads: compiled"), on
    off = fresh_value("agent.protocols.http1_head", "PARSER", {"PARALLAX_HTTP1_FAST": "0"})
    assert "Python" in off and "turned off (PARALLAX_HTTP1_FAST=0)" in off, off


def test_not_bytes_is_a_type_error(fast: tuple[Parse, Parse]) -> None:
    for f in fast:
        with pytest.raises(TypeError):
            f(cast(Any, bytearray(b"GET / HTTP/1.1\r\n\r\n")))


def test_a_build_that_does_not_fit_falls_back_to_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compiled module whose configure() refuses this Python's heads (a build from
    another tree): the agent parses in Python and says why, it does not fail to start."""

    class Misfit:
        __file__ = "_http1_fast.so"

        @staticmethod
        def configure(*_: object) -> None:
            raise ValueError("configure: more methods than MAX_METHODS")

    monkeypatch.setattr(compiled, "load", lambda *_: (Misfit, ""))
    req, resp, said = http1_head._load_compiled()
    assert req is http1_head._parse_request_py and resp is http1_head._parse_response_py
    assert said == "HTTP/1 heads: Python (compiled: configure: more methods than MAX_METHODS)"
