"""Confidence bounds for divergence = P95(user) − P95(server), and the verdicts.

Method: distribution-free order-statistic bounds (no bootstrap). For one side, with n
samples and B ~ Binomial(n, p), the interval [X(l), X(u)] holds the true p-quantile with
probability P(l ≤ B ≤ u − 1), whatever the distribution. Each side gets a 1 − α/2
interval and the divergence interval is [L_user − U_server, U_user − L_server]: by the
union bound it covers with probability ≥ 1 − α **whatever the dependence between the two
sides** — which matters because user and server values are paired per request (the same
slow request is slow on both sides). A bootstrap over pairs would use that pairing to get a
narrower interval, but it needs every raw pair of the window (cost grows with the window's
rows, B resamples each) and is only asymptotically right in the tail at small n; these
bounds need only a few order statistics, which the per-minute histograms give exactly.

Sampled windows: each pair weighs its adjusted count w = 1/p (the agent kept its request
with probability p). Quantiles are the weighted ones (the first value at which the
cumulative weight reaches q·Σw), and the bounds are the same order-statistic bounds taken
on an **effective sample size**: n_eff = q(1−q) / v, with v = Σ w²(I − q)² / (Σw)², I = 1 for
a value at or below the estimated quantile — the variance of the weighted share below the
quantile (Woodruff's interval; the linearized variance of the Hájek estimator under
Poisson sampling). The ranks l, u of n_eff become the levels l/n_eff, u/n_eff of the
weighted quantile. With equal weights (one p in the window, or none) n_eff = n and
everything is as without sampling. Kish's n_eff = (Σw)²/Σw² was measured and not taken: it
ignores where the heavy pairs lie, and when the rarely kept requests are the slow ones
(overload: latency up, p down) its interval covered the P95 of the requests only ~75 % of
the time instead of 97.5 % (tests/sla/test_weighted.py).

The order statistics of a window's series, as the store's summaries give them (read by
collector.sla.source), are held here too: ``SeriesStats`` per series, ``Window`` per
evaluation.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache

from collector.sla import quantize
from collector.sla.gpu import GpuRoute
from collector.sla.sampling import ServiceCounts

P = 0.95
ALPHA = 0.05


def _log_pmf(n: int, p: float, k: int) -> float:
    return (
        math.lgamma(n + 1)
        - math.lgamma(k + 1)
        - math.lgamma(n - k + 1)
        + k * math.log(p)
        + (n - k) * math.log1p(-p)
    )


@lru_cache(maxsize=4096)
def rank_bounds(n: int, p: float = P, alpha: float = ALPHA / 2) -> tuple[int | None, int | None]:
    """1-based ranks (l, u) with P(X(l) ≤ Q_p ≤ X(u)) ≥ 1 − alpha; None when beyond the sample.

    l is the largest rank with P(B ≤ l − 1) ≤ alpha/2; u the smallest with P(B ≥ u) ≤ alpha/2.
    Each tail's pmf from one log-gamma evaluation, then the ratio between neighbours (a
    sampled window has a distinct n_eff per series: thousands of calls per evaluation).
    """
    if n <= 0:
        return None, None
    tail = alpha / 2
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    span = int(12 * sd + 12)
    lo_k, hi_k = max(0, int(mean) - span), min(n, int(mean) + span)
    odds = p / (1 - p)
    # lower: cumulate P(B ≤ k) upward; the mass below lo_k is < 1e-30 and ignored
    cdf, low = 0.0, None
    pmf = math.exp(_log_pmf(n, p, lo_k))
    for k in range(lo_k, hi_k + 1):
        cdf += pmf
        if cdf > tail:
            # P(B ≤ k − 1) ≤ tail < P(B ≤ k): l − 1 = k − 1 → l = k
            low = k if k >= 1 else None
            break
        pmf *= (n - k) / (k + 1) * odds
    # upper: cumulate P(B ≥ k) downward
    sf, high = 0.0, None
    pmf = math.exp(_log_pmf(n, p, hi_k))
    for k in range(hi_k, lo_k - 1, -1):
        sf += pmf
        if sf > tail:
            # P(B ≥ k + 1) ≤ tail: u = k + 1
            high = k + 1 if k + 1 <= n else None
            break
        pmf *= k / (n - k + 1) / odds
    return low, high


# The levels asked of quantilesExactWeighted in one query: fixed, so the query text is
# constant; the bound ranks are rounded outward onto this grid (wider, never narrower).
LEVEL_GRID: tuple[float, ...] = tuple(
    sorted(
        {round(i * 0.05, 4) for i in range(16)}
        | {round(0.80 + i * 0.0005, 4) for i in range(400)}
        | {0.5, 0.95, 0.99, 1.0}
    )
)


def level_for_rank_at_most(k: int, n: int) -> float:
    """Largest grid level whose rank ceil(n·q) is ≤ k (rank 1 at worst)."""
    i = bisect.bisect_right(LEVEL_GRID, (k - 0.001) / n)
    return LEVEL_GRID[max(0, i - 1)]


def level_for_rank_at_least(k: int, n: int) -> float:
    """Smallest grid level whose rank ceil(n·q) is ≥ k."""
    i = bisect.bisect_left(LEVEL_GRID, (k - 1 + 0.001) / n)
    return LEVEL_GRID[i] if i < len(LEVEL_GRID) else 1.0


def equal_weights(n: int, w: float, w2: float) -> bool:
    """Every pair of a series weighs the same (Σw² · n = (Σw)², Cauchy–Schwarz's equality):
    then n_eff = n and the weighted statistics are the unweighted ones."""
    return n <= 1 or n * w2 <= w * w * (1 + 1e-9)


def n_effective(n: int, w: float, w2: float, w2_at_or_below: float, p: float = P) -> int:
    """The effective sample size of a weighted sample for its p-quantile (module doc):
    q(1−q) over the variance of the weighted share at or below the estimated quantile, from
    Σw, Σw² and Σw² of the values at or below it; at most n, at least 1."""
    if equal_weights(n, w, w2):
        return n
    above = max(0.0, w2 - w2_at_or_below)
    v = (w2_at_or_below * (1 - p) ** 2 + above * p * p) / (w * w)
    if v <= 0:
        return n
    return max(1, min(n, math.floor(p * (1 - p) / v)))


@dataclass(frozen=True, slots=True)
class Interval:
    low: float | None  # None: unbounded below (too few samples for this confidence)
    high: float | None


def divergence_interval(
    user_low: float | None,
    user_high: float | None,
    server_low: float | None,
    server_high: float | None,
) -> Interval:
    low = None if user_low is None or server_high is None else user_low - server_high
    high = None if user_high is None or server_low is None else user_high - server_low
    return Interval(low, high)


OK = "ok"
OUT = "out_of_band"
UNCERTAIN = "uncertain"
INSUFFICIENT = "insufficient_data"
VERDICTS = (OUT, UNCERTAIN, INSUFFICIENT, OK)  # worst first


def verdict(n: int, ci: Interval, band_ms: float, min_samples: int) -> str:
    if n < min_samples:
        return INSUFFICIENT
    if ci.low is not None and ci.low > band_ms:
        return OUT
    if ci.high is not None and ci.high < -band_ms:
        return OUT
    if ci.low is not None and ci.high is not None and ci.low >= -band_ms and ci.high <= band_ms:
        return OK
    return UNCERTAIN


# --- A window's series, as the store summarized them (collector.sla.source) -----------
_LEVEL_INDEX: dict[tuple[float, ...], dict[float, int]] = {}


def _level_index(levels: tuple[float, ...]) -> dict[float, int]:
    idx = _LEVEL_INDEX.get(levels)
    if idx is None:
        idx = _LEVEL_INDEX[levels] = {q: i for i, q in enumerate(levels)}
    return idx


@dataclass(slots=True)
class SeriesStats:
    """One series over the window: n pairs, the weight of those whose value is not 0 (for
    shares), and the grid cell of the weighted quantile for each level q asked (decoded to
    ms on demand); ``weight`` is Σ of the adjusted counts (the requests the pairs stand for,
    n when nothing was sampled) and ``n_eff`` the effective sample size of its P95."""

    n: int
    nonzero: float
    levels: tuple[float, ...]
    codes: Sequence[int]
    grid: quantize.Grid = quantize.FINE
    weight: float = 0.0
    n_eff: int = 0

    def __post_init__(self) -> None:
        if not self.weight:
            self.weight = float(self.n)
        if not self.n_eff:
            self.n_eff = self.n

    def share(self) -> float | None:
        """The weighted share of values not 0 (e.g. requests with retransmits)."""
        return self.nonzero / self.weight if self.n and self.weight else None

    def at(self, q: float) -> float | None:
        i = _level_index(self.levels).get(q)
        if i is None or not self.n:
            return None
        return quantize.decode(int(self.codes[i]), self.grid)


@dataclass(slots=True)
class Window:
    start: datetime
    end: datetime
    series: dict[tuple[str, str], dict[str, SeriesStats]] = field(default_factory=dict)
    far_off_sessions: dict[tuple[str, str], int] = field(default_factory=dict)
    sessions: dict[tuple[str, str], int] = field(default_factory=dict)
    # per route, the GPU aggregate of its spans that carry GPU data (collector/sla/gpu.py)
    gpu: dict[tuple[str, str], GpuRoute] = field(default_factory=dict)
    # per service, the agent's exact request counts (collector/sla/sampling.py)
    counts: dict[str, ServiceCounts] = field(default_factory=dict)
