"""Every inter-token gap of a stream, in bounded memory (pure Python).

The first :data:`EXACT` gaps are kept exactly (µs, 4 bytes each); every gap, those beyond
too, goes into a log histogram of :data:`BUCKETS` buckets (two per octave: a quantile read
from it is within ±19 % of the truth), the maximum with its token index, and the stalls —
the longest gaps over :data:`STALL_MIN_US` with their token indexes, :data:`MAX_STALLS` of
them. Quantiles are exact while the stream has at most ``EXACT`` gaps, and say when not.
Memory per stream: at most 4·EXACT + 8·BUCKETS bytes plus the stalls, whatever its length.
"""

from __future__ import annotations

import heapq
import math
from array import array

EXACT = 8192  # gaps kept exactly (a 5,000-token answer's every gap)
BUCKETS = 56  # 2 per octave from 1 µs: the last one holds gaps from 2^27.5 µs (~3 min)
STALL_MIN_US = 100_000  # a gap is a stall candidate from 100 ms
STALL_FACTOR = 8  # ... and a stall when also over 8 times the stream's median gap
MAX_STALLS = 16


def bucket_of(us: int) -> int:
    """The histogram bucket of a gap: ⌊2·log2(µs)⌋, clamped (integer arithmetic: the
    upper half of an octave starts at 2^k·√2, i.e. where us² ≥ 2^(2k+1))."""
    if us < 1:
        return 0
    k = us.bit_length() - 1
    b = 2 * k + (us * us >= 2 << (2 * k))
    return b if b < BUCKETS else BUCKETS - 1


def _bucket_start(b: int) -> int:
    """The least gap in bucket ``b`` ≥ 1: 2^k for b = 2k, the first us with us² ≥ 2^(2k+1)
    for b = 2k + 1 (bucket_of's rule)."""
    return 1 << b // 2 if b % 2 == 0 else math.isqrt((1 << b) - 1) + 1


def _bucket_table(n: int) -> bytes:
    """bucket_of(us) for every us < n, one byte each."""
    starts = [0, *(min(_bucket_start(b), n) for b in range(1, BUCKETS)), n]
    return b"".join(bytes([b]) * (starts[b + 1] - starts[b]) for b in range(BUCKETS))


# bucket_of of every gap under SMALL_US, looked up (a token's gap is almost always there):
# 128 KiB per process, an index instead of a call and its arithmetic per token
SMALL_US = 1 << 17  # ~131 ms
_SMALL_BUCKET = _bucket_table(SMALL_US)


def bucket_mid_us(i: int) -> int:
    """A bucket's representative value (its geometric middle)."""
    return round(2 ** ((i + 0.5) / 2))


class Gaps:
    __slots__ = ("exact", "hist", "max_at", "max_us", "n", "stalls")

    def __init__(self) -> None:
        self.exact = array("I")
        self.hist: list[int] = [0] * BUCKETS
        self.n = 0
        self.max_us = 0
        self.max_at = 0  # the token index after the longest gap (1 = the second token)
        self.stalls: list[tuple[int, int]] = []  # a min-heap of (gap µs, token index)

    def add(self, us: int) -> None:
        """One gap, ``us`` ≥ 0 (per output token: kept lean)."""
        n = self.n = self.n + 1
        if n <= EXACT:  # (the first EXACT gaps are the ones kept)
            self.exact.append(us if us < 0xFFFFFFFF else 0xFFFFFFFF)
        self.hist[_SMALL_BUCKET[us] if us < SMALL_US else bucket_of(us)] += 1
        if us > self.max_us:
            self.max_us, self.max_at = us, n
        if us >= STALL_MIN_US:
            if len(self.stalls) < MAX_STALLS:
                heapq.heappush(self.stalls, (us, self.n))
            elif us > self.stalls[0][0]:
                heapq.heapreplace(self.stalls, (us, self.n))

    @property
    def is_exact(self) -> bool:
        return self.n <= EXACT

    def quantile(self, q: float) -> int | None:
        """The q-quantile of the gaps (nearest rank), µs; None when there is none."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: tuple[float, ...]) -> list[int | None]:
        """Several quantiles at once (one sort)."""
        if not self.n:
            return [None] * len(qs)
        ranks = [max(1, math.ceil(q * self.n)) for q in qs]
        if self.is_exact:
            ordered = sorted(self.exact)
            return [ordered[r - 1] for r in ranks]
        out: list[int | None] = []
        for rank in ranks:
            seen = 0
            for i, c in enumerate(self.hist):
                seen += c
                if seen >= rank:
                    out.append(bucket_mid_us(i))
                    break
            else:
                out.append(self.max_us)
        return out

    def stalls_over_median(self) -> list[tuple[int, int]]:
        """(token index, gap µs) of the stalls: over STALL_MIN_US and STALL_FACTOR times the
        median gap, in token order."""
        med = self.quantile(0.5) or 0
        floor = max(STALL_MIN_US, STALL_FACTOR * med)
        return sorted((at, us) for us, at in self.stalls if us >= floor)
