"""Alert states per (service, route, metric): inactive → pending → firing → resolved, and
``insufficient_data`` while a firing alert cannot be judged.

The condition has hysteresis so a route on the edge of the band does not flap: it turns on
when the verdict is ``out_of_band`` (the whole interval outside the band) and turns off only
when the verdict is ``ok`` or the divergence is back within band − hysteresis; in between
(``uncertain`` near the edge) it keeps its last value. On top, ``for``: the condition must
hold that long before ``pending`` becomes ``firing``.

An alert instance has one label set from its first pending to its resolve: its severity is
that of the ``out_of_band`` verdict that started it (critical: users wait longer; warning:
the other way). A verdict of the other severity ends the instance and starts a new one —
while firing, the old one resolves and the new one fires at once (the route has been out of
band for ``for`` already); while pending, the new one starts pending (nothing was sent).

Too few samples is not health: while firing, an evaluation without enough paired requests
(``insufficient_data``, or none at all) moves the alert to ``insufficient_data`` — still
active in Alertmanager, its annotations saying since when nothing could be judged — never to
``resolved``. A pending alert without data goes back to ``inactive`` (nothing was announced).

Every change is logged, stored in ``sla_alerts`` with the numbers and the sentence, and
handed to the notifier with the alerts to (re)send (collector/sla/notify.py).
"""

from __future__ import annotations

import dataclasses
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
INSUFFICIENT = stats.INSUFFICIENT  # firing, but the window has too few pairs to judge
ACTIVE = (FIRING, INSUFFICIENT)  # active in Alertmanager
LIVE = (PENDING, *ACTIVE)
Key = tuple[str, str, str]


@dataclass(slots=True)
class AlertState:
    key: Key
    state: str = INACTIVE
    since: datetime = field(default_factory=lambda: datetime.fromtimestamp(0, UTC))
    active: bool = False  # the hysteresis condition
    started: datetime | None = None  # firing since (Alertmanager startsAt)
    severity: str = ""  # the instance's label, fixed from its first pending to its resolve
    last: MetricResult | None = None  # the latest evaluation's result (any verdict)
    judged: MetricResult | None = None  # the latest result with enough data
    judged_at: datetime | None = None
    superseded_by: str = ""  # on a resolve: the severity of the instance that replaced it


