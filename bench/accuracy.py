"""Benchmark: measurement accuracy against injected ground truth, side by side in one run.

One collector (embedded store) and, per scenario, a fresh app + agent + Chromium topology on
loopback, driven by the end-to-end harness (tests/e2e/harness.py). Four figures:

- **agent vs the app's own clock**: the agent's TTFB, TTFT and chunk gaps against the
  CLOCK_MONOTONIC timing log the app writes (matched by trace id), for the Python app and
  the Node.js twin;
- **network δ vs an injected relay delay** D one way (no jitter): δ − 2D;
- **θ vs an injected browser clock shift** S (page-level shift, see SHIFT_CLOCK_JS): the
  median θ of the lowest-δ half of the exchanges, + S (θ = server − browser ≈ −S);
- **render delay vs an injected page delay** R: median render delay − R. The probe stamps a
  paint after a double requestAnimationFrame, so this includes the display frame
  (16.7–33 ms at headless Chromium's 60 Hz): that part is real user-visible latency.

    python -m bench.accuracy [--requests 120]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import report
from demo.browser import chromium
from demo.stack import Stack, StartError
from parallax_contracts.trace_context import parse as parse_traceparent
from tests.e2e.harness import Outcome, Scenario, run

# Fast pacing (as the e2e scenarios): first token after 40 ms, then 6 tokens 10 ms apart,
# so ~120 chats take seconds.
FAST = ["--first-token-ms", "40", "--token-gap-ms", "10", "--tokens", "6"]
RELAY_MS = (10.0, 25.0)
SHIFTS_MS = (3000.0, -1500.0)
RENDER_MS = (0, 20, 40)
# The collector evaluates often so the harness need not wait for the production interval;
# the visible-TTFT band includes the display frame (as in tests/e2e/conftest.py).
SLA_YAML = "interval: 2s\nmetrics:\n  visible_ttft: {band_ms: 50}\n"


def q(values: Sequence[float], p: float) -> float:
    """Inclusive quantile (p in 0…1), the same definition for every figure."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class Row:
    figure: str
    truth: str
    n: int
    cells: list[str]


def _gaps(xs: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(xs)]


def agent_errors(out: Outcome, path: str = "/v1/chat") -> dict[str, list[float]]:
    """agent − app in µs for TTFB, TTFT and each chunk gap, per exchange matched by
    trace id. The app's TTFB ends at its head write: ``t_headers_ns`` (Python writes the
    head at once), else its first write (Node writes the head with the first token)."""
    app: dict[str, dict[str, Any]] = {}
    for rec in out.timing:
        tp = rec.get("traceparent")
        ctx = parse_traceparent(tp) if tp and rec.get("path") == path else None
        if ctx is not None and rec.get("t_writes_ns"):
            app[ctx.trace_id] = rec
    errs: dict[str, list[float]] = {"ttfb": [], "ttft": [], "gap": []}
    for r in out.agent_records:
        srv = app.get(r.get("trace_id") or "")
        if srv is None or r.get("path") != path or r.get("partial"):
            continue
        t0, writes = srv["t_start_ns"], srv["t_writes_ns"]
        head = srv.get("t_headers_ns", writes[0])
        errs["ttfb"].append(r["ttfb_us"] - (head - t0) / 1000)
        errs["ttft"].append(r["ttft_us"] - (writes[0] - t0) / 1000)
        # The agent may see one more body write than the app logs (the chunked terminator).
        got = _gaps(r["chunk_offsets_us"][: len(writes)])
        want = _gaps([w / 1000 for w in writes])
        errs["gap"] += [g - w for g, w in zip(got, want, strict=False)]
    return errs


def _us(signed: list[float]) -> list[str]:
    xs = [abs(x) for x in signed]
    return [f"{statistics.median(xs):.0f} µs", f"{q(xs, 0.95):.0f} µs", f"{max(xs):.0f} µs"]


def _ms(xs: list[float]) -> list[str]:
    return [f"{statistics.median(xs):+.2f} ms", f"{q(xs, 0.95):+.2f} ms", f"{max(xs):+.2f} ms"]


# The display part of a render delay, alone: a bare page changes its DOM after an idle
# pause (as a chat chunk arrives after think time) and waits for the double
# requestAnimationFrame the probe waits for (js_probe/src/core.ts, paint()).
DISPLAY_JS = """async (n) => {
    const out = [];
    for (let i = 0; i < n; i++) {
        await new Promise((r) => setTimeout(r, 10 + Math.random() * 100));
        const t0 = performance.now();
        document.body.textContent += "x";
        await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
        out.push(performance.now() - t0);
    }
    return out;
}"""


