"""The server-time split and the GPU findings (collector/sla/gpu.py) on scripted timelines:
spans with and without the agent's GPU columns, their pairs, and GPU clock readings written
into a real chDB store, evaluated by the real checker; sentences asserted word for word."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from collector.sla import gpu, quantize
from collector.sla.config import SlaConfig
from collector.sla.evaluate import evaluate
from collector.sla.source import SlaSource
from collector.sla.words import ms
from collector.store import schema as store_schema
from tests.sla import scenario
from tests.sla.gpu_timeline import Reading, Req, Timeline, write

DB = "gpu_t"  # a database of its own in the session's store: the scenario stays as it is
NOW = scenario.NOW
GPU_A, GPU_B, GPU_C, GPU_D = (f"GPU-{c * 8}" for c in "abcd")


def grid(v: float) -> str:
    """A part's percentile as the checker reads it from its histogram cells, in words."""
    return ms(quantize.decode(quantize.encode(v, quantize.COARSE), quantize.COARSE))


def at(s: float) -> Any:
    return NOW - timedelta(seconds=240) + timedelta(seconds=s)


def g(uuid: str = "", **kw: Any) -> dict[str, Any]:
    """GPU columns of one span (only those given; the rest absent)."""
    return {f"gpu_{k}": v for k, v in kw.items()} | ({"gpu_uuid": uuid} if uuid else {})


def saturated() -> Timeline:
    """Prefill on a busy GPU; short prefills at 100 %, long ones at 95 %: weighted by window
    length the GPU is busy 96.25 % of the prefill time (a plain mean would say 97.5)."""
    tl = Timeline("/v1/saturated")
    for i in range(40):
        long = i % 2 == 1
        ttft = 1200.0 if long else 400.0
        tl.reqs.append(
            Req(
                at(5 * i),
                ttft,
                2000.0,
                queue_ms=2.0,
                gpu=g(
                    GPU_A,
                    prefill_sm_util_pct=95.0 if long else 100.0,
                    decode_sm_util_pct=70.0,
                    inflight_mean=16.0 if long else 12.0,
                    sample_coverage=0.95,
                    prefill_wait_us=round(ttft * 900),
                    prefill_launches=40,
                    decode_launches=500,
                ),
            )
        )
    tl.readings = [Reading(at(10 * k - 5), GPU_A, 1980.0, 1980.0, 0) for k in range(26)]
    return tl


def starved() -> Timeline:
    """The GPU idles through both windows; NVML samples cover 40 % of the time; ten more
    requests of the route carry no GPU attributes (absent, not zero: they change nothing)."""
    tl = Timeline("/v1/starved")
    for i in range(30):
        gpu_cols = g(prefill_sm_util_pct=30.0, decode_sm_util_pct=20.0, sample_coverage=0.4)
        tl.reqs.append(Req(at(7 * i), 600.0, 1000.0, gpu=gpu_cols))
    tl.reqs += [Req(at(7 * i + 3), 600.0, 1000.0) for i in range(10)]
    return tl


def throttled() -> Timeline:
    """Clocks at their maximum when each prefill ends, at 55 % under a power cap by the
    time its decode ends."""
    tl = Timeline("/v1/throttled")
    for i in range(25):
        t1 = 9.0 * i
        gpu_cols = g(GPU_B, prefill_sm_util_pct=90.0, decode_sm_util_pct=92.0, inflight_mean=3.0)
        tl.reqs.append(Req(at(t1), 500.0, 6000.0, gpu=gpu_cols))
        tl.readings.append(Reading(at(t1 - 0.5), GPU_B, 1980.0, 1980.0, 0))
        tl.readings.append(Reading(at(t1 + 3), GPU_B, 1089.0, 1980.0, 0x4))
    return tl


def idle_clocks() -> Timeline:
    """An idle GPU clocks down (reason: GPU idle): no slowdown to report, the idle share is
    the finding."""
    tl = Timeline("/v1/idle")
    for i in range(20):
        gpu_cols = g(GPU_C, prefill_sm_util_pct=10.0, decode_sm_util_pct=10.0)
        tl.reqs.append(Req(at(10 * i), 300.0, 300.0, gpu=gpu_cols))
        tl.readings.append(Reading(at(10 * i), GPU_C, 792.0, 1980.0, 0x1))
    return tl


