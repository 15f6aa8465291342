"""Order-statistic bounds, the value grid, and the clock filter."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from collector.sla import quantize, stats
from collector.sla.clock import MAX_AGE_S, best_samples, clock_filter
from collector.sla.source import SlaSource


@pytest.mark.parametrize("n", [100, 300, 2000])
def test_one_side_bounds_cover_the_p95_at_least_97_5_percent(n: int) -> None:
    rng = np.random.default_rng(n)
    lo, hi = stats.rank_bounds(n, 0.95, 0.025)
    assert lo is not None and hi is not None
    true = float(np.exp(1.6448536269514722 * 0.5))  # P95 of lognormal(0, 0.5)
    trials = 4000
    x = np.sort(rng.lognormal(0, 0.5, (trials, n)), axis=1)
    covered = np.mean((x[:, lo - 1] <= true) & (true <= x[:, hi - 1]))
    assert covered >= 0.975 - 3 * np.sqrt(0.975 * 0.025 / trials)
    assert covered < 0.999  # and not absurdly wide


def _bounds_by_lgamma(n: int, p: float = 0.95, alpha: float = 0.025) -> tuple[Any, Any]:
    """The binomial tails summed term by term, each from log-gamma: what rank_bounds'
    neighbour-ratio recurrence must reproduce."""
    import math

    pmf = [math.exp(stats._log_pmf(n, p, k)) for k in range(n + 1)]
    low = high = None
    cdf = 0.0
    for k in range(n + 1):
        cdf += pmf[k]
        if cdf > alpha / 2:
            low = k if k >= 1 else None
            break
    sf = 0.0
    for k in range(n, -1, -1):
        sf += pmf[k]
        if sf > alpha / 2:
            high = k + 1 if k + 1 <= n else None
            break
    return low, high


def test_rank_bounds_equal_the_term_by_term_sums() -> None:
    for n in [*range(1, 400), 1000, 4567, 20_000]:
        assert stats.rank_bounds(n) == _bounds_by_lgamma(n), n


def test_unbounded_when_the_sample_is_too_small() -> None:
    assert stats.rank_bounds(40) == (34, None)
    assert stats.rank_bounds(0) == (None, None)


def test_grid_levels_round_outward() -> None:
    for n in (100, 157, 1500, 49_999):
        lo, hi = stats.rank_bounds(n)
        assert lo is not None and hi is not None
        ql, qh = stats.level_for_rank_at_most(lo, n), stats.level_for_rank_at_least(hi, n)
        assert max(1, int(np.ceil(n * ql))) <= lo
        assert int(np.ceil(n * qh)) >= hi


def test_verdicts() -> None:
    iv = stats.Interval
    assert stats.verdict(99, iv(20, 30), 15, 100) == "insufficient_data"
    assert stats.verdict(500, iv(16, 30), 15, 100) == "out_of_band"
    assert stats.verdict(500, iv(-40, -16), 15, 100) == "out_of_band"
    assert stats.verdict(500, iv(-14, 14), 15, 100) == "ok"
    assert stats.verdict(500, iv(10, 20), 15, 100) == "uncertain"
    assert stats.verdict(500, iv(16, None), 15, 100) == "out_of_band"
    assert stats.verdict(500, iv(None, 10), 15, 100) == "uncertain"


@pytest.mark.parametrize("grid", [quantize.FINE, quantize.COARSE])
def test_sql_grid_matches_python(source: SlaSource, grid: quantize.Grid) -> None:
    rng = random.Random(3)
    vals = [0.0, 0.05, -0.05, 25.59, 25.6, -25.6, 6.4, 1e-3, 7.77, 400.0, 5000.0, 86_400_000.0]
    vals += [rng.uniform(-2000, 2000) for _ in range(300)]
    arr = ", ".join(repr(v) for v in vals)
    got = source.rows(f"SELECT arrayMap(x -> {quantize.code_sql('x', grid)}, [{arr}])")[0][0]
    assert list(got) == [quantize.encode(v, grid) for v in vals]
    for v in vals:
        assert abs(quantize.decode(quantize.encode(v, grid), grid) - v) <= quantize.half_width_ms(
            v, grid
        )
    # monotone: a larger value never gets a smaller cell
    codes = [quantize.encode(v, grid) for v in sorted(vals)]
    assert codes == sorted(codes)


def _exchanges(
    rng: random.Random, theta: float, n: int, asym: float = 0.0, mean_q: float = 2.0
) -> list[tuple[float, float]]:
    """NTP samples for one session: t_arr − t0 = fwd + θ, t3 − t2 = back − θ."""
    base = rng.uniform(1, 30)
    out = []
    for _ in range(n):
        fwd = base / 2 + asym + rng.expovariate(1 / mean_q)
        back = base / 2 + rng.expovariate(1 / mean_q)
        out.append((((fwd + theta) - (back - theta)) / 2, fwd + back))
    return out


def test_clock_filter_symmetric_paths_within_1ms_after_20_exchanges() -> None:
    for seed in range(300):
        rng = random.Random(seed)
        theta = rng.uniform(-5000, 5000)
        est = clock_filter(_exchanges(rng, theta, 20))
        assert est is not None
        assert abs(est.theta_ms - theta) <= 1.0, (seed, est, theta)


@pytest.mark.parametrize("asym", [4.0, 10.0, 40.0])
def test_clock_filter_asymmetric_paths_within_half_asymmetry_plus_1ms(asym: float) -> None:
    for seed in range(100):
        rng = random.Random(seed)
        theta = rng.uniform(-5000, 5000)
        est = clock_filter(_exchanges(rng, theta, 20, asym=asym))
        assert est is not None
        assert abs(est.theta_ms - theta) <= asym / 2 + 1.0


def test_clock_filter_prefers_low_delay_samples() -> None:
    # one clean exchange among badly queued ones decides the estimate
    samples = [(100.0 + 40, 90.0)] * 10 + [(100.2, 2.0)]
    est = clock_filter(samples)
    assert est is not None and abs(est.theta_ms - 100.2) < 0.5
    assert clock_filter([]) is None
    assert clock_filter([(float("nan"), 1.0)]) is None


def test_clock_samples_age_like_ntp() -> None:
    """A session's clean samples from 10 minutes ago must not outvote fresh ones after its
    clock stepped (a laptop's sleep, an NTP correction); an hour-old sample is dropped."""
    now = 1_800_000_000_000
    old = [(1.0, 0.0, f"old{i}", now - 600_000) for i in range(8)]
    fresh = [(3.0, 50.0, f"new{i}", now - i) for i in range(3)]
    kept, weighed = best_samples([*old, *fresh])
    est = clock_filter(weighed)
    assert est is not None and abs(est.theta_ms - 50.0) < 1.0, est
    assert len(kept) == 8 and {k[2] for k in fresh} <= {k[2] for k in kept}
    # without aging the old samples (δ 1 ms) would decide: that is the bug this prevents
    stale = clock_filter((t, d) for d, t, _, _ in sorted([*old, *fresh])[:8])
    assert stale is not None and abs(stale.theta_ms) < 1.0
    ancient = (0.5, -7.0, "ancient", now - int(MAX_AGE_S * 1000) - 1)
    kept, _ = best_samples([ancient, *fresh])
    assert "ancient" not in {k[2] for k in kept}
    # one key once, however often it is offered
    kept, _ = best_samples([fresh[0], fresh[0], fresh[1]])
    assert len(kept) == 2
    assert best_samples([]) == ([], [])
