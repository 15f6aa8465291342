"""The emulation of Grafana's and the ClickHouse plugin's query expansion
(tests/grafana_interp.py), held to the examples their sources document."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.grafana_interp import (
    ALL,
    Query,
    Variable,
    backend_macros,
    conditional_all,
    interpolate,
    template_replace,
)

# The plugin's documented example range (src/ch-parser/pluginMacros.ts):
# $__timeFilter(time) → time >= toDateTime(1415792726) AND time <= toDateTime(1447328726)
Q = Query(
    datetime.fromtimestamp(1415792726.123, UTC), datetime.fromtimestamp(1447328726.456, UTC), 20
)
ROUTE_ALL = Variable("route", ALL, ("/a", "/b"))
ROUTE_ONE = Variable("route", ["/a"])


def test_backend_macros_as_the_plugin_documents_them() -> None:
    assert backend_macros("$__timeFilter(time)", Q) == (
        "time >= toDateTime(1415792726) AND time <= toDateTime(1447328726)"
    )
    assert backend_macros("$__timeInterval(column)", Q) == (
        "toStartOfInterval(toDateTime(column), INTERVAL 20 second)"
    )
    assert backend_macros("$__timeFilter_ms(t)", Q) == (
        "t >= fromUnixTimestamp64Milli(1415792726123) "
        "AND t <= fromUnixTimestamp64Milli(1447328726456)"
    )
    assert backend_macros("$__fromTime, $__toTime, $__interval_s", Q) == (
        "toDateTime(1415792726), toDateTime(1447328726), 20"
    )
    assert backend_macros("$__dateFilter(d)", Q) == (
        "d >= toDate('2014-11-12') AND d <= toDate('2015-11-12')"
    )
    # at least one second; nested parentheses stay in the argument
    assert (
        backend_macros("$__timeInterval(toDateTime(x, 'UTC'))", Query(Q.start, Q.end, 0.2))
        == "toStartOfInterval(toDateTime(toDateTime(x, 'UTC')), INTERVAL 1 second)"
    )


def test_conditional_all_is_the_condition_or_1_eq_1() -> None:
    sql = "WHERE $__conditionalAll(route IN (${route:singlequote}), $route) AND x"
    assert conditional_all(sql, {"route": ROUTE_ALL}) == "WHERE 1=1 AND x"
    assert conditional_all(sql, {"route": ROUTE_ONE}) == (
        "WHERE route IN (${route:singlequote}) AND x"
    )
    # JavaScript's replace: $$ in the condition becomes $, $` the text before the call
    assert conditional_all("x $__conditionalAll(a = '$$', $route)", {"route": ROUTE_ONE}) == (
        "x a = '$'"
    )
    assert conditional_all("x $__conditionalAll(a = '$`', $route)", {"route": ROUTE_ONE}) == (
        "x a = 'x '"
    )


def test_template_variables_and_their_formats() -> None:
    v = {"route": Variable("route", ["/a", "it's"]), "metric": Variable("metric", "ttft")}
    assert template_replace("${route:singlequote}", v) == "'/a','it\\'s'"
    # the plugin's default quotes an array's values without escaping them: hence :singlequote
    assert template_replace("$route", v) == "'/a','it's'"
    assert template_replace("$metric ${metric} ${metric:raw}", v) == "ttft ttft ttft"
    assert template_replace("${route:csv}", v) == "/a,it's"
    # "All": every option, or a custom all value left unformatted
    assert template_replace("${route:singlequote}", {"route": ROUTE_ALL}) == "'/a','/b'"
    custom = Variable("route", ALL, ("/a",), all_value="All")
    assert template_replace("${route:singlequote}", {"route": custom}) == "All"
    # not a variable: left for the backend
    assert template_replace("$__interval_s $__timeFilter(t)", v) == "$__interval_s $__timeFilter(t)"


def test_interpolate_refuses_what_would_reach_clickhouse_unexpanded() -> None:
    with pytest.raises(ValueError, match="not expanded"):
        interpolate("SELECT $__timeFiltr(t)", [], Q)
    with pytest.raises(ValueError, match="not expanded"):
        interpolate("SELECT ${nosuchvar}", [], Q)
    with pytest.raises(ValueError, match="inside a string literal"):
        interpolate("SELECT '$__fromTime'", [], Q)
    assert interpolate(
        "SELECT 1 WHERE $__conditionalAll(r IN (${route:singlequote}), $route) AND "
        "$__timeFilter(t)",
        [ROUTE_ONE],
        Q,
    ) == (
        "SELECT 1 WHERE r IN ('/a') AND t >= toDateTime(1415792726) AND t <= toDateTime(1447328726)"
    )
