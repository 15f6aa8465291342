"""The LLM stream vectors (docs/contracts/llm-stream-vectors.json): response bodies as the
writes a server makes, each with what the agent's stream reader (agent/protocols/streams)
makes of it — dialect, the write that carried the first answer token and the first output
token, each output token's write, the token count and its source, the ending. The probe's
node tests (js_probe/test/llm.test.ts) feed the same writes, one chunk each, to its reader
and must agree: the two sides of a request call the same event its first token.

``python -m tests.probe.llm_vectors`` rewrites the file; tests/probe/test_llm_vectors.py
fails while it is stale (a change of the agent's rules changes the vectors, and the probe's
tests then say where the probe differs)."""

from __future__ import annotations

import json
import sys
from typing import Any

from agent.protocols.streams.body import open_body
from agent.protocols.streams.dialect import NDJSON, SSE
from demo import sse_events as ev
from parallax_contracts import CONTRACTS_DIR

FILE = CONTRACTS_DIR / "llm-stream-vectors.json"
MS = 1_000_000
STEP_MS = 10  # write i is at (i + 1) * STEP_MS ms


def _resplit(writes: list[bytes], size: int) -> list[bytes]:
    body = b"".join(writes)
    return [body[i : i + size] for i in range(0, len(body), size)]


def _crlf(writes: list[bytes]) -> list[bytes]:
    """The same events with CRLF line ends and a comment (a heartbeat) before each."""
    return [b": keep-alive\r\n\r\n" + w.replace(b"\n", b"\r\n") for w in writes]


def _anthropic_tool_call() -> list[bytes]:
    """Text, then a tool call: its content_block_start (the tool's name) is output."""
    events = ev.anthropic(0, 2)
    start = {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {}},
    }
    delta = {"type": "content_block_delta", "index": 1}
    call = [
        ev.sse(start, "content_block_start"),
        ev.sse({**delta, "delta": {"type": "input_json_delta", "partial_json": ""}}, _DELTA),
        ev.sse({**delta, "delta": {"type": "input_json_delta", "partial_json": "{}"}}, _DELTA),
        ev.sse({"type": "content_block_stop", "index": 1}, "content_block_stop"),
    ]
    tool_only = [events[0], events[1], *call, *events[-2:]]
    return tool_only


_DELTA = "content_block_delta"


def cases() -> list[tuple[str, str, list[bytes]]]:
    """(name, framing, writes)."""
    chat_usage = ev.openai_chat(tokens=5, usage=True)
    garbage = ev.openai_chat(tokens=4, usage=False)
    garbage.insert(3, b"data: {not json\n\n")
    chat_error = [
        *ev.openai_chat(tokens=2, usage=False)[:3],
        ev.sse({"error": {"type": "server_error", "message": "x", "code": None}}),
    ]
    return [
        ("openai chat with usage: the role-only delta is no token", SSE, chat_usage),
        ("openai chat without usage: content events counted", SSE, ev.openai_chat(12, False)),
        ("openai chat, reasoning_content before the answer", SSE, ev.openai_chat(4, True, 3)),
        (
            "openai chat, a tool call's delta is an answer token",
            SSE,
            [ev.sse(o) for o in ev.openai_chat_raw(tokens=2, usage=False, tool_call=True)],
        ),
        ("openai chat cut by the server before finish_reason", SSE, ev.openai_chat(8, False)[:6]),
        ("openai chat, an error object inside the 200 stream", SSE, chat_error),
        ("openai chat, a non-JSON event after the dialect is known", SSE, garbage),
        ("openai chat cut into 7-byte writes", SSE, _resplit(chat_usage, 7)),
        ("openai chat in one write", SSE, _resplit(chat_usage, 1 << 20)),
        ("openai chat with CRLF line ends and comment heartbeats", SSE, _crlf(chat_usage)),
        ("anthropic messages, thinking then text", SSE, ev.anthropic(3, 4)),
        ("anthropic messages, an error event", SSE, ev.anthropic(0, 2, "overloaded_error")),
        ("anthropic messages, a tool call first", SSE, _anthropic_tool_call()),
        ("anthropic messages cut into 13-byte writes", SSE, _resplit(ev.anthropic(2, 3), 13)),
        ("openai responses, reasoning then output text", SSE, ev.responses(2, 3)),
        ("openai responses, response.failed", SSE, ev.responses(0, 1, failed=True)),
        ("ollama chat (NDJSON)", NDJSON, [x + b"\n" for x in ev.ollama(6)]),
        ("ollama generate (NDJSON)", NDJSON, [x + b"\n" for x in ev.ollama(4, chat=False)]),
        ("ollama cut into 11-byte writes", NDJSON, _resplit([x + b"\n" for x in ev.ollama(3)], 11)),
        ("an SSE feed in no dialect (prices)", SSE, [b'data: {"price": 1}\n\n'] * 6),
        ("NDJSON in no dialect (log lines)", NDJSON, [b'{"level": "info", "n": 1}\n'] * 6),
    ]  # fmt: skip


def _index(t: int) -> int | None:
    return t // (STEP_MS * MS) - 1 if t else None


def expected(framing: str, writes: list[bytes]) -> dict[str, Any]:
    """What the agent reads in ``writes`` (write i at (i + 1) * STEP_MS ms)."""
    r = open_body(framing, False, 0, None)
    for i, w in enumerate(writes):
        r.write((i + 1) * STEP_MS * MS, len(w), w)
    s = r.stream
    if s.dialect is None:
        return {"dialect": None}
    tokens, source = s.tokens
    return {
        "dialect": s.dialect.name,
        "first_token": _index(s.t_first_answer),
        "first_output": _index(s.t_first_out),
        "token_writes": [_index(t) for t in s.offsets],
        "tokens": tokens,
        "tokens_source": source,
        "end": s.ending(),
    }


def vectors() -> dict[str, Any]:
    out = []
    for name, framing, writes in cases():
        out.append(
            {
                "name": name,
                "framing": framing,
                "writes": [w.decode() for w in writes],
                "expect": expected(framing, writes),
            }
        )
    return {
        "about": (
            "LLM stream bodies as server writes (write i arrives at (i + 1) * 10 ms) and what "
            "the agent's reader makes of them: token and first-token positions are write "
            "indexes. Generated by python -m tests.probe.llm_vectors; the probe must agree."
        ),
        "vectors": out,
    }


def text() -> str:
    return json.dumps(vectors(), indent=1, ensure_ascii=True) + "\n"


def main() -> int:
    t = text()
    if not FILE.exists() or FILE.read_text() != t:
        FILE.write_text(t)
        print(f"wrote {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
