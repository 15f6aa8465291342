"""One evaluation: the window's histograms → numbers, intervals, verdicts, reasons.

The JSON document (``to_json``) is the contract of ``parallax-collector sla --once --json``
and ``GET /v1/sla``; docs/sla.md documents every field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from collector.sla import explain, gpu, quantize, sampling, stats, tokens
from collector.sla.config import SlaConfig
from collector.sla.source import METRIC_ORDER, SlaSource
from collector.sla.stats import SeriesStats, Window

_RANK = {v: i for i, v in enumerate(stats.VERDICTS)}


@dataclass(slots=True)
class MetricResult:
    service: str
    route: str
    metric: str
    verdict: str
    severity: str  # critical (users wait longer), warning (negative), none
    n: int
    band_ms: float
    min_samples: int
    divergence_ms: float | None
    ci_low_ms: float | None
    ci_high_ms: float | None
    user: dict[str, float | None]
    server: dict[str, float | None]
    parts: dict[str, Any]
    ranked: list[explain.RankedPart]
    traps: list[str]
    sentence: str
    alert_state: str = "inactive"
    n_eff: int = 0  # effective sample size (= n when every pair weighs the same)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "severity": self.severity,
            "divergence_ms": _r(self.divergence_ms),
            "ci_low_ms": _r(self.ci_low_ms),
            "ci_high_ms": _r(self.ci_high_ms),
            "band_ms": self.band_ms,
            "n": self.n,
            "n_eff": self.n_eff,
            "min_samples": self.min_samples,
            "user_p50_ms": _r(self.user["p50"]),
            "user_p95_ms": _r(self.user["p95"]),
            "user_p99_ms": _r(self.user["p99"]),
            "server_p50_ms": _r(self.server["p50"]),
            "server_p95_ms": _r(self.server["p95"]),
            "server_p99_ms": _r(self.server["p99"]),
            "parts": self.parts,
            "ranking": [
                {"part": r.part, "label": r.label, "p95_ms": _r(r.p95_ms)} for r in self.ranked
            ],
            "traps": self.traps,
            "sentence": self.sentence,
            "alert_state": self.alert_state,
        }


@dataclass(slots=True)
class RouteResult:
    service: str
    route: str
    metrics: dict[str, MetricResult]
    sessions: int = 0
    far_off_sessions: int = 0
    server: dict[str, Any] = field(default_factory=dict)  # gpu.server_json: split + GPU
    sampling: dict[str, Any] = field(default_factory=dict)  # sampling.route_json

    @property
    def worst(self) -> str:
        return min((m.verdict for m in self.metrics.values()), key=lambda v: _RANK[v])

    def sort_key(self) -> tuple[int, float]:
        excess = max(
            (
                abs(m.divergence_ms) - m.band_ms
                for m in self.metrics.values()
                if m.divergence_ms is not None
            ),
            default=-1e9,
        )
        return (_RANK[self.worst], -excess)

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "route": self.route,
            "verdict": self.worst,
            "sessions": self.sessions,
            "far_off_sessions": self.far_off_sessions,
            "server": self.server,
            "sampling": self.sampling,
            "metrics": {k: self.metrics[k].to_json() for k in METRIC_ORDER if k in self.metrics},
        }


@dataclass(slots=True)
class Evaluation:
    evaluated_at: datetime
    window: timedelta
    start: datetime
    end: datetime
    routes: list[RouteResult] = field(default_factory=list)

    @property
    def any_out_of_band(self) -> bool:
        return any(m.verdict == stats.OUT for r in self.routes for m in r.metrics.values())

    def results(self) -> list[MetricResult]:
        return [m for r in self.routes for m in r.metrics.values()]

    def to_json(self) -> dict[str, Any]:
        return {
            "window": {
                "start": self.start.isoformat(),
                "end": self.end.isoformat(),
                "duration_ms": self.window.total_seconds() * 1000.0,
                "evaluated_at": self.evaluated_at.isoformat(),
            },
            "routes": [r.to_json() for r in self.routes],
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def _side(s: SeriesStats | None) -> dict[str, float | None]:
    if s is None or not s.n:
        return {"p50": None, "p95": None, "p99": None}
    return {"p50": s.at(0.5), "p95": s.at(0.95), "p99": s.at(0.99)}


def _bounds(s: SeriesStats) -> tuple[float | None, float | None]:
    """97.5% order-statistic bounds of one side's P95, widened by half a grid cell; ranks of
    the effective sample size, read as levels of the weighted quantile (collector.sla.stats)."""
    n = s.n_eff
    lo_rank, hi_rank = stats.rank_bounds(n, stats.P, stats.ALPHA / 2)
    lo = hi = None
    if lo_rank is not None:
        v = s.at(stats.level_for_rank_at_most(lo_rank, n))
        lo = None if v is None else v - quantize.half_width_ms(v)
    if hi_rank is not None:
        v = s.at(stats.level_for_rank_at_least(hi_rank, n))
        hi = None if v is None else v + quantize.half_width_ms(v)
    return lo, hi


def _share(s: SeriesStats | None) -> float | None:
    v = s.share() if s is not None else None
    return None if v is None else round(v, 4)


def parts_json(series: dict[str, SeriesStats]) -> dict[str, Any]:
    rt = series.get("retransmits")
    hops = [
        {"index": i, "service": svc, "added_p95_ms": _r(v)}
        for i, svc, v in explain.hop_parts(series)
    ]
    return {
        "network_p95_ms": _r(explain.p95(series, "network")),
        "queue_p95_ms": _r(explain.p95(series, "queue")),
        "accept_queue_p95_ms": _r(explain.p95(series, "accept_queue")),
        "recv_queue_p95_ms": _r(explain.p95(series, "recv_queue")),
        "server_processing_p95_ms": _r(explain.p95(series, "server")),
        "render_delay_p95_ms": _r(explain.p95(series, "render")),
        "retransmit_share": _share(rt),
        "hops": hops,
        "itl_gap_p50_ms": {
            "server": _r(explain.p50(series, "itl_p50:server")),
            "edge": _r(explain.p50(series, "itl_p50:edge")),
            "user": _r(explain.p50(series, "itl_p50:user")),
        },
        "edge_itl_p95_ms": _r(explain.p95(series, "itl:edge")),
    }


def split_of(series: dict[str, SeriesStats]) -> gpu.Split:
    """The route's queue / prefill / decode percentiles from its part histograms."""
    pre = series.get("prefill")
    return gpu.Split(
        n=pre.n if pre is not None else 0,
        queue_p50=explain.p50(series, "queue"),
        queue_p95=explain.p95(series, "queue"),
        prefill_p50=explain.p50(series, "prefill"),
        prefill_p95=explain.p95(series, "prefill"),
        decode_p50=explain.p50(series, "decode"),
        decode_p95=explain.p95(series, "decode"),
    )


