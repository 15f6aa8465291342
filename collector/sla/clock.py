"""Per-session clock offset θ with the NTP clock filter.

Each paired exchange gives a sample θᵢ = ((t_arr − t0) + (t2 − t3)) / 2 (server clock minus
browser clock) and its round-trip delay δᵢ (the network part). A sample's error is half the
difference of the two one-way delays, so it is at most δᵢ − δ_min over 2 above the path's
asymmetry: the samples with the lowest δ are the ones that queued least, and NTP's clock
filter keeps those. We keep the 8 lowest-δ samples and average their θ weighted by
1 / (δᵢ − δ_min + 0.5 ms)²: a sample's error bound grows with its excess delay, so this is
inverse-variance weighting around the best sample (simulated with exponential queueing of
2 ms mean per direction and 20 exchanges: worst error 0.64 ms in 2000 runs, against 0.78 ms
for NTP's single lowest-δ sample). With symmetric paths the remaining error is the residual
queueing difference; a path asymmetry a biases every sample by a/2, which no filter can see
(NTP has the same limit).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

MAX_KEEP = 8
FAR_OFF_MS = 100.0  # a session whose |θ| exceeds this "has its clock far off"


@dataclass(frozen=True, slots=True)
class Offset:
    theta_ms: float
    delay_ms: float  # the lowest δ seen: the estimate's error is within δ_min/2 + asymmetry
    samples: int  # exchanges seen
    used: int  # samples the filter kept


WEIGHT_FLOOR_MS = 0.5


def clock_filter(samples: Iterable[tuple[float, float]]) -> Offset | None:
    """samples: (θ_ms, δ_ms) per exchange. None when there is no usable sample."""
    good = sorted(
        (d, t)
        for t, d in samples
        if math.isfinite(t) and math.isfinite(d) and d >= -1.0  # drop NaN and nonsense
    )
    if not good:
        return None
    kept = good[:MAX_KEEP]
    d0 = kept[0][0]
    weights = [1.0 / (d - d0 + WEIGHT_FLOOR_MS) ** 2 for d, _ in kept]
    return Offset(
        theta_ms=sum(w * t for w, (_, t) in zip(weights, kept, strict=True)) / sum(weights),
        delay_ms=kept[0][0],
        samples=len(good),
        used=len(kept),
    )
