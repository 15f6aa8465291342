"""LLM streams end to end on the real stack: the real agent in the kernel, the real llama.cpp
engine (a tiny random-weight model written at test time), the vendors' real client libraries
(openai — Chat Completions and Responses —, anthropic, ollama) reading a server that replays
each dialect's documented events, WebSocket Realtime messages, and LiteLLM as a gateway.

The agent's first-token times are checked against the client's arrival of the first content
event (absolute times on one machine: the agent's write ≤ the client's read, within 1 ms);
token counts against what the SDK delivered or the stream's usage; endings against what the
test did; queue waits against the engine's serial schedule; and the text against a canary.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import ollama
import openai
import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import Agent, one_record
from tests.agent.llm.stack import EOS_BIAS, Engine, Gateway, Replay

pytestmark = pytest.mark.ebpf
MS = 1_000_000
CANARY = "zq-canary-7f3e"
_CONTENT = re.compile(rb'"content":\s*"[^"]')  # a non-empty content delta


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.engine = Engine(tmp)
        self.replay = Replay(tmp)
        self.agent = Agent(tmp, [self.engine.port, self.replay.port, self.replay.ws_port])
        self._gateway: Gateway | None = None
        # the engine's first request loads what it caches: not a measurement
        self.chat(tokens=5)

    def gateway(self) -> Gateway:
        if self._gateway is None:
            self._gateway = Gateway(self.tmp, self.engine.url)
        return self._gateway

    def chat(
        self,
        tokens: int,
        prompt: str = "hi",
        base: str | None = None,
        stop_after: int | None = None,
        key: str = "none",
    ) -> dict[str, Any]:
        """One streamed chat through the openai SDK: its traceparent, the client's times
        (wall clock ns) of the request and of each content event, and its count."""
        ctx = trace_context.generate()
        client = openai.OpenAI(
            base_url=base or self.engine.url,
            api_key=key,
            default_headers={"traceparent": ctx.header()},
            max_retries=0,
        )
        t0 = time.time_ns()
        stream = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=tokens,
            stream=True,
            temperature=0,
            logit_bias=EOS_BIAS,
        )
        arrivals = []
        for ch in stream:
            if ch.choices and ch.choices[0].delta.content:
                arrivals.append(time.time_ns())
                if stop_after is not None and len(arrivals) >= stop_after:
                    stream.close()  # the client leaves mid-answer
                    break
        client.close()
        return {"ctx": ctx, "t0": t0, "arrivals": arrivals}


@pytest.fixture(scope="module")
def s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    st = Stack(tmp_path_factory.mktemp("llm"))
    try:
        yield st
    finally:
        st.agent.stop()
        if st._gateway is not None:
            st._gateway.stop()
        st.replay.stop()
        st.engine.stop()


def raw_first_content(url: str, ctx: trace_context.TraceContext, tokens: int) -> int:
    """The same request read lean (no SDK): the wall-clock time the bytes carrying the first
    non-empty content delta arrived — the client's first content event, without the SDK's
    own parsing in it."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": True,
        "temperature": 0,
        "logit_bias": EOS_BIAS,
    }
    seen = b""
    first = 0
    with httpx.stream(
        "POST", url + "/chat/completions", json=body, headers={"traceparent": ctx.header()}
    ) as r:
        for piece in r.iter_raw():
            t = time.time_ns()
            seen += piece
            if not first and _CONTENT.search(seen):
                first = t
    return first


def first_token_error_us(rec: dict[str, Any], first_arrival_ns: int) -> float:
    """The client's arrival of the first content event − the agent's time of its write."""
    agent_t = rec["start_unix_ns"] + rec["ttft_us"] * 1000
    return float(first_arrival_ns - agent_t) / 1000


