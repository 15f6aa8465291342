"""LLM stream dialects from the bytes a server writes (pure Python, no kernel): framing
across writes (SSE, NDJSON, chunked coding, WebSocket frames with permessage-deflate), each
dialect's events, the counts and times that leave the agent, endings, and the bounds —
garbage, truncation and 1 MB events give a counted reason, never an exception."""

from __future__ import annotations

import json
import zlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.protocols.streams import framing as fr
from agent.protocols.streams import gaps
from agent.protocols.streams.body import BodyReader, framing_of, open_body
from agent.protocols.streams.dialect import NDJSON, SSE, WS
from agent.protocols.streams.dialects import BY_FRAMING
from agent.protocols.streams.gaps import EXACT, Gaps
from agent.protocols.streams.stream import (
    CLIENT_ABORTED,
    COMPLETE,
    ERROR,
    SERVER_CUT,
    Engine,
    Stream,
)
from demo import sse_events as ev

MS = 1_000_000


def chunk(piece: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece)


def feed(
    events: list[bytes], framing: str = SSE, chunked: bool = True, gap_ms: int = 10
) -> BodyReader:
    """One write per event, ``gap_ms`` apart from t = 100 ms (t1 = 0)."""
    r = open_body(framing, chunked, 0, None)
    for i, e in enumerate(events):
        w = chunk(e) if chunked else e
        r.write((100 + i * gap_ms) * MS, len(w), w)
    if chunked:
        r.write((100 + len(events) * gap_ms) * MS, 5, b"0\r\n\r\n")
    return r


def test_openai_chat_first_token_is_the_first_content_not_the_role() -> None:
    s = feed(ev.openai_chat(tokens=5, usage=True)).stream
    assert s.dialect is not None and s.dialect.name == "openai.chat"
    # event 0: the role-only delta (no token); events 1..5: content; finish; usage; [DONE]
    assert s.t_first_answer == 110 * MS and s.t_first_out == 110 * MS
    assert s.n_content == 5 and s.tokens == (5, "usage")
    assert s.input_tokens == 7 and s.model == "tiny"
    assert s.finish_reasons == ["stop"] and s.ending() == COMPLETE
    assert s.gaps.n == 4 and s.gaps.quantile(0.95) == 10_000


def test_without_usage_the_count_is_the_content_events_and_says_so() -> None:
    s = feed(ev.openai_chat(tokens=100, usage=False)).stream
    assert s.tokens == (100, "events")


def test_events_split_across_writes_and_many_in_one_write_give_the_same_stream() -> None:
    body = b"".join(ev.sse(e) for e in ev.openai_chat_raw(tokens=20, usage=True))
    whole = open_body(SSE, False, 0, None)
    whole.write(MS, len(body), body)
    for cut in (1, 7, 50, 333):
        r = open_body(SSE, False, 0, None)
        for i in range(0, len(body), cut):
            piece = body[i : i + cut]
            r.write(MS, len(piece), piece)
        assert (r.stream.n_content, r.stream.tokens, r.stream.t_final) == (
            whole.stream.n_content,
            whole.stream.tokens,
            whole.stream.t_final,
        )
    assert whole.stream.n_content == 20


def test_crlf_and_cr_separators_multi_line_data_and_comment_heartbeats() -> None:
    got: list[tuple[bytes, bytes, bool]] = []
    f = fr.SseFramer(lambda n, d, t: got.append((n, d, t)))
    f.feed(b": ping\r\n\r\nevent: a\r\ndata: 1\r\ndata: 2\r\n\r\ndata: x\r\rdata:y\n\n")
    assert got == [(b"a", b"1\n2", False), (b"", b"x", False), (b"", b"y", False)]


def test_anthropic_thinking_then_answer_two_first_times_and_usage() -> None:
    s = feed(ev.anthropic(thinking=3, text=4)).stream
    assert s.dialect is not None and s.dialect.name == "anthropic.messages"
    # message_start, ping, block start (thinking), 3 thinking deltas, block stop, block start
    # (text), 4 text deltas …
    assert s.t_first_out == 130 * MS and s.t_first_answer == 180 * MS
    assert (s.n_reasoning, s.n_content) == (3, 4)
    assert s.input_tokens == 12 and s.tokens == (7, "usage")
    assert s.finish_reasons == ["end_turn"] and s.ending() == COMPLETE


