"""Per-client token buckets (requests per second with a burst), bounded in memory."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict


class RateLimiter:
    def __init__(self, rate: float, burst: int, max_clients: int = 100_000):
        self.rate = rate
        self.burst = float(burst)
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at
        self._lock = threading.Lock()

    def take(self, client: str, now: float | None = None) -> float:
        """0 when allowed, else the seconds to wait before the next request may pass."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, at = self._buckets.pop(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                wait = 0.0
            else:
                self._buckets[client] = (tokens, now)
                wait = (1.0 - tokens) / self.rate
            # The least recently seen clients go first (their buckets are full by now).
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        return wait


def retry_after(wait_s: float) -> str:
    return str(max(1, math.ceil(wait_s)))
