"""Pairing coverage, and the rule that tells "not sampled by the agent" from "server record
missing" for a browser entry without a server span.

Under load the agent keeps each request with a probability (docs/agent.md, Sampling), and a
request carrying a ``traceparent`` — every request the browser probe sends — is kept or
dropped by its trace id: kept when the id's randomness R (its rightmost 56 bits) is at least
the threshold T in force (``parallax_contracts.sampling.keeps``). So an entry without a span
was shed on purpose when R < T, and is missing when R >= T (the agent would have kept it: a
server record was lost, or never made).

T in force for an entry: the highest threshold stated by the server spans of the same route
in the entry's minute and the minutes either side (``th`` of their tracestate, the
``sample_th`` column). The highest: the agent's threshold moves within a minute and a route
may be served by several nodes, and an engineer must not be told a record is missing when
it may have been shed; "missing" therefore counts only entries every threshold seen then
would have kept (a lower bound). No span of the route around then: T = 0, missing — with no
server record of the route at all nothing says the agent was sampling.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from collector.store.client import Store
from collector.store.schema import adjusted_count_sql
from parallax_contracts import sampling

NOT_SAMPLED, MISSING, PAIRED = "not_sampled", "missing", "paired"
WINDOW_S = 300  # the entries of the last 5 minutes …
LAG_S = 30  # … ending 30 s ago, so pairs still being made do not count as misses
SAMPLE = 200_000  # beyond this many entries, a hash sample of trace ids
NEAR_S = 60  # the spans' thresholds within a minute either side of an entry's minute

# A trace id's randomness R in SQL: its rightmost 56 bits (14 hex digits), as
# parallax_contracts.sampling.randomness reads it.
RANDOMNESS_SQL = "reinterpretAsUInt64(reverse(unhex(substring(trace_id, 19, 14))))"
A = adjusted_count_sql("sample_th")


def status(trace_id: str, threshold: int) -> str:
    """NOT_SAMPLED or MISSING for an entry without a server span (module doc)."""
    return NOT_SAMPLED if sampling.keeps(trace_id, threshold) is False else MISSING


def threshold_near(store: Store, route: str, at: datetime) -> int:
    """The highest threshold the route's spans stated around ``at`` (0: none there)."""
    m = int(at.astimezone(UTC).replace(second=0, microsecond=0).timestamp())
    rows = store.query(
        f"SELECT max(sample_th) FROM {store.database}.server_spans "  # noqa: S608
        "WHERE route = {route:String} AND time >= fromUnixTimestamp({lo:Int64}) "
        "AND time < fromUnixTimestamp({hi:Int64})",
        {"route": route, "lo": m - NEAR_S, "hi": m + 60 + NEAR_S},
    ).result_rows
    return int(rows[0][0] or 0) if rows else 0


def compute(store: Store) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int]:
    """(spans rows: route, requests, paired requests — spans weighted by their adjusted
    counts; entries rows: route, total, paired, not sampled (entries are not sampled);
    the hash-sample factor m) over the coverage window. Beyond ``SAMPLE`` entries only trace
    ids with cityHash64 % m = 0 are counted (both sides of a trace are in or out together)."""
    db = store.database
    window = (
        "time >= now64() - toIntervalSecond({hi:UInt32}) "
        "AND time < now64() - toIntervalSecond({lo:UInt32})"
    )
    p: dict[str, Any] = {"hi": WINDOW_S + LAG_S, "lo": LAG_S, "near": NEAR_S + 60}
    n = store.query(
        f"SELECT count() FROM {db}.browser_entries WHERE {window}",  # noqa: S608
        p,
    ).result_rows[0][0]
    p["m"] = max(1, int(n) // SAMPLE + 1)
    sample = " AND cityHash64(trace_id) % {m:UInt64} = 0"
    pw = f"{window}{sample}"
    # Pairs are keyed by the browser's start time; the server's may be a little later.
    pairs_where = (
        "time >= now64() - toIntervalSecond({hi:UInt32}) - 600 "
        "AND time < now64() - toIntervalSecond({lo:UInt32}) + 600" + sample
    )
    # Spans of different keep probabilities mix here: each weighs the requests it stands for.
    spans = store.query(
        f"SELECT route, sum({A}), sumIf({A}, span_id IN (SELECT arrayJoin(hop_span_ids) "  # noqa: S608
        f"FROM {db}.pairs WHERE {pairs_where})) FROM {db}.server_spans "
        f"WHERE parent_span_id != '' AND {pw} GROUP BY route LIMIT 1000",
        p,
    ).result_rows
    # The thresholds in force: per route and minute, the highest over that minute and the
    # ones either side (a span is listed under its own minute and both neighbours).
    thresholds = (
        "SELECT route, mm, max(th) AS th FROM (SELECT route, "  # noqa: S608 — ours
        "arrayJoin([m - 60, m, m + 60]) AS mm, th FROM (SELECT route, "
        f"toStartOfMinute(time) AS m, max(sample_th) AS th FROM {db}.server_spans "
        "WHERE time >= now64() - toIntervalSecond({hi:UInt32}) - {near:UInt32} "
        "AND time < now64() - toIntervalSecond({lo:UInt32}) + {near:UInt32} "
        "GROUP BY route, m)) GROUP BY route, mm"
    )
    entries = store.query(
        f"""SELECT e.route, count(), countIf(e.paired), countIf(NOT e.paired AND e.r < s.th)
FROM (
    SELECT route, toStartOfMinute(time) AS m, {RANDOMNESS_SQL} AS r,
           (trace_id, span_id, seq) IN (SELECT trace_id, span_id, seq FROM {db}.pairs
                                        WHERE {pairs_where}) AS paired
    FROM {db}.browser_entries WHERE {pw}
) AS e
LEFT JOIN ({thresholds}) AS s ON e.route = s.route AND e.m = s.mm
GROUP BY e.route LIMIT 1000""",  # noqa: S608 — identifiers ours, values bound
        p,
    ).result_rows
    return spans, entries, int(p["m"])
