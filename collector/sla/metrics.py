"""Prometheus gauges for teams that alert from Prometheus (served with the collector's
/metrics): divergence, interval, verdict, sample count per (service, route, metric)."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge

from collector.sla import stats
from collector.sla.evaluate import Evaluation

_L = ["service", "route", "metric"]


def _f(v: float | None) -> float:
    return math.nan if v is None else v


class SlaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = self.registry = registry
        self.divergence = Gauge(
            "parallax_sla_divergence_ms", "P95(user) − P95(server), ms", _L, registry=r
        )
        self.ci_low = Gauge(
            "parallax_sla_ci_low_ms", "95% CI low of the divergence", _L, registry=r
        )
        self.ci_high = Gauge(
            "parallax_sla_ci_high_ms", "95% CI high of the divergence", _L, registry=r
        )
        self.band = Gauge(
            "parallax_sla_band_ms", "The ± band of this route and metric", _L, registry=r
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
        self.firing = Gauge("parallax_sla_alert_firing", "1 while the alert fires", _L, registry=r)
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

    def update(self, ev: Evaluation, seconds: float) -> None:
        now_keys = set()
        for m in ev.results():
            k = (m.service, m.route, m.metric)
            now_keys.add(k)
            self.divergence.labels(*k).set(_f(m.divergence_ms))
            self.ci_low.labels(*k).set(_f(m.ci_low_ms))
            self.ci_high.labels(*k).set(_f(m.ci_high_ms))
            self.band.labels(*k).set(m.band_ms)
            self.samples.labels(*k).set(m.n)
            self.effective.labels(*k).set(m.n_eff)
            self.firing.labels(*k).set(1 if m.alert_state == "firing" else 0)
            for v in stats.VERDICTS:
                self.verdict.labels(*k, v).set(1 if v == m.verdict else 0)
        for k in self._seen - now_keys:  # routes gone from the window: drop their series
            for g in (
                self.divergence,
                self.ci_low,
                self.ci_high,
                self.band,
                self.samples,
                self.effective,
                self.firing,
            ):
                g.remove(*k)
            for v in stats.VERDICTS:
                self.verdict.remove(*k, v)
        self._seen = now_keys
        self.evaluations.inc()
        self.seconds.set(seconds)
