"""Scripted populations of requests sampled as the agent samples them, for the weighted
statistics' tests: every request of the population is known (the brute-force truth), the
agent keeps each by the contract's rule (``sampling.keeps`` on a random trace id against the
threshold in force) and states the threshold on the span; the kept ones become pairs.

The overload case: a calm phase (fast, half the requests kept) then a busy one (slow, with a
longer network path, few kept) — the slow requests are the rarely kept ones, which is when an
unweighted P95 lies and when an effective sample size that ignores where the heavy pairs lie
(Kish's) is too optimistic.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from collector.sla import quantize, stats
from parallax_contracts import sampling


def threshold(p: float) -> int:
    """The 56-bit threshold the agent uses for keep probability ``p``."""
    return sampling.th_from_th32(sampling.th32_for(p))


@dataclass
class Population:
    server: np.ndarray  # every request's server TTFB, ms
    user: np.ndarray  # its user TTFB, ms
    offset_s: np.ndarray  # seconds before the evaluation
    th: np.ndarray  # the threshold in force when it arrived (uint64)
    r: np.ndarray  # its trace id's randomness (rightmost 56 bits, uint64)
    prefixes: str  # the rest of each trace id: 18 hex per request

    @property
    def kept(self) -> np.ndarray:
        """The agent's decision: R >= T (parallax_contracts.sampling.keeps)."""
        return self.r >= self.th

    @property
    def weights(self) -> np.ndarray:
        """Adjusted counts of the kept requests (sampling.adjusted_count)."""
        w: np.ndarray = 1.0 / (1.0 - self.th[self.kept].astype(float) / 2.0**56)
        return w

    def trace_id(self, i: int) -> str:
        return f"{self.prefixes[18 * i : 18 * i + 18]}{int(self.r[i]):014x}"


def overload(
    rng: np.random.Generator,
    n_calm: int = 2000,
    n_busy: int = 4000,
    p_calm: float = 0.5,
    p_busy: float = 0.05,
) -> Population:
    server = np.concatenate(
        [rng.lognormal(math.log(40), 0.25, n_calm), rng.lognormal(math.log(120), 0.3, n_busy)]
    )
    net = np.concatenate([rng.uniform(2, 8, n_calm), rng.uniform(10, 40, n_busy)])
    offset = np.concatenate([rng.uniform(170, 290, n_calm), rng.uniform(10, 170, n_busy)])
    n = n_calm + n_busy
    th = np.array([threshold(p_calm)] * n_calm + [threshold(p_busy)] * n_busy, dtype=np.uint64)
    r = rng.integers(0, 2**56, n, dtype=np.uint64)
    prefixes = rng.bytes(9 * n).hex()
    return Population(server, server + net, offset, th, r, prefixes)


def nearest_rank(a: np.ndarray, q: float = 0.95) -> float:
    s = np.sort(np.asarray(a, dtype=float))
    return float(s[max(1, math.ceil(q * len(s))) - 1])


def pair_rows(pop: Population, now: datetime, route: str, service: str) -> dict[str, list[Any]]:
    """The pairs of the kept requests (column-oriented, pairs' column names)."""
    idx = np.flatnonzero(pop.kept)
    n = len(idx)
    return {
        "time": [now - timedelta(seconds=float(pop.offset_s[i])) for i in idx],
        "version": [1] * n,
        "paired_at": [now] * n,
        "site": ["test"] * n,
        "service": [service] * n,
        "route": [route] * n,
        "method": ["GET"] * n,
        "kind": ["fetch"] * n,
        "trace_id": [pop.trace_id(int(i)) for i in idx],
        "span_id": [secrets.token_hex(8) for _ in range(n)],
        "hops": [1] * n,
        "hop_services": [[service]] * n,
        "user_ttfb_ms": [float(pop.user[i]) for i in idx],
        "server_ttfb_ms": [float(pop.server[i]) for i in idx],
        "sample_th": [int(pop.th[i]) for i in idx],
    }


def write(client: Any, db: str, cols: dict[str, list[Any]]) -> None:
    names = list(cols)
    client.insert(f"{db}.pairs", [cols[k] for k in names], column_names=names, column_oriented=True)


# --- the checker's method, in numpy (the same functions of collector.sla.stats) ------------
def weighted_level(codes: np.ndarray, w: np.ndarray, level: float) -> int:
    """The grid cell at which the cumulative weight first reaches level·Σw."""
    o = np.argsort(codes, kind="stable")
    cw = np.cumsum(w[o])
    i = int(np.searchsorted(cw, level * cw[-1] * (1 - 1e-12)))
    return int(codes[o][min(i, len(cw) - 1)])


def n_eff(codes: np.ndarray, w: np.ndarray, kish: bool = False) -> int:
    n, wsum, w2 = len(w), float(w.sum()), float((w * w).sum())
    if kish:
        return max(1, min(n, math.floor(wsum * wsum / w2)))
    q = weighted_level(codes, w, stats.P)
    return stats.n_effective(n, wsum, w2, float((w * w)[codes <= q].sum()))


def codes_of(values: np.ndarray, grid: quantize.Grid = quantize.FINE) -> np.ndarray:
    """quantize.encode over an array of positive values (tests check it against encode)."""
    a = np.asarray(values, dtype=float)
    lin = np.floor(a / grid.step_ms)
    log = grid.linear_cells + np.floor(
        grid.cells_per_octave * np.log2(np.maximum(a, 1e-9) / grid.linear_limit_ms)
    )
    return np.where(a < grid.linear_limit_ms, lin, log).astype(np.int64)


def bounds(values: np.ndarray, w: np.ndarray, kish: bool = False) -> tuple[float, float]:
    """One side's 97.5 % bounds of its P95, as the checker computes them (grid, levels,
    half-cell widening); ±inf where unbounded."""
    codes = codes_of(values)
    n = n_eff(codes, w, kish)
    lo_r, hi_r = stats.rank_bounds(n, stats.P, stats.ALPHA / 2)
    lo, hi = -math.inf, math.inf
    if lo_r is not None:
        v = quantize.decode(weighted_level(codes, w, stats.level_for_rank_at_most(lo_r, n)))
        lo = v - quantize.half_width_ms(v)
    if hi_r is not None:
        v = quantize.decode(weighted_level(codes, w, stats.level_for_rank_at_least(hi_r, n)))
        hi = v + quantize.half_width_ms(v)
    return lo, hi
