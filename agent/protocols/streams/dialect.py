"""What a stream dialect is: how to recognise it from a first event and what each of its
events means (agent.protocols.streams.dialects lists them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.protocols.streams.stream import Stream

SSE, NDJSON, WS = "sse", "ndjson", "ws"  # the framings


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str  # parallax.llm.dialect
    provider: str  # gen_ai.provider.name (OpenTelemetry's well-known value where one exists)
    operation: str  # gen_ai.operation.name
    framing: str  # SSE, NDJSON or WS
    # (event name, data) of one of the first events → is the stream in this dialect?
    detect: Callable[[bytes, bytes], bool]
    # a whole event → what it means, told to the stream (Stream.token, final, usage …)
    parse: Callable[[Stream, bytes, bytes], None]
    # an event seen only in part (too long, or bytes not copied): its head, classified
    partial: Callable[[Stream, bytes, bytes], None]
