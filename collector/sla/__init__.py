"""The SLA checker: P95(user) − P95(server) per route and metric, with evidence and reasons.

Modules, one job each:

- ``quantize``   the value grid of the per-minute histograms (precision vs cost)
- ``stats``      distribution-free order-statistic confidence bounds, verdicts
- ``clock``      the NTP clock filter for per-session clock offsets θ
- ``schema``     DDL of the ``sla_*`` tables (idempotent, run at start)
- ``source``     SQL against ``pairs``: per-minute summaries and the window's quantiles
- ``explain``    ranking of parts, traps, one plain sentence per metric
- ``tokens``     an LLM route's server side per answer in tokens, the engine's queue named
- ``evaluate``   one evaluation: source → stats → explanations → the JSON document
- ``config``     thresholds and receivers from a YAML/TOML file, validated at start
- ``alerts``     alert state machine (inactive → pending → firing → resolved) + store log
- ``notify``     Alertmanager / webhook delivery with retries, off the evaluation path
- ``metrics``    Prometheus gauges
- ``lease``      one evaluator among several collectors on one ClickHouse
- ``service``    the evaluator loop and the query-port routes (/v1/sla, /v1/alerts, /ui)
- ``cli``        ``parallax-collector sla --once``
"""
