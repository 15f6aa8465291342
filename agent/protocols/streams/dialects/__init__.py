"""The LLM stream dialects, one module each, in the order a stream's first events are tried
against them (the most specific first). Adding a dialect: its module here and one line in
DIALECTS (docs/ARCHITECTURE.md, "Adding a protocol")."""

from __future__ import annotations

from agent.protocols.streams.dialect import NDJSON, SSE, WS, Dialect
from agent.protocols.streams.dialects import (
    anthropic,
    chat_frames,
    ollama,
    openai_chat,
    openai_responses,
    realtime,
    tgi,
)

DIALECTS: tuple[Dialect, ...] = (
    anthropic.DIALECT,
    openai_responses.DIALECT,
    openai_chat.DIALECT,
    tgi.DIALECT,
    ollama.DIALECT,
    realtime.DIALECT,
    chat_frames.DIALECT,
)

BY_FRAMING: dict[str, tuple[Dialect, ...]] = {
    f: tuple(d for d in DIALECTS if d.framing == f) for f in (SSE, NDJSON, WS)
}
