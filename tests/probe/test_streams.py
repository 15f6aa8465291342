"""The probe in real Chromium on the demo chat page (demo.llm_app): fetch streaming, Server-Sent
Events and WebSocket against a token server with a known first-token wait and token gap.
The server's timing log is the ground truth: the trace id it received, and when it wrote each
token."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import pytest
from playwright.sync_api import Browser

from demo.browser import chat_url, open_chat, run_chat
from demo.llm_app import token
from parallax_contracts.trace_context import parse
from tests.probe.conftest import LlmServer
from tests.probe.sink import Sink

pytestmark = pytest.mark.browser

FIRST_MS = 150
GAP_MS = 60
TOKENS = 8
FRAME_MS = 17  # one rendering frame at 60 Hz


def _gaps(xs: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(xs)]


def _server_for(llm: LlmServer, entry: dict[str, Any], **match: Any) -> dict[str, Any]:
    """The server's record of the request whose traceparent carries the entry's ids."""

    def pred(r: dict[str, Any]) -> bool:
        tc = parse(r.get("traceparent") or "")
        return (
            tc is not None
            and tc.trace_id == entry["trace_id"]
            and tc.span_id == entry["span_id"]
            and all(r.get(k) == v for k, v in match.items())
        )

    return llm.wait_record(pred)


def _check_pacing(entry: dict[str, Any], server: dict[str, Any], n: int) -> None:
    """The user-side chunk times against the server's write times (one clock each: gaps)."""
    got = entry["chunk_ms"]
    writes = [w / 1e6 for w in server["t_writes_ns"][:n]]
    assert len(writes) == n, server
    ttft = entry["first_chunk_ms"] - entry["request_start_ms"]
    assert ttft >= FIRST_MS - 2, f"user TTFT {ttft} ms < the server's first-token wait"
    # The whole stream's span: first token to last, as written and as read. A busy main
    # thread can hand the first or last message to the script late, which moves the span:
    # a WebSocket stream's once by 16.0 ms with nothing else running, about one rendering
    # frame at 60 Hz. Hence a frame of slack; the median check below stays exact.
    span = (got[-1] - got[0]) - (writes[-1] - writes[0])
    assert abs(span) <= 10 + FRAME_MS, (got, writes)
    if len(got) < n:
        # A fetch body is a byte stream: when the page's main thread is busy for longer than
        # a token gap, two writes arrive as one chunk (what the user saw, and what the probe
        # reports). Only the span is comparable then.
        assert entry["kind"] == "fetch" and entry["chunks"] == len(got), entry
        return
    assert len(got) == n, entry
    diffs = [abs(b - s) for b, s in zip(_gaps(got), _gaps(writes), strict=True)]
    # Loopback: what the user saw between tokens is what the server wrote, within a few ms.
    # A busy main thread (two shared cores) can hold one message back, which lengthens one
    # gap and shortens the next: the median and the span stay exact.
    assert statistics.median(diffs) <= 5, (_gaps(got), _gaps(writes))


def test_fetch_sse_websocket_streams(browser: Browser, llm: LlmServer, sink: Sink) -> None:
    page = open_chat(browser, chat_url(llm.url, sink.url, flush_ms=500))
    pacing = {"first_token_ms": FIRST_MS, "token_gap_ms": GAP_MS, "tokens": TOKENS}
    expected = "".join(token(i) for i in range(TOKENS))
    for kind in ("fetch", "sse", "ws", "ws"):
        # The app reads every stream in full and unchanged (a second WebSocket exchange too).
        assert run_chat(page, kind, **pacing) == expected, kind
    page.goto("about:blank")  # pagehide: the open WebSocket exchange is sent too

    f = sink.wait_entry(lambda e: e["kind"] == "fetch" and e["url"].endswith("/v1/chat"))
    sf = _server_for(llm, f, path="/v1/chat")
    assert f["method"] == "POST" and f["status"] == 200 and 2 <= f["chunks"] <= TOKENS
    assert not f.get("coarse"), "same origin: Resource Timing phases"
    assert f["response_start_ms"] >= f["request_start_ms"]
    _check_pacing(f, sf, TOKENS)
    # renderTarget="#answer": the paint after the first chunk was shown.
    assert f["first_chunk_ms"] <= f["rendered_ms"] < f["first_chunk_ms"] + 1000

    s = sink.wait_entry(lambda e: e["kind"] == "eventsource")
    ss = _server_for(llm, s, path="/v1/stream")
    assert s["chunks"] == TOKENS  # the named "done" event is the app's, not a token
    _check_pacing(s, ss, TOKENS)
    assert s["first_chunk_ms"] <= s["rendered_ms"]

    ws = {e["seq"]: e for e in sink.wait_entry_list(lambda e: e["kind"] == "websocket", 3)}
    assert sorted(ws) == [0, 1, 2], ws
    assert len({e["trace_id"] for e in ws.values()}) == 1, "one socket, one trace"
    for seq in (1, 2):
        srv = _server_for(llm, ws[seq], kind="websocket", ws_seq=seq)
        assert ws[seq]["chunks"] == TOKENS + 1  # tokens, then "[DONE]"
        _check_pacing(ws[seq], srv, TOKENS + 1)
    assert ws[0]["status"] == 101
    # Exchange 2 was still the current one at pagehide: it ends with its last message, and
    # its paint (taken while visible) stands.
    for seq in (1, 2):
        assert ws[seq]["response_end_ms"] == ws[seq]["chunk_ms"][-1], ws[seq]
        assert "hidden" not in ws[seq] and ws[seq]["rendered_ms"] >= ws[seq]["first_chunk_ms"]

    assert sink.invalid() == []
    assert {b.content_type.split(";")[0] for b in sink.beacons} == {"text/plain"}
