"""One latency-trap scenario on loopback: app (+ relay or nginx) → agent → collector ← probe.

A scenario starts its own app under its own service name (so one collector can hold every
scenario side by side), the agent on the server ports (or takes its ports from an agent the
scenarios share: ``TracedPorts``), and Chromium pages running the chat
page with the probe; it drives a fixed number of chats, hands the beacons over, waits until
the collector has paired them, and returns the SLA report for its service together with the
pairs and the app's own timing log — the ground truth the tests compare against.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demo.browser import chat_url, chromium, flush_beacons
from demo.stack import Stack
from tests.agent.helpers import jsonl

# A browser whose wall clock is off by S ms: Date and performance.timeOrigin shifted, the
# monotonic clock (performance.now) untouched — as on a laptop without NTP. A page-level
# shift because libfaketime under Chromium 156 made a page load take 16–33 s instead of
# 0.1 s (every clock read goes through it), too slow for a scenario of 100+ exchanges.
SHIFT_CLOCK_JS = """(() => {
    const S = %f, RealDate = Date, realNow = RealDate.now.bind(RealDate);
    const origin = performance.timeOrigin + S;
    Object.defineProperty(Performance.prototype, "timeOrigin", {get: () => origin});
    class ShiftedDate extends RealDate {
        constructor(...a) { if (a.length) super(...a); else super(realNow() + S); }
        static now() { return realNow() + S; }
    }
    globalThis.Date = ShiftedDate;
})();"""

DRIVE_JS = """([kind, n, extra]) => {
    window.__run = {done: 0, errors: 0, finished: false};
    (async () => {
        while (window.__run.done + window.__run.errors < n) {
            try { await window.chat(kind, extra); window.__run.done++; }
            catch (e) { window.__run.errors++; }
            // Random think time: arrivals independent of the server's own rhythm (a closed
            // loop without it would fall into step with a stalling event loop and hide it).
            await new Promise((r) => setTimeout(r, 10 + Math.random() * 100));
        }
        window.__run.finished = true;
    })();
}"""


# The scenarios' agent: no CPU budget, as the scenarios check every pair, and on a loaded
# test machine the agent would otherwise trace a sample (its budget is 5 % of the node).
AGENT_ARGS = ("--cpu-budget", "0")

# How often the collector is asked whether the pairs and the SLA evaluation are in: its
# answers come after the chats, so asking often changes nothing measured (each wait was
# ~1 s at a 1 s poll: docs/benchmarks.md, "Where the two phases' time goes now").
POLL_S = 0.25


def get_json(url: str, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


@dataclass
class Scenario:
    """What to run. ``topology``: "direct", "relay" or "nginx"."""

    service: str
    kind: str = "fetch"
    requests: int = 120
    pages: int = 3
    app_args: list[str] = field(default_factory=list)
    page_params: dict[str, Any] = field(default_factory=dict)
    topology: str = "direct"
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    buffering: bool = False
    node: bool = False
    clock_shift_ms: float = 0.0  # the page's wall clock runs this far ahead (SHIFT_CLOCK_JS)


@dataclass
class TracedPorts:
    """An agent already running on ``ports`` (started before any server listens on them),
    shared by the scenarios of a module: each takes its server ports from here and reads
    the agent's records of those ports. An agent's start is ~5 s of bcc compile, which a
    scenario would otherwise pay each time (docs/benchmarks.md, "Where the two phases'
    time goes now")."""

    ports: list[int]
    jsonl: Path

    def take(self) -> int:
        return self.ports.pop()


@dataclass
class Outcome:
    report: dict[str, Any]  # the SLA document's routes for this service
    pairs: list[dict[str, Any]]
    timing: list[dict[str, Any]]  # the app's own clock
    agent_records: list[dict[str, Any]]
    chats: int

    def route(self, path: str) -> dict[str, Any]:
        for r in self.report["routes"]:
            if r["route"] == path:
                found: dict[str, Any] = r
                return found
        raise AssertionError(f"route {path} not in {[r['route'] for r in self.report['routes']]}")


def run(
    sc: Scenario,
    stack: Stack,
    ingest: str,
    query: str,
    timeout_s: float = 120,
    traced: TracedPorts | None = None,
) -> Outcome:
    """One scenario; its agent is ``traced``'s when given, else one of its own in ``stack``."""
    started = dt.datetime.now(dt.UTC)
    os.environ["OTEL_SERVICE_NAME"] = sc.service  # inherited by the app: its service name
    try:
        app = stack.llm_app(
            *sc.app_args, name=sc.service, node=sc.node, port=traced.take() if traced else 0
        )
    finally:
        del os.environ["OTEL_SERVICE_NAME"]
    app_port = int(app.rsplit(":", 1)[1])
    ports = [app_port]
    browser_base = app
    if sc.topology == "relay":
        relay_port = stack.relay(app_port, sc.delay_ms, sc.jitter_ms)
        browser_base = f"http://127.0.0.1:{relay_port}"
    elif sc.topology == "nginx":
        name = f"{sc.service}-nginx"
        nginx_port = stack.nginx(app_port, sc.buffering, name, traced.take() if traced else 0)
        ports.insert(0, nginx_port)
        browser_base = f"http://127.0.0.1:{nginx_port}"
    if traced is None:
        stack.agent(ports, ingest, *AGENT_ARGS)
    url = chat_url(browser_base, ingest, flush_ms=1000, **sc.page_params)
    per_page = -(-sc.requests // sc.pages)
    with chromium() as browser:
        pages = []
        for _ in range(sc.pages):
            page = browser.new_page()
            if sc.clock_shift_ms:
                page.add_init_script(SHIFT_CLOCK_JS % sc.clock_shift_ms)
            page.goto(url, wait_until="load")
            page.wait_for_function("typeof window.chat === 'function'")
            page.evaluate(DRIVE_JS, [sc.kind, per_page, None])
            pages.append(page)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = [p.evaluate("window.__run") for p in pages]
            if all(s["finished"] for s in states):
                break
            time.sleep(0.2)
        chats = sum(s["done"] for s in states)
        assert chats >= sc.requests * 0.95, states
        for p in pages:
            flush_beacons(p)
        time.sleep(0.5)
    pairs = wait_pairs(query, started, sc.service, int(chats * 0.95), deadline)
    report = wait_sla(query, sc.service, len(pairs) * 0.9, deadline)
    timing = jsonl(stack.workdir / f"{sc.service}.timing.jsonl")
    records = jsonl(traced.jsonl if traced else stack.workdir / "agent.jsonl")
    agent = [r for r in records if r.get("local_port") in ports]
    stack.close()  # app, proxy (and agent, if its own): the next scenario brings its own
    return Outcome(report, pairs, timing, agent, chats)


def wait_pairs(
    query: str, since: dt.datetime, service: str, n: int, deadline: float
) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"since": since.isoformat(), "limit": 1000})
    mine: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = get_json(f"{query}/v1/requests?{q}")["requests"]
        mine = [r for r in rows if r["service"] == service]
        if len(mine) >= n:
            return mine
        time.sleep(POLL_S)
    raise AssertionError(f"only {len(mine)} of {n} pairs for {service} reached the collector")


def wait_sla(query: str, service: str, n: float, deadline: float) -> dict[str, Any]:
    """The SLA document once its evaluation covers this scenario's pairs."""
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = get_json(f"{query}/v1/sla")
        routes = [r for r in doc.get("routes", []) if r["service"] == service]
        if routes and max(m.get("n", 0) for r in routes for m in r["metrics"].values()) >= n:
            return {**doc, "routes": routes}
        time.sleep(POLL_S)
    raise AssertionError(f"the SLA report never covered {service}: {doc}")