def display_frame_ms(n: int) -> list[float]:
    with chromium() as browser:
        page = browser.new_page()
        page.goto("data:text/html,<body></body>")
        got: list[float] = page.evaluate(DISPLAY_JS, n)
    return got


Measured = tuple[list[Row], dict[str, float], dict[str, float]]


def measure(requests: int, log: Callable[[str], None]) -> Measured:
    rows: list[Row] = []
    secs: dict[str, float] = {}
    signed: dict[str, float] = {}  # median agent − app, µs: the systematic part
    with tempfile.TemporaryDirectory(prefix="parallax-accuracy-") as tmp:
        d = Path(tmp)
        (d / "sla.yaml").write_text(SLA_YAML)
        with Stack(d / "collector") as cstack:
            ingest, query = cstack.collector(
                d / "collector", env={"PARALLAX_SLA_CONFIG": str(d / "sla.yaml")}
            )

            def scenario(name: str, sc: Scenario) -> Outcome:
                t = time.monotonic()
                with Stack(d / name) as stack:
                    out = run(sc, stack, ingest, query)
                secs[name] = time.monotonic() - t
                log(f"  {name}: {out.chats} chats, {len(out.pairs)} pairs, {secs[name]:.0f} s")
                return out

            # (a) + (d, R = 0): the Python app, straight to the browser, render delay 0.
            for label, node in (("Python (uvicorn)", False), ("Node.js (http)", True)):
                name = "acc-node" if node else "acc-py"
                sc = Scenario(
                    name,
                    app_args=FAST,
                    node=node,
                    requests=requests,
                    pages=3,
                    page_params={"render_delay_ms": 0},
                )
                out = scenario(name, sc)
                e = agent_errors(out)
                for metric, what in (("ttfb", "TTFB"), ("ttft", "TTFT"), ("gap", "chunk gap")):
                    if e[metric]:
                        signed[f"{what}, {label.split()[0]}"] = statistics.median(e[metric])
                        rows.append(
                            Row(
                                f"agent {what}, {label}: \\|agent − app\\|",
                                "app's CLOCK_MONOTONIC log",
                                len(e[metric]),
                                _us(e[metric]),
                            )
                        )
                if not node:
                    rd = [
                        p["render_delay_ms"]
                        for p in out.pairs
                        if p.get("render_delay_ms") is not None
                    ]
                    if rd:
                        rows.append(_render_row(0, rd))

            # (b) network δ vs 2 × the relay's one-way delay (no jitter).
            for one_way in RELAY_MS:
                name = f"acc-relay-{one_way:.0f}"
                sc = Scenario(
                    name, app_args=FAST, topology="relay", delay_ms=one_way, requests=requests
                )
                out = scenario(name, sc)
                err = [
                    p["network_ms"] - 2 * one_way
                    for p in out.pairs
                    if p.get("network_ms") is not None
                ]
                rows.append(
                    Row("network δ − 2D", f"relay D = {one_way:.0f} ms one way", len(err), _ms(err))
                )

            # (c) θ vs the page's clock shift S: θ ≈ −S; the lowest-δ half bounds the error.
            for shift in SHIFTS_MS:
                name = f"acc-skew-{'p' if shift > 0 else 'm'}{abs(shift):.0f}"
                sc = Scenario(name, app_args=FAST, clock_shift_ms=shift, requests=requests)
                out = scenario(name, sc)
                samples = [
                    (
                        p.get("theta_delay_ms")
                        if p.get("theta_delay_ms") is not None
                        else p.get("network_ms") or 0.0,
                        p["theta_ms"],
                    )
                    for p in out.pairs
                    if p.get("theta_ms") is not None
                ]
                best = [t for _, t in sorted(samples)[: max(1, len(samples) // 2)]]
                err = statistics.median(best) + shift
                all_err = statistics.median(t for _, t in samples) + shift
                truth = f"browser clock {shift:+.0f} ms"
                rows.append(
                    Row(
                        "θ + S (median of the lowest-δ half)",
                        truth,
                        len(best),
                        [f"{err:+.2f} ms", "—", "—"],
                    )
                )
                rows.append(
                    Row(
                        "θ + S (median of all exchanges)",
                        truth,
                        len(samples),
                        [f"{all_err:+.2f} ms", "—", "—"],
                    )
                )

            # (d) render delay vs the page's injected R (R = 0 came with the Python run).
            for r_ms in RENDER_MS[1:]:
                name = f"acc-render-{r_ms}"
                sc = Scenario(
                    name, app_args=FAST, page_params={"render_delay_ms": r_ms}, requests=requests
                )
                out = scenario(name, sc)
                rd = [
                    p["render_delay_ms"] for p in out.pairs if p.get("render_delay_ms") is not None
                ]
                rows.append(_render_row(r_ms, rd))
    t = time.monotonic()
    frames = display_frame_ms(requests)
    secs["display"] = time.monotonic() - t
    rows.append(
        Row(
            "display alone: double rAF after a DOM change (bare page)",
            "—",
            len(frames),
            [f"{x:.2f} ms" for x in (statistics.median(frames), q(frames, 0.95), max(frames))],
        )
    )
    return rows, secs, signed


def _render_row(r_ms: int, rd: list[float]) -> Row:
    err = [x - r_ms for x in rd]
    return Row(
        "render delay − R (includes the display frame)",
        f"page delay R = {r_ms} ms",
        len(err),
        _ms(err),
    )


def render(m: Measured, requests: int, wall_s: float) -> str:
    rows, secs, signed = m
    flags = f" --requests {requests}" if requests != 120 else ""
    cmd = f"`make bench-accuracy` (`python -m bench.accuracy{flags}`)"
    lines = [
        "## Measurement accuracy",
        "",
        f"Machine: {report.machine()}. Commit {report.git_rev()}. Command: {cmd}. "
        f"Wall time {wall_s:.0f} s ({len(secs) - 1} scenarios, one collector).",
        "",
        "Each figure is measured against ground truth injected in the same run: the app's own "
        "CLOCK_MONOTONIC timing log (the clock the agent's `bpf_ktime_get_ns` reads), a "
        "delaying TCP relay, a page-level browser clock shift, and a page that delays showing "
        "each chunk by R ms. Real Chromium, real agent, real collector; app paced at 40 ms "
        "to the first token then 6 tokens 10 ms apart; three pages, random think time. "
        "n counts exchanges (chunk gaps: gaps).",
        "",
        "| Figure | Ground truth | n | median | P95 | max |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.figure} | {r.truth} | {r.n} | " + " | ".join(r.cells) + " |")
    lines += [
        "",
        "How to read it:",
        "- agent vs app: the agent's t1 is the read that completed the request head, the "
        "app's `t_start_ns` is when its framework hands it the request, so the framework's "
        "parsing and dispatch (uvicorn, Node's http) is a systematic part of the TTFB/TTFT "
        "error; chunk gaps cancel it. Signed medians (agent − app): "
        + "; ".join(f"{k} {round(v) or 0:+d} µs" for k, v in signed.items())
        + ". The maxima come from scheduling on a shared 2-core machine: a process preempted "
        "between the app's stamp and its syscall shows the whole preemption as error.",
        "- network δ: the relay adds D each way on top of loopback, so δ − 2D is the "
        "relay's own forwarding (a Python asyncio process) and the scheduling of a busy "
        "2-core machine.",
        "- θ: S is applied to `Date` and `performance.timeOrigin` only (libfaketime under "
        "Chromium made page loads 100× slower). θ = server − browser ≈ −S; the NTP-style "
        "estimate is exact when the two legs are symmetric, so its error is half the "
        "path asymmetry, smallest on the exchanges with the least δ.",
        "- render delay: the probe marks a chunk visible after a double requestAnimationFrame "
        "(the frame that draws it and the one that presents it), so render delay − R is the "
        "display, real user-visible time, not an error. Headless Chromium runs frames at "
        "60 Hz while animating but starts the first frame after an idle pause at once, so "
        "the double rAF after a DOM change can take less than the 16.7–33.3 ms a fixed "
        "60 Hz grid gives: the 'display alone' row measures it in the same browser.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=120, help="chats per scenario")
    ap.add_argument("--no-write", action="store_true", help="print only (no docs/benchmarks.md)")
    args = ap.parse_args(argv)
    t = time.monotonic()
    try:
        m = measure(args.requests, lambda s: print(s, flush=True))
    except (StartError, AssertionError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"bench.accuracy: a scenario failed: {first}", file=sys.stderr)
        return 1
    md = render(m, args.requests, time.monotonic() - t)
    print(md)
    if not args.no_write:
        report.write_section("accuracy", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
