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
from typing import Any, NamedTuple

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


class _PhaseSums(NamedTuple):
    """One window kind's sums over a route's spans, each span weighted by its adjusted
    count a (one ClickHouse tuple: the SQL is made from these names, in this order)."""

    util_w: float  # Σ a·util·w
    w_util: float  # Σ a·w, util known
    n_util: int  # requests with util
    wait: float  # Σ a·wait
    w_wait: float  # Σ a·w, wait known
    launches: float  # Σ a·launches
    n_launches: float  # Σ a, launches known


def _phase_sums(name: str, window: str) -> str:
    """The tuple of one window kind's sums (_PhaseSums); ``window`` is its length in µs."""
    util, wait, launches = (
        f"gpu_{name}_sm_util_pct",
        f"gpu_{name}_wait_us",
        f"gpu_{name}_launches",
    )
    w = f"{window} * {_A}"
    sql = {
        "util_w": f"sumIf({util} * {w}, {util} IS NOT NULL)",
        "w_util": f"sumIf({w}, {util} IS NOT NULL)",
        "n_util": f"countIf({util} IS NOT NULL)",
        "wait": f"sumIf({wait} * {_A}, {wait} IS NOT NULL)",
        "w_wait": f"sumIf({w}, {wait} IS NOT NULL)",
        "launches": f"sumIf({launches} * {_A}, {launches} IS NOT NULL)",
        "n_launches": f"sumIf({_A}, {launches} IS NOT NULL)",
    }
    return f"tuple({', '.join(sql[f] for f in _PhaseSums._fields)})"


# Window lengths in µs: prefill = ttft; decode = duration − ttft (unknown without ttft).
# Public: the route dashboard (dashboards/route.py) weighs GPU busy by the same windows.
PREFILL_WINDOW_US = "toFloat64(ifNull(ttft_us, 0))"
DECODE_WINDOW_US = "toFloat64(if(ttft_us IS NULL, 0, greatest(duration_us - ttft_us, 0)))"


class _RouteSums(NamedTuple):
    """A route's row of the first query (its SELECT is made from these names, in order)."""

    service: str
    route: str
    requests: int
    coverage: float  # Σ coverage·d, d = duration·a
    w_coverage: float  # Σ d, coverage known
    inflight: float  # Σ inflight·d
    w_inflight: float  # Σ d, inflight known
    prefill: tuple[Any, ...]  # _PhaseSums
    decode: tuple[Any, ...]
    gpus: list[str]  # up to 16 distinct gpu_uuid values (each may list several GPUs)


def _select(fields: tuple[str, ...], sql: dict[str, str]) -> str:
    """A SELECT list in a row type's field order, from each field's expression (one name
    per column: the query and the row that reads it cannot disagree on positions)."""
    assert set(sql) == set(fields), set(sql) ^ set(fields)
    return ", ".join(f"{sql[f]} AS {f}" for f in fields)


def _aggregates_sql(db: str, start: datetime, end: datetime) -> str:
    d = f"duration_us * {_A}"
    sql = {
        "service": "toString(service)",
        "route": "toString(route)",
        "requests": "count()",
        "coverage": f"sumIf(gpu_sample_coverage * {d}, gpu_sample_coverage IS NOT NULL)",
        "w_coverage": f"sumIf({d}, gpu_sample_coverage IS NOT NULL)",
        "inflight": f"sumIf(gpu_inflight_mean * {d}, gpu_inflight_mean IS NOT NULL)",
        "w_inflight": f"sumIf({d}, gpu_inflight_mean IS NOT NULL)",
        "prefill": _phase_sums("prefill", PREFILL_WINDOW_US),
        "decode": _phase_sums("decode", DECODE_WINDOW_US),
        "gpus": "groupUniqArray(16)(toString(gpu_uuid))",
    }
    return f"""SELECT {_select(_RouteSums._fields, sql)}
FROM {db}.{schema.SPANS}
PREWHERE time >= '{_ts(start)}' AND time <= '{_ts(end)}' AND ({_GPU_PRESENT})
GROUP BY service, route"""  # noqa: S608 — identifiers ours, times formatted here


class _ClockSums(NamedTuple):
    """A (service, route, phase)'s row of the clock query (its SELECT made from these)."""

    service: str
    route: str
    phase: str
    readings: int  # span windows with a reading
    clock_pct: float  # SM clock as % of its maximum, weighted by window length
    low_reasons: int  # the reason bits of readings under gpu.CLOCK_LOW_PCT
    reasons_known: int  # readings with reason bits


def _clock_sql(db: str, start: datetime, end: datetime) -> str:
    """Instants as Int64 ns (no DateTime64 arithmetic: sub-second intervals are newer than
    the oldest server the store supports)."""
    clock, clock_max, reasons = (
        gm.GPU_SM_CLOCK.name,
        gm.GPU_SM_CLOCK_MAX.name,
        gm.GPU_CLOCK_EVENT_REASONS.name,
    )
    age_ns = READING_MAX_AGE_S * 10**9
    sql = {
        "service": "service",
        "route": "route",
        "phase": "phase",
        "readings": "count()",
        "clock_pct": "sum(w * ratio) / sum(w)",
        "low_reasons": f"groupBitOrIf(toUInt64(reasons), ratio < {gpu.CLOCK_LOW_PCT}"
        " AND reasons IS NOT NULL)",
        "reasons_known": "countIf(reasons IS NOT NULL)",
    }
    return f"""SELECT {_select(_ClockSums._fields, sql)}
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


def _phase(sums: tuple[Any, ...], clock: _ClockSums | None) -> gpu.Phase:
    r = _PhaseSums._make(sums)
    return gpu.Phase(
        busy_pct=_ratio(r.util_w, r.w_util),
        wait_share=_ratio(r.wait, r.w_wait),
        launches_mean=_ratio(r.launches, r.n_launches),
        clock_pct=None if clock is None else float(clock.clock_pct),
        clock_reasons=(
            None if clock is None or not clock.reasons_known else int(clock.low_reasons or 0)
        ),
        clock_readings=0 if clock is None else int(clock.readings),
    )


def read(rows: Rows, db: str, start: datetime, end: datetime) -> dict[Key, gpu.GpuRoute]:
    """Per (service, route): the GPU aggregate of the window's spans that carry GPU data."""
    out: dict[Key, gpu.GpuRoute] = {}
    found = [_RouteSums._make(r) for r in rows(_aggregates_sql(db, start, end))]
    if not found:
        return out  # no GPU spans: skip the clock join
    clocks = {
        (str(c.service), str(c.route), str(c.phase)): c
        for c in map(_ClockSums._make, rows(_clock_sql(db, start, end)))
    }
    for r in found:
        service, route = str(r.service), str(r.route)
        uuids = sorted({u for s in r.gpus for u in str(s).split(",") if u})
        out[(service, route)] = gpu.GpuRoute(
            requests=int(r.requests),
            coverage=_ratio(r.coverage, r.w_coverage),
            inflight=_ratio(r.inflight, r.w_inflight),
            prefill=_phase(r.prefill, clocks.get((service, route, "prefill"))),
            decode=_phase(r.decode, clocks.get((service, route, "decode"))),
            gpus=tuple(uuids),
        )
    return out
