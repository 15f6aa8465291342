"""The LLM stream columns of ``server_spans``, ``browser_entries`` and ``pairs`` (migration 6).

- **Spans**: one column per attribute of the agent's contract (parallax_contracts.genai),
  named as the agent's JSONL field (``parallax.llm.queue_us`` → ``llm_queue_us``,
  ``gen_ai.usage.output_tokens`` → ``gen_ai_usage_output_tokens``). The store computes them
  (MATERIALIZED) from the span's ``attributes``, where both OTLP parsers keep these
  attributes as text — as migration 5 does for the holdback: no parser changes, the row tuples
  keep their order, and spans written before read absent. Absent is NULL (numbers, flags),
  '' (strings) or [] (lists), never 0: a value of the wrong shape (a negative count, text
  where a number is due) reads absent too.
- **Browser entries**: the beacon v2 ``llm`` object (parallax_contracts.beacon.Llm), real
  columns the beacon parser fills (entries without one — v1 probes, streams in no dialect —
  read '' / NULL / []).
- **Pairs**: what the SLA checker compares on an LLM route (docs/sla.md, "LLM routes"): each
  side's first token and per-answer P95 gap, the tokens, and the engine's queue, prefill and
  decode from the origin hop.

The set of span attributes is frozen here (``SPAN_LLM_ATTRS``): an attribute the contract adds
later gets its column in a migration of its own (a shipped one is never edited).
"""

from __future__ import annotations

from collector.store.column import Column, col
from parallax_contracts import genai
from parallax_contracts.attr import Attr, record_field

# The contract's attributes as migration 6 stores them (genai.ALL when it shipped).
SPAN_LLM_ATTRS: tuple[str, ...] = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.response.model",
    "gen_ai.response.finish_reasons",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.request.stream",
    "gen_ai.response.time_to_first_chunk",
    "error.type",
    "parallax.llm.dialect",
    "parallax.llm.first_output_us",
    "parallax.llm.last_output_us",
    "parallax.llm.output_tokens_source",
    "parallax.llm.content_events",
    "parallax.llm.reasoning_events",
    "parallax.llm.reasoning_tokens",
    "parallax.llm.token_offsets_us",
    "parallax.llm.gaps",
    "parallax.llm.gap_p50_us",
    "parallax.llm.gap_p95_us",
    "parallax.llm.gap_p99_us",
    "parallax.llm.gap_max_us",
    "parallax.llm.gap_max_index",
    "parallax.llm.gaps_exact",
    "parallax.llm.stall_tokens",
    "parallax.llm.stall_gaps_us",
    "parallax.llm.queue_us",
    "parallax.llm.prefill_us",
    "parallax.llm.engine_prefill_us",
    "parallax.llm.engine_decode_us",
    "parallax.llm.engine_load_us",
    "parallax.llm.end",
    "parallax.llm.wasted_tokens",
    "parallax.llm.parse_problems",
    "parallax.llm.parse_problem",
)


def _materialized(a: Attr) -> str:
    """The column's type and the store's expression reading it from ``attributes`` (text:
    strings as sent, the rest as JSON writes them)."""
    v = f"attributes['{a.name}']"
    i = f"toInt64OrNull({v})"
    f = f"toFloat64OrNull({v})"
    exprs = {
        "string": ("LowCardinality(String)", v),
        # counts and durations alike: a negative one is no measurement
        "int": ("Nullable(Int64)", f"if({i} >= 0, {i}, NULL)"),
        "double": ("Nullable(Float64)", f"if(isFinite({f}) AND {f} >= 0, {f}, NULL)"),
        "bool": (
            "Nullable(Bool)",
            f"CAST(multiIf({v} = 'true', 1, {v} = 'false', 0, NULL), 'Nullable(Bool)')",
        ),
        "int[]": ("Array(Int64)", f"JSONExtract({v}, 'Array(Int64)')"),
        "string[]": ("Array(String)", f"JSONExtract({v}, 'Array(String)')"),
    }
    type_, expr = exprs[a.type]
    return f"{type_} MATERIALIZED {expr}"


_BY_NAME = {a.name: a for a in genai.ALL}
# Not in SPAN_COLUMNS: the store computes them, an insert never lists them.
SPAN_LLM_COLUMNS: tuple[Column, ...] = tuple(
    col(record_field(_BY_NAME[n]), _materialized(_BY_NAME[n])) for n in SPAN_LLM_ATTRS
)

# The beacon's llm object (parallax_contracts.beacon.Llm), in the row tuples' order after
# the v1 columns.
ENTRY_LLM_COLUMNS: tuple[Column, ...] = (
    col("llm_dialect", "LowCardinality(String)"),  # '' = no llm object
    col("llm_first_token_ms", "Nullable(Float64)"),  # first answer token's arrival
    col("llm_first_output_ms", "Nullable(Float64)"),  # first output token (reasoning too)
    col("llm_token_ms", "Array(Float64)"),  # each output token's arrival, the first 1024
    col("llm_gap_hist", "Array(Int64)"),  # the gaps after token 1024, in the agent's buckets
    col("llm_tokens", "Nullable(UInt32)"),
    col("llm_tokens_source", "LowCardinality(String)"),  # usage | events
    col("llm_end", "LowCardinality(String)"),  # '' = still open when sent
    col("llm_bad_events", "Nullable(UInt32)"),
)

# What the SLA checker reads of an LLM exchange (docs/store.md documents each).
PAIR_LLM_COLUMNS: tuple[Column, ...] = (
    col("llm_dialect", "LowCardinality(String)"),  # origin hop's, else the browser's; '' = none
    col("llm_model", "LowCardinality(String)"),  # origin's gen_ai.response.model
    col("llm_end", "LowCardinality(String)"),  # origin's ending
    col("user_llm_end", "LowCardinality(String)"),  # the probe's
    col("user_first_token_ms", "Nullable(Float64)"),  # first answer token − t0 (browser)
    col("server_first_token_ms", "Nullable(Float64)"),  # first answer token − t1 (origin)
    col("user_token_gap_p95_ms", "Nullable(Float64)"),  # this answer's P95 gap
    col("server_token_gap_p95_ms", "Nullable(Float64)"),
    col("user_tokens", "Nullable(UInt32)"),
    col("server_tokens", "Nullable(UInt32)"),
    col("llm_queue_ms", "Nullable(Float64)"),  # the engine's queue (the wire's reading)
    col("llm_prefill_ms", "Nullable(Float64)"),  # end of the queue → first output token
    col("llm_decode_ms", "Nullable(Float64)"),  # first → last output token
)
