"""Anthropic Messages streaming: ``message_start`` (model, input tokens),
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``thinking_delta``,
``input_json_delta`` of a tool call) / ``content_block_stop``, ``message_delta``
(``stop_reason``, output tokens so far), ``message_stop``; ``ping`` heartbeats; ``error``
events inside the 200 stream (``overloaded_error``)."""

from __future__ import annotations

import msgspec

from agent.protocols.streams.dialect import SSE, Dialect
from agent.protocols.streams.dialects.common import (
    TypedError,
    Usage,
    decode,
    error_type,
    partial_by_keys,
    type_of,
)
from agent.protocols.streams.stream import CONTENT, REASONING, Stream


class _Message(msgspec.Struct, gc=False):
    model: str | None = None
    usage: Usage | None = None


class _Delta(msgspec.Struct, gc=False):  # (its type is not read: the fields say it)
    text: str | None = None
    thinking: str | None = None
    partial_json: str | None = None
    stop_reason: str | None = None


class _Block(msgspec.Struct, gc=False):
    type: str | None = None


class _Event(msgspec.Struct, gc=False):
    type: str | None = None
    message: _Message | None = None
    delta: _Delta | None = None
    content_block: _Block | None = None
    usage: Usage | None = None
    error: TypedError | None = None


_DEC = msgspec.json.Decoder(_Event)


def detect(name: bytes, data: bytes) -> bool:
    if name in (b"message_start", b"ping", b"content_block_delta"):
        return True
    return data[:1] == b"{" and type_of(data) in ("message_start", "content_block_delta", "ping")


def parse(s: Stream, name: bytes, data: bytes) -> None:
    e = decode(s, _DEC, data)
    if e is None:
        return
    typ = e.type
    if typ == "content_block_delta" and e.delta is not None:
        d = e.delta
        if d.text or d.partial_json:
            s.token(CONTENT)
        elif d.thinking:
            s.token(REASONING)
    elif typ == "content_block_start" and e.content_block is not None:
        if e.content_block.type in ("tool_use", "server_tool_use"):
            s.token(CONTENT)  # the tool's name: the first output of a tool call
    elif typ == "message_start" and e.message is not None:
        if e.message.model:
            s.set_model(e.message.model)
        u = e.message.usage
        if u is not None:
            s.usage(u.input_tokens, None)
    elif typ == "message_delta":
        if e.delta is not None and e.delta.stop_reason:
            s.finish(e.delta.stop_reason)
        if e.usage is not None:
            s.usage(e.usage.input_tokens, e.usage.output_tokens)
    elif typ == "message_stop":
        s.final()
    elif typ == "error":
        s.fail(error_type(e.error))


def partial(s: Stream, name: bytes, head: bytes) -> None:
    partial_by_keys(s, head, (b'"text"', b'"partial_json"'), (b'"thinking"',))


DIALECT = Dialect("anthropic.messages", "anthropic", "chat", SSE, detect, parse, partial)