def test_anthropic_error_event_inside_a_200_stream() -> None:
    s = feed(ev.anthropic(thinking=0, text=2, error="overloaded_error")).stream
    assert s.ending() == ERROR and s.error_type == "overloaded_error"


def test_openai_responses_reasoning_answer_and_usage() -> None:
    s = feed(ev.responses(reasoning=2, text=3)).stream
    assert s.dialect is not None and s.dialect.name == "openai.responses"
    assert (s.n_reasoning, s.n_content) == (2, 3)
    assert s.tokens == (5, "usage") and s.reasoning_tokens == 2 and s.input_tokens == 9
    assert s.ending() == COMPLETE and s.finish_reasons == ["completed"]


def test_openai_responses_failed() -> None:
    s = feed(ev.responses(reasoning=0, text=1, failed=True)).stream
    assert s.ending() == ERROR and s.error_type == "server_error"


def test_ollama_ndjson_with_the_engine_timings() -> None:
    lines = ev.ollama(tokens=6)
    s = feed([line + b"\n" for line in lines], framing=NDJSON).stream
    assert s.dialect is not None and s.dialect.name == "ollama"
    assert s.n_content == 6 and s.tokens == (6, "usage") and s.input_tokens == 11
    assert s.engine_prefill_ns == 40 * MS and s.engine_decode_ns == 60 * MS
    assert s.operation == "chat" and s.ending() == COMPLETE


def test_tgi_generate_stream_skips_special_tokens() -> None:
    s = feed(ev.tgi(tokens=4)).stream
    assert s.dialect is not None and s.dialect.name == "tgi.generate"
    assert s.n_content == 4 and s.tokens == (5, "usage") and s.finish_reasons == ["eos_token"]


def ws_frame(payload: bytes, deflate: zlib._Compress | None = None) -> bytes:
    b0 = 0x81
    if deflate is not None:
        payload = deflate.compress(payload) + deflate.flush(zlib.Z_SYNC_FLUSH)
        payload = payload[:-4]  # RFC 7692: the 00 00 ff ff tail is taken off
        b0 |= 0x40
    n = len(payload)
    head = bytes([b0, n]) if n < 126 else bytes([b0, 126]) + n.to_bytes(2, "big")
    return head + payload


def test_websocket_realtime_messages_with_permessage_deflate_context_takeover() -> None:
    s = Stream(BY_FRAMING[WS], 0, None)
    comp = zlib.compressobj(wbits=-15)
    f = fr.WsFramer(s.event, deflate=True)
    for i, msg in enumerate(ev.realtime(tokens=5)):
        s.t_write = (100 + 10 * i) * MS
        w = ws_frame(msg, comp)
        f.feed(w[:3])  # a frame split across writes
        f.feed(w[3:])
    assert s.dialect is not None and s.dialect.name == "openai.realtime"
    assert s.n_content == 5 and s.tokens == (5, "usage") and s.ending() == COMPLETE


def test_a_gap_in_a_deflated_websocket_is_counted_not_guessed() -> None:
    s = Stream(BY_FRAMING[WS], 0, None)
    comp = zlib.compressobj(wbits=-15)
    f = fr.WsFramer(s.event, deflate=True)
    msgs = ev.realtime(tokens=3)
    for m in msgs[:2]:
        f.feed(ws_frame(m, comp))
    w = ws_frame(msgs[2], comp)
    f.feed(w[:3])
    f.gap(len(w) - 3)
    for m in msgs[3:]:
        f.feed(ws_frame(m, comp))
    assert s.problems["deflate_lost"] >= 1


def test_a_chat_servers_own_token_frames() -> None:
    s = Stream(BY_FRAMING[WS], 0, None)
    f = fr.WsFramer(s.event)
    for m in [{"token": "a"}, {"token": "b"}, {"type": "done", "finish_reason": "stop"}]:
        f.feed(ws_frame(json.dumps(m).encode()))
    assert s.dialect is not None and s.dialect.name == "chat.frames"
    assert s.n_content == 2 and s.ending() == COMPLETE