def test_llama_cpp_first_token_counts_and_endings(s: Stack) -> None:
    """Twenty answers from the real engine through the openai SDK: the first token is the
    first content event (not the head, not the role-only delta), the count is the SDK's
    content events (the engine sends no usage), every stream complete though the SDK closes
    the connection right after ``[DONE]``. (The client's own parsing is in the error: on a
    busy machine one answer in ten or twenty reads its first event late.)"""
    errors = []
    for i in range(20):
        c = s.chat(tokens=20 + i)
        rec = one_record(s.agent, c["ctx"])
        assert rec["llm_dialect"] == "openai.chat"
        assert rec["gen_ai_provider_name"] == "llama.cpp"
        assert rec["gen_ai_operation_name"] == "chat"
        assert rec["llm_output_tokens_source"] == "events"
        assert rec["gen_ai_usage_output_tokens"] == len(c["arrivals"])
        assert rec["llm_end"] == "complete" and rec["client_aborted"] is False
        assert rec["gen_ai_response_finish_reasons"] == ["length"]
        assert rec["first_chunk_us"] < rec["ttft_us"]  # the role-only event came first
        assert first_token_error_us(rec, c["arrivals"][0]) > -200  # not after the SDK saw it
        ctx = trace_context.generate()
        arrived = raw_first_content(s.engine.url, ctx, 10)
        errors.append(first_token_error_us(one_record(s.agent, ctx), arrived))
    # never later than the client saw it (clock slack); within 1 ms for half of them — a busy
    # machine delays the client's wake-up now and then (seen: 3 ms for the 18th at load 9;
    # the 15th at 1.00004 ms in a fresh clone, beside the other worker; idle: median 60 µs,
    # 15th 0.26 ms). An earlier event taken for the first token is the record's own check
    # above (first_chunk_us < ttft_us: the role-only event came 0.4-2.1 ms before it).
    # The P95 over many answers is make bench-llm's figure (docs/benchmarks.md).
    assert min(errors) > -200, errors
    assert sorted(errors)[9] <= 1000, sorted(errors)


def test_queue_on_the_serial_engine(s: Stack) -> None:
    """Four requests at once on an engine that serves one at a time: each one's queue wait
    is the time the engine served the others before it, within max(30 ms, 15 %) of the
    truth; a request served alone waits under 30 ms.

    The truth: a request's first-token time minus the same prompt's solo time — less what
    the first-served request of the burst also paid over solo (the burst's own arrival: four
    requests parsed at once on two cores, the client's four threads sharing one GIL), which
    delays all four alike and is no wait behind another request."""
    solo = []
    for _ in range(3):
        c = s.chat(tokens=60, prompt="same prompt")
        rec = one_record(s.agent, c["ctx"])
        assert rec["llm_queue_us"] < 30_000, rec
        solo.append((c["arrivals"][0] - c["t0"]) / 1000)
    solo_us = statistics.median(solo)
    results: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=lambda: results.append(s.chat(tokens=60, prompt="same prompt")))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    over_solo = sorted(
        ((c["arrivals"][0] - c["t0"]) / 1000 - solo_us, one_record(s.agent, c["ctx"]))
        for c in results
    )
    burst = over_solo[0][0]  # the first served waited for no one: its excess is the burst's
    assert over_solo[0][1]["llm_queue_us"] < 30_000, over_solo[0]
    checked = [(round(excess - burst), rec["llm_queue_us"]) for excess, rec in over_solo]
    for truth, got in checked:
        assert abs(got - truth) <= max(30_000, 0.15 * truth), (checked, round(burst))
    assert max(t for t, _ in checked) > 300_000, checked  # the engine did serialise them


def test_client_abort_and_the_tokens_written_after_it(s: Stack) -> None:
    """The client closes after 20 tokens. The engine (uvicorn under it) stops writing once
    the client's reset arrives — its decode goes on unseen (--interrupt_requests False), so
    the wire shows what was written after the client left, here little or none; a server
    that keeps writing (the replay server) shows its wasted tokens."""
    c = s.chat(tokens=200, stop_after=20)
    rec = one_record(s.agent, c["ctx"])
    assert rec["llm_end"] == "client_aborted" and rec["client_aborted"] is True
    assert rec["llm_wasted_tokens"] is not None and rec["gen_ai_usage_output_tokens"] >= 20
    # a client that half-closes (its FIN) and a server that writes on to the end
    ctx = trace_context.generate()
    body = b'{"model": "tiny", "stream": true}'
    head = (
        f"POST /v1/chat/completions?tokens=40&gap_ms=5 HTTP/1.1\r\nHost: t\r\n"
        f"traceparent: {ctx.header()}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", s.replay.port), 5) as sock:
        sock.sendall(head + body)
        got = b""
        while got.count(b"data:") < 11:  # the role-only event and 10 tokens
            got += sock.recv(65536)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
    rec = one_record(s.agent, ctx)
    assert rec["llm_end"] == "client_aborted", rec
    assert 25 <= rec["llm_wasted_tokens"] <= 31, rec  # the 30 left, give or take the race


