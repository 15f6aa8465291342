"""Scripted alert lifecycles: the real SLA service, on a store of generated pairs and a
scripted clock, notifying a real Alertmanager; after each step, what Alertmanager shows.

One route per lifecycle, every route evaluated in the same rounds. A script is a list of
steps, each one evaluation two minutes of the scripted clock after the last (the window is
one minute, so a step sees its own pairs only; ``for`` is one step): ``critical`` (pairs
+40 ms out of band), ``warning`` (−40 ms), ``ok`` (0 ms), ``dip`` (30 pairs, fewer than
``min_samples``) and ``gone`` (no pairs at all).

``Expected`` states the issue's rules at the script's level — what Alertmanager must show —
independently of the checker's state machine: an alert fires on its second out-of-band step
of one severity, a severity change while firing replaces the alert (the old one resolved),
``ok`` resolves it, a dip or no data leaves it firing and says so.

The scripted clock runs behind the wall clock (Alertmanager's): it starts ``behind`` before
now, so a resolve's ``endsAt`` (the scripted now) is in Alertmanager's past at once, and
``resend`` is long enough that a firing alert's ``endsAt`` (4 × resend ahead) is in its
future — as both are in production, where the two clocks are one.
"""

from __future__ import annotations

import json
import random
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from collector.sla.config import Receiver, SlaConfig, Thresholds
from collector.sla.notify import ALERTNAME
from collector.sla.service import SlaService
from collector.store import schema as store_schema
from tests.prom_tools import Alertmanager

SERVICE = "lifecycle"
KINDS = ("critical", "warning", "ok", "dip", "gone")
DIVERGENCE_MS = {"critical": 40.0, "warning": -40.0, "ok": 0.0}
PAIRS, DIP_PAIRS = 200, 30
STEP = timedelta(minutes=2)
RESEND = timedelta(hours=2)
LABELS = {"alertname", "service", "route", "metric", "severity"}
# fire, escalate, de-escalate, resolve, traffic dips (a few pairs; none): the script
CANONICAL = [
    "warning", "warning", "critical", "dip", "gone", "warning", "ok",
    "critical", "dip", "critical", "critical", "ok",
]  # fmt: skip


