"""The evaluator service on the scenario store: API, gauges, lease, and the /ui page in Chromium."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from collector.sla.config import SlaConfig, Thresholds
from collector.sla.service import SlaService, router
from demo.stack import free_port
from tests.sla import scenario

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def service(scenario_store: tuple[Any, Path, Any]) -> SlaService:
    client = scenario_store[0]
    svc = SlaService(
        lambda: client,
        "parallax",
        SlaConfig(defaults=Thresholds(for_s=0)),
        registry=CollectorRegistry(),
        clock=lambda: scenario.NOW,
        holder="test-a",
    )
    svc.prepare()
    svc.tick()
    return svc


@pytest.fixture(scope="module")
def app(service: SlaService) -> FastAPI:
    a = FastAPI()
    a.state.parallax = SimpleNamespace(extra={"sla": service})
    a.include_router(router)
    return a


def test_api_documents(app: FastAPI, service: SlaService) -> None:
    c = TestClient(app)
    doc = c.get("/v1/sla").json()
    assert doc["evaluator"] is True
    net = next(r for r in doc["routes"] if r["route"] == "/v1/net")["metrics"]["ttfb"]
    assert net["verdict"] == "out_of_band" and net["alert_state"] == "firing"
    alerts = c.get("/v1/alerts").json()
    firing = {(a["route"], a["metric"]) for a in alerts["current"] if a["state"] == "firing"}
    assert firing == {
        ("/v1/net", "ttfb"),
        ("/v1/loop", "ttfb"),
        ("/v1/cached", "ttfb"),
        ("/v1/render", "visible_ttft"),
        ("/v1/stream", "itl"),
        ("/v1/nagle", "itl"),
    }
    stored = {(a["route"], a["state"]) for a in alerts["recent"]}
    assert ("/v1/net", "firing") in stored  # each change is in sla_alerts
    h = c.get(
        "/v1/sla/history", params={"service": "app", "route": "/v1/net", "metric": "ttfb"}
    ).json()
    assert h["band_ms"] == 15 and len(h["points"]) >= 4
    assert all(p["user_p95_ms"] - p["server_p95_ms"] > 20 for p in h["points"] if p["n"] > 100)
    assert c.get("/ui").status_code == 200 and c.get("/ui/nope.js").status_code == 404


def test_gauges(service: SlaService) -> None:
    assert service.metrics is not None
    text = generate_latest(service.metrics.registry).decode()
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith("parallax_sla_divergence_seconds{")
        and 'route="/v1/net"' in ln
        and 'metric="ttfb"' in ln
    )
    assert 0.024 < float(line.rsplit(" ", 1)[1]) < 0.026  # seconds, Prometheus' base unit
    # the checker's alert with the severity it fired with; the cached route's is a warning
    assert (
        'parallax_sla_alert{metric="ttfb",route="/v1/net",service="app",'
        'severity="critical",state="firing"} 1.0' in text
    )
    assert (
        'parallax_sla_alert{metric="ttfb",route="/v1/cached",service="app",'
        'severity="warning",state="firing"} 1.0' in text
    )
    assert 'parallax_sla_alert_firing{metric="ttfb",route="/v1/net",service="app"} 1.0' in text
    assert not any(
        ln.startswith("parallax_sla_alert{") and 'route="/v1/ok"' in ln for ln in text.splitlines()
    )  # absent, not 0, for a route that never alerted
    assert (
        'parallax_sla_verdict{metric="ttfb",route="/v1/rare",service="app",'
        'verdict="insufficient_data"} 1.0' in text
    )
    assert "parallax_sla_samples{" in text and "parallax_sla_is_evaluator 1.0" in text
    # the sampled route: its effective sample size, below its pairs
    m = next(r for r in service.latest.routes if r.route == scenario.SAMPLED_ROUTE)  # type: ignore[union-attr]
    st = m.metrics["ttfb"]
    labels = f'metric="ttfb",route="{scenario.SAMPLED_ROUTE}",service="{scenario.SAMPLED_SERVICE}"'
    assert f"parallax_sla_effective_samples{{{labels}}} {float(st.n_eff)}" in text
    assert f"parallax_sla_samples{{{labels}}} {float(st.n)}" in text and st.n_eff < st.n


def test_one_evaluator_per_store(
    scenario_store: tuple[Any, Path, Any], service: SlaService
) -> None:
    client = scenario_store[0]
    other = SlaService(
        lambda: client,
        "parallax",
        SlaConfig(grafana_url="https://g.example"),
        clock=lambda: scenario.NOW,
        holder="test-b",
    )
    assert other.notifier.grafana_url == "https://g.example"  # the alerts' dashboard link
    other.prepare()
    other.tick()
    assert other.is_evaluator is False  # test-a holds the lease
    assert other.latest is not None and other.latest.routes  # the standby still serves
    service.tick()
    assert service.is_evaluator is True


@pytest.fixture(scope="module")
def server(app: FastAPI) -> Iterator[str]:
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    end = time.monotonic() + 10
    while not srv.started and time.monotonic() < end:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    t.join(5)


@pytest.mark.browser
def test_ui_in_chromium(server: str, service: SlaService) -> None:
    from demo.browser import chromium

    errors: list[str] = []
    bad: list[str] = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1200, "height": 1400})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "response", lambda r: bad.append(f"{r.status} {r.url}") if r.status >= 400 else None
        )
        page.goto(f"{server}/ui", timeout=15000)
        page.wait_for_selector("body[data-loaded='1']", timeout=15000)
        routes = page.locator("details.route").evaluate_all("els => els.map(e => e.dataset.route)")
        assert routes[0] == "/v1/stream"  # worst first
        assert set(routes) >= set(scenario.ROUTES)
        net = page.locator("details.route[data-route='/v1/net']")
        assert "Out of band" in net.locator("summary").inner_text()
        ok = page.locator("details.route[data-route='/v1/ok']")
        assert "Inside the band" in ok.locator("summary").inner_text()
        rare = page.locator("details.route[data-route='/v1/rare']")
        assert "Too few requests" in rare.locator("summary").inner_text()
        assert "40 paired requests (needs 100)" in rare.locator("summary").inner_text()
        alerts = page.locator("#alerts li.firing")
        assert alerts.count() == 6
        assert "/v1/net" in page.locator("#alerts").inner_text()
        # one click away: the interval, the parts and the chart
        net.locator("summary").click()
        m = service.latest.routes  # type: ignore[union-attr]
        ttfb = next(r for r in m if r.route == "/v1/net").metrics["ttfb"]
        row = net.locator("tr[data-metric='ttfb']").inner_text()
        assert f"{ttfb.divergence_ms:+.1f}".replace("-", "−") in row
        assert f"{ttfb.ci_low_ms:+.1f}" in row
        assert "network δ" in net.locator(".parts").inner_text()
        net.locator("svg.chart polyline").first.wait_for(timeout=10000)
        assert net.locator("svg.chart polyline").count() == 2
        # no GPU attributes on /v1/net: no GPU words, no badge; no kernel TTFT: no split
        assert net.locator(".gpu-badge").count() == 0 and "GPU" not in net.inner_text()
        assert net.locator(".server").count() == 0
        # the GPU route: its verdict in the summary, the split and the findings one click away
        gen = page.locator(f"details.route[data-route='{scenario.GPU_ROUTE}']")
        badges = gen.locator("summary .gpu-badge").all_inner_texts()
        assert badges == ["GPU-bound", "GPU clock low"]
        gen.locator("summary").click()
        srv = next(r for r in m if r.route == scenario.GPU_ROUTE).server
        for window in ("queue", "prefill", "decode"):
            row = gen.locator(f".server tr[data-window='{window}']").inner_text()
            for q in ("p50", "p95"):
                v = srv[f"{window}_{q}_ms"]
                assert (f"{v:.0f} ms" if v >= 10 else f"{v:.1f} ms") in row, (window, row)
        assert gen.locator(".findings li").all_inner_texts() == [
            f["sentence"] for f in srv["findings"]
        ]
        assert (
            "SM clock 55 % of max (power cap) during decode"
            in gen.locator(".findings").inner_text()
        )
        assert "GPU busy 97 % with 14 requests in flight: GPU-bound" in gen.inner_text()
        assert "120 requests with GPU figures on 1 GPU · NVML samples cover 97 %" in (
            gen.locator(".gpu-head").inner_text()
        )
        # the sampled service: the share traced in the summary, the sentence and the
        # effective sample size one click away
        smp = page.locator(f"details.route[data-route='{scenario.SAMPLED_ROUTE}']")
        doc = next(r for r in m if r.route == scenario.SAMPLED_ROUTE)
        assert smp.locator("summary .sampling-badge").inner_text() == "traced 40 %"
        smp.locator("summary").click()
        assert smp.locator("p.sampling").inner_text() == doc.sampling["sentence"]
        assert "traced 40 % of requests in the last 5 min" in doc.sampling["sentence"]
        cell = smp.locator("tr[data-metric='ttfb'] td.n").inner_text()
        st = doc.metrics["ttfb"]
        assert cell == f"{st.n} ({st.n_eff} eff.)" and st.n_eff < st.n
        assert net.locator(".sampling-badge").count() == 0  # nothing sampled there
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "sla-ui.png"), full_page=True)
    assert errors == []
    assert bad == []