AlertState = Callable[[str, str, str], str]
# The metrics whose sentence ends with an LLM route's server side (its engine queue named).
_FIRST_TOKEN = ("ttft", "visible_ttft")


def evaluate_window(
    w: Window,
    cfg: SlaConfig,
    now: datetime,
    window: timedelta,
    alert_state: AlertState | None = None,
) -> Evaluation:
    ev = Evaluation(evaluated_at=now, window=window, start=w.start, end=w.end)
    for (service, route), series in w.series.items():
        rr = _route(w, cfg, service, route, series, window, alert_state)
        if rr.metrics:
            ev.routes.append(rr)
    ev.routes.sort(key=RouteResult.sort_key)
    return ev


def _route(
    w: Window,
    cfg: SlaConfig,
    service: str,
    route: str,
    series: dict[str, SeriesStats],
    window: timedelta,
    alert_state: AlertState | None,
) -> RouteResult:
    label = route if service in ("", route) else f"{route} ({service})"
    far = w.far_off_sessions.get((service, route), 0)
    rr = RouteResult(service, route, {}, w.sessions.get((service, route), 0), far)
    # the kernel's holdback of the app's writes is a server-side fact, said whatever the
    # divergence's verdict (its trap clause joins a divergence's sentence too)
    held = explain.holdback(series, explain.HOLD_NOTABLE_MS)
    # an LLM route says its server side in tokens, the engine's queue named
    llm = tokens.split_of(series)
    head = (tokens.sentence(llm) or None) if llm is not None else None
    gpu_route = w.gpu.get((service, route))
    rr.server = gpu.server_json(label, split_of(series), gpu_route, held, head)
    rr.server["llm"] = tokens.to_json(llm)
    # the pairs of the route: its most measured metric's server side
    most = max(
        (series[f"{m}:server"] for m in METRIC_ORDER if f"{m}:server" in series),
        key=lambda s: s.n,
        default=None,
    )
    rr.sampling = sampling.route_json(
        label,
        w.counts.get(service),
        most.n if most else 0,
        most.weight if most else 0.0,
        window.total_seconds(),
    )
    ctx = _Ctx(
        cfg, service, route, label, series, parts_json(series), far, alert_state, llm is not None
    )
    for metric in METRIC_ORDER:
        note = tokens.server_note(llm) if metric in _FIRST_TOKEN else ""
        m = _metric(ctx, metric, note)
        if m is not None:
            rr.metrics[metric] = m
    return rr