def test_no_dialect_stays_bytes() -> None:
    """An SSE stream of something else (prices) and a CSV body get no dialect."""
    s = feed([b'data: {"price": 1}\n\n'] * 6).stream
    assert s.dialect is None and s.tokens == (0, "events")
    assert framing_of(b"text/csv; charset=utf-8") is None
    assert framing_of(b"text/event-stream") == SSE
    assert framing_of(b"application/x-ndjson") == NDJSON


def test_endings_client_abort_counts_the_tokens_written_after() -> None:
    r = feed(ev.openai_chat(tokens=10, usage=False)[:4], chunked=False)
    s = r.stream
    s.client_left(135 * MS)  # the client left after the 3rd content token
    for i in range(6):
        w = ev.sse(ev.content_chunk("x"))
        r.write((200 + i) * MS, len(w), w)
    assert s.ending() == CLIENT_ABORTED and s.wasted == 6
    cut = feed(ev.openai_chat(tokens=10, usage=False)[:6], chunked=False).stream
    assert cut.ending() == SERVER_CUT


def test_the_sdk_closing_after_done_is_a_complete_stream() -> None:
    r = feed(ev.openai_chat(tokens=3, usage=False), chunked=True)
    r.stream.client_left(10_000 * MS)  # after [DONE], before the chunked terminator
    assert r.stream.ending() == COMPLETE and r.stream.wasted == 0


def test_a_1_mb_event_is_one_truncated_token_and_the_framing_goes_on() -> None:
    """A write of 1 MB holding one event: the kernel copies its head and tail; the event is
    counted (a token: its head shows content) with the reason, and the next events parse."""
    r = open_body(SSE, True, 0, None)
    big = ev.sse(ev.content_chunk("y" * (1 << 20)))
    w = chunk(big)
    r.write(MS, len(w), w[:1024], w[-256:])
    for i in range(3):
        w2 = chunk(ev.sse(ev.content_chunk("z")))
        r.write((2 + i) * MS, len(w2), w2)
    s = r.stream
    assert s.n_content == 4 and s.problems["truncated"] == 1


def test_gaps_exact_then_histogram_and_the_stall() -> None:
    g = Gaps()
    for i in range(5000):
        g.add(300_000 if i == 3999 else 10_000 + i % 7)
    assert g.is_exact and g.max_us == 300_000 and g.max_at == 4000
    assert g.quantile(0.95) == sorted(10_000 + i % 7 for i in range(4999))[round(0.95 * 5000) - 2]
    assert g.stalls_over_median() == [(4000, 300_000)]
    big = Gaps()
    for _ in range(EXACT + 10):
        big.add(10_000)
    assert not big.is_exact and 10_000 / 1.2 < (big.quantile(0.95) or 0) < 10_000 * 1.2


def test_queue_wait_is_the_time_the_engine_served_others() -> None:
    """Two streams on one serial engine: B's request arrives at 0, A streams tokens and ends
    at 700 ms, B's first token comes at 800 ms: B waited 700 ms, prefilled 100 ms. Served
    side by side (a concurrent app: C's first token while D still streams), nothing is
    counted as a wait."""
    eng = Engine()
    a = Stream(BY_FRAMING[SSE], 0, eng)
    b = Stream(BY_FRAMING[SSE], 0, eng)
    a.dialect = b.dialect = BY_FRAMING[SSE][2]  # openai.chat
    for i in range(7):
        a.t_write = (100 + 100 * i) * MS
        a.token(1)
    a.final()  # [DONE] at 700 ms
    b.t_write = 800 * MS
    b.token(1)
    assert a.lead_t == 0 and b.lead_t == 700 * MS
    eng2 = Engine()
    c, d = Stream(BY_FRAMING[SSE], 50 * MS, eng2), Stream(BY_FRAMING[SSE], 0, eng2)
    for i in range(5):
        d.t_write = (100 + 100 * i) * MS
        d.token(1)
    c.t_write = 250 * MS
    c.token(1)
    assert c.lead_t == 50 * MS  # its own t1: no wait


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([SSE, NDJSON]),
    st.booleans(),
    st.lists(st.binary(max_size=400), max_size=30),
    st.lists(st.integers(min_value=0, max_value=3000), max_size=8),
)
def test_any_bytes_in_any_writes_never_raise_and_stay_bounded(
    framing: str, chunked: bool, pieces: list[bytes], gaps: list[int]
) -> None:
    r = open_body(framing, chunked, 0, Engine())
    for i, p in enumerate(pieces):
        tail = p[-7:] if gaps and i < len(gaps) else b""
        n = len(p) + (gaps[i] if i < len(gaps) else 0)
        r.write(i * MS, max(n, len(p)), p[: max(0, len(p) - len(tail))] if tail else p, tail)
    assert len(r.framer.buf) <= fr.MAX_EVENT
    r.stream.ending()


