"""parallax-sla: user vs server latency over every route — where to start, and the link to a
route's "why" (parallax-route)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from collector.sla import schema as sla_schema
from collector.sla.notify import ROUTE_DASHBOARD_UID
from dashboards import panels as pn
from dashboards.ch import (
    ADJ,
    DB,
    DS,
    EXCHANGES_ONLY,
    METRICS,
    QW,
    SEEN,
    TRACED,
    all_or,
    counter_increments,
    p95,
    sql,
    var,
)

UID = "parallax-sla"
PAIRS = f"{DB}.pairs FINAL"
ROUTES = all_or(f"route IN ({var('route')})", "route")
WHERE = f"$__timeFilter(time) AND {EXCHANGES_ONLY} AND {ROUTES}"
WEIGHTED = "Weighted by each pair's adjusted count (1/p under the agent's sampling)."
TO_ROUTE = (
    f"/d/{ROUTE_DASHBOARD_UID}?var-service=${{__data.fields.service:percentencode}}"
    "&var-route=${__data.fields.route:percentencode}"
)


def measured(metric: str) -> str:
    """The SLA checker's rule: both sides measured (and the metric's own condition)."""
    u, s, c = METRICS[metric]
    return f"({u}) IS NOT NULL AND ({s}) IS NOT NULL AND ({c})"


def route_variable() -> db.QueryVariable:
    return (
        db.QueryVariable("route")
        .label("Route")
        .datasource(DS)
        .query(f"SELECT DISTINCT route FROM {DB}.pairs WHERE $__timeFilter(time) ORDER BY route")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True)
        .current(dm.VariableOption(text=["All"], value=["$__all"]))
    )


def _p95_panel(pid: int, metric: str, words: str, x: int) -> pn.PanelBuilder:
    u, s, _ = METRICS[metric]
    q = sql(
        f"""SELECT $__timeInterval(time) AS t, {p95(u)} AS user_p95_ms, {p95(s)} AS server_p95_ms
        FROM {PAIRS} WHERE {WHERE} AND {measured(metric)} GROUP BY t ORDER BY t"""
    )
    return pn.timeseries(
        pid,
        f"{words}: user P95 vs server P95",
        f"P95 of what users waited for and what the origin server reports, each on its own "
        f"clock, over the pairs where both are measured (the SLA checker's rule). The gap is "
        f"the divergence. {WEIGHTED}",
        [q],
        (x, 7, 8, 8),
    )


def build() -> db.Dashboard:
    d = (
        db.Dashboard("Parallax — user vs server latency")
        .uid(UID)
        .tags(["parallax"])
        .timezone("utc")
        .time("now-1h", "now")
        .refresh("30s")
        .readonly()
        .with_variable(route_variable())
    )
    return pn.with_sections(
        d,
        alerts_firing(),
        user_vs_server(),
        divergence_by_route(),
        where_the_time_goes(),
        inter_token_gaps(),
        coverage_and_sampling(),
    )


def alerts_firing() -> pn.Section:
    """Where on-call starts: the checker's open alerts, each a link to its route's "why"."""
    alerts = sql(
        f"""SELECT service, route, metric, state, severity, round(divergence_ms, 1) AS
        divergence_ms, round(ci_low_ms, 1) AS ci_low_ms, round(ci_high_ms, 1) AS ci_high_ms,
        band_ms, n, since, sentence FROM {DB}.{sla_schema.ALERTS}
        WHERE (service, route, metric, time) IN (SELECT service, route, metric, max(time)
        FROM {DB}.{sla_schema.ALERTS} GROUP BY service, route, metric)
        AND state IN ('firing', 'insufficient_data', 'pending')
        ORDER BY state = 'pending', abs(divergence_ms) DESC"""
    )
    return None, [
        pn.table(
            1,
            "Alerts firing now",
            "The SLA checker's pending and firing alerts (latest state per route and "
            "metric), firing first, worst divergence first, with its sentence. Click a row: "
            "the route's dashboard, on this metric and band.",
            [alerts],
            (0, 0, 24, 7),
            links=[
                (
                    "Why? The route's dashboard",
                    TO_ROUTE + "&var-metric=${__data.fields.metric}"
                    "&var-band=${__data.fields.band_ms}&${__url_time_range}",
                )
            ],
        ),
    ]


def user_vs_server() -> pn.Section:
    """Is it the users or the app, per metric across the selected routes."""
    return None, [
        _p95_panel(2, "ttfb", "TTFB", 0),
        _p95_panel(3, "ttft", "TTFT", 8),
        _p95_panel(4, "visible_ttft", "Visible TTFT", 16),
    ]


def divergence_by_route() -> pn.Section:
    """Which routes diverge, on every metric, each a link to its route's "why"."""
    diverge = ", ".join(
        f"round({p95(f'if({measured(m)}, toFloat64({METRICS[m][0]}), NULL)')} - "
        f"{p95(f'if({measured(m)}, toFloat64({METRICS[m][1]}), NULL)')}, 1) AS {m}_ms"
        for m in ("ttfb", "ttft", "visible_ttft", "duration")
    )
    by_route = sql(
        f"""SELECT service, route, count() AS pairs, round(sum({ADJ})) AS requests, {diverge}
        FROM {PAIRS} WHERE {WHERE} GROUP BY service, route ORDER BY abs(ttfb_ms) DESC"""
    )
    return None, [
        pn.table(
            5,
            "Divergence by route (P95 user − P95 server)",
            "Point estimates over the dashboard's time range; the SLA checker's verdicts "
            "(with confidence intervals) are in the alerts panel and on /ui. P95s weigh each "
            "pair by the requests it stands for (1/p of the agent's sampling probability, "
            "the span's tracestate ot=th); `requests` is their sum. Click a row: the route's "
            "dashboard.",
            [by_route],
            (0, 15, 12, 8),
            links=[("Why? The route's dashboard", TO_ROUTE + "&${__url_time_range}")],
        ),
    ]


