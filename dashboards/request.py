"""parallax-request: one request, both lines of sight on one timeline — the last click.

A trace id (the route dashboard's slowest-requests table links here with the time range
around the request). The browser's instants are moved onto the server's clock by θ, server
clock minus browser clock: the session's filtered θ when the SLA checker has one
(``sla_sessions``, docs/sla.md "Clock offset θ per session"), else this exchange's own sample
(``pairs.theta_ms``, as ``GET /v1/requests/{trace_id}`` derives it against the edge hop:
((t_arr − t0) + (t2 − t3)) / 2 with the browser's wall clock at t0 and t3 = time origin +
reported drift + relative time). Times below are ms since the browser's t0 on that clock.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from collector.sla import schema as sla_schema
from dashboards import panels as pn
from dashboards.ch import ADJ, DB, sql, var
from parallax_contracts import span_attributes as sa

UID = "parallax-request"
TID = f"lower(trimBoth({var('trace_id')}))"
LOG = "Tuple(timestamp Float64, fields Array(Map(String, String)))"

# Each browser entry of the trace, its instants (ms after its time origin) and θ.
EXCHANGES = f"""SELECT e.span_id AS span_id, e.seq AS seq, e.site AS site, e.session AS session,
    e.kind AS kind, e.method AS method, e.route AS route,
    e.time_origin_ms + ifNull(e.clock_drift_ms, 0) AS origin_ms,
    e.request_start_ms AS t0, e.response_start_ms AS t3, e.first_chunk_ms AS first_chunk,
    e.chunk_ms AS chunks, e.rendered_ms AS rendered, e.response_end_ms AS response_end,
    ifNull(s.theta, p.theta_ms) AS theta_ms,
    multiIf(s.theta IS NOT NULL, 'session', p.theta_ms IS NOT NULL, 'this exchange', 'none')
        AS theta_from,
    origin_ms + t0 + ifNull(theta_ms, 0) AS t0_server_ms, p.hop_span_ids AS hop_span_ids
FROM (SELECT span_id, seq, site, session, kind, method, route, time_origin_ms,
        clock_drift_ms, request_start_ms, response_start_ms, first_chunk_ms, chunk_ms,
        rendered_ms, response_end_ms FROM {DB}.browser_entries WHERE trace_id = {TID}
        LIMIT 1 BY span_id, seq) AS e
LEFT JOIN (SELECT span_id, seq, theta_ms, hop_span_ids FROM {DB}.pairs FINAL
        WHERE trace_id = {TID}) AS p ON e.span_id = p.span_id AND e.seq = p.seq
LEFT JOIN (SELECT session, toNullable(theta_ms) AS theta FROM {DB}.{sla_schema.SESSIONS} FINAL
        WHERE session IN (SELECT session FROM {DB}.browser_entries WHERE trace_id = {TID}))
        AS s ON e.session = s.session"""

# Each server hop of those exchanges (edge first, origin last: the pair's hop order).
HOPS = f"""SELECT x.span_id AS exchange, x.t0_server_ms AS t0_server_ms, h.span_id AS span_id,
    h.parent_span_id AS parent_span_id, h.service AS service, h.host AS host,
    h.method AS method, h.route AS route, h.t1_ns AS t1_ns, h.arr_ns AS arr_ns,
    h.ttfb_us AS ttfb_us, h.ttft_us AS ttft_us, h.duration_us AS duration_us,
    h.chunk_offsets_us AS offsets, h.sample_th AS sample_th, h.namespace AS namespace,
    h.pod AS pod, h.container AS container,
    multiIf(x.n = 1, 'edge+origin', x.idx = 1, 'edge', x.idx = x.n, 'origin', 'middle') AS role
FROM (SELECT span_id, t0_server_ms, hop, idx, length(hop_span_ids) AS n FROM ({EXCHANGES})
        ARRAY JOIN hop_span_ids AS hop, arrayEnumerate(hop_span_ids) AS idx) AS x