def test_fuzzed_json_events_in_every_dialect() -> None:
    """Events that are JSON of the wrong shapes: counted as garbage, nothing raised."""
    bad: list[Any] = [[], 1, "x", {"choices": 5}, {"type": 3}, {"delta": {"text": 1}}, None]
    for d in (*BY_FRAMING[SSE], *BY_FRAMING[NDJSON], *BY_FRAMING[WS]):
        s = Stream((d,), 0, None)
        s.dialect = d
        for b in bad:
            d.parse(s, b"", json.dumps(b).encode())
            d.partial(s, b"", json.dumps(b).encode()[:5])
        assert s.error_type is None or isinstance(s.error_type, str)


def test_the_gap_bucket_table_is_bucket_of() -> None:
    assert all(gaps._SMALL_BUCKET[us] == gaps.bucket_of(us) for us in range(gaps.SMALL_US))


def _outcome(r: BodyReader) -> tuple[Any, ...]:
    """All a stream reports."""
    s, g = r.stream, r.stream.gaps
    return (
        s.dialect.name if s.dialect else None,
        (s.events, s.n_content, s.n_reasoning, s.offsets, s.tokens, s.input_tokens),
        (s.t_first_out, s.t_first_answer, s.t_last_out, s.t_final, s.ending()),
        (s.model, s.finish_reasons, s.error_type, sorted(s.problems.items())),
        (list(g.exact), g.hist, g.max_us, g.max_at, sorted(g.stalls)),
    )


_SSE_RUNS = [
    ev.openai_chat(3, True, reasoning=1),
    ev.anthropic(1, 2),
    ev.anthropic(0, 1, "overloaded_error"),
    ev.responses(1, 2),
    ev.tgi(2),
]
_SSE_ODD = [
    b": ping\n\n",
    b"data: [DONE]\n\n",
    b"data: {garbage\n\n",
    b"event: deflate_lost\ndata: x\n\n",
    b"event: ping\rx\ndata: {}\n\n",  # a CR in the name: the layers cut it there
    b"data: {}\revent: ping\n\n",  # ... in the data line
    b'data: {"choices":[{"delta":{"content":"x\r"}}]}\n\n',
    b"data:{}\n\n",
    b"event:\ndata:\n\n",
    b"event:  a\ndata:  {}\n\n",
    b"data: a\ndata: b\n\n",
    b"\n\n",
    b"data: {}\n\n\n",
    b'data: {"choices":[{"delta":{"content":"x"}}]}\r\n\r\n',
]
_NDJSON_RUNS = [[x + b"\n" for x in ev.ollama(4)], [x + b"\n" for x in ev.ollama(2, chat=False)]]
_NDJSON_ODD = [
    b"\n",
    b"  \n",
    b"{garbage\n",
    b'{"model":"m","done":false,"response":"a\rb"}\n',
    b"{}\n{}\n",
]


def _whole_and_layered(framing: str, chunked: bool, events: list[bytes], size: bytes) -> None:
    """The one-event fast path of BodyReader.write against the same bytes through the
    layers (each write cut in two: its first byte, then the rest at the same time)."""
    whole, layered = open_body(framing, chunked, 0, None), open_body(framing, chunked, 0, None)
    t = 100 * MS
    for i, e in enumerate(events):
        w = size % len(e) + b"\r\n" + e + b"\r\n" if chunked else e
        t += (150 if i % 5 == 4 else 7) * MS
        whole.write(t, len(w), w)
        layered.write(t, 1, w[:1])
        layered.write(t, len(w) - 1, w[1:])
    assert _outcome(whole) == _outcome(layered), (framing, chunked, events, size)