def test_a_long_answer_keeps_every_gap(s: Stack) -> None:
    """600 tokens: every gap counted (the old 256-write cap is gone), offsets to 1024."""
    c = s.chat(tokens=600)
    rec = one_record(s.agent, c["ctx"])
    n = len(c["arrivals"])
    assert rec["gen_ai_usage_output_tokens"] == n and rec["llm_gaps"] == n - 1
    assert len(rec["llm_token_offsets_us"]) == n and rec["llm_gaps_exact"] is True
    assert rec["llm_gap_p50_us"] <= rec["llm_gap_p95_us"] <= rec["llm_gap_max_us"]


def test_no_text_leaves_the_agent(s: Stack) -> None:
    """A canary in the prompt and, through the replay server, none in anything exported."""
    c = s.chat(tokens=10, prompt=f"say {CANARY} please")
    one_record(s.agent, c["ctx"])
    assert CANARY not in s.agent.jsonl.read_text()


# The agent's time of one event against the replay server's clock just before it wrote it:
# half the replay's 5 ms gap, so that an event off by one (≥ 5 ms away) still fails. Both
# sides of a single request are apart by the server's scheduling between its clock read and
# its write (and after its read of the request): 1 ms was passed once beside the other worker.
AT_WRITE_US = 2_500


def _replay_client(s: Stack, ctx: trace_context.TraceContext) -> dict[str, str]:
    return {"traceparent": ctx.header()}


def test_anthropic_sdk_thinking_then_answer(s: Stack) -> None:
    ctx = trace_context.generate()
    client = anthropic.Anthropic(
        base_url=s.replay.url, api_key="x", default_headers=_replay_client(s, ctx)
    )
    kinds = []
    with client.messages.stream(
        model="tiny",
        max_tokens=64,
        messages=[{"role": "user", "content": "hi"}],
        extra_query={"tokens": "6", "reasoning": "3"},
    ) as stream:
        for e in stream:
            if e.type == "content_block_delta":
                kinds.append((e.delta.type, time.time_ns()))
        final = stream.get_final_message()
    rec = one_record(s.agent, ctx)
    assert rec["llm_dialect"] == "anthropic.messages" and rec["gen_ai_provider_name"] == "anthropic"
    assert rec["llm_reasoning_events"] == 3 and rec["llm_content_events"] == 6
    assert rec["gen_ai_usage_output_tokens"] == final.usage.output_tokens == 9
    assert rec["gen_ai_usage_input_tokens"] == 12
    assert rec["llm_output_tokens_source"] == "usage"
    assert [k for k, _ in kinds] == ["thinking_delta"] * 3 + ["text_delta"] * 6
    # the first output is event 3 (after message_start, ping, the block's start), the first
    # answer event 8: against the server's own write times, on the agent's clock
    tp = ctx.header()
    assert abs(rec["llm_first_output_us"] - s.replay.since_read_us(tp, 3)) <= AT_WRITE_US
    assert abs(rec["ttft_us"] - s.replay.since_read_us(tp, 8)) <= AT_WRITE_US
    assert rec["gen_ai_response_finish_reasons"] == ["end_turn"] and rec["llm_end"] == "complete"


