"""Prometheus series for teams that alert from Prometheus (served with the collector's
/metrics): divergence, interval, band (seconds), verdict, sample count per (service, route,
metric), and the checker's alerts with their severity and state (deploy/prometheus/ holds
the rules that read them)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from collector.sla import stats
from collector.sla.alerts import ACTIVE, LIVE, AlertState
from collector.sla.evaluate import Evaluation

_L = ["service", "route", "metric"]


def _s(ms: float | None) -> float:
    """Milliseconds (the checker's unit) → seconds (Prometheus' base unit); None → NaN."""
    return math.nan if ms is None else ms / 1000.0


class SlaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = self.registry = registry
        self.divergence = Gauge(
            "parallax_sla_divergence_seconds",
            "P95(user) − P95(server) over the window (NaN: a side not measured)",
            _L,
            registry=r,
        )
        self.ci_low = Gauge(
            "parallax_sla_ci_low_seconds",
            "Low end of the divergence's 95% interval (NaN: unbounded)",
            _L,
            registry=r,
        )
        self.ci_high = Gauge(
            "parallax_sla_ci_high_seconds",
            "High end of the divergence's 95% interval (NaN: unbounded)",
            _L,
            registry=r,
        )
        self.band = Gauge(
            "parallax_sla_band_seconds",
            "The ± band of this route and metric",
            _L,
            registry=r,
        )
        self.verdict = Gauge(
            "parallax_sla_verdict", "1 for the current verdict", [*_L, "verdict"], registry=r
        )
        self.samples = Gauge(
            "parallax_sla_samples", "Paired requests in the window", _L, registry=r
        )
        self.effective = Gauge(
            "parallax_sla_effective_samples",
            "Effective sample size of the window's P95s: below the paired requests when the "
            "agent's sampling weighs them unequally (the verdict needs it ≥ min_samples)",
            _L,
            registry=r,
        )
        self.firing = Gauge(
            "parallax_sla_alert_firing",
            "1 while the alert is active in Alertmanager (firing, or held firing for lack of "
            "data), 0 otherwise",
            _L,
            registry=r,
        )
        self.alert = Gauge(
            "parallax_sla_alert",
            "1 per alert instance pending, firing or held firing for lack of data "
            "(state=insufficient_data), with the severity it fired with; absent otherwise",
            [*_L, "severity", "state"],
            registry=r,
        )
        self.evaluator = Gauge(
            "parallax_sla_is_evaluator",
            "1 when this collector holds the evaluation lease",
            registry=r,
        )
        self.evaluations = Counter("parallax_sla_evaluations", "Evaluations run", registry=r)
        self.errors = Counter(
            "parallax_sla_evaluation_errors", "Evaluations that failed", registry=r
        )
        self.seconds = Gauge(
            "parallax_sla_evaluation_seconds", "Duration of the last evaluation", registry=r
        )
        self._seen: set[tuple[str, str, str]] = set()
        self._shown: set[tuple[str, str, str]] = set()
        self._alerts: set[tuple[str, str, str, str, str]] = set()

    def update(self, ev: Evaluation, seconds: float, alerts: Iterable[AlertState] = ()) -> None:
        states = {st.key: st for st in alerts}
        now_keys = set()
        for m in ev.results():
            k = (m.service, m.route, m.metric)
            now_keys.add(k)
            self.divergence.labels(*k).set(_s(m.divergence_ms))
            self.ci_low.labels(*k).set(_s(m.ci_low_ms))
            self.ci_high.labels(*k).set(_s(m.ci_high_ms))
            self.band.labels(*k).set(m.band_ms / 1000.0)
            self.samples.labels(*k).set(m.n)
            self.effective.labels(*k).set(m.n_eff)
            for v in stats.VERDICTS:
                self.verdict.labels(*k, v).set(1 if v == m.verdict else 0)
        # an alert held for lack of data may have no route in the window: it stays shown
        shown = now_keys | {k for k, st in states.items() if st.state in ACTIVE}
        for k in shown:
            st = states.get(k)
            self.firing.labels(*k).set(1 if st is not None and st.state in ACTIVE else 0)
        for k in self._shown - shown:
            self.firing.remove(*k)
        for k in self._seen - now_keys:  # routes gone from the window: drop their series
            for g in (
                self.divergence,
                self.ci_low,
                self.ci_high,
                self.band,
                self.samples,
                self.effective,
            ):
                g.remove(*k)
            for v in stats.VERDICTS:
                self.verdict.remove(*k, v)
        live = {(*st.key, st.severity, st.state) for st in states.values() if st.state in LIVE}
        for a in live:
            self.alert.labels(*a).set(1)
        for a in self._alerts - live:
            self.alert.remove(*a)
        self._alerts = live
        self._seen, self._shown = now_keys, shown
        self.evaluations.inc()
        self.seconds.set(seconds)
