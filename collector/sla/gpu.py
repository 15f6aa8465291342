"""Where a route's server time goes, and the GPU's state in words: the rules, in one place.

Server time splits per request into three windows (docs/ARCHITECTURE.md): **queue** (the
kernel's accept + receive queues, t1 − t_arr), **prefill** (t1 → the first body write: the
first token) and **decode** (first → last body write: the stream). Inference servers spend
prefill and decode on the GPU, so for a route whose spans carry the agent's
``parallax.gpu.*`` attributes each window also says what the service's GPU processes were
doing in it: busy (SM utilisation), idle, clocked down (and why).

Pure functions over per-route aggregates (``Split`` from the pairs' histograms, ``GpuRoute``
from the spans and ``gpu_samples``, collector/sla/gpu_source.py): the tests feed them
scripted timelines through the real store and assert the sentences word for word.

A route without GPU attributes gets the split and nothing about the GPU: absent is not zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collector.sla.words import ms

# At or above this SM utilisation over a window, the window is GPU-bound: work queued behind
# a GPU that busy waits about ρ/(1−ρ) service times (M/M/1), already 5.7× at 85 %, so more
# of the same traffic mostly waits for the GPU — capacity, not code, is the lever.
BUSY_PCT = 85.0
# At or below this, the GPU was idle at least half the window: most of the wait cannot be
# GPU work, so it is spent before or beside the GPU (the server's scheduler, its CPU path,
# its own queue). Between the two thresholds the figures are given without a verdict.
IDLE_MAX_BUSY_PCT = 50.0
# Below this share of the maximum SM clock the GPU runs measurably slower than it can:
# GPU Boost moves the clock by up to ~10–15 % with temperature and power headroom in normal
# running, so 80 % is past ordinary variation.
CLOCK_LOW_PCT = 80.0
# Below this share of the requests' time covered by NVML samples, the GPU figures may not
# represent the rest: said beside them (a fifth or more of the time unmeasured).
COVERAGE_LOW = 0.8
# Fewer requests with GPU figures than this in the window: the figures are reported but not
# judged — a time-weighted mean over a handful of windows swings with one long request.
MIN_REQUESTS = 20

# NVML clock-event reasons (nvmlClocksEventReason*), in words an on-call engineer knows.
# 0x1 (GPU idle) is not a slowdown: an idle GPU lowers its clock, which the busy share shows.
GPU_IDLE_BIT = 0x1
REASONS = {
    0x2: "application clock setting",
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "thermal limit",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
    0x100: "display clock setting",
}
PHASES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class Split:
    """The route's server-time windows over the evaluation window's paired requests (ms)."""

    n: int = 0  # requests with the prefill (server TTFT) measured
    queue_p50: float | None = None
    queue_p95: float | None = None
    prefill_p50: float | None = None
    prefill_p95: float | None = None
    decode_p50: float | None = None
    decode_p95: float | None = None

    def p95(self, phase: str) -> float | None:
        return self.prefill_p95 if phase == "prefill" else self.decode_p95


@dataclass(frozen=True, slots=True)
class Phase:
    """The service's GPU activity in one kind of window, over the route's requests."""

    busy_pct: float | None = None  # SM utilisation 0–100, weighted by window length
    wait_share: float | None = None  # host threads blocked on the GPU / window time
    launches_mean: float | None = None  # kernel + graph launches enqueued per request
    clock_pct: float | None = None  # SM clock as % of its maximum (readings of the windows)
    clock_reasons: int | None = None  # reason bits of the readings under CLOCK_LOW_PCT
    clock_readings: int = 0


@dataclass(frozen=True, slots=True)
class GpuRoute:
    """A route's GPU aggregate: only its requests that carry GPU attributes count."""

    requests: int
    coverage: float | None  # share of those requests' time NVML samples cover, 0–1
    inflight: float | None  # requests in flight to the service, time-weighted mean
    prefill: Phase
    decode: Phase
    gpus: tuple[str, ...] = ()

    def phase(self, name: str) -> Phase:
        return self.prefill if name == "prefill" else self.decode


@dataclass(frozen=True, slots=True)
class Finding:
    id: str  # gpu_bound, before_gpu, gpu_busy, clock_low, partial_coverage, few_requests
    phase: str | None
    sentence: str


def pct(v: float) -> str:
    return f"{v:.0f} %"


