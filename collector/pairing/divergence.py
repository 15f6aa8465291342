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
# An LLM exchange: the origin hop or the browser read a stream dialect (pairs.llm_dialect).
# There the first *token* and the gaps between tokens are compared — not the first body
# write (a role-only delta, message_start or a heartbeat) nor the writes' gaps; a pair where
# one side did not read the tokens counts for neither (absent, never the chunk's value).
LLM = "llm_dialect != ''"
SERVER_FIRST = f"if({LLM}, server_first_token_ms, server_ttft_ms)"
# metric → (user expression, server expression, extra condition); both sides must be
# measured for a pair to count ("on pairs only").
METRICS: dict[str, tuple[str, str, str]] = {
    "ttfb": ("user_ttfb_ms", "server_ttfb_ms", "1"),
    "ttft": (f"if({LLM}, user_first_token_ms, user_ttft_ms)", SERVER_FIRST, "1"),
    # the render delay shows here: paint vs the server's first body write (first token)
    "visible_ttft": ("user_visible_ttft_ms", SERVER_FIRST, "1"),
    # per request, the P95 of its gaps (requests are the independent samples, gaps within
    # one stream are not); throttled browser chunk times (XHR progress) are left out. An
    # LLM answer: the P95 of its inter-token gaps on each side (a proxy that coalesces
    # tokens shows here)
    "itl": (
        f"if({LLM}, user_token_gap_p95_ms, {P95_ARR.format(a='user_itl_ms')})",
        f"if({LLM}, server_token_gap_p95_ms, {P95_ARR.format(a='server_itl_ms')})",
        f"NOT chunks_coarse AND if({LLM}, 1, length(user_itl_ms) > 0 AND "
        "length(server_itl_ms) > 0)",
    ),
    "duration": ("user_duration_ms", "server_duration_ms", "1"),
}
METRIC_ORDER = tuple(METRICS)


def measured(metric: str) -> str:
    """The condition for a pair to count for ``metric``: both sides measured."""
    u, s, cond = METRICS[metric]
    return f"({u}) IS NOT NULL AND ({s}) IS NOT NULL AND ({cond})"
