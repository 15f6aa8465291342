"""Alert delivery: Alertmanager's API (``POST /api/v2/alerts``) and/or a plain webhook.

Off the evaluation path: ``submit`` only queues; a worker thread sends with retries and
exponential backoff, so a slow or failing receiver never delays or stops evaluation. While
an alert fires it is re-sent every ``resend`` (Alertmanager forgets alerts whose ``endsAt``
passes; ours is set a few resends ahead) and at once when its state changes (to or from
insufficient data); on resolve it is sent once with ``endsAt`` = now and the label set it
fired with — a severity change is the resolve of one alert and the firing of another, sent
together (docs/sla.md, "Alerts").

With a Grafana base URL configured (``grafana: {url: …}``), every alert carries the link to
its route's dashboard (annotation ``dashboard``, and ``generatorURL`` unless one is given):
the route, the metric and the band selected, the time range from an hour before it fired to
now (to ten minutes after the resolve, once resolved). The dashboard's uid and variable names
below are the contract with dashboards/route.py, which builds the dashboard from them.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from collector.sla.alerts import INSUFFICIENT, RESOLVED, AlertState, insufficient_sentence
from collector.sla.config import Receiver

log = logging.getLogger("parallax.sla")

ALERTNAME = "ParallaxSLADivergence"
# The route dashboard (dashboards/parallax-route.json) and the variables a link sets.
ROUTE_DASHBOARD_UID = "parallax-route"
LINK_VARS = ("service", "route", "metric", "band")
LINK_BEFORE = timedelta(hours=1)  # context before the alert fired: the baseline it left
LINK_AFTER_RESOLVE = timedelta(minutes=10)


def _ms(t: datetime) -> str:
    return str(int(t.timestamp() * 1000))


def dashboard_link(grafana_url: str, st: AlertState, now: datetime) -> str:
    """The route dashboard for this alert: its route and metric, its band, its time range."""
    service, route, metric = st.key
    m = st.last
    params = {
        "from": _ms((st.started or st.since) - LINK_BEFORE),
        "to": _ms(now + LINK_AFTER_RESOLVE) if st.state == RESOLVED else "now",
        "var-service": service,
        "var-route": route,
        "var-metric": metric,
    }
    if m is not None:
        params["var-band"] = f"{m.band_ms:g}"
    return f"{grafana_url}/d/{ROUTE_DASHBOARD_UID}?{urlencode(params)}"


def alert_object(
    st: AlertState,
    now: datetime,
    resend_s: float,
    generator_url: str = "",
    grafana_url: str = "",
) -> dict[str, Any]:
    """One alert for Alertmanager's API: the instance's label set (its severity included),
    the numbers of the latest judged window as annotations, ``endsAt`` now on resolve."""
    service, route, metric = st.key
    held = st.state == INSUFFICIENT
    m = st.judged if held and st.judged is not None else st.last
    ends = now if st.state == RESOLVED else now + timedelta(seconds=4 * resend_s)
    ann: dict[str, str] = {
        "summary": insufficient_sentence(st) if held else (m.sentence if m else ""),
        "description": (
            f"P95(user) − P95(server) for {metric} on {route} ({service}) left the "
            f"±{m.band_ms:g} ms band"
            if m
            else ""
        ),
    }
    if m and m.divergence_ms is not None:
        ann["divergence_ms"] = f"{m.divergence_ms:.1f}"
        ann["ci_ms"] = (
            f"{'' if m.ci_low_ms is None else f'{m.ci_low_ms:.1f}'}…"
            f"{'' if m.ci_high_ms is None else f'{m.ci_high_ms:.1f}'}"
        )
        ann["user_p95_ms"] = f"{(m.user['p95'] or 0):.1f}"
        ann["server_p95_ms"] = f"{(m.server['p95'] or 0):.1f}"
    if st.judged_at is not None:
        ann["judged_at"] = st.judged_at.isoformat()  # the window these numbers come from
    if held:
        ann["insufficient_data_since"] = st.since.isoformat()
    if st.superseded_by:
        ann["superseded_by"] = st.superseded_by
    if grafana_url:
        ann["dashboard"] = dashboard_link(grafana_url, st, now)
        generator_url = generator_url or ann["dashboard"]
    obj: dict[str, Any] = {
        "labels": {
            "alertname": ALERTNAME,
            "service": service,
            "route": route,
            "metric": metric,
            "severity": st.severity,
        },
        "annotations": ann,
        "startsAt": (st.started or st.since).isoformat(),
        "endsAt": ends.isoformat(),
    }
    if generator_url:
        obj["generatorURL"] = generator_url
    return obj


class Notifier:
    def __init__(
        self,
        alertmanager: Receiver | None,
        webhook: Receiver | None,
        max_attempts: int = 5,
        first_backoff_s: float = 0.5,
        generator_url: str = "",
        grafana_url: str = "",
    ) -> None:
        self.am, self.hook = alertmanager, webhook
        self.max_attempts, self.first_backoff_s = max_attempts, first_backoff_s
        self.generator_url = generator_url
        self.grafana_url = grafana_url
        self._q: queue.Queue[tuple[Receiver, str, bytes] | None] = queue.Queue(maxsize=1000)
        # per instance (key + severity): when it was last sent, in which state and since when
        self._last_sent: dict[tuple[str, str, str, str], tuple[float, str, datetime]] = {}
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.failed = 0

    @property
    def enabled(self) -> bool:
        return self.am is not None or self.hook is not None

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sla-notify", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout_s)
            self._thread = None

    def submit(self, states: list[AlertState], now: datetime) -> None:
        """Queue the resolved alerts, and the active ones that are new, changed state (e.g.
        to insufficient data) or are due for their re-send."""
        if not self.enabled:
            return
        resend = min(r.resend_s for r in (self.am, self.hook) if r is not None)
        due = []
        mono = time.monotonic()
        for st in states:
            instance = (*st.key, st.severity)
            sent = self._last_sent.get(instance)
            if st.state == RESOLVED:
                self._last_sent.pop(instance, None)
            elif sent is not None and sent[1:] == (st.state, st.since) and mono - sent[0] < resend:
                continue
            else:
                self._last_sent[instance] = (mono, st.state, st.since)
            due.append(alert_object(st, now, resend, self.generator_url, self.grafana_url))
        if not due:
            return
        for r, path, body in self._requests(due):
            try:
                self._q.put_nowait((r, path, body))
            except queue.Full:
                log.warning("sla: notification queue full; dropped one delivery to %s", r.url)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued delivery is done (sent or given up); False on timeout."""
        end = time.monotonic() + timeout_s
        while self._q.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)
        return not self._q.unfinished_tasks

    def _requests(self, alerts: list[dict[str, Any]]) -> list[tuple[Receiver, str, bytes]]:
        out = []
        if self.am is not None:
            out.append((self.am, "/api/v2/alerts", json.dumps(alerts).encode()))
        if self.hook is not None:
            out.append((self.hook, "", json.dumps({"alerts": alerts}).encode()))
        return out

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                r, path, body = item
                self._deliver(r, r.url + path, body)
            finally:
                self._q.task_done()

    def _deliver(self, r: Receiver, url: str, body: bytes) -> None:
        delay = self.first_backoff_s
        for attempt in range(1, self.max_attempts + 1):
            req = urllib.request.Request(  # noqa: S310 — the URL is validated http(s) config
                url,
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", **r.headers},
            )
            try:
                with urllib.request.urlopen(req, timeout=r.timeout_s) as resp:  # noqa: S310
                    resp.read()
                self.sent += 1
                return
            except (urllib.error.URLError, OSError, TimeoutError) as e:
                if attempt == self.max_attempts:
                    self.failed += 1
                    log.warning("sla: delivery to %s failed after %d attempts: %s", url, attempt, e)
                    return
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
