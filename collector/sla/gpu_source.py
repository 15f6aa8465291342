"""The GPU side of a route's server time, read from the store for one evaluation window.

Only this module knows the GPU columns of ``server_spans`` and the ``gpu_samples`` table
(collector/store/schema.py). Two queries per evaluation:

1. Per (service, route), over the spans of the window that carry GPU attributes: sums from
   which collector/sla/gpu.py's figures follow — SM utilisation weighted by window length
   (a long prefill counts for more of the users' waiting than a short one), host wait per
   window time, launches per request, sample coverage and requests in flight weighted by
   request duration. ``PREWHERE`` on the GPU columns' null maps: spans without GPU data
   cost a read of those maps only (a store without GPUs pays little; docs/benchmarks.md).
2. The SM clock in each window: per span, per GPU of its ``parallax.gpu.uuid``, per window,
   the latest reading of that GPU at or before the window's end (ASOF JOIN on hw.id and
   time), if it is at most READING_MAX_AGE_S older than the window's start; weighted by
   window length. A reading is one export's gauges of a GPU (clock, max clock, reason bits:
   the OpenTelemetry SDK stamps one collection with one time), grouped by the second.

Each span weighs its adjusted count (1/p of its ``sample_th``: the requests it stands for when
the agent sampled), so a window whose sampling changed is not tilted towards its fully traced
minutes; ``requests`` stays the count of spans (the few-requests rule is about evidence).

Spans are read without FINAL: a client's retry that a merge has not collapsed yet weighs a
request twice in a mean, which moves no figure visibly; FINAL over the window would cost a
merge-on-read of every span of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from collector.sla import gpu
from collector.store import schema
from collector.store.schema import adjusted_count_sql
from parallax_contracts import agent_metrics as gm

# The agent exports its GPU series every 10 s (docs/contracts/agent-metrics.md): a reading up
# to one period before a window (plus jitter) is the GPU's state when the window opened.
READING_MAX_AGE_S = 15

Rows = Callable[[str], list[Sequence[Any]]]
Key = tuple[str, str]

_GPU_PRESENT = " OR ".join(
    f"{c.name} != ''" if c.type.startswith("LowCardinality") else f"{c.name} IS NOT NULL"
    for c in schema.SPAN_GPU_COLUMNS
)


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S.%f")


# A span's weight: the requests it stands for (module doc).
_A = adjusted_count_sql("sample_th")


def _phase_sums(name: str, window: str) -> str:
    """Sums of one window kind, each span weighted by its adjusted count a: Σ a·util·w,
    Σ a·w (util known), requests, Σ a·wait, Σ a·w (wait known), Σ a·launches, Σ a (launches
    known). ``window`` is its length in µs."""
    util, wait, launches = (
        f"gpu_{name}_sm_util_pct",
        f"gpu_{name}_wait_us",
        f"gpu_{name}_launches",
    )
    w = f"{window} * {_A}"
    return (
        f"sumIf({util} * {w}, {util} IS NOT NULL), sumIf({w}, {util} IS NOT NULL), "
        f"countIf({util} IS NOT NULL), sumIf({wait} * {_A}, {wait} IS NOT NULL), "
        f"sumIf({w}, {wait} IS NOT NULL), sumIf({launches} * {_A}, {launches} IS NOT NULL), "
        f"sumIf({_A}, {launches} IS NOT NULL)"
    )


# Window lengths in µs: prefill = ttft; decode = duration − ttft (unknown without ttft).
# Public: the route dashboard (dashboards/route.py) weighs GPU busy by the same windows.
PREFILL_WINDOW_US = "toFloat64(ifNull(ttft_us, 0))"
DECODE_WINDOW_US = "toFloat64(if(ttft_us IS NULL, 0, greatest(duration_us - ttft_us, 0)))"


def _aggregates_sql(db: str, start: datetime, end: datetime) -> str:
    d = f"duration_us * {_A}"
    return f"""SELECT toString(service), toString(route), count(),
    sumIf(gpu_sample_coverage * {d}, gpu_sample_coverage IS NOT NULL),
    sumIf({d}, gpu_sample_coverage IS NOT NULL),
    sumIf(gpu_inflight_mean * {d}, gpu_inflight_mean IS NOT NULL),
    sumIf({d}, gpu_inflight_mean IS NOT NULL),
    {_phase_sums("prefill", PREFILL_WINDOW_US)},
    {_phase_sums("decode", DECODE_WINDOW_US)},
    groupUniqArray(16)(toString(gpu_uuid))
