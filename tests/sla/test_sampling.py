"""The sampling in force, in words: the agent's exact request counts over the window (resets,
a series that begins inside it, a point before it as the baseline), the route's sentence and
what the evaluator says for the scenario's sampled service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collector.sla.config import SlaConfig
from collector.sla.evaluate import Evaluation, evaluate
from collector.sla.sampling import ServiceCounts, increase, route_json
from collector.sla.source import SlaSource
from tests.sla import scenario

S = 10**9


def test_increase_of_a_cumulative_counter() -> None:
    start = 100 * S
    pts = [(90 * S, 50.0), (100 * S, 60.0), (110 * S, 75.0), (120 * S, 90.0)]
    assert increase(pts, start, 1 * S, False) == 30.0  # from the point at the start
    # a reset (the agent restarted its counters): the value after it is the count since
    pts = [(95 * S, 500.0), (105 * S, 520.0), (115 * S, 7.0), (125 * S, 19.0)]
    assert increase(pts, start, 1 * S, False) == 20 + 7 + 12
    # no point before the window: a series that began inside it counts from 0 …
    assert increase([(105 * S, 8.0), (115 * S, 20.0)], start, 101 * S, False) == 20.0
    # … one that began before counts from its first point (the one before was missed)
    assert increase([(105 * S, 8.0), (115 * S, 20.0)], start, 50 * S, False) == 12.0
    assert increase([(105 * S, 8.0), (115 * S, 20.0)], start, 0, False) == 12.0  # unknown
    assert increase([(90 * S, 8.0)], start, 1 * S, False) == 0.0
    # delta temporality: each point is a count of its own
    assert increase([(95 * S, 4.0), (105 * S, 5.0), (115 * S, 6.0)], start, 0, True) == 11.0


def test_route_sentences() -> None:
    """The route's share from its own pairs (the agent counts per port), then its service's
    exact counts, said as the service's."""
    c = ServiceCounts(10_284.0, 1_234.0, {8000}, {"a", "b"}, {"a": 0.1, "b": 0.3})
    doc = route_json("/v1/chat (app)", c, 1000, 8_000.0, 300)
    assert doc["sentence"] == (
        "/v1/chat (app): traced about 12 % of this route's requests in the last 5 min (1,000 "
        "pairs stand for 8,000); its service traced 1,234 of 10,284 requests (12 %, counted "
        "by the agent on port 8000); sampling now 10 %–30 % (2 hosts)."
    )
    assert doc["traced_share"] == 0.12 and doc["seen"] == 10284 and doc["ports"] == [8000]
    assert doc["pair_share"] == 0.125
    # a route whose pairs were all kept, in a service that shed others: said per route
    calm = route_json("/v1/ping (app)", c, 300, 300.0, 300)
    assert calm["sentence"] == (
        "/v1/ping (app): traced every request of this route in the last 5 min (300 pairs); "
        "its service traced 1,234 of 10,284 requests (12 %, counted by the agent on port "
        "8000); sampling now 10 %–30 % (2 hosts)."
    )
    assert calm["pair_share"] == 1.0
    every = ServiceCounts(900.0, 900.0, {8000, 8001}, {"a"}, {"a": 1.0})
    assert route_json("/v1/chat (app)", every, 900, 900.0, 300)["sentence"] == (
        "/v1/chat (app): traced every request of this route in the last 5 min (900 pairs); "
        "its service traced every request (900, counted by the agent on ports 8000, 8001)."
    )
    few = ServiceCounts(100_000.0, 50.0, {8000}, {"a"}, {"a": 0.0005})
    assert "traced 50 of 100,000 requests (<0.1 %," in str(
        route_json("x", few, 50, 1e5, 300)["sentence"]
    )
    # no counts from the agent: what the pairs stand for; nothing sampled: nothing said
    doc = route_json("/v1/chat (app)", None, 400, 2000.0, 300)
    assert doc["sentence"] == (
        "/v1/chat (app): traced about 20 % of this route's requests in the last 5 min (400 "
        "pairs stand for 2,000); no request counts from the agent."
    )
    assert route_json("/v1/chat (app)", None, 400, 400.0, 300)["sentence"] is None


@pytest.fixture(scope="module")
def ev(source: SlaSource) -> Evaluation:
    return evaluate(source, SlaConfig(), scenario.NOW)


def test_sampled_service_in_the_evaluation(
    ev: Evaluation, scenario_store: tuple[Any, Path, Any]
) -> None:
    """The scenario's sampled service: every request counted on two nodes (4,500), the
    traced ones exactly the kept ones, the probability in force on both nodes; routes of a
    service the agent did not sample say nothing about sampling."""
    pop = scenario.sampled_population()
    r = next(r for r in ev.routes if r.route == scenario.SAMPLED_ROUTE)
    s = r.to_json()["sampling"]
    kept = int(pop.kept.sum())
    assert s["seen"] == len(pop.server) == 4500 and s["traced"] == kept
    assert s["probability_min"] == s["probability_max"] == 0.1
    assert s["pairs"] == kept and abs(s["pair_requests"] - float(pop.weights.sum())) < 0.1
    share = f"{100 * kept / 4500:.0f} %"
    about = f"{100 * kept / float(pop.weights.sum()):.0f} %"
    assert s["sentence"] == (
        f"/v1/sampled (shop): traced about {about} of this route's requests in the last 5 min "
        f"({kept:,} pairs stand for {float(pop.weights.sum()):,.0f}); its service traced "
        f"{kept:,} of 4,500 requests ({share}, counted by the agent on port 8080); sampling "
        "now 10 % (2 hosts)."
    )
    ok = next(r for r in ev.routes if r.route == "/v1/ok").to_json()["sampling"]
    assert ok["sentence"] is None and ok["seen"] is None