def stale_few() -> Timeline:
    """Four GPU requests, each with a reading 20 s before it: older than READING_MAX_AGE_S."""
    tl = Timeline("/v1/few")
    for i in range(4):
        gpu_cols = g(GPU_D, prefill_sm_util_pct=99.0)
        tl.reqs.append(Req(at(60 * i + 30), 200.0, 100.0, gpu=gpu_cols))
        tl.readings.append(Reading(at(60 * i + 10), GPU_D, 900.0, 1980.0, 0x4))
    return tl


def plain() -> Timeline:
    tl = Timeline("/v1/plain", service="web")
    tl.reqs = [Req(at(8 * i), 40.0, 0.0, queue_ms=0.5) for i in range(30)]
    return tl


@pytest.fixture(scope="module")
def server(scenario_store: tuple[Any, Path, Any]) -> dict[str, dict[str, Any]]:
    client = scenario_store[0]
    store_schema.migrate(client, DB)
    write(client, DB, [saturated(), starved(), throttled(), idle_clocks(), stale_few(), plain()])
    src = SlaSource(lambda: client, DB)
    src.ensure_schema()
    ev = evaluate(src, SlaConfig(), NOW)
    return {r.route: r.server for r in ev.routes}


def _sentences(doc: dict[str, Any]) -> list[str]:
    return [f["sentence"] for f in doc["findings"]]


def test_gpu_bound_prefill_weighted_by_window(server: dict[str, dict[str, Any]]) -> None:
    doc = server["/v1/saturated"]
    assert _sentences(doc) == [
        f"prefill P95 {grid(1200)}, GPU busy 96 % with 14 requests in flight: GPU-bound",
        f"decode P95 {grid(2000)}, GPU busy 70 % with 14 requests in flight",
    ]
    assert [f["id"] for f in doc["findings"]] == ["gpu_bound", "gpu_busy"]
    assert doc["sentence"] == (
        f"/v1/saturated (llm): server time per request: queue P95 {grid(2.0)}, prefill P95 "
        f"{grid(1200)}, decode P95 {grid(2000)} (P50 {grid(2.0)}, {grid(400)}, {grid(2000)}); "
        + "; ".join(_sentences(doc))
        + "."
    )
    gd = doc["gpu"]
    assert gd["requests"] == 40 and gd["gpus"] == [GPU_A] and gd["sample_coverage"] == 0.95
    # requests in flight weighted by duration: (12·2400 + 16·3200) / 5600
    assert gd["inflight_mean"] == pytest.approx(14.29, abs=0.01)
    pre = gd["prefill"]
    assert pre["sm_util_pct"] == pytest.approx(96.25, abs=0.051)  # not 97.5, the plain mean
    assert pre["host_wait_share"] == 0.9 and pre["launches_mean"] == 40.0
    assert pre["sm_clock_pct_of_max"] == 100.0 and pre["clock_readings"] == 40
    assert gd["decode"]["launches_mean"] == 500.0 and gd["decode"]["host_wait_share"] is None
    assert doc["n"] == 40 and doc["prefill_p95_ms"] == pytest.approx(1200, rel=0.006)


def test_gpu_idle_the_wait_is_before_the_gpu(server: dict[str, dict[str, Any]]) -> None:
    doc = server["/v1/starved"]
    assert _sentences(doc) == [
        f"prefill P95 {grid(600)}, GPU idle 70 % of the prefill window: the wait is before "
        "the GPU (scheduler, CPU, queue)",
        f"decode P95 {grid(1000)}, GPU idle 80 % of the decode window: the time between "
        "tokens is spent off the GPU (scheduler, CPU, writing the stream)",
        "GPU figures cover only 40 % of these requests' time (NVML samples missing for the rest)",
    ]
    # the ten requests without GPU attributes count in the split, not in the GPU figures
    assert doc["n"] == 40 and doc["gpu"]["requests"] == 30
    assert doc["gpu"]["prefill"]["sm_util_pct"] == 30.0 and doc["gpu"]["gpus"] == []


def test_clock_under_a_power_cap_during_decode(server: dict[str, dict[str, Any]]) -> None:
    doc = server["/v1/throttled"]
    assert _sentences(doc) == [
        f"prefill P95 {grid(500)}, GPU busy 90 % with 3.0 requests in flight: GPU-bound",
        f"decode P95 {grid(6000)}, GPU busy 92 % with 3.0 requests in flight: GPU-bound",
        "SM clock 55 % of max (power cap) during decode",
    ]
    gd = doc["gpu"]
    assert gd["prefill"]["sm_clock_pct_of_max"] == 100.0
    assert gd["prefill"]["clock_reasons"] == ""  # known, and none
    assert gd["decode"]["sm_clock_pct_of_max"] == 55.0
    assert gd["decode"]["clock_reasons"] == "power cap"
    assert gd["decode"]["clock_readings"] == 25


