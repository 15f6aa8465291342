"""Why a route's users wait longer (or shorter) than its server says: parts, traps, sentence.

The parts add up per request (docs/ARCHITECTURE.md): user TTFB − server TTFB = network δ
(against the edge hop) + what each hop between edge and origin adds + the kernel queue wait
(accept part + receive part). Visible TTFT adds the render delay. P95s do not add, so parts
are ranked by their own P95, the figure an engineer can act on.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.sla.source import HOLD_PREFIX, HOLD_REASONS, HOP_PREFIX
from collector.sla.stats import SeriesStats
from collector.sla.words import ms, signed

PART_LABELS = {
    "render": "render delay",
    "network": "network δ",
    "recv_queue": "receive-queue wait (event-loop lag)",
    "accept_queue": "accept-queue wait",
    "hop": "proxy",
}

# which parts can explain each metric's divergence
_PARTS_OF = {
    "ttfb": ("network", "accept_queue", "recv_queue", "hop"),
    "ttft": ("network", "accept_queue", "recv_queue", "hop"),
    "visible_ttft": ("render", "network", "accept_queue", "recv_queue", "hop"),
    "itl": ("network", "hop"),
    "duration": ("network", "accept_queue", "recv_queue", "hop"),
}

USER_PHRASE = {
    "ttfb": ("users get the first byte at P95 {u}", "the app reports {s}"),
    "ttft": ("users receive the first token at P95 {u}", "the app writes it at {s}"),
    "visible_ttft": ("users see the first token at P95 {u}", "the app reports {s}"),
    "itl": ("users wait P95 {u} between tokens", "the app writes them {s} apart"),
    "duration": ("users wait P95 {u} for the whole answer", "the app reports {s}"),
}
# A route in no stream dialect (a CSV download, a feed) streams chunks, not tokens.
CHUNK_PHRASE = {
    "ttft": ("users receive the first chunk at P95 {u}", "the app writes it at {s}"),
    "itl": ("users wait P95 {u} between chunks", "the app writes them {s} apart"),
}
METRIC_LABEL = {
    "ttfb": "TTFB",
    "ttft": "TTFT",
    "visible_ttft": "visible TTFT",
    "itl": "inter-token latency",
    "duration": "duration",
}


@dataclass(frozen=True, slots=True)
class RankedPart:
    part: str  # network, recv_queue, accept_queue, render, hop:<i>:<service>
    label: str
    p95_ms: float


def p95(series: dict[str, SeriesStats], name: str) -> float | None:
    s = series.get(name)
    return s.at(0.95) if s and s.n else None


def p50(series: dict[str, SeriesStats], name: str) -> float | None:
    s = series.get(name)
    return s.at(0.5) if s and s.n else None


def hop_parts(series: dict[str, SeriesStats]) -> list[tuple[int, str, float]]:
    out = []
    for name, st in series.items():
        if name.startswith(HOP_PREFIX) and st.n:
            _, idx, svc = name.split(":", 2)
            v = st.at(0.95)
            if v is not None:
                out.append((int(idx), svc, v))
    return sorted(out)


def ranked_parts(metric: str, series: dict[str, SeriesStats]) -> list[RankedPart]:
    """The parts that can explain this metric, largest P95 first (only those measured)."""
    out: list[RankedPart] = []
    for part in _PARTS_OF[metric]:
        if part == "hop":
            for idx, svc, v in hop_parts(series):
                label = "edge proxy" if idx == 1 else f"proxy hop {idx}"
                out.append(RankedPart(f"hop:{idx}:{svc}", f"{label} {svc}", v))
            continue
        pv = p95(series, part)
        if pv is not None and pv > 0.05:  # a part that is not there explains nothing
            out.append(RankedPart(part, PART_LABELS[part], pv))
    return sorted(out, key=lambda r: -r.p95_ms)


def traps(
    metric: str,
    series: dict[str, SeriesStats],
    divergence: float,
    band_ms: float,
    far_off: int,
) -> list[tuple[str, str]]:
    """(trap id, clause) for the known ways the two lines of sight part."""
    found: list[tuple[str, str]] = []
    notable = max(band_ms / 2, abs(divergence) / 4)
    held = (
        holdback(series, notable) if metric in ("itl", "ttft", "visible_ttft", "duration") else ""
    )
    # A buffering proxy: regular writes at the origin, bursts further out.
    if metric in ("itl", "ttft", "visible_ttft", "duration"):
        s50 = p50(series, "itl_p50:server")
        e50, u50 = p50(series, "itl_p50:edge"), p50(series, "itl_p50:user")
        e95 = p95(series, "itl:edge")
        if s50 is not None and s50 >= 5:
            if e50 is not None and e50 < s50 / 4:
                found.append(
                    (
                        "buffering_proxy",
                        f"a proxy buffers the stream: the app writes every {ms(s50)} "
                        f"(median gap), the edge hop sends bursts (median gap {ms(e50)}, "
                        f"P95 {ms(e95)})",
                    )
                )
            elif u50 is not None and u50 < s50 / 4 and not held:  # (else the kernel's)
                found.append(
                    (
                        "buffering_proxy",
                        f"the stream arrives in bursts: the app writes every {ms(s50)} "
                        f"(median gap), the browser reads a burst every so often "
                        f"(median gap {ms(u50)}); something between the edge and the "
                        "browser buffers",
                    )
                )
    if held:
        found.append(("wire_holdback", held))
    if metric == "visible_ttft":
        r = p95(series, "render")
        if r is not None and r >= notable:
            found.append(("render_lag", f"renders lag the chunks (render delay P95 {ms(r)})"))
    if metric in ("ttfb", "ttft", "visible_ttft", "duration"):
        q = p95(series, "recv_queue")
        if q is not None and q >= notable:
            found.append(
                (
                    "event_loop_lag",
                    f"event-loop lag: requests wait P95 {ms(q)} in the kernel's receive "
                    "queue before the app reads them, time the app's own monitoring cannot see",
                )
            )
        a = p95(series, "accept_queue")
        if a is not None and a >= notable:
            found.append(("accept_queue", f"connections wait P95 {ms(a)} in the accept queue"))
    rt = series.get("retransmits")
    share = rt.share() if rt else None
    if share is not None and share >= 0.01:
        wait = p95(series, "retransmit_wait")
        waited = (
            ""
            if wait is None
            else f", whose connections waited P95 {ms(wait)} to send bytes again (RTO and "
            "fast-retransmit waits)"
        )
        found.append(("retransmits", f"{100 * share:.1f}% of requests had TCP retransmits{waited}"))
    if far_off:
        found.append(
            (
                "clock_far_off",
                f"{far_off} browser session{'s' if far_off != 1 else ''} "
                f"{'have' if far_off != 1 else 'has'} clocks > 100 ms off "
                "(timelines only; these durations are single-clock)",
            )
        )
    return found


# What holds a server's writes in its socket, in words (the agent's reasons, hold.h).
_HOLD_WORDS = {
    "nagle": "Nagle's algorithm holds each small write until the client's delayed ACK of the "
    "previous one{cadence}, so segments leave in bursts — set TCP_NODELAY on the server's socket",
    "sndbuf": "the send buffer is full: writes wait for the client to read{cadence} — a slow "
    "reader, or a send buffer too small for the stream",
    "rwnd": "the client's receive window is full: the client reads slower than the app "
    "writes{cadence}",
    "cwnd": "TCP's congestion window holds them{cadence} (losses, or a connection still in slow "
    "start)",
    "cork": "the socket is corked (TCP_CORK or MSG_MORE) between writes{cadence} — uncork "
    "after each token",
}


# A holdback worth saying on its own (the route's server sentence), whatever the divergence.
HOLD_NOTABLE_MS = 5.0


def holdback(series: dict[str, SeriesStats], notable: float) -> str:
    """The clause for writes the server's kernel held back before they left (the agent's
    write-to-wire holdback), naming the commonest reason; '' when none is notable."""
    h = p95(series, "wire_hold")
    if h is None or h < max(notable, 2.0):
        return ""
    shares = {
        why: (series[f"{HOLD_PREFIX}{why}"].share() or 0.0)
        for why in HOLD_REASONS
        if f"{HOLD_PREFIX}{why}" in series
    }
    why = max(shares, key=lambda w: shares[w]) if shares else ""
    s50 = p50(series, "itl_p50:server")
    cadence = f" (the app writes every {ms(s50)})" if s50 is not None and s50 >= 1 else ""
    head = f"the server's kernel holds its writes P95 {ms(h)} before they leave"
    if not why or shares[why] <= 0:
        return head
    return f"{head}: {_HOLD_WORDS[why].format(cadence=cadence)}"


# Say so when sampling leaves a window worth markedly fewer pairs than it holds.
FEW_EFFECTIVE = 0.9


def few_samples(n: int, n_eff: int | None) -> str:
    """The clause for a window whose pairs weigh unequally (the sampling changed within it):
    its P95 rests on fewer independent samples than it has pairs. '' otherwise."""
    if n_eff is None or n_eff >= n * FEW_EFFECTIVE:
        return ""
    return f"effective sample size {n_eff} of {n} pairs: the sampling rate varied in the window"


@dataclass(frozen=True, slots=True)
class Figures:
    """What a metric's sentence says in numbers: both sides' P95 and their divergence with
    its 95 % interval (None: not measured, or unbounded), the pairs and their effective
    number, and the thresholds they were judged by."""

    user_p95: float | None
    server_p95: float | None
    divergence: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    n_eff: int | None
    min_samples: int
    band_ms: float


def sentence(
    label: str,
    metric: str,
    verdict: str,
    fig: Figures,
    ranked: list[RankedPart],
    trap_clauses: list[str],
    note: str = "",
    in_tokens: bool = True,
) -> str:
    """The metric's sentence; ``note`` (an LLM route's server side, collector/sla/tokens.py)
    ends it when there is a verdict to say; ``in_tokens`` False: a route in no stream dialect,
    its first byte and gaps said of chunks (CHUNK_PHRASE)."""
    phrase = USER_PHRASE[metric] if in_tokens else CHUNK_PHRASE.get(metric, USER_PHRASE[metric])
    text = _sentence(label, metric, verdict, fig, ranked, trap_clauses, phrase)
    if not note or verdict == "insufficient_data":
        return text
    return f"{text.removesuffix('.')}; {note}."


def _sentence(
    label: str,
    metric: str,
    verdict: str,
    fig: Figures,
    ranked: list[RankedPart],
    trap_clauses: list[str],
    phrase: tuple[str, str],
) -> str:
    n, n_eff, band_ms, divergence = fig.n, fig.n_eff, fig.band_ms, fig.divergence
    few = few_samples(n, n_eff)
    if verdict == "insufficient_data":
        worth = f" ({few})" if few else ""
        return (
            f"{label}: {METRIC_LABEL[metric]} has {n} paired requests in the window{worth}, "
            f"fewer than the {fig.min_samples} needed to judge a P95."
        )
    u_phrase, s_phrase = phrase
    ci = (
        f"95% CI {signed(fig.ci_low) if fig.ci_low is not None else '−∞'}…"
        f"{signed(fig.ci_high) if fig.ci_high is not None else '+∞'}"
    )
    head = (
        f"{label}: {u_phrase.format(u=ms(fig.user_p95))}, {s_phrase.format(s=ms(fig.server_p95))} "
        f"({signed(divergence)} ms, {ci}{'; ' + few if few else ''})"
    )
    if verdict == "ok":
        return f"{head}: inside the ±{band_ms:g} ms band."
    if verdict == "uncertain":
        return f"{head}: the interval straddles the ±{band_ms:g} ms band; not enough evidence yet."
    if divergence is not None and divergence < 0:
        return (
            f"{head}: users wait less than the server reports — the server counts work the "
            "user does not wait for (e.g. after the response is sent), a cache answers the "
            "user, or requests are paired wrongly."
        )
    parts = ", ".join(f"{r.label} P95 {ms(r.p95_ms)}" for r in ranked[:3] if r.p95_ms > 0.5)
    tail = "; ".join(x for x in [parts, *trap_clauses] if x)
    return f"{head}; {tail}." if tail else f"{head}."
