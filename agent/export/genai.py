"""The GenAI semantic conventions' server metrics from the records (one implementation for
the agent's Prometheus /metrics and its OTLP metrics): for each record of an LLM stream, the
observations of ``gen_ai.server.time_to_first_token``, ``time_per_output_token`` and
``request.duration`` with their attributes. A record that spoke no stream dialect gives
none (a chunked CSV download is no token stream)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallax_contracts import agent_metrics as am
from parallax_contracts.routes import route_template

if TYPE_CHECKING:
    from agent.metrics import GenAiMetrics

Observation = tuple[am.Metric, float, dict[str, str | int]]
BUCKETS: dict[am.Metric, tuple[float, ...]] = {
    am.GEN_AI_TTFT: am.GEN_AI_TTFT_BUCKETS,
    am.GEN_AI_TPOT: am.GEN_AI_TPOT_BUCKETS,
    am.GEN_AI_DURATION: am.GEN_AI_DURATION_BUCKETS,
}


def attributes(rec: dict[str, Any]) -> dict[str, str | int]:
    """The histograms' attributes (parallax_contracts.agent_metrics.GEN_AI_ATTRIBUTES); an
    absent one is left out, never an empty value."""
    out: dict[str, str | int] = {
        "gen_ai.operation.name": rec["gen_ai_operation_name"],
        "gen_ai.provider.name": rec["gen_ai_provider_name"],
        "server.address": rec["local_addr"],
        "server.port": rec["local_port"],
        "http.route": route_template(rec["path"]),
        "service.name": rec["service"],
    }
    if rec.get("gen_ai_response_model"):
        out["gen_ai.response.model"] = rec["gen_ai_response_model"]
    if rec.get("error_type"):
        out["error.type"] = rec["error_type"]
    return out


def observations(rec: dict[str, Any]) -> list[Observation]:
    if not rec.get("llm_dialect") or rec.get("partial"):
        return []
    attrs = attributes(rec)
    out: list[Observation] = [(am.GEN_AI_DURATION, rec["duration_us"] / 1e6, attrs)]
    ttft = rec.get("ttft_us")
    if ttft is not None:
        out.append((am.GEN_AI_TTFT, ttft / 1e6, attrs))
    n = rec.get("gen_ai_usage_output_tokens") or 0
    first, last = rec.get("llm_first_output_us"), rec.get("llm_last_output_us")
    if rec.get("llm_end") == "complete" and n >= 2 and first is not None and last is not None:
        out.append((am.GEN_AI_TPOT, max(0, last - first) / (n - 1) / 1e6, attrs))
    return out


class PrometheusGenAi:
    """An Exporter (agent.export.outputs) of the records into the /metrics histograms."""

    def __init__(self, hist: GenAiMetrics) -> None:
        self._hist = hist

    @property
    def failed(self) -> int:
        return 0

    def export_batch(self, recs: list[dict[str, Any]]) -> None:
        for rec in recs:
            for metric, value, attrs in observations(rec):
                self._hist.observe(metric.name, value, attrs)

    def close(self) -> None:
        pass
