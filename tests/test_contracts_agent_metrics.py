"""The GPU contract: the metric table is current, names and units agree, and every GPU span
attribute has its JSONL field."""

from __future__ import annotations

from parallax_contracts import CONTRACTS_DIR, agent_metrics, span_attributes


def test_gpu_metric_table_is_current() -> None:
    doc = (CONTRACTS_DIR / "agent-metrics.md").read_text()
    assert agent_metrics.markdown_table() in doc, (
        "docs/contracts/agent-metrics.md is stale: regenerate the table with "
        "python -m parallax_contracts.agent_metrics"
    )


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