def test_anthropic_error_event_and_a_server_cut(s: Stack) -> None:
    ctx = trace_context.generate()
    client = anthropic.Anthropic(
        base_url=s.replay.url, api_key="x", default_headers=_replay_client(s, ctx), max_retries=0
    )
    with (
        pytest.raises(anthropic.APIStatusError),
        client.messages.stream(
            model="tiny",
            max_tokens=64,
            messages=[{"role": "user", "content": "hi"}],
            extra_query={"tokens": "3", "error": "overloaded_error"},
        ) as stream,
    ):
        for _ in stream:
            pass
    rec = one_record(s.agent, ctx)
    assert rec["status"] == 200 and rec["llm_end"] == "error"
    assert rec["error_type"] == "overloaded_error"
    ctx2 = trace_context.generate()
    with (
        pytest.raises(httpx.RemoteProtocolError),  # the server closed mid-stream
        httpx.stream(
            "POST",
            s.replay.url + "/v1/chat/completions?tokens=8&cut=1",
            json={"model": "tiny", "stream": True},
            headers={"traceparent": ctx2.header()},
        ) as r,
    ):
        assert r.status_code == 200
        for _ in r.iter_bytes():
            pass
    rec2 = one_record(s.agent, ctx2)
    assert rec2["llm_end"] == "server_cut" and rec2["client_aborted"] is False


def test_openai_responses_api(s: Stack) -> None:
    ctx = trace_context.generate()
    client = openai.OpenAI(
        base_url=s.replay.url + "/v1", api_key="x", default_headers=_replay_client(s, ctx)
    )
    arrivals = []
    stream = client.responses.create(
        model="tiny", input="hi", stream=True, extra_query={"tokens": "5", "reasoning": "2"}
    )
    usage = None
    for e in stream:
        if e.type == "response.output_text.delta":
            arrivals.append(time.time_ns())
        elif e.type == "response.completed":
            usage = e.response.usage
    rec = one_record(s.agent, ctx)
    assert usage is not None
    assert rec["llm_dialect"] == "openai.responses"
    assert rec["gen_ai_usage_output_tokens"] == usage.output_tokens == 7
    assert rec["llm_reasoning_tokens"] == 2 and rec["llm_content_events"] == len(arrivals) == 5
    # created, in_progress, two reasoning deltas, then the answer: event 4
    assert abs(rec["ttft_us"] - s.replay.since_read_us(ctx.header(), 4)) <= AT_WRITE_US
    assert abs(rec["llm_first_output_us"] - s.replay.since_read_us(ctx.header(), 2)) <= AT_WRITE_US


def test_ollama_client_ndjson_with_the_engine_timings(s: Stack) -> None:
    ctx = trace_context.generate()
    client = ollama.Client(host=s.replay.url, headers=_replay_client(s, ctx))
    arrivals = []
    last = None
    for part in client.chat(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
    ):
        if part.message.content:
            arrivals.append(time.time_ns())
        last = part
    rec = one_record(s.agent, ctx)
    assert last is not None and last.done
    assert rec["llm_dialect"] == "ollama" and rec["gen_ai_provider_name"] == "ollama"
    assert rec["gen_ai_usage_output_tokens"] == last.eval_count == len(arrivals)
    assert last.prompt_eval_duration is not None and last.eval_duration is not None
    assert rec["llm_engine_prefill_us"] == last.prompt_eval_duration // 1000
    assert rec["llm_engine_decode_us"] == last.eval_duration // 1000
    assert abs(rec["ttft_us"] - s.replay.since_read_us(ctx.header(), 0)) <= AT_WRITE_US


def test_websocket_realtime_messages(s: Stack) -> None:
    """OpenAI Realtime events over a WebSocket with permessage-deflate (the client offers
    it, the server accepts): one record per turn, tokens and the end in each."""
    import websockets.asyncio.client as wsc

    ctx = trace_context.generate()

    async def run() -> list[int]:
        url = f"ws://127.0.0.1:{s.replay.ws_port}/v1/realtime?traceparent={ctx.header()}"
        counts = []
        async with wsc.connect(url) as ws:
            for n in (4, 7):
                await ws.send(json.dumps({"type": "response.create", "tokens": n}))
                got = 0
                while True:
                    m = json.loads(await ws.recv())
                    got += m["type"] == "response.output_text.delta"
                    if m["type"] == "response.done":
                        break
                counts.append(got)
        return counts

    counts = asyncio.run(run())
    recs = s.agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id and r["ws_seq"], count=2)
    by_turn = {r["ws_seq"]: r for r in recs}
    for seq, n in zip((1, 2), counts, strict=True):
        r = by_turn[seq]
        assert r["llm_dialect"] == "openai.realtime", r
        assert r["gen_ai_usage_output_tokens"] == n and r["llm_end"] == "complete"


