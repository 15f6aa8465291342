"""An LLM route's server side in tokens: its series, its figures and their words.

A route is an LLM route when its pairs carry a stream dialect (``pairs.llm_dialect``: the
origin hop or the browser read the answer's tokens, collector/pairing/llm.py). For it the
checker compares first *tokens* and token gaps (collector/pairing/divergence.py), and says
the server's side per answer in tokens — the engine's queue a named part of it:
``/v1/chat/completions (llama_cpp.server): answers at P95: queued 1.3 s, first token 95 ms
after it left the queue, 100 tokens, gap P95 11 ms (P50: …)``. A route in no dialect (a CSV
download, a plain JSON API) has none of these series and keeps its words (gpu.split_sentence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collector.pairing.divergence import LLM
from collector.sla.stats import SeriesStats
from collector.sla.words import ms

# Part series (collector/sla/source.py PARTS): one value per pair where measured.
PARTS: dict[str, str] = {
    # the route's pairs that read an LLM stream (its n says how many)
    "llm": f"if({LLM}, 1.0, NULL)",
    "llm_queue": "llm_queue_ms",  # the engine's queue, as the wire shows it
    "llm_prefill": "llm_prefill_ms",  # end of that queue → first output token
    "llm_first_token": "server_first_token_ms",  # t1 → first answer token
    # the answer's tokens: the stream's own count (the server's, else the browser's)
    "llm_tokens": "toFloat64(ifNull(server_tokens, user_tokens))",
    "llm_gap": "server_token_gap_p95_ms",  # the answer's P95 gap between tokens
}


@dataclass(frozen=True, slots=True)
class Figure:
    p50: float | None = None
    p95: float | None = None


@dataclass(frozen=True, slots=True)
class TokenSplit:
    """An LLM route's answers over the window, as the server wrote them (ms, tokens)."""

    n: int  # pairs that read an LLM stream
    queue: Figure
    after_queue: Figure
    first_token: Figure
    tokens: Figure
    gap: Figure


def _figure(series: dict[str, SeriesStats], name: str) -> Figure:
    s = series.get(name)
    if s is None or not s.n:
        return Figure()
    return Figure(s.at(0.5), s.at(0.95))


def split_of(series: dict[str, SeriesStats]) -> TokenSplit | None:
    """The route's token split, None for a route none of whose pairs read an LLM stream."""
    marker = series.get("llm")
    if marker is None or not marker.n:
        return None
    return TokenSplit(
        n=marker.n,
        queue=_figure(series, "llm_queue"),
        after_queue=_figure(series, "llm_prefill"),
        first_token=_figure(series, "llm_first_token"),
        tokens=_figure(series, "llm_tokens"),
        gap=_figure(series, "llm_gap"),
    )


def dur(v: float | None) -> str:
    """A wait in words: seconds with one decimal from 1 s (``1.3 s``), else as ms()."""
    if v is not None and abs(v) >= 1000:
        return f"{v / 1000:.1f} s"
    return ms(v)


def count(v: float | None) -> str:
    return "?" if v is None else f"{v:.0f}"


def _clauses(t: TokenSplit, at: str) -> list[str]:
    """One answer's figures at ``at`` ('p50' or 'p95'), in the order the user waits them."""
    out: list[str] = []

    def pick(f: Figure) -> float | None:
        return f.p95 if at == "p95" else f.p50

    if pick(t.queue) is not None:
        out.append(f"queued {dur(pick(t.queue))}")
    if pick(t.after_queue) is not None:
        out.append(f"first token {dur(pick(t.after_queue))} after it left the queue")
    elif pick(t.first_token) is not None:
        out.append(f"first token {dur(pick(t.first_token))}")
    if pick(t.tokens) is not None:
        out.append(f"{count(pick(t.tokens))} tokens")
    if pick(t.gap) is not None:
        out.append(f"gap P95 {ms(pick(t.gap))}")
    return out


def sentence(t: TokenSplit) -> str:
    """'answers at P95: queued 1.3 s, first token 95 ms after it left the queue, 100
    tokens, gap P95 11 ms (P50: queued 0.0 ms, first token 90 ms …, 100 tokens, gap P95
    10 ms)' — the figures measured; '' when none is."""
    p95, p50 = _clauses(t, "p95"), _clauses(t, "p50")
    if not p95:
        return ""
    typical = f" (P50: {', '.join(p50)})" if p50 else ""
    return f"answers at P95: {', '.join(p95)}{typical}"


def server_note(t: TokenSplit | None) -> str:
    """The clause a first-token sentence ends with on an LLM route: the server's own first
    token, with the engine's queue named ('' when not measured)."""
    if t is None:
        return ""
    parts = []
    if t.queue.p95 is not None:
        parts.append(f"queued P95 {dur(t.queue.p95)} in the engine")
    if t.after_queue.p95 is not None:
        parts.append(f"first token P95 {dur(t.after_queue.p95)} after it left the queue")
    return f"server side: {', '.join(parts)}" if parts else ""


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def to_json(t: TokenSplit | None) -> dict[str, Any] | None:
    """The route's ``server.llm`` object (docs/sla.md); None for a route in no dialect."""
    if t is None:
        return None
    out: dict[str, Any] = {"n": t.n}
    for name, f in (
        ("queue", t.queue),
        ("first_token_after_queue", t.after_queue),
        ("first_token", t.first_token),
    ):
        out[f"{name}_p50_ms"], out[f"{name}_p95_ms"] = _r(f.p50), _r(f.p95)
    out["tokens_p50"], out["tokens_p95"] = _r(t.tokens.p50), _r(t.tokens.p95)
    out["gap_p95_p50_ms"], out["gap_p95_p95_ms"] = _r(t.gap.p50), _r(t.gap.p95)
    out["sentence"] = sentence(t)
    return out
