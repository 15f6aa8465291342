"""The agent's CPU budget: a token bucket over its own CPU time (every thread).

Tokens accrue at ``cores`` CPU-seconds per second up to one second's worth (short bursts
pass); the agent's CPU use spends them. Below zero the agent pauses tracing in the kernel
(loader.set_paused: the programs exit at the pid filter, so the kernel-side cost drops as
well, and the traced processes' reads are counted as shed requests); it resumes once half
the bucket is back. Without a budget an agent on a saturated node takes CPU from the very
servers it measures; with one, it sheds and says how much.
"""

from __future__ import annotations

import time


class CpuBudget:
    def __init__(self, cores: float) -> None:
        self.rate = cores
        self.cap = cores * 1.0
        self.tokens = self.cap
        self.paused = False
        self._t = time.monotonic()
        self._cpu = time.process_time()

    def step(self) -> bool | None:
        """Account the CPU used since the last step: True to pause now, False to resume
        now, None for no change."""
        now, cpu = time.monotonic(), time.process_time()
        self.tokens = min(self.cap, self.tokens + self.rate * (now - self._t) - (cpu - self._cpu))
        self._t, self._cpu = now, cpu
        if not self.paused and self.tokens < 0:
            self.paused = True
            return True
        if self.paused and self.tokens >= self.cap / 2:
            self.paused = False
            return False
        return None
