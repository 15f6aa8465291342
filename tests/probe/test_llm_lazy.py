"""The token reader is a module of its own (js_probe/dist/parallax-llm.min.js), which the core
imports from its own directory when a page's first LLM candidate stream arrives, once per
page — in real Chromium. Served next to the core: every LLM stream gets its ``llm`` object,
also one that streamed entirely before the reader arrived (held, then replayed: its token
times are the arrival times the page's own code saw). Missing (404): the streams keep their
chunk times, no ``llm``, ``reason: llm_unread``, and the page sees nothing different. On a
page with a renderTarget, an LLM stream's paint is the one after its first answer token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from tests.agent.llm.stack import Replay
from tests.probe.pages import probe_page
from tests.probe.sink import Page as SinkPage
from tests.probe.sink import Sink

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    r = Replay(tmp_path_factory.mktemp("replay"))
    yield r
    r.stop()


def _page(
    browser: Browser, sink: Sink, replay: Replay, probe_src: str = "/parallax.min.js", **o: Any
) -> tuple[Page, list[str]]:
    sink.pages["/lazy.html"] = SinkPage(
        probe_page(
            sink.url + "/v1/beacons",
            "",
            probe_src=probe_src,
            propagateTo=[replay.url],
            flushIntervalMs=200,
            **o,
        )
    )
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.set_default_timeout(30_000)
    page.goto(sink.url + "/lazy.html", wait_until="load")
    return page, errors


# The page's own code: a stream read to its end, with the time its first content reached
# the code (the reader's first answer token must be that read), or an EventSource.
_APP = """
async ([base, kind]) => {
  const post = (path, q) => fetch(base + path + q, {method: "POST",
    headers: {"content-type": "application/json"}, body: "{}"});
  const out = document.getElementById("out");
  const readAll = async (res, mark) => {
    const rd = res.body.getReader(); const dec = new TextDecoder(); let text = "", first;
    for (;;) {
      const {done, value} = await rd.read();
      if (done) break;
      const t = performance.now();
      const s = dec.decode(value, {stream: true});
      text += s;
      if (mark) out.textContent += s;  // every chunk shown: role-only, reasoning, answer
      if (first === undefined && /"(content|text)":"[^"]/.test(s)) first = t;
    }
    return {text, first};
  };
  const q = "&first_ms=0&gap_ms=10";
  if (kind === "anthropic") return readAll(await post("/v1/messages", "?tokens=5" + q));
  if (kind === "ollama") return readAll(await post("/api/chat", "?tokens=6"));
  if (kind === "chat") return readAll(await post("/v1/chat/completions", "?tokens=6" + q));
  if (kind === "shown")
    return readAll(await post("/v1/chat/completions", "?tokens=4&reasoning=3&gap_ms=40"), true);
  if (kind === "csv") return readAll(await fetch(base + "/csv?rows=10&gap_ms=2"));
  if (kind === "eventsource") return new Promise((resolve) => {
    const es = new EventSource(base + "/v1/chat/completions?tokens=5&usage=1");
    let n = 0;
    es.onmessage = (m) => { n++; if (m.data === "[DONE]") { es.close(); resolve({n}); } };
  });
}
"""


def _entries(sink: Sink, replay: Replay, n: int) -> list[dict[str, Any]]:
    return sink.wait_entry_list(lambda e: e["url"].startswith(replay.url), n, timeout_s=20)


def test_reader_next_to_the_core_loaded_once_and_replayed(
    browser: Browser, sink: Sink, replay: Replay
) -> None:
    # The core from /js/: import() resolves the reader against the script's own URL. The
    # reader answers 500 ms late: the first stream (10 ms apart, ~70 ms) is held whole.
    sink.delay_s["/js/parallax-llm.min.js"] = 0.5
    page, errors = _page(browser, sink, replay, probe_src="/js/parallax.min.js")
    chat = page.evaluate(_APP, [replay.url, "chat"])
    got = {k: page.evaluate(_APP, [replay.url, k]) for k in ("anthropic", "ollama", "eventsource")}
    entries = _entries(sink, replay, 4)
    by_path = {e["url"].rsplit("/", 1)[-1]: e for e in entries if e["kind"] == "fetch"}
    first = by_path["completions"]
    assert first["kind"] == "fetch" and "reason" not in first, first
    # held, then replayed: the first answer token is the read that brought the page's code
    # its first content. The two stamps are that read's, taken a few microtasks apart (0.3 ms
    # once in CI, with the probe's times rounded to 0.1 ms); the next read is 10 ms later.
    assert abs(first["llm"]["first_token_ms"] - chat["first"]) <= 1.0, (first, chat)
    assert first["llm"]["tokens"] == 6 and first["llm"]["end"] == "complete"
    assert first["llm"]["first_token_ms"] < first["start_ms"] + 400  # before the reader came
    assert by_path["messages"]["llm"]["dialect"] == "anthropic.messages"
    assert by_path["chat"]["llm"]["dialect"] == "ollama"
    es = [e for e in entries if e["kind"] == "eventsource"]
    assert len(es) == 1 and es[0]["llm"]["tokens"] == 5 and got["eventsource"]["n"] == 9
    paths = [p.split("?")[0] for p, _ in sink.requests]
    assert paths.count("/js/parallax-llm.min.js") == 1, paths  # once per page
    assert "/parallax-llm.min.js" not in paths
    assert errors == [] and sink.invalid() == []
    page.close()


def test_reader_missing_streams_keep_chunks_and_say_why(
    browser: Browser, sink: Sink, replay: Replay
) -> None:
    sink.missing.add("/parallax-llm.min.js")
    page, errors = _page(browser, sink, replay)
    kinds = ("chat", "anthropic", "eventsource", "csv")
    got = {k: page.evaluate(_APP, [replay.url, k]) for k in kinds}
    # the page's code saw its streams whole
    assert got["chat"]["text"].endswith("data: [DONE]\n\n") and got["chat"]["first"] > 0
    assert '"type":"message_stop"' in got["anthropic"]["text"] and got["eventsource"]["n"] == 9
    assert got["csv"]["text"].startswith("id,value\n0,0\n")
    entries = _entries(sink, replay, 4)
    for e in entries:
        assert "llm" not in e, e
        assert e["chunks"] >= 2 and e["first_chunk_ms"] > 0, e
        if e["url"].endswith("/csv"):
            assert "reason" not in e, e  # no LLM candidate: nothing was missing
        else:
            assert e["reason"] == "llm_unread", e
    paths = [p.split("?")[0] for p, _ in sink.requests]
    assert paths.count("/parallax-llm.min.js") == 1, paths  # asked for once, not per stream
    # the failed import is the browser's own console message, not an error of the page's
    assert all("parallax-llm.min.js" in x or "404" in x for x in errors), errors
    assert sink.invalid() == []
    page.close()


def test_paint_after_the_first_answer_token(
    browser: Browser, sink: Sink, replay: Replay, tmp_path: Path
) -> None:
    # The page shows every chunk as it comes (the role-only delta, 3 reasoning deltas 40 ms
    # apart, then the answer): the paint that counts is the one after the first answer token.
    page, errors = _page(browser, sink, replay, renderTarget="#out")
    for _ in range(2):  # the first stream may start before the reader has come
        page.evaluate("document.getElementById('out').textContent = ''")
        shown = page.evaluate(_APP, [replay.url, "shown"])
        assert shown["first"] > 0
    entries = _entries(sink, replay, 2)
    for e in entries:
        llm = e["llm"]
        assert e["first_chunk_ms"] < llm["first_output_ms"] < llm["first_token_ms"], e
        assert llm["first_token_ms"] - e["first_chunk_ms"] >= 100  # 3 reasoning deltas first
        # the paint after the first answer token (two frames), not after the first chunk
        assert llm["first_token_ms"] <= e["rendered_ms"] < llm["first_token_ms"] + 200, e
    assert errors == [] and sink.invalid() == []
    page.close()


def test_a_first_stream_past_the_bound_is_not_read(
    browser: Browser, sink: Sink, replay: Replay
) -> None:
    # 1 MB in one event before the reader has come (it answers 300 ms late): past the 128 KiB
    # held for it, so that stream is not read; the page reads every byte; the next one is read.
    def chat(content: str) -> str:
        return 'data: {"choices":[{"delta":{"content":"' + content + '"}}]}\n\n'

    done = 'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    body = (chat("a") + chat("y" * (1 << 20)) + chat("b") + done).encode()
    sink.pages["/big"] = SinkPage(body, ctype="text/event-stream")
    sink.pages["/small"] = SinkPage((chat("a") + done).encode(), ctype="text/event-stream")
    sink.delay_s["/parallax-llm.min.js"] = 0.3
    page, errors = _page(browser, sink, replay)
    read = """async (u) => {
      const rd = (await fetch(u)).body.getReader(); let n = 0;
      for (;;) { const {done, value} = await rd.read(); if (done) return n; n += value.length; }
    }"""
    assert page.evaluate(read, "/big") == len(body)
    big = sink.wait_entry(lambda e: e["url"].endswith("/big"))
    assert "llm" not in big and big["reason"] == "llm_overflow", big
    assert page.evaluate(read, "/small") > 0
    small = sink.wait_entry(lambda e: e["url"].endswith("/small"))
    assert small["llm"]["tokens"] == 1 and "reason" not in small, small
    assert errors == [] and sink.invalid() == []
    page.close()
