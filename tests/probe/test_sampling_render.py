"""Session sampling drives the traceparent sampled flag; the paint is measured only while the
page is visible, through renderTarget or Parallax.markRendered()."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from parallax_contracts.trace_context import parse
from tests.probe.conftest import LlmServer
from tests.probe.pages import probe_page
from tests.probe.sink import Page as SinkPage
from tests.probe.sink import Sink

pytestmark = pytest.mark.browser

# Read a short stream, showing each chunk in #out; optionally call markRendered after showing.
READ = """
window.ask = (api, mark, q) => fetch(
    api + '/v1/chat?' + (q || 'tokens=3&first_token_ms=50&token_gap_ms=20'),
    {method: 'POST', body: 'q'}).then(r => {
  const rd = r.body.getReader(), dec = new TextDecoder(), out = document.getElementById('out');
  let text = '';
  const pump = () => rd.read().then(x => {
    if (x.done) return text;
    const t = dec.decode(x.value); text += t; out.textContent += t;
    if (mark) Parallax.markRendered();
    return pump();
  });
  return pump();
});
"""
HIDE = (
    "() => { Object.defineProperty(document, 'visibilityState', {value: 'hidden',"
    " configurable: true}); document.dispatchEvent(new Event('visibilitychange')); }"
)
# Two frames of the page, from now: the probe's own paint callbacks, scheduled at an earlier
# chunk, have run by then (a navigation right after the stream's end raced them, and the
# entry left without rendered_ms: absent, as it should be when nothing was painted)
PAINTED = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
SHOW = (
    "() => { Object.defineProperty(document, 'visibilityState', {value: 'visible',"
    " configurable: true}); document.dispatchEvent(new Event('visibilitychange')); }"
)


def _open(browser: Browser, sink: Sink, path: str, **options: Any) -> Page:
    sink.pages[path] = SinkPage(probe_page(sink.url + "/v1/beacons", READ, **options))
    page = browser.new_page()  # a new context: its own localStorage, so its own session
    page.set_default_timeout(15_000)
    page.goto(sink.url + path, wait_until="load")
    return page


def test_unsampled_session_sends_flag_00_and_no_beacons(
    browser: Browser, llm: LlmServer, sink: Sink
) -> None:
    page = _open(browser, sink, "/s0.html", sampleRate=0, propagateTo=[llm.url])
    before = len(llm.records())
    page.evaluate("api => ask(api, false)", llm.url)
    page.goto("about:blank")
    llm.wait_record(lambda r: r["path"] == "/v1/chat" and r["method"] == "POST", after=before)
    new = llm.records()[before:]
    sent = [r["traceparent"] for r in new if r["path"] == "/v1/chat" and r["method"] == "POST"]
    assert len(sent) == 1
    tc = parse(sent[0])
    assert tc is not None and not tc.sampled, "sampleRate 0: traced, but the sampled flag is off"
    time.sleep(1.0)
    assert sink.beacons == [], "an unsampled session sends no beacons"


def test_render_only_while_visible(browser: Browser, llm: LlmServer, sink: Sink) -> None:
    page = _open(browser, sink, "/r.html", propagateTo=[llm.url], renderTarget="#out")
    page.evaluate(HIDE)
    page.evaluate("api => ask(api, false)", llm.url)
    page.evaluate(SHOW)
    page.evaluate("api => ask(api, false)", llm.url)
    page.evaluate(PAINTED)
    page.evaluate(HIDE)  # visibilitychange → hidden sends the finished entries (flush 5 s)
    entries = sink.wait_entry_list(lambda e: e["kind"] == "fetch", 2, timeout_s=3)
    hidden, shown = sorted(entries, key=lambda e: e["start_ms"])
    assert hidden.get("hidden") is True and "rendered_ms" not in hidden, hidden
    assert "hidden" not in shown
    assert shown["first_chunk_ms"] <= shown["rendered_ms"] < shown["first_chunk_ms"] + 1000
    assert sink.invalid() == []


def test_mark_rendered(browser: Browser, llm: LlmServer, sink: Sink) -> None:
    page = _open(browser, sink, "/m.html", propagateTo=[llm.url])  # no renderTarget
    # init is idempotent: a second call (another endpoint) changes nothing.
    page.evaluate("() => Parallax.init({endpoint: 'http://127.0.0.1:9/nowhere', site: 'x'})")
    text = page.evaluate("api => ask(api, true)", llm.url)
    assert len(text.split()) == 3
    page.evaluate(PAINTED)
    page.goto("about:blank")
    e = sink.wait_entry(lambda e: e["kind"] == "fetch")
    assert e["first_chunk_ms"] <= e["rendered_ms"] < e["first_chunk_ms"] + 1000
    assert len(sink.entries()) == 1, "one wrapper, one entry"
    assert json.dumps(sink.invalid()) == "[]"


def test_mark_rendered_waits_for_the_paint_of_a_stream_that_ends_at_once(
    browser: Browser, llm: LlmServer, sink: Sink
) -> None:
    """The first stream an app marks began before the probe knew the app marks; one whose
    end comes with its only chunk was sent before its paint (no rendered_ms). The entries
    markRendered names wait for the paint."""
    page = _open(browser, sink, "/m1.html", propagateTo=[llm.url])
    page.evaluate("api => ask(api, true, 'tokens=1&first_token_ms=30&token_gap_ms=0')", llm.url)
    page.evaluate(PAINTED)
    page.evaluate("() => Parallax.flush()")
    e = sink.wait_entry(lambda e: e["kind"] == "fetch")
    assert e["first_chunk_ms"] <= e["rendered_ms"] < e["first_chunk_ms"] + 1000, e
