"""parallax-route: one route, why it diverges — the click after an alert.

An alert's link (collector/sla/notify.py) opens this dashboard with the route, the metric and
the band selected and the time range around the alert. Top to bottom: is it the users or the
app (user vs server P95 with the band), where the slow requests spend their time (the parts
stacked), the streams (TTFT and inter-token gap heatmaps), the traffic and the agent's
sampling, the GPU where the route's spans carry GPU data, and the slowest requests — each a
link to the request dashboard (parallax-request).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from collector.sla import gpu, gpu_source
from collector.sla import schema as sla_schema
from collector.sla.notify import LINK_VARS, ROUTE_DASHBOARD_UID
from dashboards import panels as pn
from dashboards.ch import (
    ADJ,
    AFTER_FIRST_WRITE,
    DB,
    DS,
    EXCHANGES_ONLY,
    METRICS,
    PARTS,
    SEEN,
    TRACED,
    counter_increments,
    metric_case,
    metric_measured,
    p95,
    sql,
    var,
)
from dashboards.request import UID as REQUEST_UID
from parallax_contracts import agent_metrics as gm

UID = ROUTE_DASHBOARD_UID
PAIRS = f"{DB}.pairs FINAL"
ROUTE = f"service = {var('service')} AND route = {var('route')}"
# An alert's latest row; a severity change writes two at one instant (the old alert's resolve
# and the new one's firing): the live one wins (collector/sla/alerts.py load_states).
LATEST = "(time, state != 'resolved')"
WHERE = f"$__timeFilter(time) AND {ROUTE} AND {EXCHANGES_ONLY}"
MEASURED = metric_measured()
USER, SERVER = metric_case(0), metric_case(1)
BAND = f"toFloat64OrZero({var('band')})"
WEIGHTED = "Each pair weighs its adjusted count (1/p under the agent's sampling)."
# Heatmap buckets (upper bounds, ms): about two per doubling.
TTFT_BOUNDS = (10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700, 1000, 1500, 2000, 3000, 5000)
ITL_BOUNDS = (1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500)
# Parts of a request, in the order they happen (stacked bottom to top).
TAIL_PARTS = (
    ("network_ms", "network_ms"),
    ("proxies_ms", "if(hops > 1, arraySum(arrayPopBack(hop_added_ms)), 0)"),
    ("queue_ms", PARTS["queue"]),
    ("prefill_ms", PARTS["prefill"]),
    ("decode_ms", AFTER_FIRST_WRITE),  # 0 for a response written at once: the means add up
    ("render_delay_ms", PARTS["render"]),
)
P95_PARTS = ("network", "queue", "accept_queue", "recv_queue", "server", "prefill", "decode")
CLOCK, CLOCK_MAX = gm.GPU_SM_CLOCK.name, gm.GPU_SM_CLOCK_MAX.name
POWER, POWER_LIMIT = gm.GPU_POWER.name, gm.GPU_POWER_LIMIT.name
REASONS = gm.GPU_CLOCK_EVENT_REASONS.name


def variables() -> list[db.QueryVariable | db.CustomVariable | db.TextBoxVariable]:
    assert LINK_VARS == ("service", "route", "metric", "band")  # the alert link sets these
    return [
        db.QueryVariable("service")
        .label("Service")
        .datasource(DS)
        .query(
            sql(
                f"""SELECT DISTINCT service FROM {DB}.pairs WHERE $__timeFilter(time)
                ORDER BY service"""
            )
        )
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED),
        db.QueryVariable("route")
        .label("Route")
        .datasource(DS)
        .query(
            sql(
                f"""SELECT DISTINCT route FROM {DB}.pairs WHERE $__timeFilter(time)
                AND service = {var("service")} ORDER BY route"""
            )
        )
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED),
        db.CustomVariable("metric")
        .label("Metric")
        .values(",".join(METRICS))
        .current(dm.VariableOption(text="ttft", value="ttft")),
        db.TextBoxVariable("band")
        .label("Band ± ms")
        .default_value("15")
        .current(dm.VariableOption(text="15", value="15")),
    ]


def _bucket_columns(value: str, bounds: tuple[int, ...]) -> str:
    cols, lo = [], None
    for b in bounds:
        cond = f"{value} <= {b}" if lo is None else f"{value} > {lo} AND {value} <= {b}"
        cols.append(f'sumIf({ADJ}, {cond}) AS "{b}"')
        lo = b
    cols.append(f'sumIf({ADJ}, {value} > {lo}) AS "+Inf"')
    return ", ".join(cols)


def heatmap_sql(source: str, bounds: tuple[int, ...]) -> str:
    """Requests (Σ adjusted counts) per time bucket and value bucket; ``source`` yields
    (time, v, sample_th) rows."""
    return sql(
        f"""SELECT $__timeInterval(time) AS t, {_bucket_columns("v", bounds)}
        FROM ({source}) GROUP BY t ORDER BY t"""
    )


def _reason_words(bits: str) -> str:
    """The NVML clock-event reason bits in words (collector/sla/gpu.py's table)."""
    arms = ", ".join(
        f"if(bitAnd({bits}, {bit}) != 0, '{word}', '')" for bit, word in gpu.REASONS.items()
    )
    return f"arrayStringConcat(arrayFilter(x -> x != '', [{arms}]), ', ')"


def _readings() -> str:
    """One row per GPU reading (one export's gauges share a time): its clock, max clock,
    power, power limit and reason bits, for the GPUs the route's spans ran on."""
    series = (CLOCK, CLOCK_MAX, POWER, POWER_LIMIT, REASONS)
    names = ("clock", "clock_max", "power", "power_limit", "reasons")
    pivot = ", ".join(
        f"anyIf(toNullable(value), metric = '{m}') AS {n}"
        for m, n in zip(series, names, strict=True)
    )
    metrics = ", ".join(f"'{m}'" for m in series)
    return f"""SELECT toString(hw_id) AS gpu, any(toString(hw_name)) AS gpu_name,
        min(time) AS at, {pivot} FROM {DB}.gpu_samples FINAL
        WHERE $__timeFilter(time) AND metric IN ({metrics}) AND hw_id IN (SELECT DISTINCT
        arrayJoin(splitByChar(',', toString(gpu_uuid))) FROM {DB}.server_spans
        WHERE $__timeFilter(time) AND {ROUTE} AND gpu_uuid != '')
        GROUP BY hw_id, intDiv(toUnixTimestamp64Nano(time), 1000000000)"""


def _gpu_busy_sql() -> str:
    def busy(phase: str, window: str) -> str:
        u = f"gpu_{phase}_sm_util_pct"
        w = f"{window} * {ADJ}"
        return (
            f"sumIf({u} * {w}, {u} IS NOT NULL) / sumIf({w}, {u} IS NOT NULL) AS {phase}_busy_pct"
        )

    d = f"duration_us * {ADJ}"
    return sql(
        f"""SELECT $__timeInterval(time) AS t, {busy("prefill", gpu_source.PREFILL_WINDOW_US)},
        {busy("decode", gpu_source.DECODE_WINDOW_US)},
        sumIf(gpu_inflight_mean * {d}, gpu_inflight_mean IS NOT NULL)
        / sumIf({d}, gpu_inflight_mean IS NOT NULL) AS inflight_mean
        FROM {DB}.server_spans WHERE $__timeFilter(time) AND {ROUTE}
        AND (gpu_prefill_sm_util_pct IS NOT NULL OR gpu_decode_sm_util_pct IS NOT NULL)
        GROUP BY t ORDER BY t"""
    )


def build() -> db.Dashboard:
    d = (
        db.Dashboard("Parallax — one route: why")
        .uid(UID)
        .tags(["parallax"])
        .timezone("utc")
        .time("now-1h", "now")
        .refresh("1m")
        .readonly()
        .variables(variables())  # type: ignore[arg-type]
        .link(pn.nav_link("All routes", "parallax-sla", "user vs server latency, every route"))
    )
    return pn.with_sections(
        d,
        users_or_app(),
        where_the_time_goes(),
        streams(),
        traffic_and_sampling(),
        gpu_use(),
        requests_to_look_at(),
    )


def users_or_app() -> pn.Section:
    """The line the SLA checker alerts on (user P95 out of the band around the server's),
    the same over the whole range, and the checker's own state."""
    divergence = sql(
        f"""SELECT $__timeInterval(time) AS t, {p95(USER)} AS user_p95_ms,
        {p95(SERVER)} AS server_p95_ms, server_p95_ms - {BAND} AS band_low_ms,
        server_p95_ms + {BAND} AS band_high_ms FROM {PAIRS} WHERE {WHERE} AND {MEASURED}
        GROUP BY t ORDER BY t"""
    )
    band_area: list[pn.Override] = [
        (
            "band_high_ms",
            [
                ("custom.fillBelowTo", "band_low_ms"),
                ("custom.fillOpacity", 20),
                ("custom.lineWidth", 0),
                ("displayName", "server P95 + band"),
            ],
        ),
        ("band_low_ms", [("custom.lineWidth", 0), ("displayName", "server P95 − band")]),
        ("user_p95_ms", [("custom.lineWidth", 2)]),
    ]
    summary = sql(
        f"""SELECT count() AS pairs, round(sum({ADJ})) AS requests,
        round({p95(USER)}, 1) AS user_p95_ms, round({p95(SERVER)}, 1) AS server_p95_ms,
        round(user_p95_ms - server_p95_ms, 1) AS divergence_ms, {BAND} AS band_ms
        FROM {PAIRS} WHERE {WHERE} AND {MEASURED}"""
    )
    checker = sql(
        f"""SELECT metric, argMax(state, latest) AS state, argMax(severity, latest) AS
        severity, max(time) AS since, argMax(round(divergence_ms, 1), latest) AS
        divergence_ms, argMax(sentence, latest) AS sentence FROM (SELECT *, {LATEST} AS
        latest FROM {DB}.{sla_schema.ALERTS} WHERE {ROUTE}) GROUP BY metric ORDER BY metric"""
    )
    return pn.row(1, "Is it the users or the app? ($metric)", 0), [
        pn.timeseries(
            2,
            "$metric: user P95 vs server P95, ±$band ms band around the server",
            "What users waited for (browser clock) and what the origin app took (server "
            "clock) for this metric, over the pairs where both are measured (the SLA "
            "checker's rule). The user line leaving the shaded band around the server line "
            f"is what the SLA checker alerts on. {WEIGHTED}",
            [divergence],
            (0, 1, 16, 9),
            overrides=band_area,
            interval="1m",
        ),
        pn.table(
            3,
            "$metric over the time range",
            "Pairs, the requests they stand for, the two P95s and their difference over "
            "the whole range (the SLA checker judges 5-minute windows with intervals: its "
            "state is below).",
            [summary],
            (16, 1, 8, 4),
        ),
        pn.table(
            4,
            "The SLA checker on this route",
            "Latest alert state per metric, with the checker's sentence (it names the "
            "traps it found: buffering proxy, render lag, event-loop lag, clock far off).",
            [checker],
            (16, 5, 8, 5),
        ),
    ]


def where_the_time_goes() -> pn.Section:
    """The slowest requests part by part (means that add up), beside each part's P95."""
    parts = ", ".join(f"{e} AS {n}" for n, e in TAIL_PARTS)
    tail = sql(
        f"""SELECT t, {", ".join(f"avgWeighted({n}, a) AS {n}" for n, _ in TAIL_PARTS)}
        FROM (SELECT $__timeInterval(time) AS t, {USER} AS u, {ADJ} AS a, {parts}
        FROM {PAIRS} WHERE {WHERE} AND {MEASURED}) AS p
        INNER JOIN (SELECT $__timeInterval(time) AS t, {p95(USER)} AS u95 FROM {PAIRS}
        WHERE {WHERE} AND {MEASURED} GROUP BY t) AS q USING t
        WHERE u >= u95 GROUP BY t ORDER BY t"""
    )
    part_p95 = sql(
        f"""SELECT $__timeInterval(time) AS t,
        {", ".join(f"{p95(PARTS[n])} AS {n}_ms" for n in P95_PARTS)}
        FROM {PAIRS} WHERE {WHERE} GROUP BY t ORDER BY t"""
    )
    return pn.row(5, "Where the time goes", 10), [
        pn.timeseries(
            6,
            "The slowest 5 % by user $metric: what they are made of",
            "Over the requests at or above each interval's P95 of the user-side $metric: "
            "the mean of each part, stacked in the order it happens — network δ (edge hop, "
            "both directions), proxies (time added by hops before the origin), kernel "
            "queue (t_arr → t1), prefill (t1 → first body write), decode (first → last "
            "write), render delay (first chunk → paint). Means over the same requests add "
            "up; P95s of parts do not (the next panel). A part not measured for a request "
            f"(no agent timings, no paint) leaves it out of that part's mean. {WEIGHTED}",
            [tail],
            (0, 11, 12, 9),
            stacked=True,
            interval="1m",
        ),
        pn.timeseries(
            7,
            "P95 of each part",
            "The SLA checker's parts (the ranking in its sentence): network δ, kernel "
            "queue (accept + receive), server processing (server TTFB), prefill, decode "
            "(over the requests written after their first body write: one written at once "
            f"has no decode window). {WEIGHTED}",
            [part_p95],
            (12, 11, 12, 9),
            interval="1m",
        ),
    ]


def streams() -> pn.Section:
    """TTFT and the inter-token gaps on both sides: a buffering proxy shows as the browser's
    gaps bunching where the origin's are regular."""
    ttft = heatmap_sql(
        f"""SELECT time, user_ttft_ms AS v, sample_th FROM {PAIRS}
        WHERE {WHERE} AND user_ttft_ms IS NOT NULL""",
        TTFT_BOUNDS,
    )
    browser_itl = heatmap_sql(
        f"""SELECT time, v, sample_th FROM {PAIRS} ARRAY JOIN user_itl_ms AS v
        WHERE {WHERE} AND NOT chunks_coarse""",
        ITL_BOUNDS,
    )
    origin_itl = heatmap_sql(
        f"SELECT time, v, sample_th FROM {PAIRS} ARRAY JOIN server_itl_ms AS v WHERE {WHERE}",
        ITL_BOUNDS,
    )
    return pn.row(8, "Streams: first token and the gaps between tokens", 20), [
        pn.heatmap(
            9,
            "User TTFT",
            "Requests per TTFT bucket (browser: first chunk − t0), each weighing its "
            "adjusted count. Two bands mean two populations (cache hits, cold starts).",
            ttft,
            (0, 21, 8, 9),
            interval="1m",
        ),
        pn.heatmap(
            10,
            "Inter-token gaps in the browser",
            "Gaps between consecutive chunk arrivals in the browser (throttled XHR "
            "progress left out). Against the origin's gaps beside it: a buffering proxy "
            "turns regular origin gaps into ~0 ms bursts and long pauses here.",
            browser_itl,
            (8, 21, 8, 9),
            interval="1m",
        ),
        pn.heatmap(
            11,
            "Inter-token gaps at the origin",
            "Gaps between the origin app's body writes (the kernel agent's chunk offsets): "
            "the model's own pace.",
            origin_itl,
            (16, 21, 8, 9),
            interval="1m",
        ),
    ]


def traffic_and_sampling() -> pn.Section:
    """The agent's exact counts for the service (it counts per port, not per route) against
    the route's pairs, and the share it traced: how many pairs the P95s above stand on."""
    counts = f"({counter_increments()}) WHERE service = {var('service')}"
    rate = sql(
        f"""SELECT $__timeInterval(time) AS t, sumIf(d, metric = '{SEEN}') / $__interval_s AS
        seen_per_s, sumIf(d, metric = '{TRACED}') / $__interval_s AS traced_per_s
        FROM {counts} GROUP BY t ORDER BY t"""
    )
    paired = sql(
        f"""SELECT $__timeInterval(time) AS t, sum({ADJ}) / $__interval_s AS
        route_requests_per_s, count() / $__interval_s AS route_pairs_per_s
        FROM {PAIRS} WHERE {WHERE} GROUP BY t ORDER BY t"""
    )
    share = sql(
        f"""SELECT $__timeInterval(time) AS t, sumIf(d, metric = '{TRACED}') /
        nullIf(sumIf(d, metric = '{SEEN}'), 0) AS traced_share FROM {counts}
        GROUP BY t ORDER BY t"""
    )
    return pn.row(12, "Traffic and the agent's sampling (service $service)", 30), [
        pn.timeseries(
            13,
            "Requests per second",
            "The agent's exact counts for the service's ports (every request, sampled or "
            "not: request_counts), the requests it traced, and this route's paired "
            "requests (Σ adjusted counts) and pairs. Counts are per service and port: the "
            "agent does not count per route.",
            [rate, paired],
            (0, 31, 12, 8),
            unit="reqps",
            interval="1m",
        ),
        pn.timeseries(
            14,
            "Share of the service's requests traced",
            "traced / seen from the agent's counts; 1 = every request. Below 1 the agent "
            "sampled under its CPU budget: the panels above weigh each pair by 1/p, so "
            "their P95s stay the population's, from fewer pairs.",
            [share],
            (12, 31, 12, 8),
            unit="percentunit",
            min_val=0,
            max_val=1,
            interval="1m",
        ),
    ]


def gpu_use() -> pn.Section:
    """Whether the route's server time is the GPU's: busy in the request windows, and for a
    clock held down, NVML's reasons. Empty for a route whose spans carry no GPU data."""
    clock = sql(
        f"""SELECT $__timeInterval(at) AS t, gpu, avg(100 * clock / clock_max) AS
        sm_clock_pct_of_max, avg(100 * power / power_limit) AS power_pct_of_limit
        FROM ({_readings()}) WHERE clock_max > 0 GROUP BY t, gpu ORDER BY t"""
    )
    low = f"100 * clock / clock_max < {gpu.CLOCK_LOW_PCT}"
    reasons = f"groupBitOrIf(toUInt64(reasons), {low} AND reasons IS NOT NULL)"
    why_clock = sql(
        f"""SELECT gpu, any(gpu_name) AS name, count() AS readings,
        round(avg(100 * clock / clock_max), 1) AS sm_clock_pct_of_max,
        round(countIf({low}) / count(), 3) AS share_below_{gpu.CLOCK_LOW_PCT:g}_pct,
        {_reason_words(f"bitAnd({reasons}, bitNot(toUInt64({gpu.GPU_IDLE_BIT})))")} AS
        reasons_when_low, round(max(100 * power / power_limit), 1) AS max_power_pct_of_limit
        FROM ({_readings()}) WHERE clock_max > 0 GROUP BY gpu ORDER BY gpu"""
    )
    return pn.row(15, "GPU (spans with the agent's parallax.gpu.* attributes)", 39), [
        pn.timeseries(
            16,
            "GPU busy in the request windows",
            "SM utilisation of the service's GPU processes during prefill and during "
            "decode, weighted by window length × adjusted count (docs/sla.md, Server time "
            f"and the GPU): ≥ {gpu.BUSY_PCT:g} % GPU-bound, ≤ {gpu.IDLE_MAX_BUSY_PCT:g} % "
            "the wait is before the GPU. Right axis: requests in flight. Empty for a route "
            "without GPU data (absent is not zero).",
            [_gpu_busy_sql()],
            (0, 40, 8, 9),
            unit="percent",
            overrides=[("inflight_mean", [("unit", "short"), ("custom.axisPlacement", "right")])],
            interval="1m",
        ),
        pn.timeseries(
            17,
            "SM clock and power, per GPU",
            "For the GPUs the route's spans ran on (their parallax.gpu.uuid = gpu_samples "
            f"hw.id): the SM clock as % of its maximum (below {gpu.CLOCK_LOW_PCT:g} % is "
            "past GPU Boost's normal range) and the power draw as % of the enforced limit.",
            [clock],
            (8, 40, 8, 9),
            unit="percent",
            interval="1m",
        ),
        pn.table(
            18,
            "Why the clock is low, per GPU",
            "Over the time range: readings, the mean SM clock, the share of readings below "
            f"{gpu.CLOCK_LOW_PCT:g} % of max, and NVML's clock-event reasons of those "
            "readings in words (GPU idle left out: an idle GPU clocks down).",
            [why_clock],
            (16, 40, 8, 9),
        ),
    ]


def requests_to_look_at() -> pn.Section:
    """The slowest pairs, each a link to its request dashboard around its own time."""
    slowest = sql(
        f"""SELECT time, trace_id, round({USER}, 1) AS user_ms, round({SERVER}, 1) AS
        server_ms, round(user_ms - server_ms, 1) AS divergence_ms, round(network_ms, 1) AS
        network_ms, round(queue_ms, 1) AS queue_ms, hops, round(theta_ms, 1) AS
        clock_offset_ms, round(1 / {ADJ}, 4) AS keep_probability, status,
        toUnixTimestamp64Milli(time) - 10000 AS from_ms, toUnixTimestamp64Milli(time) +
        toInt64(ifNull(user_duration_ms, 0)) + 10000 AS to_ms
        FROM {PAIRS} WHERE {WHERE} AND {MEASURED} ORDER BY user_ms DESC LIMIT 50"""
    )
    return pn.row(19, "Requests to look at", 49), [
        pn.table(
            20,
            "Slowest requests by user $metric",
            "The 50 slowest pairs of the range. Click a row: both lines of sight of that "
            "request on one timeline (parallax-request). clock_offset_ms is θ, server "
            "clock minus browser clock, from this exchange; keep_probability the agent's "
            "sampling probability for it.",
            [slowest],
            (0, 50, 24, 10),
            links=[
                (
                    "Both lines of sight of this request",
                    f"/d/{REQUEST_UID}?var-trace_id=${{__data.fields.trace_id}}"
                    "&from=${__data.fields.from_ms}&to=${__data.fields.to_ms}",
                )
            ],
            overrides=[
                ("from_ms", [("custom.hidden", True)]),
                ("to_ms", [("custom.hidden", True)]),
            ],
        ),
    ]
