"""Prometheus conventions, checked by the real `promtool` (Debian's Prometheus 2.42):
`promtool check metrics` prints nothing for the agent's /metrics (its server object, in
process: no eBPF needed) and the collector's (its registry and the SLA checker's, as the
query port serves them; tests/sla/test_serve.py checks a running collector's too), and the
shipped rules (deploy/prometheus/) pass `promtool check rules` and their unit tests
(`promtool test rules`), whose input series are series the agent and the collector serve."""

from __future__ import annotations

import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import metrics as agent_metrics
from collector.metrics import Metrics as CollectorMetrics
from collector.sla.alerts import Alerts
from collector.sla.config import SlaConfig, Thresholds
from collector.sla.metrics import SlaMetrics
from tests import prom_tools
from tests.sla.test_alerts import OUT, T0, _ev

ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "parallax-rules.yaml"
RULE_TESTS = RULES_DIR / "parallax-rules.test.yaml"
SCRAPE_LABELS = {"instance", "job"}


@pytest.fixture(scope="module", autouse=True)
def _promtool() -> None:
    try:
        prom_tools.tool("promtool")
    except prom_tools.ToolMissingError as e:
        pytest.fail(str(e))


def _check_metrics(text: str) -> str:
    p = prom_tools.promtool("check", "metrics", stdin=text)
    return (p.stdout + p.stderr).strip() or ("" if p.returncode == 0 else f"exit {p.returncode}")


def test_promtool_flags_what_the_conventions_forbid() -> None:
    """The check can fail: the names this project served before issue 29 are flagged."""
    old = (
        "# HELP parallax_sla_divergence_ms P95(user) − P95(server), ms\n"
        "# TYPE parallax_sla_divergence_ms gauge\n"
        'parallax_sla_divergence_ms{route="/"} 30.0\n'
        "# HELP parallax_agent_lost_events Events the kernel could not queue\n"
        "# TYPE parallax_agent_lost_events counter\n"
        "parallax_agent_lost_events 3.0\n"
    )
    out = _check_metrics(old)
    assert "parallax_sla_divergence_ms" in out and "abbreviated units" in out, out
    assert "parallax_agent_lost_events" in out and "_total" in out, out


def test_the_agents_metrics_pass_promtool() -> None:
    """The agent's metrics server, every series given a sample, scraped over HTTP."""
    m = agent_metrics.Metrics()
    prom_tools.populate(m.registry)
    m.gpu.device["sm_clock_mhz"].labels("GPU-1").set(1980)  # NVML's MHz, served in hertz
    srv = agent_metrics.serve(m, "127.0.0.1:0")
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    finally:
        srv.shutdown()
        srv.server_close()
    assert 'parallax_agent_gpu_sm_clock_hertz{gpu="GPU-1"} 1.98e+09' in text
    assert "parallax_agent_lost_events_total 3.0" in text
    assert _check_metrics(text) == ""


def test_the_collectors_metrics_pass_promtool() -> None:
    """The collector's registry with the SLA checker's series, every series given a sample
    (a real SLA update fills the checker's, in seconds)."""
    c = CollectorMetrics()
    sla = SlaMetrics(c.registry)
    prom_tools.populate(c.registry)
    alerts = Alerts(SlaConfig(defaults=Thresholds(for_s=0)))
    ev = _ev(*OUT, T0)
    alerts.update(ev, T0)
    sla.update(ev, 0.25, alerts.states.values())
    text = prom_tools.exposition(c.registry)
    assert 'parallax_sla_divergence_seconds{metric="ttft",route="/v1/chat",service="app"} 0.03' in (
        text
    )
    assert not re.search(r"^parallax_\w*_ms[{ ]", text, re.M)
    assert _check_metrics(text) == ""


def test_rules_pass_promtool_check() -> None:
    p = prom_tools.promtool("check", "rules", str(RULES))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout and "WARNING" not in p.stdout + p.stderr


def test_rules_pass_their_unit_tests() -> None:
    p = prom_tools.promtool("test", "rules", str(RULE_TESTS))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def test_the_store_lag_rule_needs_unless_absent_is_not_zero(tmp_path: Path) -> None:
    """The unit tests can fail: with `== 0` in place of `unless`, a collector that never
    wrote a row (no rows_written series at all) would not alert, and the tests say so."""
    rules = RULES.read_text()
    old = "unless sum by (instance) (rate(parallax_collector_rows_written_total[5m])) > 0"
    assert old in rules
    new = "and sum by (instance) (rate(parallax_collector_rows_written_total[5m])) == 0"
    (tmp_path / RULES.name).write_text(rules.replace(old, new))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    p = prom_tools.promtool("test", "rules", str(tmp_path / RULE_TESTS.name))
    assert p.returncode != 0 and "c2:4319" in p.stdout + p.stderr, p.stdout


def _selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, label names) of every selector of ours in a PromQL expression or template,
    with the labels it matches on and groups by."""
    out = []
    for m in re.finditer(r"\b(parallax_[a-z0-9_]+)(\{([^}]*)\})?", expr):
        labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", m.group(3) or ""))
        out.append((m.group(1), labels))
    return out


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_rules_read_real_series_with_real_labels() -> None:
    exposed = prom_tools.exposed()
    recorded = {r["record"] for r in _rules() if "record" in r}
    for r in _rules():
        name = r.get("alert") or r["record"]
        texts = [r["expr"], *r.get("annotations", {}).values()]
        groups = {
            x.strip()
            for e in texts
            for g in re.findall(r"\bby \(([^)]*)\)", e)
            for x in g.split(",")
        }
        labels: set[str] = set(SCRAPE_LABELS)
        for text in texts:
            for metric, used in _selectors(text):
                assert metric in exposed, f"{name}: {metric} is not served"
                assert used <= exposed[metric] | SCRAPE_LABELS, (name, metric, used)
                labels |= exposed[metric]
        assert groups <= labels, (name, groups - labels)
        assert not any(m in recorded for m, _ in _selectors(r["expr"])), name
    # each alert has a unit test, each recording rule a value test
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {a["alertname"] for t in tests for a in t.get("alert_rule_test", [])}
    exprs = {e["expr"] for t in tests for e in t.get("promql_expr_test", [])}
    assert tested == {r["alert"] for r in _rules() if "alert" in r}
    assert exprs == recorded


def test_rule_tests_feed_series_as_a_scrape_shows_them() -> None:
    """Every input series is a name the agent or the collector serves, with exactly its
    labels plus the scrape's instance and job."""
    exposed = prom_tools.exposed()
    for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for s in t["input_series"]:
            m = re.fullmatch(r"(\w+)\{(.*)\}", s["series"])
            assert m, s["series"]
            name, labels = m.group(1), set(re.findall(r"(\w+)=", m.group(2)))
            assert name in exposed, name
            assert labels == exposed[name] | SCRAPE_LABELS, (name, labels, exposed[name])
