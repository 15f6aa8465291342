"""When the agent stops tracing for a while: over its CPU budget, or behind its ring buffer.

* CPU budget: a token bucket over the agent's own CPU time (every thread). Tokens accrue at
  ``cores`` CPU-seconds per second up to one second's worth (short bursts pass); the
  agent's CPU use spends them; below zero it is over budget.
* Behind: the ring buffer more than half full when a drain starts — the kernel is producing
  faster than user space consumes, and once the ring is full every event the programs build
  is thrown away (counted as lost). Tracing on is then pure cost to the servers.

Either way the agent pauses tracing in the kernel (loader.set_paused: the programs exit at
the pid filter, so the kernel-side cost drops too, and the traced processes' reads are
counted as shed requests) for a hold time — 1 s, doubled on each pause that follows within
30 s of the last, at most 8 s — and resumes once the hold is over, the budget half refilled
and the ring drained. Without this an agent on a saturated node takes CPU from the very
servers it measures; with it, it sheds whole stretches and says how many requests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# The default budget: a share of the node, as overhead targets for node agents are stated,
# within a floor (the agent's idle work takes ~0.01 cores: below the floor a paused agent
# could never earn its way back) and a cap (under the DaemonSet's 500m CPU limit, so it
# sheds before the CFS quota throttles it). Measured at nginx saturation on 2 cores: a
# 0.4-core budget is a fifth of that node, and the traced throughput fell to 0.81 of
# untraced; at 0.1 (5 %) it was 0.90 (docs/benchmarks.md).
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


HOLD_S = 1.0
HOLD_MAX_S = 8.0
CALM_S = 30.0
BEHIND = 0.5  # ring share that means user space is falling behind
DRAINED = 0.05


class Shedder:
    def __init__(
        self,
        cores: float,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self._clock, self._cpu_clock = clock, cpu_clock
        self.rate = cores  # 0: no CPU budget
        self.cap = cores * 1.0
        self.tokens = self.cap
        self.paused = False
        self.reason = ""
        self._hold = HOLD_S
        self._until = 0.0
        self._resumed = float("-inf")
        self._t = clock()
        self._cpu = cpu_clock()

    def hold(self) -> None:
        """The resume just granted could not be carried out: paused for another hold."""
        self.paused = True
        self._until = self._clock() + self._hold

    def step(self, ring_fill: float | None, ring_full: bool = False) -> bool | None:
        """Account the CPU used since the last step and look at the ring (fill None:
        unknown; ``ring_full``: the programs paused themselves on a full ring): True to
        pause now (``reason`` says why), False to resume now, None for no change."""
        now, cpu = self._clock(), self._cpu_clock()
        if self.rate > 0:
            spent = cpu - self._cpu
            self.tokens = min(self.cap, self.tokens + self.rate * (now - self._t) - spent)
        self._t, self._cpu = now, cpu
        if not self.paused:
            over = self.rate > 0 and self.tokens < 0
            behind = ring_full or (ring_fill is not None and ring_fill > BEHIND)
            if not (over or behind):
                return None
            self.reason = "cpu_budget" if over else "ring_full" if ring_full else "behind"
            if now - self._resumed > CALM_S:
                self._hold = HOLD_S
            self._until = now + self._hold
            self._hold = min(HOLD_MAX_S, self._hold * 2)
            self.paused = True
            return True
        if now < self._until:
            return None
        if self.rate > 0 and self.tokens < self.cap / 2:
            return None
        if ring_fill is not None and ring_fill > DRAINED:
            return None
        self.paused = False
        self._resumed = now
        return False
