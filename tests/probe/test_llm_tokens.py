"""The probe reads LLM streams as tokens, in real Chromium, under real clients: the `openai`
SDK (Chat Completions, Responses) and Vercel's `ai` SDK streaming in the page, the page's own
fetch code for Anthropic and Ollama streams, an EventSource, against the replay server
(tests/agent/llm/replay_server.py) on another origin. The client code's own first content
event is the truth for the probe's first token (within 1 ms at P95); the counts are the
stream's own; a CSV download gets no token fields; a 1 MB event and garbage never reach the
page as an error."""

from __future__ import annotations

import json
import math
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

TOKENS = 12
RUNS = 20  # streams per client: the P95 of the first-token error is over these


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    r = Replay(tmp_path_factory.mktemp("replay"))
    yield r
    r.stop()


def _page(browser: Browser, sink: Sink, replay: Replay) -> tuple[Page, list[str]]:
    sink.pages["/llm.html"] = SinkPage(
        probe_page(
            sink.url + "/v1/beacons",
            "",
            after_probe='<script src="/llm.js"></script>',
            propagateTo=[replay.url],
            flushIntervalMs=200,
        )
    )
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(30_000)
    page.goto(sink.url + "/llm.html", wait_until="load")
    return page, errors


def _p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def _entry_of(sink: Sink, run: dict[str, Any], path: str) -> dict[str, Any]:
    """The beacon entry of the request the client made during ``run`` (runs are one at a
    time: the probe's own start time lies inside the run)."""
    return sink.wait_entry(
        lambda e: e["url"].endswith(path) and run["start"] - 0.2 <= e["start_ms"] <= run["end"],
        timeout_s=20,
    )


def _warm(page: Page, call: str, args: list[Any]) -> None:
    """One stream before the measured ones: the first compiles the SDK's code in the page
    (measured: its first token reaches the client code up to 7 ms late, once)."""
    page.evaluate(call, args)


def _check_runs(
    sink: Sink,
    runs: list[dict[str, Any]],
    path: str,
    tokens: list[int],
    label: str,
    p95_ms: float = 1.0,
) -> list[float]:
    """Each run's entry against what its client saw; returns |probe − client| first-token
    errors (ms), whose P95 must be within ``p95_ms``."""
    errs, later = [], []
    for run, n in zip(runs, tokens, strict=True):
        e = _entry_of(sink, run, path)
        llm = e.get("llm")
        assert llm, (label, e)
        errs.append(round(abs(llm["first_token_ms"] - run["first"]), 1))  # the probe's 0.1 ms
        # every later token: the client's time of it against the probe's
        later += [
            c - p for c, p in zip(run.get("times", [])[1:], llm["token_ms"][1:], strict=False)
        ]
        # the probe dates a token when the app's read of its chunk returned; the client's
        # code sees it after its own parsing (0.1: the probe's rounding)
        assert llm["first_token_ms"] <= run["first"] + 0.1, (label, llm, run)
        assert run["firstOutput"] - llm["first_output_ms"] >= -0.1, (label, llm, run)
        assert llm["tokens"] == n, (label, llm, run)
        assert llm["end"] == "complete", (label, llm)
        assert llm["token_ms"][0] == llm["first_output_ms"] and len(llm["token_ms"]) <= 1024
        assert llm["token_ms"] == sorted(llm["token_ms"])
    print(  # the figures docs/probe.md quotes
        f"\n{label}: first-token error over {len(errs)} streams: median "
        f"{sorted(errs)[len(errs) // 2]:.2f} ms, P95 {_p95(errs):.2f} ms, max {max(errs):.2f} ms"
        + (f"; later tokens ({len(later)}): P95 {_p95(later):.2f} ms" if later else "")
    )
    assert _p95(errs) <= p95_ms, (label, sorted(errs))
    if later:
        assert _p95(later) <= p95_ms, (label, sorted(later))
    return errs