INNER JOIN (SELECT span_id, parent_span_id, toString(service) AS service,
        toString(host) AS host, toString(method) AS method, toString(route) AS route,
        toUnixTimestamp64Nano(time) AS t1_ns, toUnixTimestamp64Nano(arrival) AS arr_ns,
        ttfb_us, ttft_us, duration_us, chunk_offsets_us, sample_th,
        attributes['{sa.RESOURCE_K8S_NAMESPACE_NAME}'] AS namespace,
        attributes['{sa.RESOURCE_K8S_POD_NAME}'] AS pod,
        attributes['{sa.RESOURCE_K8S_CONTAINER_NAME}'] AS container
        FROM {DB}.server_spans WHERE trace_id = {TID} LIMIT 1 BY span_id) AS h
    ON h.span_id = x.hop"""


def _since_t0(ns: str) -> str:
    return f"{ns} / 1e6 - t0_server_ms"


def events_sql() -> str:
    browser = f"""SELECT toDateTime64((origin_ms + ev.2 + ifNull(theta_ms, 0)) / 1000, 6, 'UTC')
        AS at, ev.2 - t0 AS ms_since_t0, concat('browser (', site, ')') AS side, ev.1 AS event,
        span_id AS exchange FROM ({EXCHANGES})
        ARRAY JOIN arrayConcat([('request sent (t0)', t0), ('response starts (t3)', t3),
            ('first chunk arrives', first_chunk), ('painted', rendered),
            ('response ends', response_end)],
            arrayMap((c, i) -> (concat('chunk ', toString(i), ' arrives'), toNullable(c)),
            chunks, arrayEnumerate(chunks))) AS ev
        WHERE ev.2 IS NOT NULL AND t0 IS NOT NULL"""
    server = f"""SELECT fromUnixTimestamp64Nano(assumeNotNull(ev.2)) AS at,
        {_since_t0("ev.2")} AS ms_since_t0, concat(service, ' (', role, ')') AS side,
        ev.1 AS event, exchange FROM ({HOPS})
        ARRAY JOIN arrayConcat([('request arrives (t_arr)', arr_ns),
            ('app reads it (t1)', toNullable(t1_ns)),
            ('first byte written (t2)', t1_ns + ttfb_us * 1000),
            ('response ends', toNullable(t1_ns + duration_us * 1000))],
            arrayMap((o, i) -> (concat('write ', toString(i)), toNullable(t1_ns + o * 1000)),
            offsets, arrayEnumerate(offsets))) AS ev
        WHERE ev.2 IS NOT NULL"""
    return sql(
        f"""SELECT at, round(ms_since_t0, 3) AS ms_since_t0, side, event, exchange
        FROM ({browser} UNION ALL {server}) ORDER BY ms_since_t0, side"""
    )


def chunks_sql() -> str:
    """Chunk i as the origin wrote it and as the browser received it."""
    return sql(
        f"""SELECT exchange, i AS chunk,
        round(if(i <= length(offsets), {_since_t0("(t1_ns + offsets[i] * 1000)")}, NULL), 3)
            AS written_ms,
        round(if(i <= length(chunks), chunks[i] - t0, NULL), 3) AS arrived_ms,
        round(arrived_ms - written_ms, 3) AS delivery_ms,
        round(if(i > 1 AND i <= length(offsets), (offsets[i] - offsets[i - 1]) / 1000, NULL), 3)
            AS origin_gap_ms,
        round(if(i > 1 AND i <= length(chunks), chunks[i] - chunks[i - 1], NULL), 3)
            AS browser_gap_ms
        FROM (SELECT h.exchange AS exchange, h.t0_server_ms AS t0_server_ms, h.t1_ns AS t1_ns,
            h.offsets AS offsets, x.chunks AS chunks, x.t0 AS t0
            FROM ({HOPS}) AS h INNER JOIN ({EXCHANGES}) AS x ON x.span_id = h.exchange
            WHERE h.role IN ('origin', 'edge+origin'))
        ARRAY JOIN range(1, greatest(length(offsets), length(chunks)) + 1) AS i
        ORDER BY exchange, chunk"""
    )


def _log(ts_ms: str, name: str) -> str:
    return f"CAST(({ts_ms}, [map('key', 'event', 'value', {name})]), '{LOG}')"


def _tags(*kv: tuple[str, str]) -> str:
    return "[" + ", ".join(f"map('key', '{k}', 'value', {v})" for k, v in kv) + "]"


# Where a hop ran: its host and, from the agent's Resource (in the span's attributes), its
# Kubernetes namespace, pod and container — those it does not have left out.
HOP_PROCESS_TAGS = (
    "arrayFilter(m -> m['value'] != '', "
    + _tags(
        ("host", "host"),
        (sa.RESOURCE_K8S_NAMESPACE_NAME, "namespace"),
        (sa.RESOURCE_K8S_POD_NAME, "pod"),
        (sa.RESOURCE_K8S_CONTAINER_NAME, "container"),
    )
    + ")"
)


TRACE_COLUMNS = (
    ("traceID", "String"),
    ("spanID", "String"),
    ("parentSpanID", "String"),
    ("serviceName", "String"),
    ("operationName", "String"),
    ("startTime", "Float64"),
    ("duration", "Float64"),
    ("logs", f"Array({LOG})"),
    ("tags", "Array(Map(String, String))"),
    ("serviceTags", "Array(Map(String, String))"),
)


def _row(*values: str) -> str:
    """One span row of the trace frame: the plugin's column names and types."""
    return ", ".join(
        f"CAST({v}, '{t}') AS {n}" for v, (n, t) in zip(values, TRACE_COLUMNS, strict=True)
    )