def count(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def reasons_text(bits: int) -> str:
    names = [w for b, w in REASONS.items() if bits & b]
    return ", ".join(names)


def split_sentence(s: Split) -> str:
    """'server time per request: queue P95 1.2 ms, prefill P95 840 ms, decode P95 2400 ms
    (P50 0.4 ms, 610 ms, 1900 ms)' — the windows that were measured and are there (a
    response written at once has no decode window; a request read at once, no queue)."""
    parts = [
        (name, p95, p50)
        for name, p95, p50 in (
            ("queue", s.queue_p95, s.queue_p50),
            ("prefill", s.prefill_p95, s.prefill_p50),
            ("decode", s.decode_p95, s.decode_p50),
        )
        if p95 is not None and p95 > 0.05  # a window that is not there (no stream) says nothing
    ]
    if not parts:
        return ""
    p95s = ", ".join(f"{name} P95 {ms(p95)}" for name, p95, _ in parts)
    p50s = ", ".join(ms(p50) for _, _, p50 in parts)
    return f"server time per request: {p95s} (P50 {p50s})"


def _busy(phase: str, split: Split, gpu: GpuRoute) -> Finding | None:
    ph = gpu.phase(phase)
    if ph.busy_pct is None:
        return None
    p95 = split.p95(phase)
    head = f"{phase} P95 {ms(p95)}" if p95 is not None else phase
    crowd = f" with {count(gpu.inflight)} requests in flight" if gpu.inflight is not None else ""
    if ph.busy_pct >= BUSY_PCT:
        return Finding("gpu_bound", phase, f"{head}, GPU busy {pct(ph.busy_pct)}{crowd}: GPU-bound")
    if ph.busy_pct <= IDLE_MAX_BUSY_PCT:
        where = (
            "the wait is before the GPU (scheduler, CPU, queue)"
            if phase == "prefill"
            else "the time between tokens is spent off the GPU (scheduler, CPU, writing the stream)"
        )
        idle = f"GPU idle {pct(100.0 - ph.busy_pct)} of the {phase} window"
        return Finding("before_gpu", phase, f"{head}, {idle}: {where}")
    return Finding("gpu_busy", phase, f"{head}, GPU busy {pct(ph.busy_pct)}{crowd}")


def _clock(phase: str, gpu: GpuRoute) -> Finding | None:
    ph = gpu.phase(phase)
    if ph.clock_pct is None or not ph.clock_readings or ph.clock_pct >= CLOCK_LOW_PCT:
        return None
    bits = ph.clock_reasons
    if bits is None:  # the driver reports no reasons (or the agent sends none)
        why = ""
    elif bits & ~GPU_IDLE_BIT:
        why = f" ({reasons_text(bits) or f'reason bits {bits:#x}'})"
    elif bits & GPU_IDLE_BIT:
        return None  # an idle GPU clocks down: the busy share says it, not a slowdown
    else:
        why = " (no throttle reason reported)"
    return Finding("clock_low", phase, f"SM clock {pct(ph.clock_pct)} of max{why} during {phase}")


def findings(split: Split, gpu: GpuRoute | None) -> list[Finding]:
    """The GPU findings of one route, in reading order: per window its busy state, then its
    clock; then how much of the time the figures cover. None for a route without GPU data."""
    if gpu is None or gpu.requests == 0:
        return []
    if gpu.requests < MIN_REQUESTS:
        return [
            Finding(
                "few_requests",
                None,
                f"GPU figures from only {gpu.requests} request{'s' if gpu.requests != 1 else ''}"
                f", fewer than the {MIN_REQUESTS} needed to judge the GPU",
            )
        ]
    out: list[Finding] = []
    for phase in PHASES:
        for f in (_busy(phase, split, gpu), _clock(phase, gpu)):
            if f is not None:
                out.append(f)
    if gpu.coverage is not None and gpu.coverage < COVERAGE_LOW:
        out.append(
            Finding(
                "partial_coverage",
                None,
                f"GPU figures cover only {pct(100 * gpu.coverage)} of these requests' time "
                "(NVML samples missing for the rest)",
            )
        )
    return out


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)


def server_json(
    label: str, split: Split, gpu: GpuRoute | None, held: str = "", head: str | None = None
) -> dict[str, Any]:
    """The route's ``server`` object of the SLA document (docs/sla.md); ``held``: the
    clause for writes the kernel held back (collector/sla/explain.py holdback), if any;
    ``head``: the sentence's first clause in place of the split's (an LLM route's, in
    tokens: collector/sla/tokens.py)."""
    found = findings(split, gpu)
    if held:
        found.append(Finding("wire_holdback", None, held))
    if head is None:
        head = split_sentence(split)
    clauses = [x for x in [head, *(f.sentence for f in found)] if x]
    gpu_doc = None
    if gpu is not None and gpu.requests:
        gpu_doc = {
            "requests": gpu.requests,
            "sample_coverage": _r(gpu.coverage, 3),
            "inflight_mean": _r(gpu.inflight),
            "gpus": list(gpu.gpus),
            **{
                name: {
                    "sm_util_pct": _r(ph.busy_pct, 1),
                    "host_wait_share": _r(ph.wait_share, 3),
                    "launches_mean": _r(ph.launches_mean, 1),
                    "sm_clock_pct_of_max": _r(ph.clock_pct, 1),
                    "clock_reasons": (
                        None if ph.clock_reasons is None else reasons_text(ph.clock_reasons)
                    ),
                    "clock_readings": ph.clock_readings,
                }
                for name in PHASES
                for ph in (gpu.phase(name),)
            },
        }
    return {
        "n": split.n,
        "queue_p50_ms": _r(split.queue_p50),
        "queue_p95_ms": _r(split.queue_p95),
        "prefill_p50_ms": _r(split.prefill_p50),
        "prefill_p95_ms": _r(split.prefill_p95),
        "decode_p50_ms": _r(split.decode_p50),
        "decode_p95_ms": _r(split.decode_p95),
        "gpu": gpu_doc,
        "findings": [{"id": f.id, "phase": f.phase, "sentence": f.sentence} for f in found],
        "sentence": f"{label}: {'; '.join(clauses)}." if clauses else "",
    }
