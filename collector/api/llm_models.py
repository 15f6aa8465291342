"""The query API's view of an LLM stream: a hop's (the agent's reading), a browser entry's
(the probe's) and the pair's parts. Null members were not measured (absent, never 0); a
response in no stream dialect has no ``llm`` object at all."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from collector.store.llm_columns import ENTRY_LLM_COLUMNS


class HopLlm(BaseModel):
    """The agent's parallax_contracts.genai attributes of one span (ms from t1)."""

    dialect: str
    operation: str = Field(description="gen_ai.operation.name")
    provider: str = Field(description="gen_ai.provider.name")
    model: str | None
    finish_reasons: list[str]
    error_type: str | None = Field(description="an error event inside the 200 stream")
    end: str | None = Field(description="complete, server_cut, client_aborted or error")
    input_tokens: int | None
    output_tokens: int | None
    output_tokens_source: str | None = Field(description="usage or events")
    reasoning_tokens: int | None
    first_output_ms: float | None = Field(description="first output token (reasoning too)")
    first_token_ms: float | None = Field(description="first answer token (the span's TTFT)")
    last_output_ms: float | None
    queue_ms: float | None = Field(description="the engine's queue, as the wire shows it")
    prefill_ms: float | None = Field(description="end of that queue → first output token")
    gaps: int | None
    gap_p50_ms: float | None
    gap_p95_ms: float | None
    gap_max_ms: float | None
    stalls: list[tuple[int, float]] = Field(description="(token index, gap ms) of each stall")
    wasted_tokens: int | None = Field(description="written after the client had left")
    parse_problems: int | None


def _ms(us: Any) -> float | None:
    return None if us is None else us / 1000.0


def hop_llm(s: dict[str, Any]) -> HopLlm | None:
    """A span read back from the store (its LLM columns) → its LLM object, None when it
    spoke no dialect."""
    if not s.get("llm_dialect"):
        return None
    return HopLlm(
        dialect=s["llm_dialect"],
        operation=s.get("gen_ai_operation_name") or "",
        provider=s.get("gen_ai_provider_name") or "",
        model=s.get("gen_ai_response_model") or None,
        finish_reasons=list(s.get("gen_ai_response_finish_reasons") or []),
        error_type=s.get("error_type") or None,
        end=s.get("llm_end") or None,
        input_tokens=s.get("gen_ai_usage_input_tokens"),
        output_tokens=s.get("gen_ai_usage_output_tokens"),
        output_tokens_source=s.get("llm_output_tokens_source") or None,
        reasoning_tokens=s.get("llm_reasoning_tokens"),
        first_output_ms=_ms(s.get("llm_first_output_us")),
        first_token_ms=_ms(s.get("ttft_us")),
        last_output_ms=_ms(s.get("llm_last_output_us")),
        queue_ms=_ms(s.get("llm_queue_us")),
        prefill_ms=_ms(s.get("llm_prefill_us")),
        gaps=s.get("llm_gaps"),
        gap_p50_ms=_ms(s.get("llm_gap_p50_us")),
        gap_p95_ms=_ms(s.get("llm_gap_p95_us")),
        gap_max_ms=_ms(s.get("llm_gap_max_us")),
        stalls=[
            (int(at), us / 1000.0)
            for at, us in zip(
                s.get("llm_stall_tokens") or [], s.get("llm_stall_gaps_us") or [], strict=False
            )
        ],
        wasted_tokens=s.get("llm_wasted_tokens"),
        parse_problems=s.get("llm_parse_problems"),
    )


class EntryLlm(BaseModel):
    """What the probe read of the stream (beacon v2 ``llm``; ms after time_origin)."""

    dialect: str
    first_token_ms: float | None
    first_output_ms: float | None
    token_ms: list[float] = Field(description="each output token's arrival, the first 1024")
    gap_hist: list[int] = Field(description="the gaps after the 1024th token, in log buckets")
    tokens: int | None
    tokens_source: str
    end: str | None = Field(description="null: the stream was still open when sent")
    bad_events: int | None


_ENTRY_KEYS = [c.name for c in ENTRY_LLM_COLUMNS]


def entry_llm(e: dict[str, Any]) -> EntryLlm | None:
    if not e.get("llm_dialect"):
        return None
    v: dict[str, Any] = {k.removeprefix("llm_"): e.get(k) for k in _ENTRY_KEYS}
    v["end"] = v["end"] or None
    v["token_ms"], v["gap_hist"] = list(v["token_ms"] or []), list(v["gap_hist"] or [])
    return EntryLlm.model_validate(v)


class PairLlm(BaseModel):
    """The pair's LLM parts (docs/store.md, pairs' LLM columns)."""

    dialect: str = Field(description="the origin's, else the browser's")
    user_first_token_ms: float | None = Field(description="first answer token − t0")
    server_first_token_ms: float | None = Field(description="first answer token − t1")
    user_token_gap_p95_ms: float | None
    server_token_gap_p95_ms: float | None
    user_tokens: int | None
    server_tokens: int | None
    queue_ms: float | None = Field(description="the engine's queue (origin)")
    prefill_ms: float | None
    decode_ms: float | None = Field(description="first → last output token (origin)")
    end: str | None = Field(description="the origin's ending")
    user_end: str | None = Field(description="the probe's")


def pair_llm(parts: dict[str, Any]) -> PairLlm | None:
    """The LLM parts of a derived pair (pairing.rules.derive), None when neither side read
    a stream dialect."""
    if not parts.get("llm_dialect"):
        return None
    return PairLlm(
        dialect=parts["llm_dialect"],
        user_first_token_ms=parts.get("user_first_token_ms"),
        server_first_token_ms=parts.get("server_first_token_ms"),
        user_token_gap_p95_ms=parts.get("user_token_gap_p95_ms"),
        server_token_gap_p95_ms=parts.get("server_token_gap_p95_ms"),
        user_tokens=parts.get("user_tokens"),
        server_tokens=parts.get("server_tokens"),
        queue_ms=parts.get("llm_queue_ms"),
        prefill_ms=parts.get("llm_prefill_ms"),
        decode_ms=parts.get("llm_decode_ms"),
        end=parts.get("llm_end") or None,
        user_end=parts.get("user_llm_end") or None,
    )