def test_openai_sdk_chat_completions(browser: Browser, sink: Sink, replay: Replay) -> None:
    page, errors = _page(browser, sink, replay)
    _warm(page, "([u, q]) => openaiChat(u, q, true)", [replay.url + "/v1", {"tokens": "2"}])
    runs, expected = [], []
    for i in range(RUNS):
        reasoning = 3 if i % 4 == 3 else 0
        usage = i % 2 == 0
        q = {"tokens": str(TOKENS), "gap_ms": "8", "reasoning": str(reasoning)}
        run = page.evaluate(
            "([u, q, usage]) => openaiChat(u, q, usage)", [replay.url + "/v1", q, usage]
        )
        assert run["text"] == "".join(f" w{k}" for k in range(TOKENS))
        assert run["events"] == TOKENS + reasoning
        runs.append(run)
        expected.append(TOKENS + reasoning)  # usage states it; without, the events say it
    _check_runs(sink, runs, "/v1/chat/completions", expected, "openai SDK, chat")
    for run in runs:
        llm = _entry_of(sink, run, "/v1/chat/completions")["llm"]
        assert llm["dialect"] == "openai.chat"
        if llm["first_output_ms"] < llm["first_token_ms"]:  # the reasoning runs
            assert llm["tokens"] == TOKENS + 3
    sources = [_entry_of(sink, r, "/chat/completions")["llm"]["tokens_source"] for r in runs]
    assert sources == ["usage", "events"] * (RUNS // 2)
    assert errors == [] and sink.invalid() == []
    page.close()


def test_vercel_ai_sdk_chat(browser: Browser, sink: Sink, replay: Replay) -> None:
    page, errors = _page(browser, sink, replay)
    _warm(page, "([u, q]) => aiSdkChat(u, q)", [replay.url + "/v1", "?tokens=2"])
    runs = []
    for _ in range(RUNS):
        run = page.evaluate(
            "([u, q]) => aiSdkChat(u, q)", [replay.url + "/v1", f"?tokens={TOKENS}&gap_ms=8"]
        )
        assert run["text"] == "".join(f" w{k}" for k in range(TOKENS))
        runs.append(run)
    # The ai SDK hands its consumer the first text part about 1.4 ms (median, measured)
    # after the bytes reached the page: its own start-of-stream parts and validation come
    # first. The probe dates arrival; later tokens agree within 1 ms at P95.
    _check_runs(sink, runs, "/v1/chat/completions", [TOKENS] * RUNS, "ai SDK, chat", 5.0)
    assert errors == [] and sink.invalid() == []
    page.close()


def test_openai_sdk_responses_reasoning_first(browser: Browser, sink: Sink, replay: Replay) -> None:
    page, errors = _page(browser, sink, replay)
    _warm(page, "([u, q]) => openaiResponses(u, q)", [replay.url + "/v1", {"tokens": "2"}])
    runs = [
        page.evaluate(
            "([u, q]) => openaiResponses(u, q)",
            [replay.url + "/v1", {"tokens": "6", "reasoning": "4", "gap_ms": "10"}],
        )
        for _ in range(RUNS)
    ]
    _check_runs(sink, runs, "/v1/responses", [10] * RUNS, "openai SDK, responses")
    for run in runs:
        llm = _entry_of(sink, run, "/v1/responses")["llm"]
        assert llm["dialect"] == "openai.responses" and llm["tokens_source"] == "usage"
        # 4 reasoning deltas 15 ms apart before the answer: the two first times differ
        assert llm["first_token_ms"] - llm["first_output_ms"] >= 4 * 10 - 5
    assert errors == [] and sink.invalid() == []
    page.close()


# The page's own code: fetch and read the body (Anthropic, Ollama, cut, cancel), an
# EventSource, a CSV download. Returns what the app saw.
_APP = """
async ([base, kind]) => {
  const post = (path, q) => fetch(base + path + q, {method: "POST",
    headers: {"content-type": "application/json"}, body: "{}"});
  const readAll = async (res, stopAfter) => {
    const rd = res.body.getReader(); const dec = new TextDecoder(); let text = "", n = 0;
    try {
      for (;;) {
        const {done, value} = await rd.read();
        if (done) break;
        text += dec.decode(value, {stream: true});
        if (stopAfter && ++n >= stopAfter) { await rd.cancel(); break; }
      }
    } catch (e) {
      return text + " [" + e.name + "]";  // a cut chunked stream: the read rejects
    }
    return text;
  };
  if (kind === "anthropic") return readAll(await post("/v1/messages", "?tokens=7&reasoning=2"));
  if (kind === "anthropic-error")
    return readAll(await post("/v1/messages", "?tokens=3&error=overloaded_error"));
  if (kind === "ollama") return readAll(await post("/api/chat", "?tokens=9"));
  if (kind === "cut") return readAll(await post("/v1/chat/completions", "?tokens=8&cut=1"));
  if (kind === "cancel")
    return readAll(await post("/v1/chat/completions", "?tokens=40&gap_ms=20"), 4);
  if (kind === "csv") return readAll(await fetch(base + "/csv?rows=30&gap_ms=2"));
  if (kind === "eventsource") return new Promise((resolve) => {
    const es = new EventSource(base + "/v1/chat/completions?tokens=5&usage=1");
    const seen = [];
    es.onmessage = (m) => {
      seen.push(m.data);
      if (m.data === "[DONE]") { es.close(); resolve(seen.length); }
    };
  });
}
"""


def test_page_code_dialects_endings_and_a_csv(browser: Browser, sink: Sink, replay: Replay) -> None:
    page, errors = _page(browser, sink, replay)
    got = {k: page.evaluate(_APP, [replay.url, k]) for k in (
        "anthropic", "anthropic-error", "ollama", "cut", "cancel", "csv", "eventsource",
    )}  # fmt: skip
    assert got["csv"].startswith("id,value\n0,0\n") and got["eventsource"] == 9
    assert got["cut"].endswith("[TypeError]")  # the server left without the final chunk
    entries = sink.wait_entry_list(lambda e: e["url"].startswith(replay.url), 7)

    def one(path: str, kind: str = "fetch", **llm: Any) -> dict[str, Any]:
        es = [e for e in entries if e["url"].endswith(path) and e["kind"] == kind]
        es = [e for e in es if all(e.get("llm", {}).get(k) == v for k, v in llm.items())]
        assert len(es) == 1, (path, llm, entries)
        return es[0]

    a = one("/v1/messages", end="complete")["llm"]
    assert (a["dialect"], a["tokens"], a["tokens_source"]) == ("anthropic.messages", 9, "usage")
    assert a["first_output_ms"] < a["first_token_ms"]  # 2 thinking deltas first
    err = one("/v1/messages", end="error")["llm"]
    assert err["tokens"] == 3 and err["tokens_source"] == "events"
    o = one("/api/chat")["llm"]
    assert (o["dialect"], o["tokens"], o["end"]) == ("ollama", 9, "complete")
    cut = one("/v1/chat/completions", end="server_cut")
    # of 8: the last 3 events (w7, finish, [DONE]) were never written; Chromium may drop
    # what it held when the connection broke
    assert cut["error"] == "network" and 1 <= cut["llm"]["tokens"] <= 7
    cancel = one("/v1/chat/completions", end="client_aborted")
    assert cancel["error"] == "abort" and 1 <= cancel["llm"]["tokens"] <= 4
    es = one("/v1/chat/completions", kind="eventsource")["llm"]
    assert (es["tokens"], es["tokens_source"], es["end"]) == (5, "usage", "complete")
    csv = one("/csv")
    assert "llm" not in csv and csv["chunks"] >= 2, csv  # bytes: a first chunk, no tokens
    assert errors == [] and sink.invalid() == []
    page.close()


def test_a_1_mb_event_and_garbage_never_reach_the_page(
    browser: Browser, sink: Sink, replay: Replay, tmp_path: Path
) -> None:
    def chat(content: str) -> str:
        return "data: " + json.dumps({"choices": [{"delta": {"content": content}}]}) + "\n\n"

    body = (
        chat("")
        + chat("a")
        + chat("y" * (1 << 20))
        + "data: {garbage\n\n"
        + "\x00\xff\ud7ff not sse at all \r\r\n"
        + chat("b")
        + 'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    ).encode("utf-8", "surrogatepass")
    sink.pages["/big"] = SinkPage(body, ctype="text/event-stream")
    done = 'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    sink.pages["/warm"] = SinkPage((chat("a") + done).encode(), ctype="text/event-stream")
    page, errors = _page(browser, sink, replay)
    # The reader first (its own load): a stream that comes before it is held, 128 KiB at
    # most — test_llm_lazy.py has a 1 MB first stream; this one is about the reader.
    page.evaluate("async () => { await (await fetch('/warm')).body.pipeTo(new WritableStream()); }")
    sink.wait_entry(lambda e: e["url"].endswith("/warm") and "llm" in e)
    n = page.evaluate(
        """async () => {
          const res = await fetch("/big");
          const rd = res.body.getReader(); let n = 0;
          for (;;) { const {done, value} = await rd.read(); if (done) break; n += value.length; }
          return n;
        }"""
    )
    assert n == len(body)  # the app read every byte, unchanged in length
    llm = sink.wait_entry(lambda e: e["url"].endswith("/big"))["llm"]
    assert llm["tokens"] == 2 and llm["end"] == "complete"
    assert llm["bad_events"] == 2  # the 1 MB event (not read) and the garbage
    assert errors == [] and sink.invalid() == []
    page.close()
