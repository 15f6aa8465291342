"""The sampling in force, per route, in words: how many of its requests the agent traced.

Under load the agent traces each request with a probability p (docs/agent.md, Sampling) and
counts every request exactly, sampled or not (``parallax.requests.seen`` / ``traced`` per
port, cumulative counters; ``parallax.sampling.probability`` per agent): the store's
``request_counts``. The agent counts per port, so a route's own share comes from its pairs:
each stands for its adjusted count (collector/sla/stats.py), so about n / Σw of the route's
requests were traced ("traced about 40 % of this route's requests"); the service's exact
counts over the window follow, said as the service's, with the probability the agent uses
now. A route with neither counts nor sampled pairs gets no sentence: nothing says it was
sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ServiceCounts:
    """One service's requests over the window, summed over its ports and hosts."""

    seen: float = 0.0
    traced: float = 0.0
    ports: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    # the latest sampling probability of each host serving the service
    probability: dict[str, float] = field(default_factory=dict)


Point = tuple[int, float]  # (time ns, value)


def increase(points: Sequence[Point], start_ns: int, series_start_ns: int, delta: bool) -> float:
    """What a counter series counted after ``start_ns``, from its points in time order.

    Cumulative (the agent's): the difference from the last point at or before ``start_ns``;
    a value below the one before is a reset (the counter began again: its value is the
    count since). Without a point before the window, a series that began inside it (its
    start time) counts from 0, any other from its first point (the collector may have missed
    the one before). Delta temporality: the sum of the points after ``start_ns``."""
    if delta:
        return sum(v for t, v in points if t > start_ns)
    before = [v for t, v in points if t <= start_ns]
    after = [v for t, v in points if t > start_ns]
    if before:
        prev = before[-1]
    elif after and series_start_ns and series_start_ns >= start_ns:
        prev = 0.0
    elif after:
        prev, after = after[0], after[1:]
    else:
        return 0.0
    total = 0.0
    for v in after:
        total += v - prev if v >= prev else v
        prev = v
    return total


def _pct(x: float) -> str:
    """A share in %: whole percent, one decimal below 10 %, '<0.1 %' above 0."""
    p = 100 * x
    if p == 0 or p >= 10:
        return f"{p:.0f} %"
    return f"{p:.1f} %" if p >= 0.1 else "<0.1 %"


def _count(x: float) -> str:
    return f"{round(x):,}"


def _minutes(window_s: float) -> str:
    m = window_s / 60
    return f"{m:.0f} min" if m == int(m) else f"{window_s:.0f} s"


def route_json(
    label: str,
    counts: ServiceCounts | None,
    pairs: int,
    weight: float,
    window_s: float,
) -> dict[str, Any]:
    """The route's ``sampling`` object: the share of the route's requests traced, from its
    pairs (``pair_share`` = n / Σw: the agent counts per port, not per route), its service's
    exact counts and the probability now (null without the agent's counts), and the sentence
    (null when nothing says the route was sampled)."""
    doc: dict[str, Any] = {
        "seen": None,
        "traced": None,
        "traced_share": None,
        "probability_min": None,
        "probability_max": None,
        "ports": [],
        "pairs": pairs,
        "pair_requests": round(weight, 1),
        "pair_share": round(min(1.0, pairs / weight), 4) if pairs and weight > 0 else None,
        "sentence": None,
    }
    span = f"in the last {_minutes(window_s)}"
    sampled = bool(pairs) and weight > pairs * (1 + 1e-9)
    clauses = []
    if sampled:
        clauses.append(
            f"traced about {_pct(pairs / weight)} of this route's requests {span} "
            f"({_count(pairs)} pairs stand for {_count(weight)})"
        )
    elif pairs:
        clauses.append(f"traced every request of this route {span} ({_count(pairs)} pairs)")
    if counts is not None and counts.seen > 0:
        share = min(1.0, counts.traced / counts.seen)
        doc.update(
            seen=round(counts.seen),
            traced=round(counts.traced),
            traced_share=round(share, 4),
            ports=sorted(counts.ports),
        )
        ports = ", ".join(str(p) for p in sorted(counts.ports))
        on = f"counted by the agent on port{'s' if len(counts.ports) > 1 else ''} {ports}"
        if round(counts.traced) >= round(counts.seen):
            clauses.append(f"its service traced every request ({_count(counts.seen)}, {on})")
        else:
            clauses.append(
                f"its service traced {_count(counts.traced)} of {_count(counts.seen)} requests "
                f"({_pct(share)}, {on})"
            )
        probs = sorted(counts.probability.values())
        if probs:
            doc.update(probability_min=probs[0], probability_max=probs[-1])
            if probs[0] < 1:
                now = (
                    _pct(probs[0])
                    if probs[0] == probs[-1]
                    else f"{_pct(probs[0])}–{_pct(probs[-1])}"
                )
                hosts = f" ({len(probs)} hosts)" if len(probs) > 1 else ""
                clauses.append(f"sampling now {now}{hosts}")
    elif sampled:
        clauses.append("no request counts from the agent")
    else:
        return doc  # neither counts nor sampled pairs: nothing says the route was sampled
    doc["sentence"] = f"{label}: {'; '.join(clauses)}."
    return doc
