"""Alert lifecycle with a fake clock; a real HTTP server receives the Alertmanager calls."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from collector.sla import schema as sla_schema
from collector.sla.alerts import Alerts, AlertState, Change, load_states, store_recorder
from collector.sla.config import Receiver, SlaConfig, Thresholds
from collector.sla.evaluate import Evaluation, MetricResult, RouteResult
from collector.sla.metrics import SlaMetrics
from collector.sla.notify import Notifier

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


class _Receiver:
    def __init__(self, fail_first: int = 0) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_first = fail_first
        rec = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if rec.fail_first > 0:
                    rec.fail_first -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                rec.calls.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, n: int, timeout: float = 10.0) -> list[tuple[str, Any]]:
        end = time.monotonic() + timeout
        while len(self.calls) < n and time.monotonic() < end:
            time.sleep(0.02)
        return self.calls


@pytest.fixture
def am() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _ev(
    verdict: str, div: float, lo: float | None, hi: float | None, now: datetime, n: int = 800
) -> Evaluation:
    m = MetricResult(
        service="app",
        route="/v1/chat",
        metric="ttft",
        verdict=verdict,
        severity=("critical" if div > 0 else "warning") if verdict == "out_of_band" else "none",
        n=n,
        band_ms=15,
        min_samples=100,
        divergence_ms=div,
        ci_low_ms=lo,
        ci_high_ms=hi,
        user={"p50": 300.0, "p95": 341 + div, "p99": 500.0},
        server={"p50": 250.0, "p95": 341.0, "p99": 400.0},
        parts={},
        ranked=[],
        traps=[],
        sentence=f"/v1/chat: users receive the first token … ({div:+.0f} ms)",
    )
    ev = Evaluation(now, timedelta(minutes=5), now - timedelta(minutes=5), now)
    ev.routes.append(RouteResult("app", "/v1/chat", {"ttft": m}))
    return ev


OUT = ("out_of_band", 30.0, 22.0, 38.0)
EDGE_OUT = ("out_of_band", 17.0, 15.5, 18.5)
EDGE_UNCERTAIN = ("uncertain", 14.0, 11.0, 17.0)
OK = ("ok", 2.0, -3.0, 7.0)
NEG = ("out_of_band", -30.0, -38.0, -22.0)
FEW = ("insufficient_data", 30.0, None, None)


def test_lifecycle_pending_firing_no_flap_resolved(am: _Receiver) -> None:
    cfg = SlaConfig(
        defaults=Thresholds(band_ms=15, for_s=120, hysteresis_ms=3),
        alertmanager=Receiver(am.url, resend_s=60),
    )
    notifier = Notifier(cfg.alertmanager, None, first_backoff_s=0.05)
    notifier.start()
    stored: list[Change] = []
    alerts = Alerts(cfg, record=lambda ch, who: stored.extend(ch), notify=notifier.submit)
    now = T0
    seq = [OUT] * 9 + [EDGE_UNCERTAIN, EDGE_OUT, EDGE_UNCERTAIN, EDGE_OUT, EDGE_UNCERTAIN] + [OK]
    states = []
    for step in seq:
        ev = _ev(*step, now)
        alerts.update(ev, now)
        states.append(alerts.state_of("app", "/v1/chat", "ttft"))
        now += timedelta(seconds=15)
    # pending for `for` (2 min = 8 evaluations at 15 s), firing at 120 s, no flap, resolved
    assert states[:8] == ["pending"] * 8
    assert states[8:14] == ["firing"] * 6
    assert states[14] == "resolved"
    assert [(c.previous, c.state) for c in stored] == [
        ("inactive", "pending"),
        ("pending", "firing"),
        ("firing", "resolved"),
    ]
    fired_at, resolved_at = T0 + timedelta(seconds=120), T0 + timedelta(seconds=14 * 15)
    calls = am.wait(2)
    notifier.stop()
    assert all(path == "/api/v2/alerts" for path, _ in calls)
    first, last = calls[0][1][0], calls[-1][1][0]
    assert first["labels"] == {
        "alertname": "ParallaxSLADivergence",
        "service": "app",
        "route": "/v1/chat",
        "metric": "ttft",
        "severity": "critical",
    }
    assert first["annotations"]["divergence_ms"] == "30.0"
    assert "users receive the first token" in first["annotations"]["summary"]
    assert datetime.fromisoformat(first["startsAt"]) == fired_at
    assert datetime.fromisoformat(first["endsAt"]) > fired_at  # still firing
    assert datetime.fromisoformat(last["startsAt"]) == fired_at
    assert datetime.fromisoformat(last["endsAt"]) == resolved_at  # endsAt on resolve
    # re-sent while firing: once every `resend` (60 s of the fake clock is not waited for
    # here; the notifier uses its own monotonic clock), so exactly firing + resolve
    assert len(calls) == 2


def test_pending_that_clears_goes_back_to_inactive_without_notifying(am: _Receiver) -> None:
    cfg = SlaConfig(defaults=Thresholds(for_s=120), alertmanager=Receiver(am.url))
    notifier = Notifier(cfg.alertmanager, None)
    notifier.start()
    alerts = Alerts(cfg, notify=notifier.submit)
    alerts.update(_ev(*OUT, T0), T0)
    assert alerts.state_of("app", "/v1/chat", "ttft") == "pending"
    alerts.update(_ev(*OK, T0 + timedelta(seconds=15)), T0 + timedelta(seconds=15))
    assert alerts.state_of("app", "/v1/chat", "ttft") == "inactive"
    time.sleep(0.3)
    notifier.stop()
    assert am.calls == []


def test_failing_receiver_is_retried_and_never_blocks_evaluation() -> None:
    flaky = _Receiver(fail_first=2)
    cfg = SlaConfig(
        defaults=Thresholds(for_s=0),
        alertmanager=Receiver(flaky.url),
        webhook=Receiver("http://127.0.0.1:9"),
    )
    notifier = Notifier(cfg.alertmanager, cfg.webhook, max_attempts=4, first_backoff_s=0.05)
    notifier.start()
    alerts = Alerts(cfg, notify=notifier.submit)
    t = time.perf_counter()
    alerts.update(_ev(*OUT, T0), T0)
    assert time.perf_counter() - t < 0.5  # delivery is off the evaluation path
    assert alerts.state_of("app", "/v1/chat", "ttft") == "firing"
    calls = flaky.wait(1)
    assert len(calls) == 1 and calls[0][1][0]["labels"]["route"] == "/v1/chat"
    end = time.monotonic() + 5
    while notifier.failed < 1 and time.monotonic() < end:  # the dead webhook gives up
        time.sleep(0.05)
    notifier.stop()
    flaky.server.shutdown()
    flaky.server.server_close()
    assert notifier.failed == 1 and notifier.sent == 1


def test_webhook_gets_the_same_alert_objects(am: _Receiver) -> None:
    cfg = SlaConfig(defaults=Thresholds(for_s=0), webhook=Receiver(am.url + "/hook"))
    notifier = Notifier(None, cfg.webhook)
    notifier.start()
    Alerts(cfg, notify=notifier.submit).update(_ev(*OUT, T0), T0)
    calls = am.wait(1)
    notifier.stop()
    assert calls[0][0] == "/hook"
    assert calls[0][1]["alerts"][0]["labels"]["metric"] == "ttft"


def test_alerts_link_the_route_dashboard_when_grafana_is_configured(am: _Receiver) -> None:
    """Alertmanager and the webhook both get the annotation (the webhook's objects are the
    same); Alertmanager's generatorURL points there too (its UI's "Source" link)."""
    cfg = SlaConfig(
        defaults=Thresholds(for_s=0),
        alertmanager=Receiver(am.url),
        webhook=Receiver(am.url + "/hook"),
        grafana_url="https://ops.example/grafana",
    )
    notifier = Notifier(cfg.alertmanager, cfg.webhook, grafana_url=cfg.grafana_url)
    notifier.start()
    Alerts(cfg, notify=notifier.submit).update(_ev(*OUT, T0), T0)
    calls = am.wait(2)
    notifier.stop()
    by_path = {path: body for path, body in calls}
    sent = [by_path["/api/v2/alerts"][0], by_path["/hook"]["alerts"][0]]
    for a in sent:
        link = a["annotations"]["dashboard"]
        assert link.startswith("https://ops.example/grafana/d/parallax-route?")
        assert "var-route=%2Fv1%2Fchat" in link and "var-metric=ttft" in link
        assert "var-band=15" in link and "to=now" in link
        assert a["generatorURL"] == link


def test_firing_alert_is_re_sent_until_resolved(am: _Receiver) -> None:
    cfg = SlaConfig(defaults=Thresholds(for_s=0), alertmanager=Receiver(am.url, resend_s=0.2))
    notifier = Notifier(cfg.alertmanager, None)
    notifier.start()
    alerts = Alerts(cfg, notify=notifier.submit)
    now = T0
    for _ in range(4):  # four evaluations 0.25 s apart while firing: each one re-sends
        alerts.update(_ev(*OUT, now), now)
        now += timedelta(seconds=15)
        time.sleep(0.25)
    alerts.update(_ev(*OK, now), now)
    calls = am.wait(5)
    notifier.stop()
    assert len(calls) == 5
    ends = [datetime.fromisoformat(c[1][0]["endsAt"]) for c in calls]
    starts = {c[1][0]["startsAt"] for c in calls}
    assert starts == {T0.isoformat()}
    assert all(e > T0 for e in ends[:4]) and ends[4] == now


def test_severity_change_and_insufficient_data_survive_a_restart(
    chdb_store: tuple[Any, Path],
) -> None:
    """The states and their severities go to sla_alerts; a restarted checker resumes the
    live instance (the severity change's two rows share one instant), and resolves it with
    the labels it fired with."""
    client = chdb_store[0]
    db = "alerts_restart"
    client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    sla_schema.ensure(client, db)
    cfg = SlaConfig(defaults=Thresholds(for_s=0))
    sent: list[tuple[str, str, str, str]] = []

    def notify(states: list[AlertState], now: datetime) -> None:
        sent.extend(
            (st.state, st.severity, st.superseded_by, st.started.isoformat())
            for st in states
            if st.started
        )

    rec = store_recorder(lambda: client, db)
    a = Alerts(cfg, record=rec, notify=notify)
    t = [T0 + timedelta(seconds=15 * i) for i in range(6)]
    a.update(_ev(*NEG, t[0]), t[0])  # a warning fires at once (for: 0)
    a.update(_ev(*OUT, t[1]), t[1])  # escalates: the warning resolves, a critical fires
    assert [(c.previous, c.state, c.severity) for c in a.recent[:2]] == [
        ("resolved", "firing", "critical"),
        ("firing", "resolved", "warning"),
    ]
    assert ("resolved", "warning", "critical", t[0].isoformat()) in sent
    assert ("firing", "critical", "", t[1].isoformat()) in sent
    a.update(_ev(*FEW, t[2], n=40), t[2])  # a traffic dip: held, not resolved
    assert a.state_of("app", "/v1/chat", "ttft") == "insufficient_data"
    (cur,) = a.to_json()["current"]
    assert cur["state"] == "insufficient_data" and cur["severity"] == "critical"
    assert cur["sentence"].startswith("Insufficient data since 2026-11-29 10:00:30 UTC")
    assert cur["divergence_ms"] == 30.0 and cur["judged_at"] == t[1].isoformat()

    b = Alerts(cfg, record=rec, notify=notify)  # a restart
    b.load(load_states(lambda: client, db))
    st = b.states[("app", "/v1/chat", "ttft")]
    assert (st.state, st.severity, st.started, st.since) == (
        "insufficient_data",
        "critical",
        t[1],
        t[2],
    )
    b.update(_ev(*FEW, t[3], n=40), t[3])
    b.update(Evaluation(t[4], timedelta(minutes=5), t[4], t[4]), t[4])  # no pairs at all
    assert b.state_of("app", "/v1/chat", "ttft") == "insufficient_data"
    (cur,) = b.to_json()["current"]  # what the window has now, the numbers judged before
    assert "/v1/chat: no paired requests in the window." in cur["sentence"]
    assert cur["divergence_ms"] is None  # the restart lost the judged numbers: none shown
    sent.clear()
    b.update(_ev(*OK, t[5]), t[5])
    assert sent == [("resolved", "critical", "", t[1].isoformat())]
    rows = client.query(
        f"SELECT state, severity FROM {db}.sla_alerts ORDER BY time, state"
    ).result_rows
    assert {sev for _, sev in rows} == {"warning", "critical"}


def test_a_pending_alert_without_data_or_of_the_other_severity_starts_over() -> None:
    cfg = SlaConfig(defaults=Thresholds(for_s=30))
    a = Alerts(cfg)
    t = [T0 + timedelta(seconds=15 * i) for i in range(7)]
    a.update(_ev(*OUT, t[0]), t[0])
    a.update(_ev(*FEW, t[1], n=40), t[1])
    assert a.state_of("app", "/v1/chat", "ttft") == "inactive"  # nothing was announced
    a.update(_ev(*OUT, t[2]), t[2])
    a.update(_ev(*NEG, t[3]), t[3])  # the other severity: a new claim, `for` afresh
    assert (
        a.state_of("app", "/v1/chat", "ttft"),
        a.states[("app", "/v1/chat", "ttft")].severity,
    ) == ("pending", "warning")
    a.update(_ev(*NEG, t[4]), t[4])
    assert a.state_of("app", "/v1/chat", "ttft") == "pending"
    a.update(_ev(*NEG, t[5]), t[5])
    assert a.state_of("app", "/v1/chat", "ttft") == "firing"
    assert [(c.state, c.severity) for c in reversed(a.recent)] == [
        ("pending", "critical"),
        ("inactive", "critical"),
        ("pending", "critical"),
        ("inactive", "critical"),
        ("pending", "warning"),
        ("firing", "warning"),
    ]


def test_gauges_show_the_alert_with_its_severity_and_state() -> None:
    """parallax_sla_alert: one series per live instance; a held alert stays shown when its
    route has left the window; gone once resolved (absent, not 0)."""
    reg = CollectorRegistry()
    metrics = SlaMetrics(reg)
    a = Alerts(SlaConfig(defaults=Thresholds(for_s=0)))
    labels = 'metric="ttft",route="/v1/chat",service="app"'
    t = [T0 + timedelta(seconds=15 * i) for i in range(3)]
    ev = _ev(*OUT, t[0])
    a.update(ev, t[0])
    metrics.update(ev, 0.1, a.states.values())
    text = generate_latest(reg).decode()
    assert f'parallax_sla_alert{{{labels},severity="critical",state="firing"}} 1.0' in text
    assert f"parallax_sla_divergence_seconds{{{labels}}} 0.03" in text
    ev = Evaluation(t[1], timedelta(minutes=5), t[1], t[1])
    a.update(ev, t[1])
    metrics.update(ev, 0.1, a.states.values())
    text = generate_latest(reg).decode()
    assert (
        f'parallax_sla_alert{{{labels},severity="critical",state="insufficient_data"}} 1.0' in text
    )
    assert f"parallax_sla_alert_firing{{{labels}}} 1.0" in text
    assert "parallax_sla_divergence_seconds{" not in text  # not in the window: no value
    ev = _ev(*OK, t[2])
    a.update(ev, t[2])
    metrics.update(ev, 0.1, a.states.values())
    text = generate_latest(reg).decode()
    assert "parallax_sla_alert{" not in text
    assert f"parallax_sla_alert_firing{{{labels}}} 0.0" in text
