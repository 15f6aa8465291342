"""Overload, carried out in the kernel: agent.budget decides, this module applies.

* Sampling: the Sampler's probability becomes the programs' threshold (loader.set_sample_th);
  the kernel keeps each request or not at its first read and counts every request.
* Pausing, the last resort after a full ring: the programs' ``paused`` flag is held (they
  exit at the pid filter and count the traced processes' reads as shed requests) and the
  hooks that would still run for every TCP write and arrival on the node are detached;
  resuming attaches them again first, and every followed connection resynchronises at its
  next request (what the kernel skipped cannot be framed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agent.budget import Sampler, Shedder
from agent.kernel import loader
from agent.metrics import Metrics
from parallax_contracts import sampling

log = logging.getLogger("parallax.agent")

_WHY = {
    "behind": "the ring buffer is filling faster than it is drained",
    "ring_full": "the ring buffer was full",
}


class Shedding:
    def __init__(
        self,
        bpf: Any,
        cpu_budget: float,
        m: Metrics,
        on_resume: Callable[[], None],
        fixed_p: float | None = None,
    ) -> None:
        self.bpf = bpf
        self.cpu_budget = cpu_budget
        self.sampler = Sampler(cpu_budget)
        self.shedder = Shedder()
        self.fixed_p = fixed_p  # tests: a probability held whatever the load
        self.m = m
        self._on_resume = on_resume
        self.detached: list[bytes] = []  # hooks taken off for the current pause
        self._warned: set[str] = set()
        self._reattach_warned = False
        self._last_counts = 0.0
        self._counts = (0, 0)
        self.p = 1.0
        if fixed_p is not None:
            self._apply(fixed_p)

    def step(self, ring_fill: float | None) -> None:
        """After a drain: look at the ring and the CPU; adapt the sampling; pause or
        resume."""
        shedder = self.shedder
        full = not shedder.paused and loader.paused_by_kernel(self.bpf)
        change = shedder.step(ring_fill, full)
        if change is not None:
            self._pause(change)
        if shedder.paused or self.fixed_p is not None:
            return
        now = time.monotonic()
        if now - self._last_counts >= 0.5:  # the sampler looks once a second
            self._last_counts = now
            c = loader.counters(self.bpf, ("requests_seen", "requests_kept"))
            self._counts = (c["requests_seen"], c["requests_kept"])
        p = self.sampler.step(ring_fill, *self._counts)
        if p is not None:
            self._apply(p)

    def _apply(self, p: float) -> None:
        th32 = sampling.th32_for(p)
        loader.set_sample_th(self.bpf, th32)
        self.p = sampling.probability(sampling.th_from_th32(th32))
        self.m.sampling_probability.set(self.p)
        if self.p < 1 and self.sampler.reason not in self._warned and self.fixed_p is None:
            reason = self.sampler.reason
            self._warned.add(reason)
            why = _WHY.get(reason) or f"over the CPU budget ({self.cpu_budget:g} cores)"
            log.warning(
                "%s: tracing %.3g %% of requests, chosen at random (every request is still"
                " counted: parallax_agent_requests_seen_total); the share follows the load",
                why,
                100 * self.p,
            )

    def _pause(self, change: bool) -> None:
        shedder = self.shedder
        if not change and self.detached:
            # the hooks taken off for the pause go back before the programs trace again
            try:
                loader.reattach(self.bpf, self.detached)
            except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
                if not self._reattach_warned:
                    self._reattach_warned = True
                    log.warning("could not attach hooks again after a pause (%s): still paused", e)
                shedder.hold()
                return
            self.detached = []
        loader.set_paused(self.bpf, change)
        self.m.paused.set(1 if change else 0)
        if not change:
            if self.fixed_p is None:
                self._apply(self.sampler.after_pause())
            self._on_resume()
            return
        # Paused, these programs return at once, yet every TCP write and arrival on the
        # node still runs them (docs/agent.md, Overload).
        self.detached = loader.detach_idle(self.bpf)
        self.m.pauses.labels(shedder.reason).inc()
        if "pause" not in self._warned:
            self._warned.add("pause")
            log.warning(
                "the ring buffer was full: tracing paused for a while; requests meanwhile"
                " are counted in parallax_agent_shed_requests_total"
            )
