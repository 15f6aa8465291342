"""Each dialect's event sequence as its documentation shows it (and its SDK accepts:
tests/agent/test_llm_dialects.py reads them through the vendors' real clients; the demo's
apps stream them, tests/test_llm_app.py reads theirs through the same clients). Builders
return one bytes item per event — SSE events already framed (``data: …\\n\\n``, with an
``event:`` line where the dialect names its events), NDJSON lines and WebSocket messages
bare. ``words(i)`` is the i-th content delta's text (`` w0``, `` w1``… unless given)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

MODEL = "tiny"
_DELTA = "content_block_delta"
Text = Callable[[int], str]


def _w(i: int) -> str:
    return f" w{i}"


def sse(obj: Any, event: str | None = None) -> bytes:
    data = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + data + b"\n\n"


def _chat_chunk(
    delta: dict[str, Any], finish: str | None = None, model: str = MODEL
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1733331234,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def content_chunk(text: str) -> dict[str, Any]:
    return _chat_chunk({"content": text})


def finish_chunk(reason: str = "stop") -> dict[str, Any]:
    return _chat_chunk({}, reason)


def openai_chat_raw(
    tokens: int,
    usage: bool,
    reasoning: int = 0,
    tool_call: bool = False,
    *,
    words: Text = _w,
    model: str = MODEL,
    prompt_tokens: int = 7,
    finish: str | None = None,
) -> list[Any]:
    """Chat Completions chunks as objects (and the final ``[DONE]`` as bytes). With
    ``usage`` (``stream_options.include_usage``) every chunk carries ``"usage": null`` and
    one more chunk, with no choices, the counts — as the API documents it."""
    out: list[Any] = [_chat_chunk({"role": "assistant", "content": ""}, model=model)]
    out += [_chat_chunk({"reasoning_content": f"r{i}"}, model=model) for i in range(reasoning)]
    if tool_call:
        out.append(
            _chat_chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get", "arguments": ""},
                        }
                    ]
                },
                model=model,
            )
        )
    out += [_chat_chunk({"content": words(i)}, model=model) for i in range(tokens)]
    out.append(_chat_chunk({}, finish or ("tool_calls" if tool_call else "stop"), model=model))
    if usage:
        for chunk in out:
            chunk["usage"] = None
        done = tokens + reasoning
        u = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": done,
            "total_tokens": prompt_tokens + done,
        }
        out.append({**_chat_chunk({}, model=model), "choices": [], "usage": u})
    out.append(b"[DONE]")
    return out


def openai_chat(
    tokens: int,
    usage: bool,
    reasoning: int = 0,
    *,
    words: Text = _w,
    model: str = MODEL,
    prompt_tokens: int = 7,
    finish: str | None = None,
) -> list[bytes]:
    raw = openai_chat_raw(
        tokens,
        usage,
        reasoning,
        words=words,
        model=model,
        prompt_tokens=prompt_tokens,
        finish=finish,
    )
    return [sse(o) for o in raw]


def anthropic(
    thinking: int,
    text: int,
    error: str | None = None,
    *,
    words: Text = _w,
    model: str = MODEL,
    input_tokens: int = 12,
    stop_reason: str = "end_turn",
) -> list[bytes]:
    msg: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    out = [
        sse({"type": "message_start", "message": msg}, "message_start"),
        sse({"type": "ping"}, "ping"),
    ]
    idx = 0
    if thinking:
        out.append(
            sse(
                {
                    "type": "content_block_start",
                    "index": idx,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                },
                "content_block_start",
            )
        )
        for i in range(thinking):
            d = {"type": "thinking_delta", "thinking": f"t{i}"}
            out.append(
                sse(
                    {"type": "content_block_delta", "index": idx, "delta": d}, "content_block_delta"
                )
            )
        out.append(sse({"type": "content_block_stop", "index": idx}, "content_block_stop"))
        idx += 1
    out.append(
        sse(
            {
                "type": "content_block_start",
                "index": idx,
                "content_block": {"type": "text", "text": ""},
            },
            "content_block_start",
        )
    )
    for i in range(text):
        d = {"type": "text_delta", "text": words(i)}
        out.append(sse({"type": "content_block_delta", "index": idx, "delta": d}, _DELTA))
    if error:
        out.append(
            sse({"type": "error", "error": {"type": error, "message": "Overloaded"}}, "error")
        )
        return out
    out.append(sse({"type": "content_block_stop", "index": idx}, "content_block_stop"))
    out.append(
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": thinking + text},
            },
            "message_delta",
        )
    )
    out.append(sse({"type": "message_stop"}, "message_stop"))
    return out


def responses(reasoning: int, text: int, failed: bool = False) -> list[bytes]:
    base = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1733331234,
        "model": MODEL,
        "output": [],
        "status": "in_progress",
    }
    seq = 0

    def e(obj: dict[str, Any]) -> bytes:
        nonlocal seq
        seq += 1
        obj["sequence_number"] = seq
        return sse(obj, obj["type"])

    out = [
        e({"type": "response.created", "response": base}),
        e({"type": "response.in_progress", "response": base}),
    ]
    for i in range(reasoning):
        out.append(
            e(
                {
                    "type": "response.reasoning_summary_text.delta",
                    "item_id": "rs_1",
                    "output_index": 0,
                    "summary_index": 0,
                    "delta": f"r{i}",
                }
            )
        )
    for i in range(text):
        out.append(
            e(
                {
                    "type": "response.output_text.delta",
                    "item_id": "msg_1",
                    "output_index": 1,
                    "content_index": 0,
                    "delta": f" w{i}",
                    "logprobs": [],
                }
            )
        )
    if failed:
        r = {**base, "status": "failed", "error": {"code": "server_error", "message": "x"}}
        out.append(e({"type": "response.failed", "response": r}))
        return out
    usage = {
        "input_tokens": 9,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": reasoning + text,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": 9 + reasoning + text,
    }
    out.append(
        e(
            {
                "type": "response.completed",
                "response": {**base, "status": "completed", "usage": usage},
            }
        )
    )
    return out


def ollama(tokens: int, chat: bool = True) -> list[bytes]:
    def line(obj: dict[str, Any]) -> bytes:
        return json.dumps({"model": MODEL, "created_at": "2026-12-04T00:00:00Z", **obj}).encode()

    out = []
    for i in range(tokens):
        part = (
            {"message": {"role": "assistant", "content": f" w{i}"}}
            if chat
            else {"response": f" w{i}"}
        )
        out.append(line({**part, "done": False}))
    last = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    out.append(
        line(
            {
                **last,
                "done": True,
                "done_reason": "stop",
                "total_duration": 120_000_000,
                "load_duration": 5_000_000,
                "prompt_eval_count": 11,
                "prompt_eval_duration": 40_000_000,
                "eval_count": tokens,
                "eval_duration": 60_000_000,
            }
        )
    )
    return out


def tgi(tokens: int) -> list[bytes]:
    out = []
    for i in range(tokens):
        tok = {"id": i, "text": f" w{i}", "logprob": -0.1, "special": False}
        out.append(sse({"index": i + 1, "token": tok, "generated_text": None, "details": None}))
    eos = {"id": 2, "text": "</s>", "logprob": -0.1, "special": True}
    details = {"finish_reason": "eos_token", "generated_tokens": tokens + 1, "seed": None}
    out.append(sse({"index": tokens + 1, "token": eos, "generated_text": "x", "details": details}))
    return out


def realtime(tokens: int) -> list[bytes]:
    def m(obj: dict[str, Any]) -> bytes:
        return json.dumps(obj).encode()

    out = [
        m({"type": "response.created", "event_id": "e0", "response": {"id": "r1"}}),
        m({"type": "response.output_item.added", "event_id": "e1", "output_index": 0}),
    ]
    for i in range(tokens):
        out.append(
            m(
                {
                    "type": "response.output_text.delta",
                    "event_id": f"d{i}",
                    "response_id": "r1",
                    "item_id": "i1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": f" w{i}",
                }
            )
        )
    out.append(
        m(
            {
                "type": "response.done",
                "event_id": "e9",
                "response": {
                    "id": "r1",
                    "status": "completed",
                    "usage": {"input_tokens": 3, "output_tokens": tokens, "total_tokens": 0},
                },
            }
        )
    )
    return out
