"""OpenTelemetry's fetch instrumentation and the probe on one page, loaded in either order:
the traceparent on the wire and the one in the beacon must be the same."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import Browser

from parallax_contracts.trace_context import parse
from tests.probe.conftest import LlmServer
from tests.probe.pages import probe_page
from tests.probe.sink import Page, Sink

pytestmark = pytest.mark.browser

# Both a URL and a Request object: OpenTelemetry treats them differently (it merges its header
# under a plain headers object, but overwrites a Request's).
SCRIPT = """
const q = '?tokens=1&first_token_ms=0&token_gap_ms=0';
window.done = Promise.all([
  fetch(%(api)s + '/v1/complete' + q).then(r => r.text()),
  fetch(new Request(%(api)s + '/v1/complete' + q + '&r=1')).then(r => r.text()),
]).then(() => new Promise(ok => setTimeout(ok, 300)));
"""


@pytest.mark.parametrize("order", ["otel-first", "probe-first"])
def test_one_id_on_the_wire_and_in_the_beacon(
    order: str, browser: Browser, llm: LlmServer, sink: Sink
) -> None:
    otel = f"<script src='/otel.js'></script><script>startOtel({json.dumps([llm.url])});</script>"
    script = SCRIPT % {"api": json.dumps(llm.url)}
    ep = sink.url + "/v1/beacons"
    if order == "otel-first":
        html = probe_page(ep, script, before_probe=otel, propagateTo=[llm.url])
    else:
        # The probe first; OpenTelemetry then wraps the probe's fetch.
        html = probe_page(ep, script, after_probe=otel, propagateTo=[llm.url])
    sink.pages["/otel.html"] = Page(html)
    page = browser.new_page()
    page.set_default_timeout(15_000)
    page.goto(sink.url + "/otel.html", wait_until="load")
    page.evaluate("window.done")
    spans = page.evaluate("otelSpans()")
    assert len(spans) == 2, "OpenTelemetry traced both fetches"
    page.goto("about:blank")
    entries = sink.wait_entry_list(lambda e: e["kind"] == "fetch", 2)
    assert len(entries) == 2
    for e in entries:

        def pred(r: dict[str, object], e: dict[str, object] = e) -> bool:
            tc = parse(str(r.get("traceparent") or ""))
            return tc is not None and tc.trace_id == e["trace_id"]

        srv = llm.wait_record(pred)
        tc = parse(str(srv["traceparent"]))
        assert tc is not None and tc.span_id == e["span_id"], (order, srv, e)
    if order == "probe-first":
        # OpenTelemetry ran outside the probe: its ids went on the wire, the probe kept them.
        assert {e["trace_id"] for e in entries} == {s["traceId"] for s in spans}
    assert sink.invalid() == []
    page.close()
