"""The probe in real Chromium on test pages: page hide and navigation linking, what crosses
origins, errors that belong to the app, and OpenTelemetry loaded before or after the probe."""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from demo.browser import chat_url
from parallax_contracts.trace_context import parse
from tests.probe.conftest import LlmServer
from tests.probe.pages import probe_page
from tests.probe.sink import Page as SinkPage
from tests.probe.sink import Sink

pytestmark = pytest.mark.browser

NAV_TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
META_TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _open(browser: Browser, url: str) -> Page:
    page = browser.new_page()
    page.set_default_timeout(15_000)
    page.goto(url, wait_until="load")
    return page


def test_navigation_linked_and_beacon_on_pagehide(browser: Browser, sink: Sink) -> None:
    # A long flush interval: only the page hide can deliver these beacons.
    ep = sink.url + "/v1/beacons"
    sink.pages["/st.html"] = SinkPage(
        probe_page(ep, "", flushIntervalMs=600_000),
        {"Server-Timing": f'traceparent;desc="{NAV_TP}", app;dur=3.5'},
    )
    sink.pages["/meta.html"] = SinkPage(
        probe_page(
            ep, "", head=f'<meta name="traceparent" content="{META_TP}">', flushIntervalMs=600_000
        )
    )
    for path, tp in (("/st.html", NAV_TP), ("/meta.html", META_TP)):
        page = _open(browser, sink.url + path)
        page.wait_for_timeout(200)  # the navigation entry is taken after load
        tc = parse(tp)
        assert tc is not None
        assert all(e["trace_id"] != tc.trace_id for e in sink.entries()), "sent before hide"
        page.goto("about:blank")  # pagehide → sendBeacon
        e = sink.wait_entry(
            lambda e, tc=tc: e["kind"] == "navigation" and e["trace_id"] == tc.trace_id
        )
        assert e["span_id"] == tc.span_id
        assert e["url"] == sink.url + path
        assert 0 <= e["request_start_ms"] <= e["response_start_ms"] <= e["response_end_ms"]
        assert e["status"] == 200
        if path == "/st.html":
            assert {"name": "app", "dur_ms": 3.5} in e["server_timing"]
        page.close()
    assert sink.invalid() == []


def test_cross_origin_propagation_and_coarse_timing(
    browser: Browser, llm: LlmServer, sink: Sink
) -> None:
    aux = Sink()  # a cross-origin API that allows traceparent but not Timing-Allow-Origin
    try:
        other = f"http://localhost:{llm.port}"  # another origin, not in propagateTo
        ep = sink.url + "/v1/beacons"
        sink.pages["/x.html"] = SinkPage(
            probe_page(ep, "", propagateTo=[llm.url, aux.url], flushIntervalMs=300)
        )
        page = _open(browser, sink.url + "/x.html")
        q = "?tokens=2&first_token_ms=0&token_gap_ms=0"
        before = len(llm.records())
        page.evaluate("u => fetch(u).then(r => r.text())", other + "/v1/complete" + q)
        llm.wait_record(lambda r: r["path"] == "/v1/complete", after=before)
        new = [r for r in llm.records()[before:] if r["path"] == "/v1/complete"]
        assert [r["traceparent"] for r in new] == [None], "not in propagateTo: no header"

        page.evaluate("u => fetch(u).then(r => r.text())", llm.url + "/v1/complete" + q)
        page.evaluate(
            """u => new Promise(ok => { const x = new XMLHttpRequest(); x.open('GET', u);
                 x.onloadend = () => ok(x.status); x.send(); })""",
            llm.url + "/v1/complete" + q,
        )
        # The app's own traceparent on an XHR: a valid one is kept (and recorded), an
        # invalid one is left alone: XHR headers append, so ours would make "theirs, ours".
        before = len(llm.records())
        for tp in ("garbage", "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"):
            page.evaluate(
                """([u, tp]) => new Promise(ok => { const x = new XMLHttpRequest();
                     x.open('GET', u); x.setRequestHeader('traceparent', tp);
                     x.onloadend = () => ok(x.status); x.send(); })""",
                [llm.url + "/v1/complete" + q, tp],
            )
        llm.wait_record(lambda r: r["traceparent"] and "ab" * 16 in r["traceparent"])
        got = [r["traceparent"] for r in llm.records()[before:] if r["path"] == "/v1/complete"]
        assert got == ["garbage", "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"], got
        page.evaluate("u => fetch(u).then(r => r.text())", aux.url + "/notao")
        f = sink.wait_entry(lambda e: e["kind"] == "fetch" and e["url"] == llm.url + "/v1/complete")
        x = sink.wait_entry(lambda e: e["kind"] == "xhr")
        for e in (f, x):
            srv = _by_trace(llm, e["trace_id"])
            assert parse(srv["traceparent"]).span_id == e["span_id"]  # type: ignore[union-attr]
            # Timing-Allow-Origin: *, so the phases and Server-Timing are visible cross-origin.
            assert not e.get("coarse"), e
            assert any(s["name"] == "app" for s in e["server_timing"]), e
        assert x["chunks_coarse"] is True and x["status"] == 200
        mine = sink.wait_entry(lambda e: e["kind"] == "xhr" and e["trace_id"] == "ab" * 16)
        assert mine["span_id"] == "cd" * 8
        assert len([e for e in sink.entries() if e["kind"] == "xhr"]) == 2, "none for garbage"
        n = sink.wait_entry(lambda e: e["url"] == aux.url + "/notao")
        assert n["coarse"] is True, "no Timing-Allow-Origin: the probe's own timestamps"
        assert n["request_start_ms"] == n["start_ms"]
        assert n["response_start_ms"] >= n["request_start_ms"]
        assert next(tp for p, tp in aux.requests if p == "/notao") is not None
        page.close()
        assert sink.invalid() == []
    finally:
        aux.close()