@dataclass(frozen=True, slots=True)
class Change:
    key: Key
    state: str
    previous: str
    time: datetime
    since: datetime  # the instance's start: its firing time once it fired, else its pending
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
        """Resume from the store (``load_states``): per key the latest change's state,
        severity, instance start and time."""
        for service, route, metric, _, state, severity, started, at in rows:
            k = (str(service), str(route), str(metric))
            at_dt, started_dt = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in (at, started))
            live = state in LIVE
            self.states[k] = AlertState(
                k,
                state=str(state),
                since=at_dt,
                active=live,
                started=started_dt if state in ACTIVE else None,
                severity=str(severity) if live else "",
            )

    def _condition(self, st: AlertState, m: MetricResult) -> bool:
        """The hysteresis condition on a judged result (enough data)."""
        if m.verdict == stats.OK:
            return False
        if m.verdict == stats.OUT:
            return True
        th = self.cfg.thresholds(*st.key)
        if m.divergence_ms is not None and abs(m.divergence_ms) <= th.band_ms - th.hysteresis_ms:
            return False
        return st.active  # uncertain near the edge: keep the last value

    def _move(self, st: AlertState, new: str, now: datetime, changes: list[Change]) -> None:
        prev, pending_since = st.state, st.since
        st.state, st.since = new, now
        if new == FIRING and prev != INSUFFICIENT:
            st.started = now
        th = self.cfg.thresholds(*st.key)
        if new == PENDING:
            start = now
        elif new == INACTIVE:
            start = pending_since
        else:
            start = st.started or now
        changes.append(Change(st.key, new, prev, now, start, st.last, st.severity, th.band_ms))
        m = st.last
        service, route, metric = st.key
        log.info(
            "sla alert %s → %s (%s): %s %s %s divergence %s ms (band ±%g) — %s",
            prev,
            new,
            st.severity,
            service,
            route,
            metric,
            "?" if not m or m.divergence_ms is None else f"{m.divergence_ms:+.1f}",
            th.band_ms,
            m.sentence if m else "no paired requests in the window",
        )

    def _start(self, st: AlertState, m: MetricResult, now: datetime, ch: list[Change]) -> None:
        """A new instance with the verdict's severity: pending, or firing when ``for`` is 0."""
        st.severity, st.superseded_by, st.started = m.severity, "", None
        self._move(st, FIRING if self.cfg.thresholds(*st.key).for_s <= 0 else PENDING, now, ch)

    def update(self, ev: Evaluation, now: datetime) -> list[Change]:
        results = {(m.service, m.route, m.metric): m for m in ev.results()}
        changes: list[Change] = []
        ended: list[AlertState] = []  # instances resolved in this round, as they ended
        for k in sorted(set(results) | set(self.states)):
            m = results.get(k)
            st = self.states.get(k)
            if st is None:
                if m is None or m.verdict != stats.OUT:
                    continue  # nothing to track
                st = self.states[k] = AlertState(k)
            st.last = m  # None: no pairs in the window at all
            if m is None or m.verdict == stats.INSUFFICIENT:
                # too few pairs (or none): nothing can be judged, so nothing is resolved
                if st.state == FIRING:
                    self._move(st, INSUFFICIENT, now, changes)
                elif st.state == PENDING:
                    st.active = False
                    self._move(st, INACTIVE, now, changes)
            else:
                st.judged, st.judged_at = m, now
                st.active = self._condition(st, m)
                other = m.verdict == stats.OUT and m.severity != st.severity
                if st.state in (INACTIVE, RESOLVED):
                    if st.active and m.verdict == stats.OUT:
                        self._start(st, m, now, changes)
                elif not st.active:
                    self._move(st, INACTIVE if st.state == PENDING else RESOLVED, now, changes)
                    if st.state == RESOLVED:
                        ended.append(dataclasses.replace(st))
                elif other and st.state == PENDING:
                    self._move(st, INACTIVE, now, changes)
                    self._start(st, m, now, changes)  # `for` counts the new claim afresh
                elif other:
                    self._move(st, RESOLVED, now, changes)
                    ended.append(dataclasses.replace(st, superseded_by=m.severity))
                    st.severity = m.severity
                    self._move(st, FIRING, now, changes)
                elif st.state == INSUFFICIENT:
                    self._move(st, FIRING, now, changes)  # judged again, the condition holds
                elif (
                    st.state == PENDING
                    and (now - st.since).total_seconds() >= self.cfg.thresholds(*k).for_s
                ):
                    self._move(st, FIRING, now, changes)
            if m is not None:
                m.alert_state = st.state
        if changes:
            self.recent = (changes[::-1] + self.recent)[:200]
            if self._record:
                try:
                    self._record(changes, self.evaluator)
                except Exception as e:  # noqa: BLE001 — a store hiccup must not stop alerting
                    log.warning("sla: could not store %d alert changes: %s", len(changes), e)
        live = [st for st in self.states.values() if st.state in ACTIVE]
        if self._notify and (live or ended):
            self._notify(ended + live, now)
        return changes

    def to_json(self) -> dict[str, Any]:
        current = [
            _state_json(st)
            for st in sorted(self.states.values(), key=lambda s: s.key)
            if st.state in LIVE
        ]
        return {"current": current, "recent": [change_json(c) for c in self.recent]}


def insufficient_sentence(st: AlertState) -> str:
    """What an alert held for lack of data says: since when, what the window has, and the
    last judgement its numbers come from."""
    m = st.last
    now_says = (
        m.sentence
        if m is not None and m.verdict == stats.INSUFFICIENT
        else f"{st.key[1]}: no paired requests in the window"
    )
    last = (
        f" Last judged at {st.judged_at:%Y-%m-%d %H:%M:%S} UTC: {st.judged.sentence}"
        if st.judged is not None and st.judged_at is not None
        else ""
    )
    return (
        f"Insufficient data since {st.since:%Y-%m-%d %H:%M:%S} UTC: the alert stays firing "
        f"until the divergence can be judged again. {now_says.rstrip('.')}.{last}"
    )


def _state_json(st: AlertState) -> dict[str, Any]:
    m = st.judged if st.state == INSUFFICIENT and st.judged is not None else st.last
    return {
        "service": st.key[0],
        "route": st.key[1],
        "metric": st.key[2],
        "state": st.state,
        "since": st.since.isoformat(),
        "severity": st.severity,
        "divergence_ms": None if not m or m.divergence_ms is None else round(m.divergence_ms, 2),
        "ci_low_ms": None if not m or m.ci_low_ms is None else round(m.ci_low_ms, 2),
        "ci_high_ms": None if not m or m.ci_high_ms is None else round(m.ci_high_ms, 2),
        "judged_at": None if st.judged_at is None else st.judged_at.isoformat(),
        "sentence": insufficient_sentence(st)
        if st.state == INSUFFICIENT
        else (m.sentence if m else ""),
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
    """Per key, the latest change: (service, route, metric, state, severity, since, time).
    A severity change writes two rows at one instant (the old instance's resolve, the new
    one's firing): the live row wins the tie."""
    return list(
        get_client()
        .query(
            "SELECT service, route, metric, "  # noqa: S608
            "argMax(tuple(state, severity, since), (time, state != 'resolved')) AS last, "
            f"last.1, last.2, last.3, max(time) FROM {db}.{schema.ALERTS} "
            "GROUP BY service, route, metric"
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
