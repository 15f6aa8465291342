"""The agent's metrics contract: the tables are current, names and units agree, the agent's
Prometheus registry serves exactly the declared series, and every GPU span attribute has its
JSONL field."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import Metrics
from parallax_contracts import CONTRACTS_DIR, agent_metrics, span_attributes
from tests import prom_tools


def test_gpu_metric_table_is_current() -> None:
    doc = (CONTRACTS_DIR / "agent-metrics.md").read_text()
    assert agent_metrics.markdown_table() in doc, (
        "docs/contracts/agent-metrics.md is stale: regenerate the table with "
        "python -m parallax_contracts.agent_metrics"
    )


def test_prometheus_table_is_current() -> None:
    doc = (CONTRACTS_DIR / "agent-metrics.md").read_text()
    assert agent_metrics.prometheus_table() in doc, (
        "docs/contracts/agent-metrics.md is stale: regenerate its tables with "
        "python -m parallax_contracts.agent_metrics"
    )


def test_the_agents_registry_serves_exactly_the_declared_series() -> None:
    """Every family the agent's /metrics shows, with its type and labels, is declared in
    PROMETHEUS, and every declared one is served (labelled ones once a label set is used)."""
    text = prom_tools.exposition(prom_tools.populate(Metrics().registry))
    served = {}
    counters = {s.name.removesuffix("_total") for s in agent_metrics.PROMETHEUS}
    for fam in text_string_to_metric_families(text):
        if fam.name.endswith("_created") and fam.name.removesuffix("_created") in counters:
            continue  # the client library's creation time of a counter
        name = fam.name + ("_total" if fam.type == "counter" else "")
        labels = {k for s in fam.samples for k in s.labels} - {"le"}
        served[name] = (fam.type, tuple(sorted(labels)))
    declared = {s.name: (s.kind, tuple(sorted(s.labels))) for s in agent_metrics.PROMETHEUS}
    assert served == declared


def test_prometheus_names_follow_prometheus_conventions() -> None:
    """Base units only (no ms, µs, MHz in a name); counters end _total, nothing else does."""
    for s in agent_metrics.PROMETHEUS:
        # ours, or the GenAI conventions' (their OpenTelemetry names in Prometheus' form)
        assert s.name.startswith(("parallax_agent_", "gen_ai_server_")), s
        assert s.name.endswith("_total") == (s.kind == "counter"), s
        assert not re.search(r"_(ms|us|ns|mhz|khz|kb|mb|milliseconds|microseconds)(_|$)", s.name)
    assert len({s.name for s in agent_metrics.PROMETHEUS}) == len(agent_metrics.PROMETHEUS)


def test_metric_names_follow_their_conventions() -> None:
    for m in agent_metrics.ALL:
        assert m.standard == (not m.name.startswith("parallax.")), m
        if m.kind == "histogram":
            assert m.unit == "s", m  # the GenAI conventions' unit
    assert len(agent_metrics.BY_NAME) == len(agent_metrics.ALL)


def test_gpu_span_attributes_and_their_record_fields() -> None:
    fields = [span_attributes.record_field(a) for a in span_attributes.GPU]
    assert fields == [
        "gpu_prefill_launches",
        "gpu_decode_launches",
        "gpu_prefill_wait_us",
        "gpu_decode_wait_us",
        "gpu_prefill_sm_util_pct",
        "gpu_decode_sm_util_pct",
        "gpu_sample_coverage",
        "gpu_inflight_mean",
        "gpu_uuid",
    ]
