"""Alert states per (service, route, metric): inactive → pending → firing → resolved.

The condition has hysteresis so a route on the edge of the band does not flap: it turns on
when the verdict is ``out_of_band`` (the whole interval outside the band) and turns off only
when the verdict is ``ok`` or ``insufficient_data``, or the divergence is back within
band − hysteresis; in between (``uncertain`` near the edge) it keeps its last value. On top,
``for``: the condition must hold that long before ``pending`` becomes ``firing``. Every
change is logged, stored in ``sla_alerts`` with the numbers and the sentence, and handed to
the notifier (firing and resolved; Alertmanager gets ``endsAt`` on resolve).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from collector.sla import schema, stats
from collector.sla.config import SlaConfig
from collector.sla.evaluate import Evaluation, MetricResult

log = logging.getLogger("parallax.sla")

INACTIVE, PENDING, FIRING, RESOLVED = "inactive", "pending", "firing", "resolved"
Key = tuple[str, str, str]


@dataclass(slots=True)
class AlertState:
    key: Key
    state: str = INACTIVE
    since: datetime = field(default_factory=lambda: datetime.fromtimestamp(0, UTC))
    active: bool = False  # the hysteresis condition
    started: datetime | None = None  # firing since (Alertmanager startsAt)
    last_sent: datetime | None = None
    last: MetricResult | None = None


@dataclass(frozen=True, slots=True)
class Change:
    key: Key
    state: str
    previous: str
    time: datetime
    since: datetime
    result: MetricResult | None
    severity: str
    band_ms: float


class Alerts:
    def __init__(
        self,
        cfg: SlaConfig,
        record: Callable[[list[Change], str], None] | None = None,
        notify: Callable[[list[AlertState], datetime], None] | None = None,
        evaluator: str = "",
    ) -> None:
        self.cfg = cfg
        self.states: dict[Key, AlertState] = {}
        self.recent: list[Change] = []
        self._record = record
        self._notify = notify
        self.evaluator = evaluator

    def state_of(self, service: str, route: str, metric: str) -> str:
        st = self.states.get((service, route, metric))
        return st.state if st else INACTIVE

    def load(self, rows: list[tuple[Any, ...]]) -> None:
        """Resume from the store: (service, route, metric, state, since) of the latest change."""
        for service, route, metric, state, since in rows:
            k = (str(service), str(route), str(metric))
            since_dt = since if since.tzinfo else since.replace(tzinfo=UTC)
            self.states[k] = AlertState(
                k,
                state=str(state),
                since=since_dt,
                active=state in (PENDING, FIRING),
                started=since_dt if state == FIRING else None,
            )

    def _condition(self, st: AlertState, m: MetricResult | None) -> bool:
        if m is None or m.verdict in (stats.OK, stats.INSUFFICIENT):
            return False
        if m.verdict == stats.OUT:
            return True
        th = self.cfg.thresholds(*st.key)
        if m.divergence_ms is not None and abs(m.divergence_ms) <= th.band_ms - th.hysteresis_ms:
            return False
        return st.active  # uncertain near the edge: keep the last value

    def update(self, ev: Evaluation, now: datetime) -> list[Change]:
        results = {(m.service, m.route, m.metric): m for m in ev.results()}
        changes: list[Change] = []
        for k in set(results) | set(self.states):
            m = results.get(k)
            st = self.states.get(k)
            if st is None:
                if m is None or m.verdict != stats.OUT:
                    continue  # nothing to track
                st = self.states[k] = AlertState(k)
            if m is not None:
                st.last = m
            st.active = self._condition(st, m)
            th = self.cfg.thresholds(*k)
            prev = st.state
            new = prev
            if prev in (INACTIVE, RESOLVED) and st.active:
                new = FIRING if th.for_s <= 0 else PENDING
            elif prev == PENDING:
                if not st.active:
                    new = INACTIVE
                elif (now - st.since).total_seconds() >= th.for_s:
                    new = FIRING
            elif prev == FIRING and not st.active:
                new = RESOLVED
            if new != prev:
                st.state, st.since = new, now
                if new == FIRING:
                    st.started = now
                sev = st.last.severity if st.last and st.last.severity != "none" else "critical"
                ch = Change(k, new, prev, now, now, st.last, sev, th.band_ms)
                changes.append(ch)
                service, route, metric = k
                log.info(
                    "sla alert %s → %s: %s %s %s divergence %s ms (band ±%g) — %s",
                    prev,
                    new,
                    service,
                    route,
                    metric,
                    "?"
                    if not st.last or st.last.divergence_ms is None
                    else f"{st.last.divergence_ms:+.1f}",
                    th.band_ms,
                    st.last.sentence if st.last else "",
                )
            if m is not None:
                m.alert_state = st.state
        if changes:
            self.recent = (changes + self.recent)[:200]
            if self._record:
                try:
                    self._record(changes, self.evaluator)
                except Exception as e:  # noqa: BLE001 — a store hiccup must not stop alerting
                    log.warning("sla: could not store %d alert changes: %s", len(changes), e)
        to_send = [
            st
            for st in self.states.values()
            if (st.state == FIRING)
            or (
                st.state == RESOLVED
                and any(c.key == st.key and c.state == RESOLVED for c in changes)
            )
        ]
        if self._notify and to_send:
            self._notify(to_send, now)
        return changes

    def to_json(self) -> dict[str, Any]:
        current = [
            _state_json(st)
            for st in sorted(self.states.values(), key=lambda s: s.key)
            if st.state in (PENDING, FIRING)
        ]
        return {"current": current, "recent": [change_json(c) for c in self.recent]}


def _state_json(st: AlertState) -> dict[str, Any]:
    m = st.last
    return {
        "service": st.key[0],
        "route": st.key[1],
        "metric": st.key[2],
        "state": st.state,
        "since": st.since.isoformat(),
        "severity": (m.severity if m and m.severity != "none" else "critical"),
        "divergence_ms": None if not m or m.divergence_ms is None else round(m.divergence_ms, 2),
        "ci_low_ms": None if not m or m.ci_low_ms is None else round(m.ci_low_ms, 2),
        "ci_high_ms": None if not m or m.ci_high_ms is None else round(m.ci_high_ms, 2),
        "sentence": m.sentence if m else "",
    }


def change_json(c: Change) -> dict[str, Any]:
    m = c.result
    return {
        "time": c.time.isoformat(),
        "service": c.key[0],
        "route": c.key[1],
        "metric": c.key[2],
        "state": c.state,
        "previous": c.previous,
        "severity": c.severity,
        "verdict": m.verdict if m else None,
        "divergence_ms": None if not m or m.divergence_ms is None else round(m.divergence_ms, 2),
        "ci_low_ms": None if not m or m.ci_low_ms is None else round(m.ci_low_ms, 2),
        "ci_high_ms": None if not m or m.ci_high_ms is None else round(m.ci_high_ms, 2),
        "band_ms": c.band_ms,
        "n": m.n if m else 0,
        "sentence": m.sentence if m else "",
    }


ALERT_COLUMNS = [
    "time",
    "service",
    "route",
    "metric",
    "state",
    "previous",
    "severity",
    "verdict",
    "since",
    "divergence_ms",
    "ci_low_ms",
    "ci_high_ms",
    "band_ms",
    "n",
    "user_p95_ms",
    "server_p95_ms",
    "sentence",
    "evaluator",
]


def store_recorder(get_client: Callable[[], Any], db: str) -> Callable[[list[Change], str], None]:
    def record(changes: list[Change], evaluator: str) -> None:
        rows = []
        for c in changes:
            m = c.result
            rows.append(
                [
                    c.time,
                    c.key[0],
                    c.key[1],
                    c.key[2],
                    c.state,
                    c.previous,
                    c.severity,
                    m.verdict if m else "",
                    c.since,
                    m.divergence_ms if m else None,
                    m.ci_low_ms if m else None,
                    m.ci_high_ms if m else None,
                    c.band_ms,
                    m.n if m else 0,
                    m.user["p95"] if m else None,
                    m.server["p95"] if m else None,
                    m.sentence if m else "",
                    evaluator,
                ]
            )
        get_client().insert(f"{db}.{schema.ALERTS}", rows, column_names=ALERT_COLUMNS)

    return record


def load_states(get_client: Callable[[], Any], db: str) -> list[tuple[Any, ...]]:
    return list(
        get_client()
        .query(
            f"SELECT service, route, metric, argMax(state, time), max(time) "  # noqa: S608
            f"FROM {db}.{schema.ALERTS} GROUP BY service, route, metric"
        )
        .result_rows
    )


def load_recent(
    get_client: Callable[[], Any], db: str, since: timedelta, now: datetime
) -> list[dict[str, Any]]:
    r = get_client().query(
        f"SELECT time, service, route, metric, state, previous, severity, verdict, "  # noqa: S608
        f"divergence_ms, ci_low_ms, ci_high_ms, band_ms, n, sentence FROM {db}.{schema.ALERTS} "
        f"WHERE time >= {{t:DateTime64(3, 'UTC')}} ORDER BY time DESC LIMIT 200",
        parameters={"t": now - since},
    )
    out = []
    for row in r.result_rows:
        d = dict(zip(r.column_names, row, strict=True))
        t = d["time"]
        d["time"] = (t if t.tzinfo else t.replace(tzinfo=UTC)).isoformat()
        out.append(d)
    return out