def test_a_write_taken_whole_gives_what_the_layers_give() -> None:
    """Each odd event first (detection), inside and last, in each dialect's run."""
    for framing, runs, odds in ((SSE, _SSE_RUNS, _SSE_ODD), (NDJSON, _NDJSON_RUNS, _NDJSON_ODD)):
        for run in runs:
            for odd in odds:
                for at in (0, 2, len(run)):
                    for chunked, size in ((False, b""), (True, b"%x"), (True, b"%X")):
                        _whole_and_layered(framing, chunked, [*run[:at], odd, *run[at:]], size)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([SSE, NDJSON]),
    st.booleans(),
    st.integers(min_value=0, max_value=4),
    st.lists(st.tuples(st.integers(min_value=0, max_value=20), st.integers(0, 13)), max_size=6),
    st.sampled_from([b"%x", b"%X", b"%04x", b"%x;a=b", b" %x", b"%x\r", b"0x%x"]),
)
def test_odd_events_anywhere_taken_whole_or_by_the_layers_alike(
    framing: str, chunked: bool, run: int, odd: list[tuple[int, int]], size: bytes
) -> None:
    runs, odds = (_SSE_RUNS, _SSE_ODD) if framing == SSE else (_NDJSON_RUNS, _NDJSON_ODD)
    events = list(runs[run % len(runs)])
    for at, k in odd:
        events.insert(at, odds[k % len(odds)])
    _whole_and_layered(framing, chunked, events, size)


def test_a_chunk_of_another_size_or_a_cut_pending_goes_to_the_layers() -> None:
    """A write whose size line is not its length, writes that look whole while an event or a
    chunk is begun, and an NDJSON line after a gap that ended on a line's end (the layers
    mark it truncated): whole or cut in two, the same stream."""
    content = ev.sse(ev.content_chunk("x"))
    pending = [
        [chunk(content[:-2]), chunk(content)],  # an event begun: its blank line still to come
        # a chunk begun: the next write is the rest of its data (looking like a chunk)
        [b"%x\r\n%s" % (len(content) + len(chunk(content)) - 2, content), chunk(content)],
    ]
    for begun in pending:
        # (then two events in a chunk: the layers' turn, in the state the others left)
        writes = [chunk(content), *begun, chunk(content), chunk(content * 2), chunk(content)]
        whole, layered = open_body(SSE, True, 0, None), open_body(SSE, True, 0, None)
        for i, w in enumerate(writes):
            whole.write(i * MS, len(w), w)
            layered.write(i * MS, 1, w[:1])
            layered.write(i * MS, len(w) - 1, w[1:])
        assert _outcome(whole) == _outcome(layered)
    events = ev.openai_chat(4, True)
    for delta in (-2, -1, 1, 2):
        whole, layered = open_body(SSE, True, 0, None), open_body(SSE, True, 0, None)
        for i, e in enumerate(events):
            w = (b"%x" % (len(e) + (delta if i == 2 else 0))) + b"\r\n" + e + b"\r\n"
            whole.write(i * MS, len(w), w)
            layered.write(i * MS, 1, w[:1])
            layered.write(i * MS, len(w) - 1, w[1:])
        assert _outcome(whole) == _outcome(layered)
    lines = [x + b"\n" for x in ev.ollama(4)]
    two = chunk(lines[0] + lines[1])
    readers = open_body(NDJSON, True, 0, None), open_body(NDJSON, True, 0, None)
    for r in readers:  # the second line not copied, the chunk's CRLF in the tail
        r.write(MS, len(two), two[: two.index(b"\n") + 1 + len(lines[0])], two[-2:])
    whole, layered = readers
    for i, line in enumerate(lines[2:]):
        w = chunk(line)
        whole.write((2 + i) * MS, len(w), w)
        layered.write((2 + i) * MS, 1, w[:1])
        layered.write((2 + i) * MS, len(w) - 1, w[1:])
    assert whole.stream.problems["truncated"] == 1
    assert _outcome(whole) == _outcome(layered)
