"""The SLA checker inside a real ``parallax-collector serve`` (plugin wiring, real HTTP)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests import prom_tools
from tests.collector.helpers import start_collector
from tests.sla.test_cli import _store


def test_serve_evaluates_and_serves_sla_alerts_metrics_ui(tmp_path: Path) -> None:
    d = _store(tmp_path, "/v1/ok,/v1/net")
    cfg = tmp_path / "sla.yaml"
    cfg.write_text("for: 0s\ninterval: 1s\n")
    c = start_collector(d, env={"PARALLAX_SLA_CONFIG": str(cfg)})
    try:
        c.wait_ready(60)
        doc: dict[str, object] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = httpx.get(f"{c.query}/v1/sla", timeout=10)
            if r.status_code == 200 and r.json()["routes"]:
                doc = r.json()
                break
            time.sleep(0.5)
        assert doc, c.tail()
        routes = {r["route"]: r for r in doc["routes"]}  # type: ignore[attr-defined]
        assert routes["/v1/net"]["metrics"]["ttfb"]["verdict"] == "out_of_band"
        assert routes["/v1/ok"]["verdict"] == "ok"
        deadline = time.monotonic() + 30
        firing: list[dict[str, str]] = []
        while time.monotonic() < deadline and not firing:
            firing = httpx.get(f"{c.query}/v1/alerts", timeout=10).json()["current"]
            time.sleep(0.5)
        assert [(a["route"], a["state"]) for a in firing] == [("/v1/net", "firing")]
        metrics = httpx.get(f"{c.query}/metrics", timeout=10).text
        assert 'parallax_sla_divergence_seconds{metric="ttfb",route="/v1/net",service="app"}' in (
            metrics
        )
        lint = prom_tools.promtool("check", "metrics", stdin=metrics)  # Prometheus conventions
        assert (lint.returncode, lint.stdout + lint.stderr) == (0, ""), lint.stdout + lint.stderr
        assert httpx.get(f"{c.query}/ui", timeout=10).status_code == 200
        assert httpx.get(f"{c.ingest}/v1/sla", timeout=10).status_code == 404  # not public
    finally:
        c.stop()
    assert "sla alert pending → firing" in c.tail() or "sla alert inactive → firing" in c.tail()


def test_bad_config_is_one_line_naming_the_key(tmp_path: Path) -> None:
    """A config mistake stops ``serve`` before it listens: exit 2, one line naming the key."""
    d = tmp_path / "data"
    d.mkdir()
    cfg = tmp_path / "sla.yaml"
    cfg.write_text("routes:\n  - route: /x\n    band_ms: -2\n")
    c = start_collector(d, env={"PARALLAX_SLA_CONFIG": str(cfg)})
    try:
        with pytest.raises(RuntimeError, match=r"collector exited 2"):
            c.wait_ready(60)
    finally:
        c.stop()
    lines = [ln for ln in c.tail().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "ERROR" in ln]
    assert len(errors) == 1 and "routes[0].band_ms: must be ≥ 0" in errors[0], lines
    assert "Traceback" not in c.tail()