def test_idle_clocks_are_not_a_slowdown(server: dict[str, dict[str, Any]]) -> None:
    doc = server["/v1/idle"]
    assert [f["id"] for f in doc["findings"]] == ["before_gpu", "before_gpu"]
    assert doc["gpu"]["decode"]["sm_clock_pct_of_max"] == 40.0
    assert not any("SM clock" in s for s in _sentences(doc))


def test_few_requests_and_stale_readings(server: dict[str, dict[str, Any]]) -> None:
    doc = server["/v1/few"]
    assert _sentences(doc) == [
        "GPU figures from only 4 requests, fewer than the 20 needed to judge the GPU"
    ]
    pre = doc["gpu"]["prefill"]
    assert pre["sm_util_pct"] == 99.0
    assert pre["clock_readings"] == 0 and pre["sm_clock_pct_of_max"] is None


def test_no_gpu_attributes_no_gpu_words(server: dict[str, dict[str, Any]]) -> None:
    doc = server["/v1/plain"]
    assert doc["gpu"] is None and doc["findings"] == []
    assert doc["decode_p50_ms"] is None and doc["decode_p95_ms"] is None  # absent, not 0 ms
    assert doc["sentence"] == (
        f"/v1/plain (web): server time per request: queue P95 {grid(0.5)}, prefill P95 "
        f"{grid(40)} (P50 {grid(0.5)}, {grid(40)})."  # written at once: no decode window
    )
    assert "GPU" not in doc["sentence"]


def test_rules_at_their_thresholds() -> None:
    """The pure rules at the edges of each threshold (no store)."""

    def phase(**kw: Any) -> gpu.Phase:
        return gpu.Phase(**kw)

    def route(n: int = 50, coverage: float | None = 1.0, **pre: Any) -> gpu.GpuRoute:
        return gpu.GpuRoute(n, coverage, None, phase(**pre), phase())

    split = gpu.Split(n=50, prefill_p95=840.0)

    def ids(r: gpu.GpuRoute) -> list[str]:
        return [f.id for f in gpu.findings(split, r)]

    assert ids(route(busy_pct=gpu.BUSY_PCT)) == ["gpu_bound"]
    assert ids(route(busy_pct=gpu.BUSY_PCT - 0.01)) == ["gpu_busy"]
    assert ids(route(busy_pct=gpu.IDLE_MAX_BUSY_PCT)) == ["before_gpu"]
    assert ids(route(busy_pct=gpu.IDLE_MAX_BUSY_PCT + 0.01)) == ["gpu_busy"]
    assert ids(route(coverage=gpu.COVERAGE_LOW)) == []
    assert ids(route(coverage=gpu.COVERAGE_LOW - 0.01)) == ["partial_coverage"]
    assert ids(route(n=gpu.MIN_REQUESTS - 1, busy_pct=99.0)) == ["few_requests"]
    assert ids(route(n=0)) == [] and gpu.findings(split, None) == []
    low = gpu.CLOCK_LOW_PCT - 0.01
    clock: dict[str, Any] = {"clock_pct": low, "clock_readings": 3}
    assert ids(route(clock_reasons=0x4, **clock)) == ["clock_low"]
    assert ids(route(clock_reasons=0x4, clock_pct=gpu.CLOCK_LOW_PCT, clock_readings=3)) == []
    assert ids(route(clock_reasons=0x1, **clock)) == []  # idle clock-down
    text = [f.sentence for f in gpu.findings(split, route(clock_reasons=0x45, **clock))]
    assert text == ["SM clock 80 % of max (power cap, hardware thermal slowdown) during prefill"]
    text = [f.sentence for f in gpu.findings(split, route(clock_reasons=None, **clock))]
    assert text == ["SM clock 80 % of max during prefill"]
    text = [f.sentence for f in gpu.findings(split, route(clock_reasons=0, **clock))]
    assert text == ["SM clock 80 % of max (no throttle reason reported) during prefill"]
    text = [f.sentence for f in gpu.findings(split, route(busy_pct=97.0))]
    assert text == ["prefill P95 840 ms, GPU busy 97 %: GPU-bound"]  # in-flight unknown
