"""Shedding load in the kernel: the pauses agent.budget.Shedder decides, carried out.

Pausing sets the programs' ``paused`` flag (they exit at the pid filter and count the traced
processes' reads as shed requests) and detaches the hooks that would still run for every
TCP write and arrival on the node; resuming attaches them again first, and every followed
connection resynchronises at its next request (what the kernel skipped cannot be framed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agent import loader
from agent.budget import Shedder
from agent.metrics import Metrics

log = logging.getLogger("parallax.agent")

_WHY = {
    "behind": "the ring buffer is filling faster than it is drained",
    "ring_full": "the ring buffer was full (the kernel paused itself)",
}


class Shedding:
    def __init__(
        self, bpf: Any, cpu_budget: float, m: Metrics, on_resume: Callable[[], None]
    ) -> None:
        self.bpf = bpf
        self.cpu_budget = cpu_budget
        self.shedder = Shedder(cpu_budget)
        self.m = m
        self._on_resume = on_resume
        self.detached: list[bytes] = []  # hooks taken off for the current pause
        self._warned: set[str] = set()
        self._reattach_warned = False

    def step(self, ring_fill: float | None) -> None:
        """After a drain: account the CPU used, look at the ring, pause or resume."""
        shedder = self.shedder
        full = not shedder.paused and loader.paused_by_kernel(self.bpf)
        change = shedder.step(ring_fill, full)
        if change is None:
            return
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
            self._on_resume()
            return
        # Paused, these programs return at once, yet every TCP write and arrival on the
        # node still runs them (docs/agent.md, Overload).
        self.detached = loader.detach_idle(self.bpf)
        reason = shedder.reason
        self.m.pauses.labels(reason).inc()
        if reason not in self._warned:
            self._warned.add(reason)
            why = _WHY.get(reason) or f"over the CPU budget ({self.cpu_budget:g} cores)"
            log.warning(
                "%s: tracing paused for a while; requests meanwhile are counted in"
                " parallax_agent_shed_requests_total",
                why,
            )