def where_the_time_goes() -> pn.Section:
    """The parts the app cannot see from inside: network, kernel queues, render delay."""
    parts = ", ".join(
        f"{p95(e)} AS {name}_ms"
        for name, e in (
            ("network", "network_ms"),
            ("accept_queue", "accept_queue_ms"),
            ("recv_queue", "recv_queue_ms"),
            ("render_delay", "render_delay_ms"),
        )
    )
    where_time = sql(
        f"""SELECT $__timeInterval(time) AS t, {parts} FROM {PAIRS} WHERE {WHERE}
        GROUP BY t ORDER BY t"""
    )
    return None, [
        pn.timeseries(
            6,
            "Where the time goes (P95 of each part)",
            "Network + proxies δ (edge hop), kernel accept/receive-queue waits (event-loop "
            f"lag the app cannot see), render delay in the browser. {WEIGHTED}",
            [where_time],
            (12, 15, 12, 8),
        ),
    ]


def inter_token_gaps() -> pn.Section:
    """The stream at each of its three points: a buffering proxy between them shows here."""
    gaps = [
        sql(
            f"""SELECT $__timeInterval(time) AS t, quantileExactWeighted(0.95)(gap, {QW}) AS
            {name}_gap_ms FROM {PAIRS} ARRAY JOIN {col} AS gap WHERE {WHERE} GROUP BY t
            ORDER BY t"""
        )
        for name, col in (
            ("origin", "server_itl_ms"),
            ("edge", "edge_itl_ms"),
            ("browser", "user_itl_ms"),
        )
    ]
    return None, [
        pn.timeseries(
            7,
            "Inter-token gaps P95: origin, edge, browser",
            "Token gaps as the origin app wrote them. A buffering proxy shows as regular "
            f"gaps here and bursts at the edge and in the browser (see /ui). {WEIGHTED}",
            gaps,
            (0, 23, 12, 8),
        ),
    ]


def coverage_and_sampling() -> pn.Section:
    """How many requests the panels above stand on: the pairs, and the share traced."""
    coverage = sql(
        f"""SELECT $__timeInterval(time) AS t, count() AS pairs, round(sum({ADJ})) AS requests,
        countIf(hops > 1) AS via_proxy, countIf(server_timed) AS kernel_timed FROM {PAIRS}
        WHERE {WHERE} GROUP BY t ORDER BY t"""
    )
    share = sql(
        f"""SELECT $__timeInterval(time) AS t, service, sumIf(d, metric = '{TRACED}') /
        nullIf(sumIf(d, metric = '{SEEN}'), 0) AS traced_share FROM ({counter_increments()})
        GROUP BY t, service ORDER BY t"""
    )
    return None, [
        pn.timeseries(
            8,
            "Pairing coverage",
            "Requests seen from both sides (pairs), and the requests they stand for under "
            "the agent's sampling (each pair weighs 1/p); how many crossed a proxy; how many "
            "the kernel agent timed (the rest came from an OpenTelemetry SDK span).",
            [coverage],
            (12, 23, 12, 8),
            unit="short",
        ),
        pn.timeseries(
            9,
            "Traced share of requests, by service (agent sampling)",
            "The share of each service's requests the agent traced, from its exact counts "
            "(parallax.requests.seen / traced per port, request_counts); 1 = every request. "
            "Under load the agent samples each request at random with a probability it "
            "adapts to its CPU budget; the other panels weigh each traced request by 1/p, so "
            "their P95s stay the population's. A low share means fewer pairs: wider "
            "intervals, not wrong ones.",
            [share],
            (0, 31, 24, 8),
            unit="percentunit",
            min_val=0,
            max_val=1,
        ),
    ]
