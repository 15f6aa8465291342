"""One response's LLM stream: its events → tokens, times, counts, the ending (pure Python).

Fed the events its framing cut (agent.protocols.streams.framing), a :class:`Stream`
recognises its dialect from the first events (never from the route), hands each event to
the dialect, and keeps what leaves the agent: times of the first output and the first
answer token, every inter-token gap (bounded: agent.protocols.streams.gaps), token counts
(the stream's own usage when it says, else its content events), model, finish reason,
error type, and the engine's own timings where its stream states them. The text of prompts
and answers is looked at here and dropped: no field holds it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from agent.protocols.streams.gaps import Gaps

if TYPE_CHECKING:
    from agent.protocols.streams.dialect import Dialect

CONTENT, REASONING = 1, 2  # an output token event: the answer (text, a tool call), thinking
DETECT_EVENTS = 4  # events looked at for a dialect before the stream is left as bytes
OFFSETS_CAP = 1024  # output-token times exported exactly (the rest: gaps, histogram)
MAX_REASONS = 8  # distinct parse-problem reasons kept per stream
# the endings (parallax.llm.end)
COMPLETE, SERVER_CUT, CLIENT_ABORTED, ERROR = "complete", "server_cut", "client_aborted", "error"


class Engine:
    """What the agent sees of one engine (the streams served on one local port): when a
    stream of it last ended (its final event). A stream whose first output comes after
    another stream ended waited for it — a serial engine serves one request at a time, a
    batching one admits a waiting request when a slot frees. Streams served side by side
    (a concurrent app, a batch with room) end none in between: no wait is counted."""

    __slots__ = ("last_end_t",)

    def __init__(self) -> None:
        self.last_end_t = 0


class Engines:
    """The engines by local port (bounded: the oldest forgotten past MAX)."""

    MAX = 4096

    def __init__(self) -> None:
        self._by_port: dict[int, Engine] = {}

    def of(self, lport: int) -> Engine:
        e = self._by_port.get(lport)
        if e is None:
            if len(self._by_port) >= self.MAX:
                self._by_port.pop(next(iter(self._by_port)))
            e = self._by_port[lport] = Engine()
        return e


class Stream:
    """An exchange's body as LLM stream events (``event`` is the framing's sink)."""

    __slots__ = (
        "candidates",
        "dialect",
        "engine",
        "engine_decode_ns",
        "engine_load_ns",
        "engine_prefill_ns",
        "error_type",
        "events",
        "final_seen",
        "finish_reasons",
        "gaps",
        "input_tokens",
        "lead_t",
        "model",
        "n_content",
        "n_reasoning",
        "offsets",
        "operation",
        "output_tokens",
        "problems",
        "reasoning_tokens",
        "t1",
        "t_final",
        "t_first_answer",
        "t_first_out",
        "t_last_out",
        "t_write",
        "wasted",
        "wasted_after",
    )

    def __init__(self, candidates: tuple[Dialect, ...], t1: int, engine: Engine | None) -> None:
        self.candidates = candidates  # the dialects of its framing, in detection order
        self.dialect: Dialect | None = None
        self.operation: str | None = None  # a dialect that knows better than its default
        self.t1 = t1
        self.engine = engine
        self.t_write = 0  # the time of the write being framed (the sink's events' time)
        self.events = 0  # events seen (heartbeats are not events)
        self.t_first_out = 0  # first output token (answer or reasoning)
        self.t_first_answer = 0  # first answer token (text or a tool call)
        self.t_last_out = 0
        self.final_seen = False  # the dialect's final event ([DONE], message_stop, done …)
        self.t_final = 0  # ... and its time
        self.lead_t = 0  # when the engine last wrote another stream's token before ours
        self.n_content = 0
        self.n_reasoning = 0
        self.gaps = Gaps()
        self.offsets: list[int] = []  # output-token times, the first OFFSETS_CAP
        self.model: str | None = None
        self.finish_reasons: list[str] = []
        self.error_type: str | None = None
        self.input_tokens: int | None = None  # as the stream's usage states them
        self.output_tokens: int | None = None
        self.reasoning_tokens: int | None = None
        self.engine_prefill_ns: int | None = None  # the engine's own timings (Ollama)
        self.engine_decode_ns: int | None = None
        self.engine_load_ns: int | None = None
        self.problems: Counter[str] = Counter()  # parse problems, by reason
        self.wasted_after = 0  # the client's FIN: tokens written after it are wasted decode
        self.wasted = 0

    # -- the framing's sink -------------------------------------------------------------
    def event(self, name: bytes, data: bytes, truncated: bool) -> None:
        """One event (SSE: its ``event:`` name and joined ``data:``; NDJSON: a line; a
        WebSocket message), at the time of the write that completed it."""
        if name and name == b"deflate_lost":  # (most events have no name: one test)
            self.problem("deflate_lost")
            return
        self.events += 1
        d = self.dialect
        if d is None:
            if self.events > DETECT_EVENTS or not self.candidates:
                return
            for c in self.candidates:
                if c.detect(name, data):
                    d = self.dialect = c
                    break
            else:
                return
        if truncated:
            self.problem("truncated")
            d.partial(self, name, data)
        else:
            d.parse(self, name, data)

    # -- what a dialect reports ---------------------------------------------------------
    def token(self, kind: int) -> None:
        """An output token event (CONTENT or REASONING) at the current write's time (once
        per token: kept lean)."""
        t = self.t_write
        if kind == CONTENT:
            self.n_content += 1
            if not self.t_first_answer:
                self.t_first_answer = t
        else:
            self.n_reasoning += 1
        n = self.n_content + self.n_reasoning
        if n > 1:
            us = (t - self.t_last_out) // 1000
            self.gaps.add(us if us > 0 else 0)
        else:
            self.t_first_out = t
            eng = self.engine
            if eng is not None:
                # the others' last token before ours: the engine was theirs until then
                self.lead_t = max(self.t1, eng.last_end_t)
        self.t_last_out = t
        if n <= OFFSETS_CAP:  # (each token's time is kept until the cap)
            self.offsets.append(t)
        if self.wasted_after and t > self.wasted_after:
            self.wasted += 1

    def final(self) -> None:
        if not self.final_seen:
            self.final_seen = True
            self.t_final = self.t_write
            if self.engine is not None and self.t_write > self.engine.last_end_t:
                self.engine.last_end_t = self.t_write  # the engine is free of this one

    def fail(self, error_type: str) -> None:
        """An error event inside the stream (its type only, never its message)."""
        if self.error_type is None:
            self.error_type = error_type[:64] or "error"

    def finish(self, reason: str) -> None:
        if reason and reason not in self.finish_reasons and len(self.finish_reasons) < 4:
            self.finish_reasons.append(reason[:32])

    def set_model(self, model: str) -> None:
        if model and self.model is None:
            self.model = model[:128]

    def usage(
        self, input_tokens: int | None, output_tokens: int | None, reasoning: int | None = None
    ) -> None:
        """Token counts the stream states (the last statement wins: Anthropic sends
        running totals)."""
        if input_tokens is not None and input_tokens >= 0:
            self.input_tokens = input_tokens
        if output_tokens is not None and output_tokens >= 0:
            self.output_tokens = output_tokens
        if reasoning is not None and reasoning >= 0:
            self.reasoning_tokens = reasoning

    def engine_timings(
        self, prefill_ns: int | None, decode_ns: int | None, load_ns: int | None
    ) -> None:
        """The engine's own account of its time (Ollama's final line), in ns."""
        self.engine_prefill_ns = prefill_ns if prefill_ns is not None and prefill_ns >= 0 else None
        self.engine_decode_ns = decode_ns if decode_ns is not None and decode_ns >= 0 else None
        self.engine_load_ns = load_ns if load_ns is not None and load_ns >= 0 else None

    def problem(self, reason: str) -> None:
        if reason in self.problems or len(self.problems) < MAX_REASONS:
            self.problems[reason] += 1

    # -- the end ------------------------------------------------------------------------
    def client_left(self, t: int) -> None:
        """The client's FIN (or reset) arrived: output written after it is wasted."""
        if not self.wasted_after:
            self.wasted_after = t

    def ending(self) -> str:
        if self.error_type is not None:
            return ERROR
        if self.final_seen and not (self.wasted_after and self.wasted_after < self.t_final):
            return COMPLETE  # whatever the socket did after (the SDK closes after [DONE])
        if self.wasted_after:
            return CLIENT_ABORTED
        return SERVER_CUT

    @property
    def tokens(self) -> tuple[int, str]:
        """The output token count and where it comes from: the stream's usage, else its
        content events (answer and reasoning)."""
        if self.output_tokens is not None:
            return self.output_tokens, "usage"
        return self.n_content + self.n_reasoning, "events"
