"""What the agent reports about an LLM stream (agent/protocols/streams): span attributes in
OpenTelemetry's GenAI semantic conventions (``gen_ai.*``, now in
`semantic-conventions-genai`) where they exist, ``parallax.llm.*`` for the rest.

Only on a response whose body spoke a known stream dialect; a stream in no dialect (a CSV
download, an SSE feed of prices) keeps byte semantics and carries none of these. Times are
µs from t1 (the app's read of the request) like the other ``parallax.*_us``;
``gen_ai.response.time_to_first_chunk`` is semconv's, in seconds. Absent means not measured
(no usage in the stream, no other stream on the engine …), never zero.
"""

from __future__ import annotations

from parallax_contracts.attr import Attr

# --- OpenTelemetry GenAI semantic conventions ---------------------------------------
GEN_AI_OPERATION_NAME = Attr(
    "gen_ai.operation.name",
    "string",
    "",
    "`chat`, or `text_completion` (legacy Completions, Ollama's generate, TGI's generate_stream).",
    True,
)
GEN_AI_PROVIDER_NAME = Attr(
    "gen_ai.provider.name",
    "string",
    "",
    "semconv's well-known value where one exists (`openai`, `anthropic`); for self-hosted"
    " engines recognised by their process: `llama.cpp`, `vllm`, `tgi`, `ollama`, `sglang`;"
    " `chat` for a chat server's own WebSocket frames.",
    True,
)
GEN_AI_RESPONSE_MODEL = Attr(
    "gen_ai.response.model", "string", "", "The model the stream names (first 128 bytes).", True
)
GEN_AI_RESPONSE_FINISH_REASONS = Attr(
    "gen_ai.response.finish_reasons",
    "string[]",
    "",
    "As the stream states them (`stop`, `length`, `tool_calls`, `end_turn` …).",
    True,
)
GEN_AI_USAGE_INPUT_TOKENS = Attr(
    "gen_ai.usage.input_tokens", "int", "", "Input tokens, where the stream states them.", True
)
GEN_AI_USAGE_OUTPUT_TOKENS = Attr(
    "gen_ai.usage.output_tokens",
    "int",
    "",
    "Output tokens: the stream's usage when it states it, else its output events"
    " (`parallax.llm.output_tokens_source` says which).",
    True,
)
GEN_AI_REQUEST_STREAM = Attr(
    "gen_ai.request.stream", "bool", "", "The response was streamed (always true here).", True
)
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = Attr(
    "gen_ai.response.time_to_first_chunk",
    "double",
    "s",
    "Time to the first answer token (the server's write of it), seconds from t1.",
    True,
)
ERROR_TYPE = Attr(
    "error.type",
    "string",
    "",
    "An error event inside the 200 stream: its type (`overloaded_error` …), never its text.",
    True,
)

