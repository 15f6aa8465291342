"""Panel shapes the dashboards use, on the SDK's typed panel builders."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap as hb
from grafana_foundation_sdk.builders import table as tb
from grafana_foundation_sdk.builders import text as xb
from grafana_foundation_sdk.builders import timeseries as tsb
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import text as tm

from dashboards.ch import DS, TABLE, TIME_SERIES, TRACE, QueryBuilder

Grid = tuple[int, int, int, int]  # x, y, w, h
Override = tuple[str, list[tuple[str, Any]]]
PanelBuilder = cogbuilder.Builder[dm.Panel]
RowBuilder = cogbuilder.Builder[dm.RowPanel]
# One job of a dashboard: its row (None where the dashboard has no rows) and the panels
# under it, in grid order.
Section = tuple[RowBuilder | None, Sequence[PanelBuilder]]


def _targets(queries: Sequence[str], fmt: int) -> list[cogbuilder.Builder[Any]]:
    return [QueryBuilder(q, fmt, chr(ord("A") + i)) for i, q in enumerate(queries)]


def _pos(g: Grid) -> dm.GridPos:
    x, y, w, h = g
    return dm.GridPos(x=x, y=y, w=w, h=h)


def _overrides(p: Any, overrides: Sequence[Override]) -> None:
    for name, props in overrides:
        p.override_by_name(name, [dm.DynamicConfigValue(id_val=k, value=v) for k, v in props])


def timeseries(
    pid: int,
    title: str,
    description: str,
    queries: Sequence[str],
    grid: Grid,
    unit: str = "ms",
    stacked: bool = False,
    overrides: Sequence[Override] = (),
    min_val: float | None = None,
    max_val: float | None = None,
    points: bool = False,
    interval: str = "",
) -> PanelBuilder:
    p = (
        tsb.Panel()
        .id(pid)
        .title(title)
        .description(description)
        .datasource(DS)
        .targets(_targets(queries, TIME_SERIES))
        .grid_pos(_pos(grid))
        .unit(unit)
        .legend(
            cb.VizLegendOptions()
            .show_legend(True)
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
        )
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.NONE))
        .span_nulls(True)
    )
    if stacked:
        p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(60)
    if interval:
        p.interval(interval)  # the least bucket: a query's $__interval_s is at least this
    if points:
        p.show_points(cm.VisibilityMode.ALWAYS).point_size(6)
    if min_val is not None:
        p.min(min_val)
    if max_val is not None:
        p.max(max_val)
    _overrides(p, overrides)
    return p


def table(
    pid: int,
    title: str,
    description: str,
    queries: Sequence[str],
    grid: Grid,
    overrides: Sequence[Override] = (),
    links: Sequence[tuple[str, str]] = (),
    unit: str = "",
) -> PanelBuilder:
    p = (
        tb.Panel()
        .id(pid)
        .title(title)
        .description(description)
        .datasource(DS)
        .targets(_targets(queries, TABLE))
        .grid_pos(_pos(grid))
        .show_header(True)
        .cell_height(cm.TableCellHeight.SM)
        .footer(cb.TableFooterOptions().show(False).reducer([]))
    )
    if unit:
        p.unit(unit)
    if links:
        p.data_links([_link(t, u) for t, u in links])
    _overrides(p, overrides)
    return p


def _link(title: str, url: str, tooltip: str = "", keep_time: bool = False) -> db.DashboardLink:
    return (
        db.DashboardLink(title)
        .type(dm.DashboardLinkType.LINK)
        .url(url)
        .icon("dashboard" if keep_time else "external link")
        .tooltip(tooltip or title)
        .tags([])
        .as_dropdown(False)
        .target_blank(False)
        .include_vars(False)
        .keep_time(keep_time)
    )


def nav_link(title: str, uid: str, tooltip: str) -> db.DashboardLink:
    """A link in the dashboard's header to another one, keeping the time range."""
    return _link(title, f"/d/{uid}", tooltip, keep_time=True)


def heatmap(
    pid: int,
    title: str,
    description: str,
    query: str,
    grid: Grid,
    unit: str = "ms",
    interval: str = "",
) -> PanelBuilder:
    """Buckets computed in SQL (weighted counts), one column per bucket named by its upper
    bound: the heatmap reads them as rows with ``le`` layout, no calculation of its own."""
    p = (
        hb.Panel()
        .id(pid)
        .title(title)
        .description(description)
        .datasource(DS)
        .targets(_targets([query], TIME_SERIES))
        .grid_pos(_pos(grid))
        .calculate(False)
        .rows_frame(hb.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.LE).value("requests"))
        .y_axis(hb.YAxisConfig().unit(unit).axis_placement(cm.AxisPlacement.LEFT))
        .color(
            hb.HeatmapColorOptions()
            .mode(hm.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .fill("dark-orange")
            .scale(hm.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
            .reverse(False)
        )
        .cell_gap(1)
        .show_value(cm.VisibilityMode.NEVER)
        .show_legend()
        .mode(cm.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .selection_mode(hm.HeatmapSelectionMode.X)
    )
    if interval:
        p.interval(interval)
    return p


def traces(pid: int, title: str, description: str, query: str, grid: Grid) -> PanelBuilder:
    """Grafana's trace view, fed by the plugin's trace format (one row per span)."""
    return (
        db.Panel()
        .type("traces")
        .id(pid)
        .title(title)
        .description(description)
        .datasource(DS)
        .targets(_targets([query], TRACE))
        .grid_pos(_pos(grid))
    )


def text(pid: int, title: str, content: str, grid: Grid) -> PanelBuilder:
    return (
        xb.Panel()
        .id(pid)
        .title(title)
        .description(title)
        .grid_pos(_pos(grid))
        .mode(tm.TextMode.MARKDOWN)
        .content(content)
    )


def row(pid: int, title: str, y: int) -> RowBuilder:
    return db.Row(title).id(pid).grid_pos(dm.GridPos(x=0, y=y, w=24, h=1)).collapsed(False)


def with_sections(dashboard: db.Dashboard, *sections: Section) -> db.Dashboard:
    """Appends each section's row, then its panels: the dashboard's panel list is in the
    order they are appended (each carries its own grid position)."""
    for section_row, panels in sections:
        if section_row is not None:
            dashboard.with_row(section_row)
        for panel in panels:
            dashboard.with_panel(panel)
    return dashboard