def random_scripts(n: int, steps: int, seed: int) -> list[list[str]]:
    """``n`` scripts of ``steps`` steps; runs of one kind make alerts fire and hold."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        script: list[str] = []
        while len(script) < steps:
            kind = rng.choices(KINDS, weights=(4, 3, 2, 2, 1))[0]
            script += [kind] * rng.choice((1, 2, 2, 3))
        out.append(script[:steps])
    return out


@dataclass
class Expected:
    """What Alertmanager must show for one route (the issue's rules)."""

    fired: str | None = None  # the severity of the one active alert
    pending: str | None = None
    held: bool = False  # firing, and the last window had too little data
    ever: set[str] = field(default_factory=set)  # severities that fired

    def step(self, kind: str) -> str:
        """Apply one step; the transition's name."""
        if kind in ("critical", "warning"):
            if self.fired is not None:
                was, self.fired, self.held = self.fired, kind, False
                self.ever.add(kind)
                if was == kind:
                    return "firing"
                return "escalate" if kind == "critical" else "de-escalate"
            if self.pending == kind:
                self.fired, self.pending = kind, None
                self.ever.add(kind)
                return "fire"
            self.pending = kind
            return "pending"
        self.pending = None
        if kind == "ok":
            resolved = self.fired is not None
            self.fired, self.held = None, False
            return "resolve" if resolved else "ok"
        if self.fired is not None:
            self.held = True
            return "hold"
        return "quiet"


class Sink:
    """Alertmanager's webhook receiver: every notification it sends."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        sink = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                sink.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def last_status(self) -> dict[tuple[str, str], str]:
        """Per (route, severity): the status of its latest notification."""
        out = {}
        for n in self.notifications:
            for a in n["alerts"]:
                out[(a["labels"]["route"], a["labels"]["severity"])] = a["status"]
        return out


def alertmanager_config(sink_url: str) -> dict[str, Any]:
    """One group per route and metric (severity is not a grouping label, so a group holds
    the resolve of one severity beside the firing of the other), notified at once."""
    return {
        "route": {
            "receiver": "sink",
            "group_by": ["alertname", "service", "route", "metric"],
            "group_wait": "0s",
            "group_interval": "200ms",
            "repeat_interval": "1h",
        },
        "receivers": [
            {"name": "sink", "webhook_configs": [{"url": sink_url, "send_resolved": True}]}
        ],
    }


@contextmanager
def alertmanager(workdir: Path) -> Iterator[tuple[Alertmanager, Sink]]:
    sink = Sink()
    am = Alertmanager(workdir, alertmanager_config(sink.url)).start()
    try:
        yield am, sink
    finally:
        am.stop()
        sink.server.shutdown()
        sink.server.server_close()


@dataclass
class StepReport:
    index: int
    transitions: dict[str, str]  # route → transition
    evaluate_s: float  # the pairs written, one evaluation (SlaService.tick)
    deliver_s: float  # then until Alertmanager holds every notification of the round
    violations: list[str]


class Lifecycles:
    """The scripts' routes in database ``db`` of ``client``, evaluated by a real
    ``SlaService`` with a scripted clock, notifying ``am_url``."""

    def __init__(
        self,
        client: Any,
        db: str,
        am_url: str,
        scripts: list[list[str]],
        seed: int = 1,
        behind: timedelta | None = None,
    ) -> None:
        self.client, self.db = client, db
        self.scripts = {f"/lc/{i:03d}": s for i, s in enumerate(scripts)}
        self.expected = {r: Expected() for r in self.scripts}
        steps = max(len(s) for s in scripts)
        behind = behind or STEP * (steps + 2)
        self.start = (datetime.now(UTC) - behind).replace(second=0, microsecond=0)
        self.now = self.start
        self.rng = np.random.default_rng(seed)
        self.last_div = dict.fromkeys(self.scripts, 40.0)
        store_schema.migrate(client, db)
        cfg = SlaConfig(
            defaults=Thresholds(band_ms=15, min_samples=100, for_s=STEP.total_seconds()),
            interval_s=STEP.total_seconds(),
            window_s=60,
            alertmanager=Receiver(am_url, resend_s=RESEND.total_seconds()),
        )
        self.svc = SlaService(lambda: client, db, cfg, clock=lambda: self.now, holder="lifecycle")
        self.svc.prepare()
        self.svc.notifier.start()

    def close(self) -> None:
        self.svc.notifier.stop()

    def _write(self, minute: datetime, i: int) -> None:
        cols: dict[str, list[Any]] = {
            k: []
            for k in ("time", "paired_at", "route", "server_ttfb_ms", "user_ttfb_ms", "trace_id")
        }
        for route, script in self.scripts.items():
            kind = script[i] if i < len(script) else "gone"
            if kind == "gone":
                continue
            n = DIP_PAIRS if kind == "dip" else PAIRS
            div = self.last_div[route] if kind == "dip" else DIVERGENCE_MS[kind]
            self.last_div[route] = div
            server = self.rng.normal(40.0, 1.0, n)
            user = server + div + self.rng.uniform(0.0, 0.5, n)
            cols["time"] += [
                minute + timedelta(seconds=float(s)) for s in self.rng.uniform(0, 25, n)
            ]
            cols["paired_at"] += [minute + timedelta(seconds=26)] * n
            cols["route"] += [route] * n
            cols["server_ttfb_ms"] += server.tolist()
            cols["user_ttfb_ms"] += user.tolist()
            cols["trace_id"] += [secrets.token_hex(16) for _ in range(n)]
        n = len(cols["time"])
        if not n:
            return
        cols.update(
            version=[1] * n,
            site=["test"] * n,
            service=[SERVICE] * n,
            method=["POST"] * n,
            kind=["fetch"] * n,
            span_id=[secrets.token_hex(8) for _ in range(n)],
            hops=[1] * n,
            hop_services=[[SERVICE]] * n,
        )
        names = list(cols)
        self.client.insert(
            f"{self.db}.pairs", [cols[k] for k in names], column_names=names, column_oriented=True
        )

    def step(self, i: int, am: Alertmanager) -> StepReport:
        t = time.perf_counter()
        minute = self.start + STEP * i
        self._write(minute, i)
        self.now = minute + timedelta(seconds=30)
        self.svc.tick()
        evaluated = time.perf_counter()
        delivered = self.svc.notifier.flush()
        done = time.perf_counter()
        transitions = {
            r: self.expected[r].step(s[i] if i < len(s) else "gone")
            for r, s in self.scripts.items()
        }
        shown = am.alerts()
        violations = [] if delivered else [f"step {i}: notifications not delivered in 10 s"]
        violations += self.check(i, shown)
        return StepReport(i, transitions, evaluated - t, done - evaluated, violations)

    def check(self, i: int, shown: list[dict[str, Any]]) -> list[str]:
        """What Alertmanager shows against ``expected``: one active alert per firing route,
        with the severity that fired, saying when its data is insufficient; none otherwise."""
        out = []
        by_route: dict[str, list[dict[str, Any]]] = {}
        for a in shown:
            if set(a["labels"]) != LABELS or a["labels"]["alertname"] != ALERTNAME:
                out.append(f"step {i}: unexpected label set {a['labels']}")
            by_route.setdefault(a["labels"].get("route", "?"), []).append(a)
        for route, exp in self.expected.items():
            active = by_route.pop(route, [])
            sevs = sorted(a["labels"]["severity"] for a in active)
            where = f"step {i} {route} {self.scripts[route][: i + 1]}"
            if exp.fired is None:
                if active:
                    out.append(f"{where}: expected no active alert, Alertmanager shows {sevs}")
                continue
            if sevs != [exp.fired]:
                out.append(f"{where}: expected [{exp.fired!r}] active, Alertmanager shows {sevs}")
                continue
            ann = active[0]["annotations"]
            says = "insufficient_data_since" in ann and ann["summary"].startswith(
                "Insufficient data since"
            )
            if says != exp.held:
                out.append(f"{where}: insufficient data expected {exp.held}, annotations {ann}")
        out += [f"step {i}: alerts for unknown routes {sorted(by_route)}"] if by_route else []
        return out

    def check_notifications(self, sink: Sink, settle_s: float = 5.0) -> list[str]:
        """After the last step: every severity Alertmanager notified for a route fired
        there, and each alert's last notification says what the script ends in."""
        want = {
            (r, sev): "firing" if exp.fired == sev else "resolved"
            for r, exp in self.expected.items()
            for sev in exp.ever
        }
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and sink.last_status() != want:
            time.sleep(0.1)
        out = []
        for n in sink.notifications:
            for a in n["alerts"]:
                r, sev = a["labels"]["route"], a["labels"]["severity"]
                if sev not in self.expected[r].ever:
                    out.append(f"{r}: notified {a['status']} {sev!r}, which never fired")
        got = sink.last_status()
        for k, status in want.items():
            if got.get(k) != status:
                out.append(f"{k}: last notification {got.get(k)!r}, expected {status!r}")
        return out
