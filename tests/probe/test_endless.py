"""An endless token stream read through the probe: the page's JS heap stays within a small
bound (the probe keeps 256 chunk times and a count, and buffers no body)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from tests.probe.conftest import LlmServer
from tests.probe.pages import probe_page
from tests.probe.sink import Page, Sink

pytestmark = pytest.mark.browser

DURATION_S = 14
# 10 000 tokens (the server's cap) 1 ms apart: ~13.5 s here (fetch reads ~1.4 ms a chunk),
# about the test's length, i.e. endless for it.
SCRIPT = """
window.count = 0; window.bytes = 0;
const out = document.getElementById('out');
const url = %(api)s + '/v1/chat?first_token_ms=0&token_gap_ms=1&tokens=10000';
fetch(url, {method: 'POST', body: 'go'})
  .then(r => {
    const rd = r.body.getReader();
    const pump = () => rd.read().then(x => {
      if (x.done) return;
      count++; bytes += x.value.length; out.textContent = String(count); pump();
    });
    pump();
  });
"""


@pytest.fixture
def llm(tmp_path: Path) -> Iterator[LlmServer]:
    """Its own server: an abandoned stream keeps it writing (paced) until the token cap, which
    must not disturb the pacing the other tests measure."""
    s = LlmServer(tmp_path / "timing.jsonl")
    yield s
    s.close()


def test_endless_stream_keeps_the_heap_bounded(
    browser: Browser, llm: LlmServer, sink: Sink
) -> None:
    sink.pages["/endless.html"] = Page(
        probe_page(
            sink.url + "/v1/beacons",
            SCRIPT % {"api": json.dumps(llm.url)},
            propagateTo=[llm.url],
            renderTarget="#out",
        )
    )
    page = browser.new_page()
    page.set_default_timeout(15_000)
    cdp = page.context.new_cdp_session(page)
    page.goto(sink.url + "/endless.html", wait_until="load")
    page.wait_for_function("window.count > 100")

    def heap() -> float:
        cdp.send("HeapProfiler.collectGarbage")
        used: float = cdp.send("Runtime.getHeapUsage")["usedSize"]
        return used

    page.wait_for_timeout(2000)  # past start-up allocations
    start, c0 = heap(), page.evaluate("window.count")
    page.wait_for_timeout((DURATION_S - 3) * 1000)
    end, c1 = heap(), page.evaluate("window.count")
    chunks = c1 - c0
    # Enough chunks for the bound below (3 B a chunk) to clear the heap's own noise (≤ 8 KiB)
    # twice over: measured ~6,500 over these 11 s.
    assert chunks > 4000, f"the stream kept flowing ({c0} → {c1} chunks)"
    growth = end - start
    print(f"heap {start / 1024:.0f} KiB -> {end / 1024:.0f} KiB over {chunks} chunks")
    # Measured: −6 to +8 KiB (the heap's own noise, over 8,700 chunks in 27 s or 6,600 in 9 s).
    # A tee holding the body (~150 B a chunk) or an uncapped list of chunk times (8 B a chunk)
    # would break this bound.
    assert growth < 3 * chunks, f"JS heap grew {growth / 1024:.0f} KiB over {chunks} chunks"
    page.goto("about:blank")  # pagehide: the still-open stream's entry is sent
    e = sink.wait_entry(lambda e: e["kind"] == "fetch")
    assert len(e["chunk_ms"]) == 256 and e["chunks"] >= c1
    assert sink.invalid() == []
    page.close()
