"""How much the agent traces: per-request sampling adapted to its budget, and the pause as a
last resort. Pure logic on injectable clocks; agent.shedding carries it out in the kernel.

* **Sampling** (:class:`Sampler`): the kernel keeps each request with a probability p, decided
  at the request's first read, uniformly and independently of time (bpf/agent/sample.h).
  Once a second p is set so that the agent's CPU stays within its budget: the CPU it used
  per kept request, times the rate of requests, against the budget. p falls at once when
  the budget is exceeded or the ring buffer is more than half full at a drain (user space
  is falling behind), and rises back smoothly — at most ×RISE a second — so that a load at
  the limit settles instead of oscillating. Every request is still counted, in the kernel.
* **Pausing** (:class:`Shedder`): when the ring buffer was full (the programs paused
  themselves, losing events), tracing stays paused for a hold — 1 s, doubled on each pause
  within 30 s of the last, at most 8 s — and resumes once the ring is drained, with p halved.
  Sampling should make this rare: it is what happens when load rises faster than p falls.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# The default budget: a share of the node, as overhead targets for node agents are stated,
# within a floor (the agent's idle work takes ~0.01 cores) and a cap (under the DaemonSet's
# 500m CPU limit, so that it samples before the CFS quota throttles it).
NODE_SHARE = 0.05
MIN_CORES = 0.05
MAX_CORES = 0.4


def default_cores(cpus: int | None = None) -> float:
    """5 % of the CPUs this process may run on, within [MIN_CORES, MAX_CORES]."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except OSError:
            cpus = os.cpu_count() or 1
    return round(min(MAX_CORES, max(MIN_CORES, NODE_SHARE * cpus)), 3)


# --- sampling -----------------------------------------------------------------------------
PERIOD_S = 1.0  # p is reconsidered this often (and at once when the ring is behind)
TARGET = 0.8  # of the budget: headroom for the bursts between two adjustments
RISE = 1.25  # p rises at most this factor a second: 1 % → 100 % in about 21 s
DEADBAND = 0.05  # a wanted change under 5 % of p is not made (no dithering)
P_MIN = 1 / 1024  # even a flooded agent keeps a sample
BEHIND = 0.5  # ring share that means user space is falling behind
HOLD_RISE_S = 2.0  # after a fall, p does not rise again for this long
BEHIND_EVERY_S = 0.5  # a ring still behind halves p again after this (the backlog drains)
IDLE_CORES = 0.002  # the agent's CPU with nothing to trace (measured 0.0017–0.0026)
# After the agent starts tracing, its own start-up work (imports, the exporters' first
# batches, the first drain of the ring) is not a cost per request: for this long the CPU
# does not lower p, and the cost is measured from its end (the ring still can).
WARMUP_S = 2.0


class Sampler:
    """The keep probability p. ``step`` after each drain with the kernel's cumulative
    request counts (every request seen, those kept) returns the new p when it changes."""

    def __init__(
        self,
        cores: float,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self.cores = cores  # 0: no CPU budget (only the ring lowers p)
        self.p = 1.0
        self.cost_s: float | None = None  # agent CPU per kept request (EWMA)
        self.reason = ""  # why p last fell: "cpu_budget" or "behind"
        self._clock, self._cpu_clock = clock, cpu_clock
        self._t = clock()
        self._cpu = cpu_clock()
        self._seen = 0
        self._kept = 0
        self._hold_until = float("-inf")
        self._behind_at = float("-inf")
        self._warm_until = float("-inf")

    def start(self, warmup_s: float = WARMUP_S) -> None:
        """Tracing begins now: the CPU spent so far (compiling, attaching, imports) is not
        the requests', nor is that of the next ``warmup_s`` (the outputs' first work)."""
        self._t = self._clock()
        self._cpu = self._cpu_clock()
        self._warm_until = self._t + warmup_s

    def step(self, ring_fill: float | None, seen: int, kept: int) -> float | None:
        now = self._clock()
        if ring_fill is not None and ring_fill > BEHIND and now - self._behind_at >= BEHIND_EVERY_S:
            self.reason = "behind"
            self._behind_at = now
            return self._set(max(P_MIN, self.p / 2), now)
        dt = now - self._t
        if dt < PERIOD_S:
            return None
        if now < self._warm_until or self._t < self._warm_until:
            # warming up (or the window that began in it): a fresh baseline, no decision
            self._t, self._cpu, self._seen, self._kept = now, self._cpu_clock(), seen, kept
            return None
        cpu = self._cpu_clock()
        used = (cpu - self._cpu) / dt  # cores
        seen_rate = max(0, seen - self._seen) / dt
        kept_rate = max(0, kept - self._kept) / dt
        self._t, self._cpu, self._seen, self._kept = now, cpu, seen, kept
        if kept_rate > 0:
            cost = max(0.0, used - IDLE_CORES) / kept_rate
            self.cost_s = cost if self.cost_s is None else 0.7 * self.cost_s + 0.3 * cost
        want = 1.0
        if self.cores > 0 and self.cost_s and seen_rate > 0:
            want = min(1.0, self.cores * TARGET / (seen_rate * self.cost_s))
            if used > self.cores:  # over the budget now: at least in proportion
                want = min(want, self.p * self.cores / used)
        want = max(P_MIN, want)
        if want < self.p * (1 - DEADBAND):
            self.reason = "cpu_budget"
            return self._set(want, now)
        # the dead band is for dithering between two shares, not for the last step to all:
        # without the exemption a share that came back to within 5 % of 1 stayed there
        rise = want > self.p * (1 + DEADBAND) or (want == 1.0 and self.p < 1.0)
        if rise and now >= self._hold_until:
            return self._set(min(want, self.p * RISE), now, falling=False)
        return None

    def after_pause(self) -> float:
        """Tracing resumes after a full ring: at half the probability it had."""
        self.reason = "ring_full"
        return self._set(max(P_MIN, self.p / 2), self._clock()) or self.p

    def _set(self, p: float, now: float, falling: bool = True) -> float | None:
        if p == self.p:
            return None
        self.p = p
        if falling:
            self._hold_until = now + HOLD_RISE_S
        return p


# --- pausing ------------------------------------------------------------------------------
HOLD_S = 1.0
HOLD_MAX_S = 8.0
CALM_S = 30.0
DRAINED = 0.05


class Shedder:
    """The last resort: paused while the ring buffer was full, for a hold."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.paused = False
        self.reason = "ring_full"
        self._hold = HOLD_S
        self._until = 0.0
        self._resumed = float("-inf")

    def hold(self) -> None:
        """The resume just granted could not be carried out: paused for another hold."""
        self.paused = True
        self._until = self._clock() + self._hold

    def step(self, ring_fill: float | None, ring_full: bool) -> bool | None:
        """``ring_full``: the programs paused themselves on a full ring. True to pause now,
        False to resume now, None for no change."""
        now = self._clock()
        if not self.paused:
            if not ring_full:
                return None
            if now - self._resumed > CALM_S:
                self._hold = HOLD_S
            self._until = now + self._hold
            self._hold = min(HOLD_MAX_S, self._hold * 2)
            self.paused = True
            return True
        if now < self._until or (ring_fill is not None and ring_fill > DRAINED):
            return None
        self.paused = False
        self._resumed = now
        return False
