"""The SLA checker's SQL: per-minute summaries of ``pairs`` and the window's quantiles.

Only this module of the SLA checker knows the ``pairs`` column names (collector/store/schema.py,
docs/store.md); the metric pairs themselves are collector/pairing/divergence.py's.

Each pair weighs its adjusted count (1/p of its ``sample_th``: the requests it stands for
when the agent sampled; 1 otherwise): the histograms hold per cell the count, Σw and Σw²,
quantiles are weighted, and Σw² gives the effective sample size of a P95 (collector.sla.stats).

Summaries: a pair is rewritten (higher ``version``) when a late hop arrives, so instead of a
materialized view (which would count the rewritten pair twice) the evaluator re-summarizes
whole minutes from ``pairs FINAL``: the minutes whose mark (rows, newest ``paired_at``)
changed since their last summary. In steady traffic that is the current minute and
sometimes one before: the cost of summarizing follows the pair rate, and the cost of an
evaluation follows the occupied histogram cells of the window's minutes, not its pairs.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from collector.pairing import divergence
from collector.sla import gpu_source, quantize, sampling_source, schema, stats, tokens
from collector.sla.clock import Sample, best_samples, clock_filter
from collector.store.schema import adjusted_count_sql

PAIRS = "pairs"
HORIZON_EXTRA = timedelta(minutes=2)
# A pair's weight: its adjusted count (the requests it stands for under the agent's sampling).
PAIR_WEIGHT = adjusted_count_sql("sample_th")
# quantilesExactWeighted takes integer weights: the adjusted counts in 1/65536 units (a count
# of whole pairs stays exact, so an unsampled window reads exactly the ranks it read before).
WEIGHT_SCALE = 65536
_QW = f"arrayMap(x -> toUInt64(round(x * {WEIGHT_SCALE})), weights)"
_HIST = "cells, counts, weights, weights2"
_HIST_COLS = f"n, {_HIST}, w, w2"
# the metric pairs (collector/pairing/divergence.py), named here for the SLA modules
METRICS, METRIC_ORDER = divergence.METRICS, divergence.METRIC_ORDER
EXCHANGES_ONLY = divergence.EXCHANGES_ONLY
_P95_ARR, _P50_ARR = divergence.P95_ARR, divergence.P50_ARR

HOLD_PREFIX = "wire_hold:"  # wire_hold:<reason>
# the reasons the agent names (bpf/agent/hold.h) that the SLA checker puts in words
HOLD_REASONS = ("nagle", "sndbuf", "rwnd", "cwnd", "cork")
# The time after the first body write, 0 for a response written at once: what a sum of a
# request's parts needs (the dashboards' stacked means); the decode window is this where
# there is one.
AFTER_FIRST_WRITE = (
    "if(server_duration_ms IS NULL OR server_ttft_ms IS NULL, NULL, "
    "greatest(server_duration_ms - server_ttft_ms, 0))"
)
# parts: one value per pair where measured
PARTS: dict[str, str] = {
    "network": "network_ms",
    "queue": "queue_ms",
    "accept_queue": "accept_queue_ms",
    "recv_queue": "recv_queue_ms",
    "server": "server_ttfb_ms",
    "render": "render_delay_ms",
    "retransmits": "if(retransmits IS NULL, NULL, toFloat64(retransmits > 0))",
    # the edge connection's wait to send bytes again (RTO, fast retransmit): NULL when the
    # request had no retransmit or none could be timed
    "retransmit_wait": "retransmit_wait_ms",
    "itl_p50:user": f"if(NOT chunks_coarse AND length(user_itl_ms) > 0, "
    f"{_P50_ARR.format(a='user_itl_ms')}, NULL)",
    "itl_p50:server": f"if(length(server_itl_ms) > 0, {_P50_ARR.format(a='server_itl_ms')}, NULL)",
    "itl_p50:edge": f"if(hops > 1 AND length(edge_itl_ms) > 0, "
    f"{_P50_ARR.format(a='edge_itl_ms')}, NULL)",
    "itl:edge": f"if(hops > 1 AND length(edge_itl_ms) > 0, "
    f"{_P95_ARR.format(a='edge_itl_ms')}, NULL)",
    # the server-time windows (collector/sla/gpu.py): t1 → first body write, then → last
    "prefill": "server_ttft_ms",
    # a response written at once (its last write is its first body write) has no decode
    # window: absent, not 0 ms
    "decode": f"if(server_duration_ms <= server_ttft_ms, NULL, {AFTER_FIRST_WRITE})",
    # write-to-wire holdback at the origin, and per reason the share of requests it explains
    "wire_hold": "wire_hold_ms",
    **{
        f"{HOLD_PREFIX}{why}": f"if(wire_hold_ms IS NULL, NULL, "
        f"toFloat64(wire_hold_ms > 0 AND wire_hold_reason = '{why}'))"
        for why in HOLD_REASONS
    },
    **tokens.PARTS,  # an LLM route's answers in tokens (collector/sla/tokens.py)
}
HOP_PREFIX = "hop:"  # hop:<index>:<service>, for every hop but the origin


# Fixed series, in the order of their index in the packed grouping key (1-based).
SERIES: tuple[str, ...] = (
    *(f"{m}:{side}" for m in METRICS for side in ("user", "server")),
    *PARTS,
)


def _values_array() -> str:
    """One Float64 per fixed series for a pair; NaN where not measured."""
    items: list[str] = []
    for m, (u, s, _) in METRICS.items():
        both = divergence.measured(m)
        items.append(f"if({both}, toFloat64(assumeNotNull({u})), nan)")
        items.append(f"if({both}, toFloat64(assumeNotNull({s})), nan)")
    for e in PARTS.values():
        items.append(f"ifNull(toFloat64({e}), nan)")
    return "[" + ", ".join(items) + "]"


N_FINE = 2 * len(METRICS)  # series 1…N_FINE (the metric sides) use the fine grid


def grid_of(series: str) -> quantize.Grid:
    return quantize.FINE if series in SERIES[:N_FINE] else quantize.COARSE


def _packed_keys() -> str:
    """Per pair, (series index << 32) + (cell + 2^31) for every measured value: one UInt64
    grouping key instead of (series string, cell) — half the time of grouping by both."""
    vals = _values_array()
    cell = (
        f"if(i <= {N_FINE}, {quantize.code_sql('v', quantize.FINE)}, "
        f"{quantize.code_sql('v', quantize.COARSE)})"
    )
    return (
        f"arrayFilter(k -> k != 0, arrayMap((v, i) -> if(isFinite(v), "
        f"bitShiftLeft(toUInt64(i), 32) + toUInt64({cell} + 2147483648), 0), "
        f"{vals}, arrayEnumerate({vals})))"
    )


def _ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _sec(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _minute(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(second=0, microsecond=0)


class SlaSource:
    """SQL access for the checker. ``get_client`` returns a clickhouse-connect client for
    the calling thread (chDB or server); ``db`` is the store's database."""

    def __init__(
        self,
        get_client: Callable[[], Any],
        db: str,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        cluster: str | None = None,
    ) -> None:
        self._get, self.db, self.cluster = get_client, db, cluster  # cluster: DDL ON CLUSTER
        self._wall = wall  # the real time: what the store's TTLs are measured against
        self._marks: dict[datetime, tuple[int, datetime]] | None = None
        self._parts_sig: tuple[str, ...] | None = None
        self._covered: datetime | None = None  # the scan with these parts reached back to
        self._block: tuple[datetime, datetime] | None = None  # valid sla_blocks (start, end)
        self._block_loaded = False

    # -- plumbing ---------------------------------------------------------------------
    def command(self, sql: str) -> None:
        self._get().command(sql)

    def rows(self, sql: str, parameters: dict[str, Any] | None = None) -> list[Sequence[Any]]:
        return list(self._get().query(sql, parameters=parameters).result_rows)

    def ensure_schema(self) -> None:
        schema.ensure(self._get(), self.db, self.cluster)

    # -- change detection -------------------------------------------------------------
    def _load_marks(self) -> dict[datetime, tuple[int, datetime]]:
        """The minutes' marks and the pairs table's parts signature they were taken at."""
        r = self.rows(
            f"SELECT argMax(value, version) FROM {self.db}.{schema.STATE} "  # noqa: S608
            "WHERE key = 'minute_marks'"
        )
        if not r or not r[0][0]:
            return {}
        sig, _, body = str(r[0][0]).partition("|")
        parts = sig.split(",") if sig else []
        if len(parts) == 5:
            self._parts_sig = tuple(parts[:4])
            self._covered = datetime.fromisoformat(parts[4])
        out: dict[datetime, tuple[int, datetime]] = {}
        for line in body.split(";"):
            if line:
                m, n, p = line.split(",")
                out[datetime.fromisoformat(m)] = (int(n), datetime.fromisoformat(p))
        return out

    def _store_marks(
        self, marks: dict[datetime, tuple[int, datetime]], sig: tuple[str, ...], covered: datetime
    ) -> None:
        value = (
            ",".join([*sig, covered.isoformat()])
            + "|"
            + ";".join(
                f"{m.isoformat()},{n},{p.isoformat()}" for m, (n, p) in sorted(marks.items())
            )
        )
        self._get().insert(
            f"{self.db}.{schema.STATE}",
            [["minute_marks", value, _time.time_ns()]],
            column_names=["key", "value", "version"],
        )

    # -- summaries --------------------------------------------------------------------
    def summarize(self, now: datetime, window: timedelta) -> int:
        """Re-summarize the minutes of the horizon whose pairs changed since their summary.

        A minute's mark is (rows, newest paired_at) of its pairs without FINAL: a new pair
        or a rewrite (a new version row) changes it; so does a merge that drops an old
        version (one harmless re-summary). Returns how many minutes were summarized."""
        if self._marks is None:
            self._marks = self._load_marks()
        # Nothing written or merged since the last look (same active parts): nothing to do.
        # A Distributed table has no local parts: then always look.
        sig = tuple(
            str(x)
            for x in self.rows(
                "SELECT count(), sum(rows), max(modification_time), sum(cityHash64(name)) "  # noqa: S608
                f"FROM system.parts WHERE database = '{self.db}' AND table = '{PAIRS}' "
                "AND active"
            )[0]
        )
        horizon = _minute(now - window - HORIZON_EXTRA)
        if (
            sig[0] != "0"
            and sig == self._parts_sig
            and self._covered is not None
            and horizon >= self._covered
        ):
            return 0
        covered = (
            min(horizon, self._covered)
            if sig == self._parts_sig and self._covered is not None
            else horizon
        )
        # no upper bound: pairs from a browser whose clock runs ahead land in future minutes,
        # summarized now and read once the window reaches them
        found = self.rows(
            f"SELECT toStartOfMinute(time) AS m, count(), max(paired_at) "  # noqa: S608
            f"FROM {self.db}.{PAIRS} WHERE time >= '{_ts(horizon)}' GROUP BY m"
        )
        current = {as_utc(m): (int(n), as_utc(p)) for m, n, p in found}
        dirty = sorted(m for m, mark in current.items() if self._marks.get(m) != mark)
        if not dirty:
            if sig != self._parts_sig or covered != self._covered:
                self._store_marks(self._marks, sig, covered)
            self._parts_sig, self._covered = sig, covered
            return 0
        self.summarize_minutes(dirty)
        self.update_sessions(dirty)
        blk = self._current_block()
        if blk is not None and any(blk[0] <= m <= blk[1] for m in dirty):
            self._set_block(None)  # one of its minutes changed: rebuild on the next read
        keep = {m: v for m, v in self._marks.items() if m >= horizon}
        keep.update({m: current[m] for m in dirty})
        self._marks = keep
        self._store_marks(keep, sig, covered)
        self._parts_sig, self._covered = sig, covered  # only once the summaries are written
        return len(dirty)

    def summarize_minutes(self, minutes: Sequence[datetime]) -> None:
        if not minutes:
            return
        db = self.db
        mins = ", ".join(f"toDateTime('{_sec(m)}', 'UTC')" for m in minutes)
        lo, hi = _ts(min(minutes)), _ts(max(minutes) + timedelta(minutes=1))
        v = _time.time_ns()
        # Tombstones first: a series that vanished from a rewritten minute must not survive.
        self.command(
            f"INSERT INTO {db}.{schema.MINUTES} (minute, service, route, series, {_HIST_COLS}, "  # noqa: S608
            f"version) SELECT minute, service, route, series, 0, [], [], [], [], 0, 0, {v} "
            f"FROM {db}.{schema.MINUTES} FINAL WHERE minute IN ({mins}) AND n > 0"
        )
        names = "[" + ", ".join(f"'{x}'" for x in SERIES) + "]"
        self.command(
            f"""INSERT INTO {db}.{schema.MINUTES}
(minute, service, route, series, {_HIST_COLS}, version)
SELECT minute, service, route, {names}[toUInt32(bitShiftRight(k, 32))] AS series, sum(c),
       groupArray(toInt32(toInt64(bitAnd(k, 4294967295)) - 2147483648)), groupArray(c),
       groupArray(sw), groupArray(sw2), sum(sw), sum(sw2), {v + 1}
FROM (
    SELECT toStartOfMinute(time) AS minute, service, route, k, count() AS c,
           sum({PAIR_WEIGHT}) AS sw, sum({PAIR_WEIGHT} * {PAIR_WEIGHT}) AS sw2
    FROM {db}.{PAIRS} FINAL
    ARRAY JOIN {_packed_keys()} AS k
    WHERE time >= '{lo}' AND time < '{hi}' AND toStartOfMinute(time) IN ({mins})
      AND {EXCHANGES_ONLY}
    GROUP BY minute, service, route, k
)
GROUP BY minute, service, route, series"""  # noqa: S608
        )
        # what each hop before the origin adds (proxied pairs only; the service is a label)
        cell = quantize.code_sql("h.2", quantize.COARSE)
        self.command(
            f"""INSERT INTO {db}.{schema.MINUTES}
(minute, service, route, series, {_HIST_COLS}, version)
SELECT minute, service, route, series, sum(c), groupArray(cell), groupArray(c),
       groupArray(sw), groupArray(sw2), sum(sw), sum(sw2), {v + 1}
FROM (
    SELECT toStartOfMinute(time) AS minute, service, route, h.1 AS series, {cell} AS cell,
           count() AS c, sum({PAIR_WEIGHT}) AS sw, sum({PAIR_WEIGHT} * {PAIR_WEIGHT}) AS sw2
    FROM {db}.{PAIRS} FINAL
    ARRAY JOIN arrayMap(i -> (concat('{HOP_PREFIX}', toString(i), ':',
        toString(hop_services[i])), hop_added_ms[i]),
        arrayEnumerate(arrayPopBack(hop_added_ms))) AS h
    WHERE time >= '{lo}' AND time < '{hi}' AND toStartOfMinute(time) IN ({mins})
      AND hops > 1 AND isFinite(h.2) AND {EXCHANGES_ONLY}
    GROUP BY minute, service, route, series, cell
)
GROUP BY minute, service, route, series"""  # noqa: S608
        )

    def update_sessions(self, minutes: Sequence[datetime]) -> None:
        """Fold the clock samples of these minutes into each session's 8 lowest-δ samples."""
        if not minutes:
            return
        db = self.db
        mins = ", ".join(f"toDateTime('{_sec(m)}', 'UTC')" for m in minutes)
        lo, hi = _ts(min(minutes)), _ts(max(minutes) + timedelta(minutes=1))
        new = self.rows(
            f"""SELECT session, any(site), groupUniqArray(64)((toString(service), toString(route))),
    arraySlice(arraySort(x -> x.1, groupArray((assumeNotNull(theta_delay_ms),
        assumeNotNull(theta_ms), concat(trace_id, ':', span_id, ':', toString(seq)),
        toUnixTimestamp64Milli(time)))), 1, 8),
    max(time)
FROM {db}.{PAIRS} FINAL
WHERE time >= '{lo}' AND time < '{hi}' AND toStartOfMinute(time) IN ({mins})
  AND theta_ms IS NOT NULL AND theta_delay_ms IS NOT NULL AND session != ''
GROUP BY session"""  # noqa: S608
        )
        if not new:
            return
        old: dict[str, tuple[list[Any], list[Sample], datetime]] = {}
        names = [r[0] for r in new]
        for i in range(0, len(names), 1000):
            chunk = names[i : i + 1000]
            quoted = ", ".join(
                "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'" for s in chunk
            )
            for s, routes, best, best_ms, last_seen in self.rows(
                f"SELECT session, routes, best, best_ms, last_seen FROM {db}.{schema.SESSIONS} "  # noqa: S608
                f"FINAL WHERE session IN ({quoted})"
            ):
                seen = as_utc(last_seen)
                # rows written before best_ms existed: date their samples last_seen
                times = list(best_ms) or [int(seen.timestamp() * 1000)] * len(best)
                samples = [(d, t, k, ms) for (d, t, k), ms in zip(best, times, strict=False)]
                old[s] = (list(routes), samples, seen)
        out_cols: list[list[Any]] = [[] for _ in range(10)]
        v = _time.time_ns()
        for session, site, routes, best, last in new:
            prev_routes, prev_best, prev_last = old.get(session, ([], [], as_utc(last)))
            kept, weighed = best_samples([*prev_best, *(tuple(x) for x in best)])
            off = clock_filter(weighed)
            if off is None:
                continue
            rts = sorted({tuple(x) for x in [*prev_routes, *routes]})[:64]
            row = [
                session,
                site,
                rts,
                [(d, t, k) for d, t, k, _ in kept],
                [ms for *_, ms in kept],
                off.theta_ms,
                off.delay_ms,
                off.used,
                max(as_utc(last), prev_last),
                v,
            ]
            for col, val in zip(out_cols, row, strict=True):
                col.append(val)
        if out_cols[0]:
            self._get().insert(
                f"{db}.{schema.SESSIONS}",
                out_cols,
                column_names=[
                    "session",
                    "site",
                    "routes",
                    "best",
                    "best_ms",
                    "theta_ms",
                    "delay_ms",
                    "used",
                    "last_seen",
                    "version",
                ],
                column_oriented=True,
            )

    # -- the merged block of complete minutes -----------------------------------------
    def _current_block(self) -> tuple[datetime, datetime] | None:
        if not self._block_loaded:
            r = self.rows(
                f"SELECT argMax(value, version) FROM {self.db}.{schema.STATE} "  # noqa: S608
                "WHERE key = 'window_block'"
            )
            v = str(r[0][0]) if r and r[0][0] else ""
            if "|" in v:
                a, b = v.split("|")
                self._block = (datetime.fromisoformat(a), datetime.fromisoformat(b))
            self._block_loaded = True
        return self._block

    def _set_block(self, blk: tuple[datetime, datetime] | None) -> None:
        value = f"{blk[0].isoformat()}|{blk[1].isoformat()}" if blk else ""
        self._get().insert(
            f"{self.db}.{schema.STATE}",
            [["window_block", value, _time.time_ns()]],
            column_names=["key", "value", "version"],
        )
        self._block, self._block_loaded = blk, True

    def _build_block(self, start: datetime, end: datetime) -> None:
        """Merge the minutes start…end into one histogram per series (once a minute)."""
        db = self.db
        self.command(
            f"""INSERT INTO {db}.{schema.BLOCKS}
(start_minute, end_minute, service, route, series, {_HIST_COLS}, version)
SELECT toDateTime('{_sec(start)}', 'UTC'), toDateTime('{_sec(end)}', 'UTC'), service, route,
       series, sum(c), groupArray(cell), groupArray(c), groupArray(sw), groupArray(sw2),
       sum(sw), sum(sw2), {_time.time_ns()}
FROM (
    SELECT service, route, series, cell, sum(cnt) AS c, sum(wt) AS sw, sum(wt2) AS sw2
    FROM {db}.{schema.MINUTES} FINAL
    ARRAY JOIN cells AS cell, counts AS cnt, weights AS wt, weights2 AS wt2
    WHERE minute >= '{_sec(start)}' AND minute <= '{_sec(end)}' AND n > 0
    GROUP BY service, route, series, cell
)
GROUP BY service, route, series"""  # noqa: S608
        )
        self._set_block((start, end))

    def _window_rows_sql(self, start: datetime, last: datetime) -> str:
        """The histograms making up the window: the merged block of its complete minutes
        (built when missing) plus the current minute; per minute when there is no block."""
        db = self.db
        end = last - timedelta(minutes=1)
        # A window that ended more than a day ago (a past evaluation) would get a block
        # already past the table's TTL, dropped as it is written: read its minutes instead.
        stale = self._wall() - end > timedelta(days=schema.BLOCK_TTL_DAYS, hours=-1)
        if end < start or stale:
            return (
                f"SELECT service, route, series, {_HIST_COLS} FROM {db}.{schema.MINUTES} "  # noqa: S608
                f"FINAL WHERE minute >= '{_sec(start)}' AND minute <= '{_sec(last)}' AND n > 0"
            )
        if self._current_block() != (start, end):
            self._build_block(start, end)
        return (
            f"SELECT service, route, series, {_HIST_COLS} FROM {db}.{schema.BLOCKS} FINAL "  # noqa: S608
            f"WHERE start_minute = '{_sec(start)}' AND end_minute = '{_sec(end)}' AND n > 0 "
            f"UNION ALL SELECT service, route, series, {_HIST_COLS} "
            f"FROM {db}.{schema.MINUTES} FINAL WHERE minute = '{_sec(last)}' AND n > 0"
        )

    # -- the window -------------------------------------------------------------------
    def window_minutes(self, now: datetime, window: timedelta) -> tuple[datetime, datetime]:
        """The minutes whose summaries make up the window: from the minute holding
        now − window to the current minute (the window covers window…window + 1 min)."""
        return _minute(now - window), _minute(now)

    def read_window(self, now: datetime, window: timedelta) -> stats.Window:
        start, last = self.window_minutes(now, window)
        w = stats.Window(start=start, end=now)
        db = self.db
        metric_series = ", ".join(f"'{m}:{side}'" for m in METRICS for side in ("user", "server"))
        rows_sql = self._window_rows_sql(start, last)
        # identifiers are ours, times formatted by us: nothing user-given in the SQL
        # a series is a few rows (the merged block, the current minute): their arrays are
        # aggregated as they are (-Array combinators), no ARRAY JOIN
        base = (
            f"SELECT toString(service), toString(route), toString(series), sum(n), "  # noqa: S608
            "sum(arraySum((c, x) -> if(c != 0, x, 0), cells, weights)), sum(w), "
            f"quantilesExactWeightedArray({{levels}})(cells, {_QW}) "
            f"FROM ({rows_sql}) WHERE series {{op}} ({metric_series}) "
            "GROUP BY service, route, series"
        )
        # Ask only the grid levels some series needs (its bounds depend on its effective
        # sample size): a few dozen numbers per series instead of the whole grid.
        needed = {0.5, 0.95, 0.99}
        n_eff = self._effective_sizes(rows_sql, metric_series)
        for n in n_eff.values():
            lo, hi = stats.rank_bounds(n)
            if lo is not None:
                needed.add(stats.level_for_rank_at_most(lo, n))
            if hi is not None:
                needed.add(stats.level_for_rank_at_least(hi, n))
        grid = tuple(sorted(needed))
        levels = ", ".join(repr(q) for q in grid)
        queries = [
            (grid, base.format(levels=levels, op="IN")),
            ((0.5, 0.95, 0.99), base.format(levels="0.5, 0.95, 0.99", op="NOT IN")),
        ]
        for lv, sql in queries:
            for service, route, series, n, nz, wsum, qs in self.rows(sql):
                w.series.setdefault((service, route), {})[series] = stats.SeriesStats(
                    int(n),
                    float(nz),
                    lv,
                    qs,
                    grid_of(series),
                    float(wsum),
                    n_eff.get((service, route, series), int(n)),
                )
        for service, route, total, far in self.rows(
            f"""SELECT r.1, r.2, count(), countIf(abs(theta_ms) > 100)
FROM {db}.{schema.SESSIONS} FINAL ARRAY JOIN routes AS r
WHERE last_seen >= '{_sec(start)}' GROUP BY r.1, r.2"""  # noqa: S608
        ):
            w.sessions[(service, route)] = int(total)
            w.far_off_sessions[(service, route)] = int(far)
        w.gpu = gpu_source.read(self.rows, db, start, now)
        w.counts = sampling_source.read(self.rows, db, now - window, now)
        return w

    def _effective_sizes(
        self, rows_sql: str, metric_series: str
    ) -> dict[tuple[str, str, str], int]:
        """The effective sample size of each metric side's P95 (collector.sla.stats). From
        the series' totals when its pairs weigh the same (n_eff = n: no second pass); else
        from Σw² of the cells at or below its weighted P95 cell."""
        out: dict[tuple[str, str, str], int] = {}
        unequal = False
        for service, route, series, n, wsum, w2 in self.rows(
            f"SELECT toString(service), toString(route), toString(series), sum(n), sum(w), "  # noqa: S608
            f"sum(w2) FROM ({rows_sql}) WHERE series IN ({metric_series}) "
            "GROUP BY service, route, series"
        ):
            out[(service, route, series)] = int(n)
            unequal = unequal or not stats.equal_weights(int(n), float(wsum), float(w2))
        if not unequal:
            return out
        # Per series the window is a few rows (the merged block, the current minute): their
        # arrays are read as they are (-Array combinators), no ARRAY JOIN.
        for service, route, series, n, wsum, w2, at_or_below in self.rows(
            f"""SELECT service, route, series, n, wsum, w2sum,
       arraySum((cs, ws) -> arraySum((c, x) -> if(c <= q, x, 0), cs, ws), gc, gw)
FROM (
    SELECT toString(service) AS service, toString(route) AS route,
           toString(series) AS series, sum(n) AS n, sum(w) AS wsum, sum(w2) AS w2sum,
           quantileExactWeightedArray({stats.P})(cells,
               arrayMap(x -> toUInt64(round(x * {WEIGHT_SCALE})), weights)) AS q,
           groupArray(cells) AS gc, groupArray(weights2) AS gw
    FROM ({rows_sql})
    WHERE series IN ({metric_series})
    GROUP BY service, route, series
    HAVING n * w2sum > wsum * wsum * (1 + 1e-9)
)"""  # noqa: S608 — identifiers ours
        ):
            out[(service, route, series)] = stats.n_effective(
                int(n), float(wsum), float(w2), float(at_or_below)
            )
        return out


def as_utc(t: Any) -> datetime:
    if isinstance(t, datetime):
        return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return datetime.fromisoformat(str(t)).replace(tzinfo=UTC)
