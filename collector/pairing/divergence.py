"""The divergence's metric pairs as SQL over the ``pairs`` table: per metric the user side,
the server side and the condition for a pair to count (docs/sla.md, "What is evaluated").
One definition, read by the SLA checker (collector/sla/source.py), the dashboards and the
query API's slowest requests (collector/api/query.py).
"""

from __future__ import annotations

# A WebSocket handshake (seq 0) is connection set-up, not an exchange: mixed into the route's
# message exchanges it would pull TTFB and duration towards the open time.
EXCHANGES_ONLY = "NOT (kind = 'websocket' AND seq = 0)"

P95_ARR = "arrayReduce('quantileExact(0.95)', {a})"
P50_ARR = "arrayReduce('quantileExact(0.5)', {a})"
# metric → (user expression, server expression, extra condition); both sides must be
# measured for a pair to count ("on pairs only").
METRICS: dict[str, tuple[str, str, str]] = {
    "ttfb": ("user_ttfb_ms", "server_ttfb_ms", "1"),
    "ttft": ("user_ttft_ms", "server_ttft_ms", "1"),
    # the render delay shows here: paint vs the server's first body write
    "visible_ttft": ("user_visible_ttft_ms", "server_ttft_ms", "1"),
    # per request, the P95 of its gaps (requests are the independent samples, gaps within
    # one stream are not); throttled browser chunk times (XHR progress) are left out
    "itl": (
        P95_ARR.format(a="user_itl_ms"),
        P95_ARR.format(a="server_itl_ms"),
        "NOT chunks_coarse AND length(user_itl_ms) > 0 AND length(server_itl_ms) > 0",
    ),
    "duration": ("user_duration_ms", "server_duration_ms", "1"),
}
METRIC_ORDER = tuple(METRICS)


def measured(metric: str) -> str:
    """The condition for a pair to count for ``metric``: both sides measured."""
    u, s, cond = METRICS[metric]
    return f"({u}) IS NOT NULL AND ({s}) IS NOT NULL AND ({cond})"
