"""The ClickHouse side of the dashboards: the datasource's query type for the SDK, and the SQL
pieces every panel shares.

grafana-foundation-sdk has builders for Grafana's own panels and for the datasources Grafana
Labs ships in core (Prometheus, Loki, …), not for the ClickHouse plugin: its query is a plain
object (``rawSql``, ``format``, ``editorType``, ``queryType``), so ``Query`` below is one
``Dataquery`` variant of the SDK's, built like the SDK's own.

SQL conventions, as the plugin expands them (tests/grafana_interp.py emulates it):

- ``$__timeFilter(col)``, ``$__timeInterval(col)``, ``$__interval_s``, ``$__fromTime`` and
  ``$__toTime`` are the plugin backend's macros (seconds, whole-second bounds);
- a variable is always written ``${name:singlequote}``: Grafana quotes and escapes it, so a
  value from the URL cannot end the string literal;
- a multi-value variable filters through the plugin's ``$__conditionalAll(cond, $var)``
  (``1=1`` when "All" is selected), never a custom "All" value: Grafana leaves a custom all
  value unformatted, so ``${route:singlequote}`` would expand to a bare ``All``.

The SQL itself reuses the SLA checker's definitions (collector/sla/source.py: the metrics'
user and server expressions, the parts, the pair weight), so a panel and the verdict it
explains read the same columns the same way.
"""

from __future__ import annotations

from typing import Any, Self

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import dashboard as dm

from collector.sla import source as sla_source
from collector.store.schema import adjusted_count_sql
from parallax_contracts import agent_metrics as gm

PLUGIN = "grafana-clickhouse-datasource"
DS = dm.DataSourceRef(type_val=PLUGIN, uid="parallax-clickhouse")
DB = "parallax"

# The plugin's result formats (sqlutil.FormatQueryOption).
TIME_SERIES, TABLE, TRACE = 0, 1, 3


class Query(cogvariants.Dataquery):
    """A raw-SQL query of the ClickHouse plugin."""

    def __init__(self, ref_id: str, sql: str, fmt: int) -> None:
        self.ref_id, self.sql, self.fmt = ref_id, sql, fmt

    def to_json(self) -> dict[str, object]:
        return {
            "datasource": DS,
            "editorType": "sql",
            "format": self.fmt,
            # the plugin's display type (QueryType); the backend goes by `format`
            "queryType": {TIME_SERIES: "timeseries", TABLE: "table", TRACE: "traces"}[self.fmt],
            "rawSql": self.sql,
            "refId": self.ref_id,
        }


class QueryBuilder(cogbuilder.Builder[cogvariants.Dataquery]):
    def __init__(self, sql: str, fmt: int = TIME_SERIES, ref_id: str = "A") -> None:
        self._q = Query(ref_id, sql, fmt)

    def build(self) -> cogvariants.Dataquery:
        return self._q

    def ref_id(self, ref_id: str) -> Self:
        self._q.ref_id = ref_id
        return self


def sql(text: str) -> str:
    """One line per query in the JSON (the generator's source keeps the layout)."""
    return " ".join(text.split())


def var(name: str) -> str:
    """A variable as a quoted, escaped SQL string literal."""
    return "${" + name + ":singlequote}"


def all_or(cond: str, name: str) -> str:
    """The plugin's conditionalAll: ``cond`` unless every value of ``name`` is selected."""
    return f"$__conditionalAll({cond}, ${name})"


# A pair's (or span's) adjusted count, and the same in the integer units quantileExactWeighted
# takes (ClickHouse accepts no float weight there; 1/65536 keeps a whole count exact).
ADJ = adjusted_count_sql("sample_th")
QW = f"toUInt64(round({sla_source.WEIGHT_SCALE} * {ADJ}))"
METRICS = sla_source.METRICS
PARTS = sla_source.PARTS
AFTER_FIRST_WRITE = sla_source.AFTER_FIRST_WRITE
EXCHANGES_ONLY = sla_source.EXCHANGES_ONLY
SEEN, TRACED = gm.REQUESTS_SEEN.name, gm.REQUESTS_TRACED.name


def p95(expr: str) -> str:
    return f"quantileExactWeighted(0.95)({expr}, {QW})"


def metric_case(side: int, name: str = "metric") -> str:
    """The user (side 0) or server (side 1) expression of the metric a variable selects."""
    arms = ", ".join(f"{var(name)} = '{m}', toFloat64({e[side]})" for m, e in METRICS.items())
    return f"multiIf({arms}, NULL)"


def metric_measured(name: str = "metric") -> str:
    """The SLA checker's rule: a pair counts for a metric when both sides are measured."""
    arms = ", ".join(
        f"{var(name)} = '{m}', ({u}) IS NOT NULL AND ({s}) IS NOT NULL AND ({c})"
        for m, (u, s, c) in METRICS.items()
    )
    return f"multiIf({arms}, 0)"


def field_config(
    unit: str = "",
    custom: dict[str, Any] | None = None,
    overrides: list[tuple[str, list[tuple[str, Any]]]] | None = None,
    links: list[dm.DashboardLink] | None = None,
    **defaults: Any,
) -> dm.FieldConfigSource:
    """Field defaults and by-name overrides ([(field, [(property id, value)])])."""
    d = dm.FieldConfig(unit=unit or None, custom=custom, links=links, **defaults)
    return dm.FieldConfigSource(
        defaults=d,
        overrides=[
            dm.DashboardFieldConfigSourceOverrides(
                matcher=dm.MatcherConfig(id_val="byName", options=name),
                properties=[dm.DynamicConfigValue(id_val=k, value=v) for k, v in props],
            )
            for name, props in (overrides or [])
        ],
    )


def link(title: str, url: str) -> dm.DashboardLink:
    """A data link (the v1 schema types them as dashboard links; Grafana reads title, url)."""
    return dm.DashboardLink(
        title=title,
        type_val=dm.DashboardLinkType.LINK,
        url=url,
        icon="external link",
        tooltip=title,
        tags=[],
        as_dropdown=False,
        target_blank=False,
        include_vars=False,
        keep_time=False,
    )


def counter_increments() -> str:
    """The agent's request counters as increments, one row per point in the time range:
    (time, service, metric, d) — collector/sla/sampling.py's rule per point: the difference
    from the series' previous point (from up to a minute before the range), a value below it
    a reset (the count since), a series that began in the range counting from 0, delta
    points as they are. One series per (port, host, metric, start time); its service is the
    latest non-empty one (a port's first points may precede the record that named it)."""
    return f"""SELECT fromUnixTimestamp64Nano(pts[i].1) AS time, service, metric,
        multiIf(is_delta, pts[i].2, i > 1, if(pts[i].2 >= pts[i - 1].2,
        pts[i].2 - pts[i - 1].2, pts[i].2), st >= from_ns, pts[i].2, 0) AS d
    FROM (SELECT argMaxIf(toString(service), time, service != '') AS service,
        toString(metric) AS metric, any(toString(temporality)) = 'delta' AS is_delta,
        ifNull(toUnixTimestamp64Nano(start_time), 0) AS st,
        toInt64(toUnixTimestamp($__fromTime)) * 1000000000 AS from_ns,
        arraySort(x -> x.1, groupArray((toUnixTimestamp64Nano(time), value))) AS pts
        FROM {DB}.request_counts FINAL
        WHERE metric IN ('{SEEN}', '{TRACED}') AND time > $__fromTime - INTERVAL 1 MINUTE
        AND time <= $__toTime GROUP BY port, host, metric, st)
    ARRAY JOIN arrayEnumerate(pts) AS i
    WHERE pts[i].1 > from_ns"""
