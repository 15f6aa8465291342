"""Weighted statistics for sampled windows, against brute force on populations sampled here.

The agent keeps each request with a probability that falls under load; each pair weighs its
adjusted count 1/p. Checked: the weighted P95 against the whole population's, the
intervals' coverage over many samplings (the checker's method — the effective sample size of
collector.sla.stats — against Kish's, which is too optimistic when the rarely kept requests
are the slow ones), and the real evaluator in chDB on 60 independently sampled routes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collector.sla import quantize, stats
from collector.sla.config import SlaConfig
from collector.sla.evaluate import Evaluation, evaluate
from collector.sla.source import SlaSource
from collector.store import schema as store_schema
from parallax_contracts import sampling
from tests.sla import sampled, scenario

DB = "weighted"
SERVICE = "shop"
ROUTES = 60


def test_codes_and_weights_mirror_the_checker() -> None:
    """The numpy mirror used below: the grid of quantize.encode, the agent's keep rule and
    adjusted counts of parallax_contracts.sampling."""
    rng = np.random.default_rng(1)
    v = np.concatenate([rng.uniform(0.01, 25.6, 500), rng.lognormal(4, 1.5, 500)])
    assert sampled.codes_of(v).tolist() == [quantize.encode(float(x)) for x in v]
    pop = sampled.overload(rng, 300, 300)
    kept = pop.kept
    for i in range(600):
        assert sampling.keeps(pop.trace_id(i), int(pop.th[i])) == bool(kept[i])
    want = [sampling.adjusted_count(int(t)) for t in pop.th[kept]]
    assert np.allclose(pop.weights, want, rtol=1e-12)
    assert abs(sampling.probability(sampled.threshold(0.05)) - 0.05) < 1e-9


def test_effective_sample_size_is_n_for_equal_weights() -> None:
    assert stats.n_effective(1000, 1000.0, 1000.0, 0.0) == 1000
    assert stats.n_effective(1000, 4000.0, 16000.0, 123.0) == 1000  # all weigh 4
    # two strata, the heavy one above the quantile: far fewer than n
    assert stats.n_effective(1100, 1000 + 100 * 20.0, 1000 + 100 * 400.0, 1000.0) < 200


def test_interval_coverage_over_many_samplings() -> None:
    """1000 populations of 11,000 requests, each sampled once as the agent would (calm and
    fast: all kept; busy and slow: p = 0.05): the checker's 97.5 % bounds of the weighted
    P95 hold the population's P95 (brute force) about 97.5 % of the time (measured 98.1 %);
    Kish's n_eff = (Σw)²/Σw² on the same weighted quantiles covers ~81 % (the heavy pairs are
    the slow ones); the unweighted P95 — what an unaware checker reports — is far off."""
    rng = np.random.default_rng(18)
    ours = kish = 0
    off: list[float] = []
    sims = 1000
    for _ in range(sims):
        pop = sampled.overload(rng, 8000, 3000, 1.0, 0.05)
        truth = sampled.nearest_rank(pop.server)
        values, w = pop.server[pop.kept], pop.weights
        lo, hi = sampled.bounds(values, w)
        ours += lo <= truth <= hi
        lo, hi = sampled.bounds(values, w, kish=True)
        kish += lo <= truth <= hi
        off.append(sampled.nearest_rank(values) - truth)
    assert ours / sims >= 0.965, ours
    assert kish / sims <= 0.9, kish
    assert float(np.median(off)) < -40  # the unweighted P95 misses the slow phase's tail


@pytest.fixture(scope="module")
def weighted(scenario_store: tuple[Any, Path, Any]) -> tuple[Evaluation, dict[str, Any]]:
    """60 routes, each an independent population sampled by the agent's rule, in a
    database of their own in the session's chDB store; one evaluation."""
    client = scenario_store[0]
    store_schema.migrate(client, DB)
    rng = np.random.default_rng(2026)
    pops = {}
    for k in range(ROUTES):
        route = f"/w/{k}"
        pops[route] = pop = sampled.overload(rng)
        sampled.write(client, DB, sampled.pair_rows(pop, scenario.NOW, route, SERVICE))
    src = SlaSource(lambda: client, DB)
    src.ensure_schema()
    return evaluate(src, SlaConfig(), scenario.NOW), pops


def test_weighted_p95_is_the_populations(weighted: tuple[Evaluation, dict[str, Any]]) -> None:
    """Per route: the evaluator's server and user P95 are the weighted quantile of the kept
    pairs (the same grid cell) and the effective sample size the one computed here; the
    divergence interval holds the population's P95(user) − P95(server) (brute force over
    every request, kept or not) in at least 90 % of the 60 routes (nominal ≥ 95 %)."""
    ev, pops = weighted
    by_route = {r.route: r.metrics["ttfb"] for r in ev.routes if r.service == SERVICE}
    assert len(by_route) == ROUTES
    covered = 0
    for route, pop in pops.items():
        m = by_route[route]
        kept, w = pop.kept, pop.weights
        assert m.n == int(kept.sum())
        for side, values in (("server", pop.server), ("user", pop.user)):
            cell = sampled.weighted_level(sampled.codes_of(values[kept]), w, 0.95)
            assert m.__getattribute__(side)["p95"] == quantize.decode(cell), (route, side)
        n_eff = min(sampled.n_eff(sampled.codes_of(v[kept]), w) for v in (pop.server, pop.user))
        assert abs(m.n_eff - n_eff) <= max(1, n_eff // 100), (m.n_eff, n_eff)
        assert m.n_eff < m.n / 3  # the busy phase's pairs weigh 10 each
        truth = sampled.nearest_rank(pop.user) - sampled.nearest_rank(pop.server)
        lo = -math.inf if m.ci_low_ms is None else m.ci_low_ms
        hi = math.inf if m.ci_high_ms is None else m.ci_high_ms
        covered += lo <= truth <= hi
    assert covered >= 0.9 * ROUTES, covered


def test_few_effective_samples_are_said(weighted: tuple[Evaluation, dict[str, Any]]) -> None:
    ev, _ = weighted
    m = next(r for r in ev.routes if r.route == "/w/0").metrics["ttfb"]
    doc = m.to_json()
    assert doc["n_eff"] == m.n_eff < doc["n"]
    want = f"effective sample size {m.n_eff} of {m.n} pairs: the sampling rate varied"
    assert want in m.sentence, m.sentence
