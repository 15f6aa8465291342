"""The evaluator loop and the query-port routes: /v1/sla, /v1/alerts, /v1/sla/history, /ui.

Inside ``parallax-collector serve`` (through collector/plugins.py): every ``interval``
(15 s) the lease holder summarizes new pairs, evaluates the window (5 min), updates alert
states, notifications and gauges; a collector without the lease stands by and serves the
same document computed read-only from the store.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from collector.sla import alerts as alerts_mod
from collector.sla import history
from collector.sla.config import SlaConfig
from collector.sla.evaluate import Evaluation, evaluate, evaluate_window
from collector.sla.lease import Lease
from collector.sla.metrics import SlaMetrics
from collector.sla.notify import Notifier
from collector.sla.source import METRIC_ORDER, SlaSource

log = logging.getLogger("parallax.sla")

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


class SlaService:
    def __init__(
        self,
        get_client: Callable[[], Any],
        db: str,
        cfg: SlaConfig,
        registry: Any = None,
        clock: Clock = utcnow,
        holder: str | None = None,
        notifier: Notifier | None = None,
        cluster: str | None = None,
    ) -> None:
        self.cfg, self.clock, self._get, self.db = cfg, clock, get_client, db
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.source = SlaSource(get_client, db, cluster=cluster)
        self.notifier = notifier or Notifier(
            cfg.alertmanager, cfg.webhook, grafana_url=cfg.grafana_url
        )
        self.alerts = alerts_mod.Alerts(
            cfg,
            record=alerts_mod.store_recorder(get_client, db),
            notify=self.notifier.submit,
            evaluator=self.holder,
        )
        self.lease = Lease(
            get_client, db, self.holder, timedelta(seconds=max(4 * cfg.interval_s, 30))
        )
        self.metrics = SlaMetrics(registry) if registry is not None else None
        self.window = timedelta(seconds=cfg.window_s)
        self.latest: Evaluation | None = None
        self.is_evaluator = False
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def prepare(self) -> None:
        self.source.ensure_schema()
        self.alerts.load(alerts_mod.load_states(self._get, self.db))

    def tick(self) -> Evaluation:
        """One round: evaluate (lease holder) or read (standby)."""
        now = self.clock()
        t = time.perf_counter()
        with self._lock:
            self.is_evaluator = self.lease.acquire(now)
            if self.is_evaluator:
                ev = evaluate(self.source, self.cfg, now, self.window)
                self.alerts.update(ev, now)
            else:
                self.alerts.states.clear()
                self.alerts.load(alerts_mod.load_states(self._get, self.db))
                ev = evaluate_window(
                    self.source.read_window(now, self.window),
                    self.cfg,
                    now,
                    self.window,
                    self.alerts.state_of,
                )
            self.latest = ev
        if self.metrics is not None:
            self.metrics.update(ev, time.perf_counter() - t, self.alerts.states.values())
            self.metrics.evaluator.set(1 if self.is_evaluator else 0)
        return ev

    def start(self) -> None:
        self.prepare()
        self.notifier.start()
        self._thread = threading.Thread(target=self._loop, name="sla-evaluator", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
                self.last_error = None
            except Exception as e:  # noqa: BLE001 — keep evaluating; say what failed
                self.last_error = str(e).splitlines()[0] if str(e) else type(e).__name__
                log.warning("sla: evaluation failed: %s", self.last_error)
                if self.metrics is not None:
                    self.metrics.errors.inc()
            self._stop.wait(self.cfg.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        try:
            self.lease.release()
        except Exception as e:  # noqa: BLE001 — the store may already be gone at shutdown
            log.debug("sla: lease release failed: %s", e)
        self.notifier.stop()

    def document(self) -> dict[str, Any]:
        ev = self.latest
        if ev is None:
            ev = self.tick()
        doc = ev.to_json()
        doc["evaluator"] = self.is_evaluator
        return doc

    def alerts_document(self) -> dict[str, Any]:
        now = self.clock()
        doc = self.alerts.to_json()
        doc["recent"] = alerts_mod.load_recent(self._get, self.db, timedelta(days=1), now)
        return doc


# -- HTTP ----------------------------------------------------------------------------------

router = APIRouter()
_ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def _svc(request: Request) -> SlaService:
    ctx = getattr(request.app.state, "parallax", None)
    svc = ctx.extra.get("sla") if ctx is not None else None
    if svc is None:
        raise HTTPException(503, "the SLA checker is not running")
    return svc  # type: ignore[no-any-return]


@router.get("/v1/sla")
def get_sla(request: Request) -> JSONResponse:
    """Current window per route and metric (the same shape as ``sla --once --json``)."""
    return JSONResponse(_svc(request).document())


@router.get("/v1/alerts")
def get_alerts(request: Request) -> JSONResponse:
    """Pending and firing alerts, and the state changes of the last 24 h."""
    return JSONResponse(_svc(request).alerts_document())


@router.get("/v1/sla/history")
def get_history(
    request: Request, service: str, route: str, metric: str = "ttfb", minutes: int = 60
) -> JSONResponse:
    """Per minute: user and server P95 of one route and metric, and the band."""
    if metric not in METRIC_ORDER:
        raise HTTPException(400, f"metric must be one of {', '.join(METRIC_ORDER)}")
    svc = _svc(request)
    minutes = max(1, min(minutes, 24 * 60))
    pts = history.read(svc.source, service, route, metric, svc.clock(), minutes)
    band = svc.cfg.thresholds(service, route, metric).band_ms
    return JSONResponse(
        {
            "service": service,
            "route": route,
            "metric": metric,
            "band_ms": band,
            "points": [
                {
                    "minute": p.minute.isoformat(),
                    "user_p95_ms": None if p.user_p95_ms is None else round(p.user_p95_ms, 2),
                    "server_p95_ms": None if p.server_p95_ms is None else round(p.server_p95_ms, 2),
                    "n": p.n,
                }
                for p in pts
            ],
        }
    )


def _asset(name: str) -> bytes:
    return resources.files("collector.sla").joinpath("ui", name).read_bytes()


@router.get("/ui", response_class=HTMLResponse)
def ui_page() -> HTMLResponse:
    return HTMLResponse(_asset("index.html").decode())


@router.get("/ui/{name}")
def ui_asset(name: str) -> Response:
    if name not in _ASSETS:
        raise HTTPException(404)
    return Response(
        _asset(name), media_type=_ASSETS[name], headers={"Cache-Control": "max-age=300"}
    )