def trace_sql() -> str:
    """Grafana's trace view (the plugin's trace format): the browser exchange and every hop
    as spans on the server's clock, the hop's queue, prefill and decode as its children, the
    chunk writes and arrivals as the spans' events."""
    t3_log = _log("origin_ms + assumeNotNull(t3) + th", "'response starts (t3)'")
    paint_log = _log("origin_ms + assumeNotNull(rendered) + th", "'painted'")
    chunk_log = _log("origin_ms + c + th", "concat('chunk ', toString(i), ' arrives')")
    browser_row = _row(
        TID,
        "span_id",
        "''",
        "concat('browser (', site, ')')",
        "concat(kind, ' ', method, ' ', route)",
        "t0_server_ms",
        "ifNull(response_end, ifNull(t3, t0)) - t0",
        f"arrayConcat(if(t3 IS NULL, [], [{t3_log}]), if(rendered IS NULL, [], [{paint_log}]), "
        f"arrayMap((c, i) -> {chunk_log}, chunks, arrayEnumerate(chunks)))",
        _tags(
            ("clock offset θ ms", "toString(round(th, 3))"),
            ("θ from", "theta_from"),
            ("session", "session"),
        ),
        _tags(("site", "site")),
    )
    browser = (
        f"SELECT {browser_row} FROM (SELECT *, ifNull(theta_ms, 0) AS th FROM ({EXCHANGES})) "
        "WHERE t0 IS NOT NULL"
    )
    t1_log = _log("t1_ns / 1e6", "'app reads it (t1)'")
    t2_log = _log("(t1_ns + assumeNotNull(ttfb_us) * 1000) / 1e6", "'first byte written (t2)'")
    write_log = _log("(t1_ns + o * 1000) / 1e6", "concat('write ', toString(i))")
    start = "ifNull(arr_ns, t1_ns)"
    hop_row = _row(
        TID,
        "span_id",
        "parent_span_id",
        "service",
        "concat(method, ' ', route, ' · ', role)",
        f"{start} / 1e6",
        f"(t1_ns + duration_us * 1000 - {start}) / 1e6",
        f"arrayConcat([{t1_log}], if(ttfb_us IS NULL, [], [{t2_log}]), "
        f"arrayMap((o, i) -> {write_log}, offsets, arrayEnumerate(offsets)))",
        _tags(("role", "role"), ("keep probability", f"toString(round(1 / {ADJ}, 4))")),
        HOP_PROCESS_TAGS,
    )
    hop = f"SELECT {hop_row} FROM ({HOPS})"
    phase_row = _row(
        TID,
        "concat(span_id, ':', ph.1)",
        "span_id",
        "service",
        "ph.1",
        "ph.2 / 1e6",
        "(ph.3 - ph.2) / 1e6",
        "[]",
        _tags(("window", "ph.1")),
        HOP_PROCESS_TAGS,
    )
    phases = f"""SELECT {phase_row} FROM ({HOPS})
        ARRAY JOIN [('kernel queue (t_arr → t1)', arr_ns, toNullable(t1_ns)),
            ('prefill (t1 → first token)', toNullable(t1_ns), t1_ns + ttft_us * 1000),
            ('decode (first → last write)', t1_ns + ttft_us * 1000,
             toNullable(t1_ns + duration_us * 1000))] AS ph
        WHERE ph.2 IS NOT NULL AND ph.3 IS NOT NULL AND ph.3 > ph.2"""
    return sql(f"SELECT * FROM ({browser} UNION ALL {hop} UNION ALL {phases}) ORDER BY startTime")


def build() -> db.Dashboard:
    d = (
        db.Dashboard("Parallax — one request, both lines of sight")
        .uid(UID)
        .tags(["parallax"])
        .timezone("utc")
        .time("now-1h", "now")
        .readonly()
        .with_variable(
            db.TextBoxVariable("trace_id")
            .label("Trace id")
            .description("32 hex digits (the traceparent's trace id)")
            .default_value("")
        )
        .link(pn.nav_link("Route", "parallax-route", "the route's dashboard"))
    )
    return pn.with_sections(
        d, the_exchanges(), both_lines_of_sight(), chunk_delivery(), every_instant()
    )