# --- Parallax ---------------------------------------------------------------------------
DIALECT = Attr(
    "parallax.llm.dialect",
    "string",
    "",
    "The stream's dialect: `openai.chat`, `openai.responses`, `anthropic.messages`,"
    " `ollama`, `tgi.generate`, `openai.realtime`, `chat.frames`.",
)
FIRST_OUTPUT_US = Attr(
    "parallax.llm.first_output_us",
    "int",
    "us",
    "First output token of any kind (reasoning included) − t1; `parallax.ttft_us` is the"
    " first *answer* token.",
)
LAST_OUTPUT_US = Attr(
    "parallax.llm.last_output_us",
    "int",
    "us",
    "The last output token's write − t1 (time per output token: last − first over the count − 1).",
)
OUTPUT_TOKENS_SOURCE = Attr(
    "parallax.llm.output_tokens_source",
    "string",
    "",
    "`usage` (the stream stated its count) or `events` (its output events counted).",
)
CONTENT_EVENTS = Attr(
    "parallax.llm.content_events", "int", "", "Answer events (text or tool-call deltas)."
)
REASONING_EVENTS = Attr(
    "parallax.llm.reasoning_events", "int", "", "Reasoning (thinking) events before or between."
)
REASONING_TOKENS = Attr(
    "parallax.llm.reasoning_tokens", "int", "", "Reasoning tokens, where the usage states them."
)
TOKEN_OFFSETS_US = Attr(
    "parallax.llm.token_offsets_us",
    "int[]",
    "us",
    "Each output token event's write − t1, the first 1024 (the gaps below cover all).",
)
GAPS = Attr("parallax.llm.gaps", "int", "", "Inter-token gaps measured (output events − 1).")
GAP_P50_US = Attr("parallax.llm.gap_p50_us", "int", "us", "Median inter-token gap.")
GAP_P95_US = Attr("parallax.llm.gap_p95_us", "int", "us", "P95 inter-token gap.")
GAP_P99_US = Attr("parallax.llm.gap_p99_us", "int", "us", "P99 inter-token gap.")
GAP_MAX_US = Attr("parallax.llm.gap_max_us", "int", "us", "Longest inter-token gap.")
GAP_MAX_INDEX = Attr(
    "parallax.llm.gap_max_index", "int", "", "The output token after the longest gap (1-based)."
)
GAPS_EXACT = Attr(
    "parallax.llm.gaps_exact",
    "bool",
    "",
    "The quantiles are exact (up to 8192 gaps); false: from a log histogram, within ±19 %.",
)
STALL_TOKENS = Attr(
    "parallax.llm.stall_tokens",
    "int[]",
    "",
    "Stalls: the output tokens after a gap over 100 ms and 8× the median gap (up to 16).",
)
STALL_GAPS_US = Attr(
    "parallax.llm.stall_gaps_us", "int[]", "us", "Those stalls' gaps, in the same order."
)
QUEUE_US = Attr(
    "parallax.llm.queue_us",
    "int",
    "us",
    "Seen on the wire: from t1 until another stream of the engine (the streams of the same"
    " local port) last ended before this stream's first output — the time the engine was"
    " busy with others while this one waited (0: served beside them).",
)
PREFILL_US = Attr(
    "parallax.llm.prefill_us",
    "int",
    "us",
    "From the end of that wait to the first output token (the engine's prefill, on a"
    " serial engine).",
)
ENGINE_PREFILL_US = Attr(
    "parallax.llm.engine_prefill_us",
    "int",
    "us",
    "The engine's own prefill time, where its stream states it (Ollama prompt_eval_duration).",
)
ENGINE_DECODE_US = Attr(
    "parallax.llm.engine_decode_us",
    "int",
    "us",
    "The engine's own decode time (Ollama eval_duration).",
)
ENGINE_LOAD_US = Attr(
    "parallax.llm.engine_load_us", "int", "us", "The engine's model load time (Ollama)."
)
END = Attr(
    "parallax.llm.end",
    "string",
    "",
    "`complete` (final event seen, whatever the socket did after), `server_cut` (no final"
    " event), `client_aborted` (the client left first), `error` (an error event).",
)
WASTED_TOKENS = Attr(
    "parallax.llm.wasted_tokens",
    "int",
    "",
    "Output events the server wrote after the client had left (wasted decode).",
)
PARSE_PROBLEMS = Attr(
    "parallax.llm.parse_problems",
    "int",
    "",
    "Events that could not be read whole: `parallax.llm.parse_problem` names the commonest"
    " reason (`truncated`, `garbage`, `deflate_lost`).",
)
PARSE_PROBLEM = Attr("parallax.llm.parse_problem", "string", "", "See parse_problems.")

ALL: tuple[Attr, ...] = (
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    GEN_AI_REQUEST_STREAM,
    GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    ERROR_TYPE,
    DIALECT,
    FIRST_OUTPUT_US,
    LAST_OUTPUT_US,
    OUTPUT_TOKENS_SOURCE,
    CONTENT_EVENTS,
    REASONING_EVENTS,
    REASONING_TOKENS,
    TOKEN_OFFSETS_US,
    GAPS,
    GAP_P50_US,
    GAP_P95_US,
    GAP_P99_US,
    GAP_MAX_US,
    GAP_MAX_INDEX,
    GAPS_EXACT,
    STALL_TOKENS,
    STALL_GAPS_US,
    QUEUE_US,
    PREFILL_US,
    ENGINE_PREFILL_US,
    ENGINE_DECODE_US,
    ENGINE_LOAD_US,
    END,
    WASTED_TOKENS,
    PARSE_PROBLEMS,
    PARSE_PROBLEM,
)
TOKEN_OFFSETS_CAP = 1024

# The process names of self-hosted engines (the traced server's service or executable),
# for gen_ai.provider.name: the dialect alone says only which API shape they speak.
ENGINES: tuple[tuple[str, str], ...] = (
    ("llama_cpp", "llama.cpp"),
    ("llama-server", "llama.cpp"),
    ("vllm", "vllm"),
    ("text-generation", "tgi"),
    ("ollama", "ollama"),
    ("sglang", "sglang"),
)


def provider(dialect_provider: str, service: str) -> str:
    """gen_ai.provider.name: the engine's, when the process is one we know, else the
    dialect's (an OpenAI-shaped stream from an unknown process is `openai`)."""
    low = service.lower()
    for needle, name in ENGINES:
        if needle in low:
            return name
    return dialect_provider