def test_xhr_object_reused(browser: Browser, llm: LlmServer, sink: Sink) -> None:
    # One XMLHttpRequest opened and sent again (from the app's own loadend handler, which
    # runs before the probe's): each send is its own entry, and the second request's events
    # do not touch the first's (still queued) entry.
    ep = sink.url + "/v1/beacons"
    sink.pages["/xr.html"] = SinkPage(
        probe_page(ep, "", propagateTo=[llm.url], flushIntervalMs=300)
    )
    page = _open(browser, sink.url + "/xr.html")
    q = "?tokens=2&first_token_ms=0&token_gap_ms=0"
    page.evaluate(
        """([a, b]) => new Promise(ok => { const x = new XMLHttpRequest();
             x.onloadend = () => {
               if (x.responseURL === b) ok(); else { x.open('GET', b); x.send(); } };
             x.open('GET', a); x.send(); })""",
        [llm.url + "/v1/complete" + q, llm.url + "/missing"],
    )
    # Opened again while the first request is still waiting: open() aborts it.
    slow = "?tokens=2&first_token_ms=2000&token_gap_ms=0"
    page.evaluate(
        """([a, b]) => new Promise(ok => { const x = new XMLHttpRequest();
             x.open('GET', a); x.send();
             setTimeout(() => { x.open('GET', b); x.onloadend = ok; x.send(); }, 100); })""",
        [llm.url + "/v1/stream" + slow, llm.url + "/v1/complete" + q],
    )
    xs = sink.wait_entry_list(lambda e: e["kind"] == "xhr", 4)
    assert len(xs) == 4, xs
    assert len({e["trace_id"] for e in xs}) == 4
    assert [e["status"] for e in xs if e["url"] == llm.url + "/missing"] == [404]
    aborted = next(e for e in xs if e["url"] == llm.url + "/v1/stream")
    assert aborted["error"] == "abort" and "chunks" not in aborted, aborted
    assert [e["status"] for e in xs if e["url"] == llm.url + "/v1/complete"] == [200, 200]
    page.close()
    assert sink.invalid() == []


def _by_trace(llm: LlmServer, trace_id: str) -> dict[str, Any]:
    def pred(r: dict[str, Any]) -> bool:
        tc = parse(r.get("traceparent") or "")
        return tc is not None and tc.trace_id == trace_id

    return llm.wait_record(pred)


