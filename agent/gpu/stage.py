"""The GPU stage of the export path: a record of a service with GPU processes waits until the
GPU data covering its windows has been read (bounded: MAX_HOLD_S), then gets its ``gpu_*``
fields (parallax_contracts.span_attributes, ``parallax.gpu.*``). Other records pass at once.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from agent.gpu import attribution as at
from agent.kernel.clock import MonoClock
from parallax_contracts import span_attributes as sa

if TYPE_CHECKING:
    from agent.gpu.side import GpuSide

# How long a record may wait for the GPU data of its windows. The NVML samples of a moment
# are read at the next poll, the CUDA buckets at the next drain (the same thread): a record
# normally leaves one poll period after its end; this bounds the wait when a poll is late.
MAX_HOLD_S = 2.0
KEEP_S = 120.0  # request intervals kept per service for the in-flight mean
F_PREFILL_LAUNCHES = sa.record_field(sa.GPU_PREFILL_LAUNCHES)
F_DECODE_LAUNCHES = sa.record_field(sa.GPU_DECODE_LAUNCHES)
F_PREFILL_WAIT = sa.record_field(sa.GPU_PREFILL_WAIT_US)
F_DECODE_WAIT = sa.record_field(sa.GPU_DECODE_WAIT_US)
F_PREFILL_SM = sa.record_field(sa.GPU_PREFILL_SM_UTIL_PCT)
F_DECODE_SM = sa.record_field(sa.GPU_DECODE_SM_UTIL_PCT)
F_COVERAGE = sa.record_field(sa.GPU_SAMPLE_COVERAGE)
F_INFLIGHT = sa.record_field(sa.GPU_INFLIGHT_MEAN)
F_UUID = sa.record_field(sa.GPU_UUID)


def windows(rec: dict[str, Any]) -> tuple[at.Window, at.Window | None]:
    """(prefill, decode) on the Unix clock: t1 → first body write → last write. A response
    with no body write is all prefill."""
    t1, end = rec["start_unix_ns"], rec["end_unix_ns"]
    ttft = rec.get("ttft_us")
    if ttft is None:
        return at.Window(t1, end), None
    tok = t1 + ttft * 1000
    return at.Window(t1, tok), (at.Window(tok, end) if end > tok else None)


class _Intervals:
    """One service's requests as [t1, end) intervals, kept sorted by end: those open at a
    time t are found from the first that ends after t."""

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.spans: list[tuple[int, int]] = []

    def add(self, start: int, end: int) -> None:
        i = bisect.bisect_right(self.ends, end)
        self.ends.insert(i, end)
        self.spans.insert(i, (start, end))

    def ending_after(self, t: int) -> list[tuple[int, int]]:
        return self.spans[bisect.bisect_right(self.ends, t) :]

    def forget_before(self, t: int) -> None:
        i = bisect.bisect_left(self.ends, t)
        if i:
            del self.ends[:i], self.spans[:i]


class GpuStage:
    """A record processor (agent.export.outputs): ``process`` takes records and returns those
    ready; ``flush`` returns every record still held (stopping)."""

    def __init__(
        self,
        side: GpuSide,
        clock: MonoClock,
        open_requests: Callable[[str], list[int]] = lambda service: [],
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        self._side = side
        self._clock = clock
        self._open = open_requests  # the mono t1 of the service's requests open now
        self._open_now: dict[str, list[int]] = {}  # per release round
        self._wall = wall
        self._held: deque[tuple[float, dict[str, Any], frozenset[int]]] = deque()
        self._requests: dict[str, _Intervals] = {}
        self.n_attributed = 0
        self.n_hold_expired = 0  # released without all their GPU data (MAX_HOLD_S)

    @property
    def pending(self) -> bool:
        return bool(self._held)

    def process(self, recs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        now = self._wall()
        for rec in recs:
            gpu_pids = self._side.processes.of(rec["pid"])
            if not gpu_pids:
                out.append(rec)
                continue
            svc = self._requests.setdefault(rec["service"], _Intervals())
            svc.add(rec["start_unix_ns"], rec["end_unix_ns"])
            self._held.append((now, rec, gpu_pids))
        if self._held:
            covered = self._side.covered_to(self._clock.offset_ns)
            keep: deque[tuple[float, dict[str, Any], frozenset[int]]] = deque()
            self._open_now = {}
            for since, rec, pids in self._held:
                late = now - since >= MAX_HOLD_S
                if rec["end_unix_ns"] <= covered or late:
                    self.n_hold_expired += late and rec["end_unix_ns"] > covered
                    out.append(self._attribute(rec, pids))
                else:
                    keep.append((since, rec, pids))
            self._held = keep
            horizon = time.time_ns() - int(KEEP_S * 1e9)
            for iv in self._requests.values():
                iv.forget_before(horizon)
        return out

    def flush(self) -> list[dict[str, Any]]:
        self._open_now = {}
        out = [self._attribute(rec, pids) for _, rec, pids in self._held]
        self._held.clear()
        return out

    def _attribute(self, rec: dict[str, Any], pids: frozenset[int]) -> dict[str, Any]:
        self.n_attributed += 1
        side, off = self._side, self._clock.offset_ns
        prefill, decode = windows(rec)
        whole = at.Window(prefill.start, decode.end if decode else prefill.end)
        cuda = side.cuda
        since = cuda.probed_since(pids) if cuda is not None else None
        if cuda is not None and since is not None:
            # a window is counted only if the probes were in place when it began: what came
            # before is unknown, not zero
            buckets = cuda.buckets(pids, whole.start - off, whole.end - off)
            for w, f_launches, f_wait in (
                (prefill, F_PREFILL_LAUNCHES, F_PREFILL_WAIT),
                (decode, F_DECODE_LAUNCHES, F_DECODE_WAIT),
            ):
                if w is not None and since + off <= w.start:
                    rec[f_launches] = at.launches_in(buckets, w, off)
                    rec[f_wait] = at.wait_in(buckets, w, off) // 1000
        view = side.sm_view(pids, whole)
        if view is not None:  # NVML polled: coverage is known, even when it is 0
            samples, known = view
            covered = 0
            for w, field in ((prefill, F_PREFILL_SM), (decode, F_DECODE_SM)):
                if w is None:
                    continue
                pct, seen = at.sm_util(samples, known, w)
                covered += seen
                if pct is not None:
                    rec[field] = round(pct, 2)
            if whole.length:
                rec[F_COVERAGE] = round(min(1.0, covered / whole.length), 4)
            if known:
                rec[F_UUID] = ",".join(sorted(known))
        others = self._requests[rec["service"]].ending_after(whole.start)
        now_ns = time.time_ns()
        others = [iv for iv in others if iv != (rec["start_unix_ns"], rec["end_unix_ns"])]
        service = rec["service"]
        if service not in self._open_now:
            self._open_now[service] = self._open(service)
        others += [(t + off, now_ns) for t in self._open_now[service]]
        inflight = at.inflight_mean(whole, others)
        if inflight is not None:
            rec[F_INFLIGHT] = round(inflight, 3)
        return rec