FROM {db}.{schema.SPANS}
PREWHERE time >= '{_ts(start)}' AND time <= '{_ts(end)}' AND ({_GPU_PRESENT})
GROUP BY service, route"""  # noqa: S608 — identifiers ours, times formatted here


def _clock_sql(db: str, start: datetime, end: datetime) -> str:
    """Instants as Int64 ns (no DateTime64 arithmetic: sub-second intervals are newer than
    the oldest server the store supports)."""
    clock, clock_max, reasons = (
        gm.GPU_SM_CLOCK.name,
        gm.GPU_SM_CLOCK_MAX.name,
        gm.GPU_CLOCK_EVENT_REASONS.name,
    )
    age_ns = READING_MAX_AGE_S * 10**9
    return f"""SELECT service, route, phase, count(), sum(w * ratio) / sum(w),
    groupBitOrIf(toUInt64(reasons), ratio < {gpu.CLOCK_LOW_PCT} AND reasons IS NOT NULL),
    countIf(reasons IS NOT NULL)
FROM (
    SELECT toString(service) AS service, toString(route) AS route,
           arrayJoin(splitByChar(',', toString(gpu_uuid))) AS hw, ph.1 AS phase,
           ph.2 AS w_start, ph.3 AS w_end, greatest(toFloat64(ph.3 - ph.2), 1.0) * a AS w
    FROM (
        SELECT service, route, gpu_uuid, {_A} AS a, toUnixTimestamp64Nano(time) AS t1,
               t1 + 1000 * assumeNotNull(ttft_us) AS tok,
               t1 + 1000 * greatest(duration_us, assumeNotNull(ttft_us)) AS t_end
        FROM {db}.{schema.SPANS}
        PREWHERE time >= '{_ts(start)}' AND time <= '{_ts(end)}' AND gpu_uuid != ''
        WHERE ttft_us IS NOT NULL
    )
    ARRAY JOIN [('prefill', t1, tok), ('decode', tok, t_end)] AS ph
) AS s
ASOF JOIN (
    SELECT hw_id, t, 100.0 * clock / clock_max AS ratio, reasons
    FROM (
        SELECT toString(hw_id) AS hw_id, intDiv(toUnixTimestamp64Nano(time), 1000000000)
                   * 1000000000 AS t,
               anyIf(toNullable(value), metric = '{clock}') AS clock,
               anyIf(toNullable(value), metric = '{clock_max}') AS clock_max,
               anyIf(toNullable(value), metric = '{reasons}') AS reasons
        FROM {db}.{schema.GPU_SAMPLES} FINAL
        WHERE metric IN ('{clock}', '{clock_max}', '{reasons}')
          AND time >= toDateTime64('{_ts(start)}', 9, 'UTC') - toIntervalSecond({READING_MAX_AGE_S})
        GROUP BY hw_id, t
    )
    WHERE clock IS NOT NULL AND clock_max > 0
) AS r
ON s.hw = r.hw_id AND s.w_end >= r.t
WHERE r.t >= s.w_start - {age_ns}
GROUP BY service, route, phase"""  # noqa: S608 — identifiers and names ours


def _ratio(num: Any, den: Any) -> float | None:
    return float(num) / float(den) if den else None


def _phase(r: Sequence[Any], clock: Sequence[Any] | None) -> gpu.Phase:
    util_w, w_util, _, wait, w_wait, launches, n_launches = r
    return gpu.Phase(
        busy_pct=_ratio(util_w, w_util),
        wait_share=_ratio(wait, w_wait),
        launches_mean=_ratio(launches, n_launches),
        clock_pct=None if clock is None else float(clock[1]),
        clock_reasons=None if clock is None or not clock[3] else int(clock[2] or 0),
        clock_readings=0 if clock is None else int(clock[0]),
    )


def read(rows: Rows, db: str, start: datetime, end: datetime) -> dict[Key, gpu.GpuRoute]:
    """Per (service, route): the GPU aggregate of the window's spans that carry GPU data."""
    out: dict[Key, gpu.GpuRoute] = {}
    found = rows(_aggregates_sql(db, start, end))
    if not found:
        return out  # no GPU spans: skip the clock join
    clocks: dict[tuple[str, str, str], Sequence[Any]] = {
        (str(r[0]), str(r[1]), str(r[2])): r[3:] for r in rows(_clock_sql(db, start, end))
    }
    for r in found:
        service, route, n = str(r[0]), str(r[1]), int(r[2])
        uuids = sorted({u for s in r[21] for u in str(s).split(",") if u})
        out[(service, route)] = gpu.GpuRoute(
            requests=n,
            coverage=_ratio(r[3], r[4]),
            inflight=_ratio(r[5], r[6]),
            prefill=_phase(r[7:14], clocks.get((service, route, "prefill"))),
            decode=_phase(r[14:21], clocks.get((service, route, "decode"))),
            gpus=tuple(uuids),
        )
    return out
