"""The exported path keeps no query string and no ";" path parameters: Java servlets put the
session token there (``/cart;jsessionid=...``). Pure Python, no kernel."""

from __future__ import annotations

import pytest

from agent.protocols import http1_head

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _path(target: str) -> str:
    r = http1_head.parse_request(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert r is not None
    return r.path


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/cart;jsessionid=0123456789ABCDEF", "/cart"),
        ("/cart;JSESSIONID=s3cret?item=4", "/cart"),
        ("/a;v=1/b;jsessionid=s3cret/c", "/a/b/c"),
        ("/shop/;jsessionid=s3cret", "/shop/"),
        (";jsessionid=s3cret", ""),
        ("http://example.com/x;jsessionid=s3cret/y", "/x/y"),
        ("/plain/path", "/plain/path"),
        ("/q?a=1;b=2", "/q"),
    ],
)
def test_path_parameters_are_dropped(target: str, path: str) -> None:
    assert _path(target) == path
    assert "s3cret" not in _path(target)


def test_traceparent_in_the_query_still_read_behind_path_parameters() -> None:
    r = http1_head.parse_request(
        f"GET /events;jsessionid=s3cret?traceparent={TP} HTTP/1.1\r\n\r\n".encode()
    )
    assert r is not None and r.path == "/events"
    assert r.traceparent is not None and r.traceparent.header() == TP