@dataclass(frozen=True, slots=True)
class _Ctx:
    """What every metric of one route is judged with."""

    cfg: SlaConfig
    service: str
    route: str
    label: str
    series: dict[str, SeriesStats]
    parts: dict[str, Any]
    far: int
    alert_state: AlertState | None
    in_tokens: bool  # an LLM route (its pairs read a stream dialect)


def _metric(c: _Ctx, metric: str, note: str) -> MetricResult | None:
    """One metric of a route: its numbers, interval, verdict and sentence (None when
    neither side was measured)."""
    series = c.series
    us, ss = series.get(f"{metric}:user"), series.get(f"{metric}:server")
    if us is None and ss is None:
        return None
    th = c.cfg.thresholds(c.service, c.route, metric)
    n = min(us.n if us else 0, ss.n if ss else 0)
    n_eff = min(us.n_eff if us else 0, ss.n_eff if ss else 0)
    u, s = _side(us), _side(ss)
    div = None if u["p95"] is None or s["p95"] is None else u["p95"] - s["p95"]
    if us is not None and ss is not None and n:
        ul, uh = _bounds(us)
        sl, sh = _bounds(ss)
        ci = stats.divergence_interval(ul, uh, sl, sh)
    else:
        ci = stats.Interval(None, None)
    # few effective samples is few samples, however many pairs they are
    verdict = stats.verdict(n_eff, ci, th.band_ms, th.min_samples)
    severity = "none"
    if verdict == stats.OUT:
        severity = "critical" if (div or 0) > 0 else "warning"
    ranked = explain.ranked_parts(metric, series)
    trap_list = (
        explain.traps(metric, series, div or 0.0, th.band_ms, c.far)
        if verdict == stats.OUT and (div or 0) > 0
        else []
    )
    fig = explain.Figures(
        u["p95"], s["p95"], div, ci.low, ci.high, n, n_eff, th.min_samples, th.band_ms
    )
    text = explain.sentence(
        c.label,
        metric,
        verdict,
        fig,
        ranked,
        [x for _, x in trap_list],
        note,
        c.in_tokens or metric not in explain.CHUNK_PHRASE,
    )
    return MetricResult(
        service=c.service,
        route=c.route,
        metric=metric,
        verdict=verdict,
        severity=severity,
        n=n,
        band_ms=th.band_ms,
        min_samples=th.min_samples,
        divergence_ms=div,
        ci_low_ms=ci.low,
        ci_high_ms=ci.high,
        user=u,
        server=s,
        parts=c.parts,
        ranked=ranked,
        traps=[t for t, _ in trap_list],
        sentence=text,
        alert_state=c.alert_state(c.service, c.route, metric) if c.alert_state else "inactive",
        n_eff=n_eff,
    )


def evaluate(
    source: SlaSource,
    cfg: SlaConfig,
    now: datetime,
    window: timedelta | None = None,
    alert_state: AlertState | None = None,
) -> Evaluation:
    """Summarize what changed, read the window, judge every route and metric."""
    win = window or timedelta(seconds=cfg.window_s)
    source.summarize(now, win)
    return evaluate_window(source.read_window(now, win), cfg, now, win, alert_state)