APP_SCRIPT = """
window.seen = [];
addEventListener('error', e => seen.push('error:' + e.message));
addEventListener('unhandledrejection', e => seen.push('rejection:' + e.reason.message));
const API = %(api)s, WS = API.replace(/^http/, 'ws');
const q = '?tokens=1&first_token_ms=0&token_gap_ms=0';
fetch(API + '/v1/complete' + q).then(r => {
  window.fetchInfo = [r instanceof Response, r.url, r.status, r.type];
  throw new Error('app-fetch');
});
const x = new XMLHttpRequest(); x.open('GET', API + '/v1/complete' + q);
x.onload = () => { throw new Error('app-xhr'); }; x.send();
const es = new EventSource(API + '/v1/stream' + q);
window.esUrl = es.url;
es.onmessage = () => { es.close(); throw new Error('app-sse'); };
const ws = new WebSocket(WS + '/v1/ws' + q);
window.wsUrl = ws.url;
window.wsIsWs = ws instanceof WebSocket && WebSocket.OPEN === 1;
ws.onopen = () => ws.send('hi');
ws.onmessage = () => { ws.close(); throw new Error('app-ws'); };
"""


def test_app_errors_stay_the_apps(browser: Browser, llm: LlmServer, sink: Sink) -> None:
    ep = sink.url + "/v1/beacons"
    sink.pages["/err.html"] = SinkPage(
        probe_page(ep, APP_SCRIPT % {"api": json.dumps(llm.url)}, propagateTo=[llm.url])
    )
    page = _open(browser, sink.url + "/err.html")
    page.wait_for_function("window.seen.length >= 4")
    seen = page.evaluate("window.seen")
    assert sorted(seen) == sorted(
        [
            "rejection:app-fetch",
            "error:Uncaught Error: app-xhr",
            "error:Uncaught Error: app-sse",
            "error:Uncaught Error: app-ws",
        ]
    ), seen
    # What the app's code sees is unchanged: the native Response, the URLs it gave.
    q = "?tokens=1&first_token_ms=0&token_gap_ms=0"
    assert page.evaluate("window.fetchInfo") == [True, llm.url + "/v1/complete" + q, 200, "cors"]
    assert page.evaluate("window.esUrl") == llm.url + "/v1/stream" + q
    assert page.evaluate("window.wsUrl") == llm.url.replace("http", "ws") + "/v1/ws" + q
    assert page.evaluate("window.wsIsWs") is True
    # ... while the query parameter did reach the server.
    sse = llm.wait_record(lambda r: r["path"] == "/v1/stream" and r["traceparent"])
    assert parse(sse["traceparent"]) is not None
    page.close()


THREE = """u => {
  // no-store: Chromium's HTTP cache would otherwise queue identical GETs one after another.
  const one = () => fetch(u, {cache: 'no-store'}).then(r => r.text());
  const wait = ms => new Promise(ok => setTimeout(ok, ms));
  return Promise.all([one(), wait(150).then(one), wait(300).then(one)]);
}"""


def test_same_url_in_flight_matched_to_own_timing(
    browser: Browser, llm: LlmServer, sink: Sink
) -> None:
    # Same origin (the demo chat page on the LLM server): no CORS preflight before the
    # request, so requestStart follows the app's fetch() call within a few ms.
    page = _open(browser, chat_url(llm.url, sink.url, flush_ms=300))
    url = llm.url + "/v1/complete?tokens=1&first_token_ms=500&token_gap_ms=0"
    page.evaluate(THREE, url)
    es = sorted(
        sink.wait_entry_list(lambda e: e["kind"] == "fetch", 3), key=lambda e: e["start_ms"]
    )
    assert len(es) == 3
    # Started 150 ms apart, each in flight ~500 ms: a wrong match would shift request_start
    # by ±150 ms from the request's own start (a loaded machine can delay one by tens of ms).
    for e in es:
        assert not e.get("coarse"), e
        assert 0 <= e["request_start_ms"] - e["start_ms"] < 75, e
        assert e["response_end_ms"] - e["request_start_ms"] >= 490, e
    page.close()
    assert sink.invalid() == []
