"""CLOCK_MONOTONIC (bpf_ktime_get_ns) → Unix time, with an offset re-measured periodically
(NTP steps and slews move CLOCK_REALTIME, not the kernel's timestamps)."""

from __future__ import annotations

import time


class MonoClock:
    def __init__(self, remeasure_s: float = 10.0) -> None:
        self.remeasure_s = remeasure_s
        self.offset_ns = 0
        self._at = 0.0
        self.measure()

    def measure(self) -> int:
        """Offset from the tightest of a few bracketed readings."""
        best: tuple[int, int] | None = None
        for _ in range(5):
            a = time.monotonic_ns()
            r = time.time_ns()
            b = time.monotonic_ns()
            if best is None or b - a < best[0]:
                best = (b - a, r - (a + b) // 2)
        assert best is not None
        self.offset_ns = best[1]
        self._at = time.monotonic()
        return self.offset_ns

    def maybe_remeasure(self) -> None:
        if time.monotonic() - self._at >= self.remeasure_s:
            self.measure()

    def to_unix_ns(self, mono_ns: int) -> int:
        return mono_ns + self.offset_ns