def test_a_csv_download_has_no_token_fields(s: Stack) -> None:
    ctx = trace_context.generate()
    r = httpx.get(s.replay.url + "/csv?rows=50", headers={"traceparent": ctx.header()})
    assert r.status_code == 200
    rec = one_record(s.agent, ctx)
    assert rec["first_chunk_us"] is not None and rec["chunks"] > 1
    # no token fields at all (a record carries the LLM fields only for an LLM stream)
    assert not any(k.startswith(("llm_", "gen_ai_")) for k in rec), rec


def test_a_5000_token_answer_with_a_stall(s: Stack) -> None:
    """One 300 ms stall before token 4,000 of 5,000: reported at its token with its gap, and
    the P95 gap exact against the server's own write times."""
    ctx = trace_context.generate()
    with httpx.stream(
        "POST",
        s.replay.url + "/v1/chat/completions?tokens=5000&gap_ms=0&stall_at=4001&stall_ms=300",
        json={"model": "tiny", "stream": True},
        headers={"traceparent": ctx.header()},
        timeout=60,
    ) as r:
        for _ in r.iter_bytes():
            pass
    rec = one_record(s.agent, ctx)
    writes = s.replay.writes(ctx.header())
    content = writes[1:5001]  # the role-only event first; then the 5,000 content events
    gaps_us = sorted((b - a) // 1000 for a, b in itertools.pairwise(content))
    p95 = gaps_us[max(1, -(-95 * len(gaps_us) // 100)) - 1]
    assert rec["gen_ai_usage_output_tokens"] == 5000 and rec["llm_gaps_exact"] is True
    assert abs(rec["llm_gap_p95_us"] - p95) <= max(50, 0.05 * p95), (rec["llm_gap_p95_us"], p95)
    assert rec["llm_stall_tokens"] == [4000], rec["llm_stall_tokens"]
    assert 290_000 <= rec["llm_stall_gaps_us"][0] <= 400_000


def test_litellm_in_front_two_hops(s: Stack) -> None:
    """LiteLLM proxies the engine: two records, the gateway's with the client's trace; the
    engine's without it (LiteLLM does not forward traceparent: docs/agent.md says what that
    costs), both in the same dialect."""
    gw = s.gateway()
    s.agent.stop()
    s.agent = Agent(s.tmp, [s.engine.port, s.replay.port, s.replay.ws_port, gw.port])
    c = s.chat(tokens=30, base=gw.url, key=gw.key)
    front = one_record(s.agent, c["ctx"])
    assert front["llm_dialect"] == "openai.chat" and front["llm_end"] == "complete"
    back = s.agent.wait_for(
        lambda r: r["local_port"] == s.engine.port and r["start_unix_ns"] > c["t0"]
    )
    assert back and back[0]["trace_id"] != c["ctx"].trace_id  # the dropped traceparent
    assert back[0]["llm_content_events"] == front["llm_content_events"] == len(c["arrivals"])


def test_genai_metrics_for_llm_streams_only(s: Stack) -> None:
    """The agent's /metrics: GenAI semconv histograms (seconds) for the LLM streams above,
    with their attributes as labels; none for the CSV download."""
    c = s.chat(tokens=12)
    one_record(s.agent, c["ctx"])
    deadline = time.monotonic() + 10
    while True:
        m = s.agent.metrics()
        ttft = {k: v for k, v in m.items() if k.startswith("gen_ai_server_time_to_first_token")}
        if (
            any('gen_ai_provider_name="llama.cpp"' in k for k in ttft)
            or time.monotonic() > deadline
        ):
            break
        time.sleep(0.2)
    engine = [
        k
        for k in ttft
        if k.startswith("gen_ai_server_time_to_first_token_seconds_count")
        and 'gen_ai_provider_name="llama.cpp"' in k
    ]
    assert engine and all('gen_ai_operation_name="chat"' in k for k in engine), ttft
    assert any(k.startswith("gen_ai_server_time_per_output_token_seconds_count") for k in m)
    assert any(k.startswith("gen_ai_server_request_duration_seconds_bucket") for k in m)
    assert not any('http_route="/csv"' in k for k in m)
