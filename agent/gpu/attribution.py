"""Which GPU activity belongs beside a request: pure functions over the service's timelines.

A request has two windows on the server's clock: *prefill* = t1 (its read) → its first body
write, *decode* = first body write → last write. Inference servers batch, and their GPU
work often runs in another process of the same container, so a window gets the activity of
the request's *service* — its GPU processes — in those seconds, never "its own kernels":

* launches: kernel and graph launches enqueued on the host (CUDA buckets, agent.gpu.cuda);
* host wait: time a host thread was blocked on the GPU, the union over threads (computed in
  the kernel per process) and over the service's processes;
* SM utilisation: the service's processes' NVML samples, time-weighted over the window;
  ``coverage`` says how much of the windows the samples cover;
* in flight: the mean number of the service's requests open over the request.

Every time here is Unix ns. Nothing is zero for "unknown": a figure that cannot be measured
is None and its attribute stays absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.gpu.cuda import Bucket
from agent.gpu.nvml import ProcessSample


@dataclass(frozen=True, slots=True)
class Window:
    start: int
    end: int

    @property
    def length(self) -> int:
        return max(0, self.end - self.start)


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def launches_in(buckets: Iterable[Bucket], w: Window, offset_ns: int = 0) -> int:
    """Launches (kernel and graph) in ``w``. A bucket whose launches all fall on one side
    of an edge counts whole or not at all (exact); one that straddles an edge is split in
    proportion to the time its launches spanned on each side."""
    total = 0.0
    for b in buckets:
        n = b.launches + b.graphs
        if not n:
            continue
        first, last = b.t_first + offset_ns, b.t_last + offset_ns + 1
        if last <= w.start or first >= w.end:
            continue
        if first >= w.start and last <= w.end:
            total += n
        else:
            total += n * _overlap(first, last, w.start, w.end) / (last - first)
    return round(total)


def _merge(intervals: list[tuple[int, int]]) -> int:
    """The length of the union of intervals."""
    out = 0
    end = None
    start = 0
    for a, b in sorted(intervals):
        if end is None or a > end:
            if end is not None:
                out += end - start
            start, end = a, b
        elif b > end:
            end = b
    if end is not None:
        out += end - start
    return out


def wait_in(buckets: Iterable[Bucket], w: Window, offset_ns: int = 0) -> int:
    """Host-wait time in ``w`` (ns), the union over the service's processes. A bucket with
    one wait interval gives it exactly; one with several (they lie in [wait_first,
    wait_last], ``wait_ns`` in all) is spread evenly over that span."""
    exact: list[tuple[int, int]] = []
    spread = 0.0
    for b in buckets:
        if not b.waits:
            continue
        first, last = b.wait_first + offset_ns, b.wait_last + offset_ns
        if b.waits == 1:
            a, z = max(first, w.start), min(last, w.end)
            if z > a:
                exact.append((a, z))
        elif last > first:
            spread += b.wait_ns * _overlap(first, last, w.start, w.end) / (last - first)
    return min(w.length, _merge(exact) + round(spread))


def sm_util(
    samples: Sequence[ProcessSample], known: dict[str, tuple[int, int]], w: Window
) -> tuple[float | None, int]:
    """(mean SM % of the service over ``w``, ns of ``w`` the samples are complete for).

    ``samples``: the service's processes' NVML samples; a sample stamped t covers the
    driver's period (t − period, t], and a process missing from a period used no SM in it
    (NVML omits idle processes), so a mean is only taken where the samples are complete:
    ``known`` gives, per GPU the service uses, the stretch [from, to] (Unix ns) its samples
    cover. On each GPU the service's share is the sum over its processes (at most 100 %);
    with several GPUs, the mean over them. None when no part of ``w`` is known."""
    means: list[float] = []
    covered: list[int] = []
    for uuid, (k0, k1) in known.items():
        a, z = max(w.start, k0), min(w.end, k1)
        if z <= a:
            continue
        busy = 0.0
        for smp in samples:
            if smp.uuid == uuid:
                busy += smp.sm_pct * _overlap(
                    (smp.t_us - smp.period_us) * 1000, smp.t_us * 1000, a, z
                )
        means.append(min(100.0, busy / (z - a)))
        covered.append(z - a)
    if not means:
        return None, 0
    return sum(means) / len(means), min(covered)


def inflight_mean(w: Window, others: Iterable[tuple[int, int]]) -> float | None:
    """Mean number of requests open over ``w`` (the request itself included): ``others``
    are the intervals [t1, end) of the service's other requests (an open one ends now)."""
    if w.length <= 0:
        return None
    return 1.0 + sum(_overlap(a, z, w.start, w.end) for a, z in others) / w.length