def the_exchanges() -> pn.Section:
    """Each exchange's numbers as the pairs have them, and the θ the panels below apply."""
    exchanges = sql(
        f"""SELECT p.time AS time, p.kind AS kind, p.method AS method, p.route AS route,
        p.service AS service, p.hops AS hops, round(p.user_ttfb_ms, 1) AS user_ttfb_ms,
        round(p.server_ttfb_ms, 1) AS server_ttfb_ms, round(p.user_ttft_ms, 1) AS user_ttft_ms,
        round(p.server_ttft_ms, 1) AS server_ttft_ms, round(p.user_duration_ms, 1) AS
        user_duration_ms, round(p.server_duration_ms, 1) AS server_duration_ms,
        round(p.network_ms, 1) AS network_ms, round(p.queue_ms, 1) AS queue_ms,
        round(x.theta_ms, 3) AS clock_offset_ms, x.theta_from AS clock_offset_from,
        round(1 / {ADJ}, 4) AS keep_probability
        FROM (SELECT * FROM {DB}.pairs FINAL WHERE trace_id = {TID}) AS p
        LEFT JOIN ({EXCHANGES}) AS x ON x.span_id = p.span_id AND x.seq = p.seq
        ORDER BY time"""
    )
    return None, [
        pn.table(
            1,
            "The exchanges of this trace",
            "Each browser request of the trace paired with its server hops: both sides' "
            "TTFB, TTFT and duration (each on its own clock), network δ, kernel queue, the "
            "clock offset θ used below and where it comes from (the session's filtered θ, "
            "else this exchange's sample), the agent's keep probability.",
            [exchanges],
            (0, 0, 24, 5),
        ),
    ]


def both_lines_of_sight() -> pn.Section:
    return None, [
        pn.traces(
            2,
            "Both lines of sight on the server's clock",
            "The browser's request (t0 → response end, moved by θ) and each server hop "
            "(t_arr → last write) with its kernel queue, prefill and decode; events: the "
            "browser's chunk arrivals and paint, the app's read, first byte and body "
            "writes. A gap between a write and its arrival is network + proxies; a proxy "
            "that buffers shows writes spread out and arrivals bunched. Each hop's process "
            "tags say where it ran: host and, in Kubernetes, namespace, pod and container.",
            trace_sql(),
            (0, 5, 24, 12),
        ),
    ]


def chunk_delivery() -> pn.Section:
    """Each chunk as the origin wrote it and as the browser received it: where a buffering
    proxy or the network coalescing shows."""
    writes = sql(
        f"""SELECT fromUnixTimestamp64Nano(t1_ns + o * 1000) AS time, toFloat64(i) AS
        written_at_origin FROM ({HOPS}) ARRAY JOIN offsets AS o, arrayEnumerate(offsets) AS i
        WHERE role IN ('origin', 'edge+origin') ORDER BY time"""
    )
    arrivals = sql(
        f"""SELECT toDateTime64((origin_ms + c + ifNull(theta_ms, 0)) / 1000, 6, 'UTC') AS time,
        toFloat64(i) AS arrived_in_browser FROM ({EXCHANGES})
        ARRAY JOIN chunks AS c, arrayEnumerate(chunks) AS i ORDER BY time"""
    )
    return None, [
        pn.timeseries(
            3,
            "Chunks written at the origin vs arrived in the browser",
            "Chunk number over time, both on the server's clock (browser times moved by "
            "θ): the horizontal distance between the two lines is each chunk's delivery "
            "time. Steps in the browser line where the origin line is smooth: something "
            "between them buffers. Needs the time range around the request (the link from "
            "the route dashboard sets it).",
            [writes, arrivals],
            (0, 17, 12, 10),
            unit="short",
            points=True,
        ),
        pn.table(
            4,
            "Chunk by chunk",
            "Per chunk: when the origin wrote it and when the browser received it (ms "
            "since the browser's t0, server clock), the difference, and the gap since the "
            "previous chunk on each side. The browser may see fewer, larger chunks than "
            "the app wrote (a proxy or the network coalescing them).",
            [chunks_sql()],
            (12, 17, 12, 10),
        ),
    ]


def every_instant() -> pn.Section:
    return None, [
        pn.table(
            5,
            "Every instant, in order",
            "Browser and server events of the trace on one clock: ms since the browser's "
            "t0 (θ applied), and the instant on the server's clock.",
            [events_sql()],
            (0, 27, 24, 12),
        ),
    ]
