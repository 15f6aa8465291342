"""HTTP/1.x head parsing for the agent: only the fields Parallax exports, nothing else kept.

Privacy: header values other than the framing ones and ``traceparent`` are never copied out
of the bytes; Cookie, Authorization and bodies are neither parsed nor stored.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qsl

from parallax_contracts import compiled, trace_context

_METHOD = re.compile(rb"^[A-Z]{3,10} ")
_REQ_LINE = re.compile(rb"^([A-Z]{3,10}) (\S+) HTTP/(1\.[01])$")
_STATUS_LINE = re.compile(rb"^HTTP/(1\.[01]) (\d{3})(?: .*)?$")
METHODS = frozenset(
    b"GET HEAD POST PUT DELETE CONNECT OPTIONS TRACE PATCH PROPFIND PROPPATCH MKCOL COPY "
    b"MOVE LOCK UNLOCK SEARCH REPORT".split()
)
# decoded once: a method or version is one dict lookup per request, not a decode
_METHOD_TEXT = {m: m.decode() for m in METHODS}
_VERSION_TEXT = {b"1.0": "1.0", b"1.1": "1.1"}


# Named tuples, not frozen dataclasses: as immutable, built by one tuple allocation instead
# of a setattr per field (two are built per request).
class RequestHead(NamedTuple):
    method: str
    path: str  # query string and ";" path parameters dropped
    version: str
    traceparent: trace_context.TraceContext | None
    traceparent_present: bool  # a traceparent was sent (valid or not)
    content_length: int  # 0 when absent
    chunked: bool
    upgrade_websocket: bool
    head_len: int


class ResponseHead(NamedTuple):
    status: int
    version: str
    head_len: int | None  # None: the head did not end inside the captured bytes
    content_length: int | None
    chunked: bool
    # `Server-Timing: traceparent;desc="00-…"`: the app names the trace of a request that
    # came without one (a page load: the browser sends no traceparent for a navigation)
    server_traceparent: trace_context.TraceContext | None = None
    content_type: bytes = b""  # its value, lowercased ("" when absent)
    # 101: the WebSocket extensions accepted (permessage-deflate: its parameters)
    ws_extensions: bytes = b""


def looks_like_request(data: bytes) -> bool:
    """Whether a byte stream can be the start of an HTTP/1.x request."""
    if len(data) < 4:
        return all(65 <= c <= 90 for c in data)
    m = _METHOD.match(data[:11])
    if m is not None:
        return data[: m.end() - 1] in METHODS
    # a short prefix of a method without its space yet
    return len(data) < 11 and all(65 <= c <= 90 for c in data)


_TRACEPARENT = b"\r\ntraceparent:"
_CONTENT_LENGTH = b"\r\ncontent-length:"
_TRANSFER_ENCODING = b"\r\ntransfer-encoding:"
_UPGRADE = b"\r\nupgrade:"
_SERVER_TIMING = b"\r\nserver-timing:"
_CONTENT_TYPE = b"\r\ncontent-type:"
_WS_EXTENSIONS = b"\r\nsec-websocket-extensions:"
# one metric of Server-Timing: traceparent;desc="00-…" (quotes optional, RFC 8941 token)
_ST_TRACEPARENT = re.compile(rb'(?:^|,)\s*traceparent\s*;\s*desc\s*=\s*"?([0-9a-f-]{55})"?', re.I)
# A Content-Length longer than this is malformed (19 digits hold any length a 64-bit
# counter can: no real body is larger), and int() of over 4,300 digits raises ValueError
# (Python's int-string limit): the bytes come from any client, so they are checked first.
MAX_LENGTH_DIGITS = 19


def _length(value: bytes | None) -> int | None:
    """A Content-Length value: 1-19 ASCII digits, else None (malformed or absent)."""
    if value is None or not 0 < len(value) <= MAX_LENGTH_DIGITS or not value.isdigit():
        return None  # (bytes.isdigit() is ASCII only: no other script's digits)
    return int(value)


def _header(block: bytes, lower: bytes, needle: bytes) -> bytes | None:
    """The value of one header (``needle``: CRLF, the lowercase name and its colon), found in
    the lowercased block: one scan per wanted header, no split of all the others (and
    nothing else read)."""
    i = lower.find(needle)
    if i < 0:
        return None
    start = i + len(needle)
    end = block.find(b"\r\n", start)
    return block[start : end if end >= 0 else len(block)].strip(b" \t")


def clean_path(target: str) -> str:
    """The path the agent keeps from a request target (HTTP/1's, or HTTP/2's ``:path``):
    no query string, no ``;`` parameters, no scheme and authority."""
    path = target.partition("?")[0]
    if "://" in path:  # absolute form (proxies): keep only the path
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    if ";" in path:
        # matrix parameters (RFC 3986 path parameters) carry session tokens
        # (";jsessionid=..." of Java servlets): each segment is cut at its first ";"
        path = "/".join(seg.partition(";")[0] for seg in path.split("/"))
    return path


def _query_traceparent(query: str) -> str | None:
    """The first ``traceparent`` parameter of a query string: EventSource and WebSocket
    cannot send headers, so the probe puts it there."""
    for k, v in parse_qsl(query, keep_blank_values=True):
        if k == "traceparent":
            return v
    return None


def _server_traceparent(value: bytes) -> trace_context.TraceContext | None:
    """The trace a Server-Timing value names (its traceparent metric; nothing else read)."""
    found = _ST_TRACEPARENT.search(value)
    if found is None:
        return None
    return trace_context.parse(found.group(1).decode("ascii").lower())


def _parse_request_py(head: bytes) -> RequestHead | None:
    """``head`` ends with the blank line. None when it is not an HTTP/1.x request.
    (The reference of the compiled parser: see ``parse_request`` below.)"""
    end = head.find(b"\r\n")
    if end < 0:
        end = max(0, len(head) - 1)  # as head[:-1] would
    m = _REQ_LINE.match(head, 0, end)  # the request line, without slicing it out
    if m is None:
        return None
    method_b, target_b, version_b = m.groups()
    method = _METHOD_TEXT.get(method_b)
    if method is None:
        return None
    target = target_b.decode("latin-1")
    path, _, query = target.partition("?")
    path = clean_path(path)
    block = head[end:]  # starts with CRLF, so every header line is preceded by one
    lower = block.lower()
    # The framing headers are absent from most requests: a miss is one find; a hit goes
    # through _header.
    tp_value = None
    if _TRACEPARENT in lower:
        tp = _header(block, lower, _TRACEPARENT)
        tp_value = tp.decode("latin-1") if tp is not None else None
    content_length = 0
    if _CONTENT_LENGTH in lower:
        # malformed: taken as no body (the next bytes are parsed as the next request;
        # if they are not one the connection resynchronises)
        content_length = _length(_header(lower, lower, _CONTENT_LENGTH)) or 0
    chunked = False
    if _TRANSFER_ENCODING in lower:
        te = _header(lower, lower, _TRANSFER_ENCODING)
        chunked = te is not None and b"chunked" in te
    upgrade = _UPGRADE in lower and _header(lower, lower, _UPGRADE) == b"websocket"
    if tp_value is None and "traceparent" in query:
        tp_value = _query_traceparent(query)
    return RequestHead(
        method,
        path,
        _VERSION_TEXT[version_b],
        trace_context.parse(tp_value) if tp_value is not None else None,
        tp_value is not None,
        content_length,
        chunked,
        upgrade,
        len(head),
    )


def _parse_response_py(data: bytes) -> ResponseHead | None:
    """A response's head from the first bytes of its first write; None when they are not
    an HTTP/1.x status line. (The reference of the compiled parser.)"""
    end = data.find(b"\r\n")
    if end < 0:
        end = len(data)
    m = _STATUS_LINE.match(data, 0, end)
    if m is None:
        return None
    stop = data.find(b"\r\n\r\n")
    head_len = stop + 4 if stop >= 0 else None
    lower = (data[end:stop] if stop >= 0 else data[end:]).lower()
    content_length = None
    if _CONTENT_LENGTH in lower:
        # malformed: None, as if absent (the body then ends at the next response or close)
        content_length = _length(_header(lower, lower, _CONTENT_LENGTH))
    chunked = False
    if _TRANSFER_ENCODING in lower:
        te = _header(lower, lower, _TRANSFER_ENCODING)
        chunked = te is not None and b"chunked" in te
    server_tp = None
    if _SERVER_TIMING in lower:  # only its traceparent metric is read, nothing else
        block = data[end:stop] if stop >= 0 else data[end:]
        st = _header(block, lower, _SERVER_TIMING)
        server_tp = _server_traceparent(st) if st is not None else None
    ctype = b""
    if _CONTENT_TYPE in lower:
        ctype = _header(lower, lower, _CONTENT_TYPE) or b""
    ws_ext = b""
    if _WS_EXTENSIONS in lower:
        ws_ext = _header(lower, lower, _WS_EXTENSIONS) or b""
    return ResponseHead(
        int(m.group(2), 10),
        _VERSION_TEXT[m.group(1)],
        head_len,
        content_length,
        chunked,
        server_tp,
        ctype,
        ws_ext,
    )


def _load_compiled() -> tuple[
    Callable[[bytes], RequestHead | None], Callable[[bytes], ResponseHead | None], str
]:
    """The compiled parsers (agent/protocols/_http1_fast.c: the same heads, in one walk of
    the bytes; tests/agent/test_http1_fast.py holds them to the references above), or the
    references, and which run (for the agent's start-up log)."""
    fast, why_not = compiled.load(
        "agent.protocols._http1_fast", compiled.HTTP1_SOURCE, "PARALLAX_HTTP1_FAST"
    )
    if fast is None:
        return _parse_request_py, _parse_response_py, f"HTTP/1 heads: Python (compiled: {why_not})"
    try:
        fast.configure(
            RequestHead, ResponseHead, trace_context.parse, clean_path, _query_traceparent,
            _server_traceparent, _METHOD_TEXT,
        )  # fmt: skip
    except (TypeError, ValueError) as e:  # a build that does not fit this Python
        return _parse_request_py, _parse_response_py, f"HTTP/1 heads: Python (compiled: {e})"
    name = Path(fast.__file__ or "?").name
    return fast.parse_request, fast.parse_response, f"HTTP/1 heads: compiled ({name})"


# parse_request(head): ``head`` ends with the blank line; None when it is not an HTTP/1.x
# request. parse_response(data): the first bytes of a response's first write.
parse_request, parse_response, PARSER = _load_compiled()
