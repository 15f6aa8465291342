"""The ring records as the real kernel programs write them: the layouts the agent reads
(agent.kernel.layout, from the C structs) against the compiled program's own view of the
same structs, and records captured from the kernel while a real server answers — decoded,
field by field, against what the server and the client did, then cut into exchanges."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from agent.connections import Connections
from agent.export.outputs import RecordQueue
from agent.kernel import events
from agent.kernel.clock import MonoClock
from agent.kernel.layout import layout
from demo import sse_events as ev
from parallax_contracts import trace_context
from tests.agent.helpers import PY, Proc, http_request, read_response

pytestmark = pytest.mark.ebpf


class Capture:
    def __init__(self, tmp: Path, port: int, pids: list[int]) -> None:
        self.path = tmp / "ring.hex"
        self.proc = Proc(
            [PY, "-m", "tests.agent.ring_capture", str(self.path), str(port), *map(str, pids)]
        )
        assert self.proc.p.stdout is not None
        line = self.proc.p.stdout.readline()
        assert line.strip() == "ready", line + (
            self.proc.p.stderr.read() if self.proc.p.stderr else ""
        )

    def stop(self) -> tuple[dict[str, dict[str, int]], list[bytes]]:
        time.sleep(0.2)
        self.proc.stop()
        lines = self.path.read_text().splitlines()
        return json.loads(lines[0]), [bytes.fromhex(x) for x in lines[1:]]


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A keep-alive connection to a real server: a Content-Length GET, a chunked stream of
    3 writes, and an OpenAI-shaped SSE stream (EV_BODY), then close."""
    tmp = tmp_path_factory.mktemp("ring")
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp / "t.log")])
    replay = Proc([PY, "-m", "tests.agent.llm.replay_server"])
    try:
        port = srv.port()
        rport = replay.port()
        replay.port()  # (its WebSocket port)
        cap = Capture(tmp, port, [srv.p.pid])
        ctxs = [trace_context.generate() for _ in range(2)]
        reqs = [
            f"GET /plain?n=7 HTTP/1.1\r\nHost: t\r\ntraceparent: {ctxs[0].header()}\r\n\r\n",
            f"GET /stream?n=3&gap_ms=20 HTTP/1.1\r\nHost: t\r\ntraceparent: {ctxs[1].header()}"
            "\r\n\r\n",
        ]
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            answers = [http_request(port, r.encode(), sock=s) for r in reqs]
        views, raws = cap.stop()
        # the SSE stream, on the replay server under its own capture
        cap2 = Capture(tmp, rport, [replay.p.pid])
        sse_ctx = trace_context.generate()
        body = b'{"model": "tiny", "stream": true}'
        head = (
            f"POST /v1/chat/completions?tokens=4&gap_ms=10 HTTP/1.1\r\nHost: t\r\n"
            f"traceparent: {sse_ctx.header()}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", rport), 5) as s:
            s.sendall(head + body)
            sse_answer = read_response(s)
        _, sse_raws = cap2.stop()
    finally:
        srv.stop()
        replay.stop()
    return {
        "port": port,
        "pid": srv.p.pid,
        "reqs": reqs,
        "answers": answers,
        "views": views,
        "raws": raws,
        "ctxs": ctxs,
        "sse": (sse_ctx, sse_raws, sse_answer, rport),
    }


def test_the_agents_layouts_are_the_compiled_programs(captured: dict[str, Any]) -> None:
    """Every field the agent reads sits where the compiled program puts it."""
    views: dict[str, dict[str, int]] = captured["views"]
    for struct_name, view in views.items():
        ours = layout(struct_name)
        for f in ours.fields:
            assert view[f.name] == f.offset, (struct_name, f.name)
        for nested in ("h", "a"):
            if nested in view:
                inner = layout("px_hdr" if nested == "h" else "px_agg")
                for f in inner.fields:
                    assert view[f"{nested}.{f.name}"] - view[nested] == f.offset, (nested, f.name)
    assert set(views) == {"px_ev_read", "px_ev_resp", "px_ev_wagg", "px_ev_h2", "px_ev_body"}


def test_records_from_the_kernel_decode_to_what_happened(captured: dict[str, Any]) -> None:
    port, pid, reqs = captured["port"], captured["pid"], captured["reqs"]
    decoded = [events.decode(r) for r in captured["raws"]]
    reads = [e for e in decoded if isinstance(e, events.ReadEv)]
    resps = [e for e in decoded if isinstance(e, events.RespEv)]
    waggs = [e for e in decoded if isinstance(e, events.WaggEv)]
    closes = [e for e in decoded if isinstance(e, events.CloseEv)]
    assert [r.data for r in reads] == [r.encode() for r in reqs]  # the bytes the app read
    for r in reads:
        assert r.h.tgid == pid and r.lport == port and r.n == len(r.data)
        assert r.addrs()[0] == "127.0.0.1" and r.family == events.AF_INET
        assert 0 < r.t_arr <= r.h.t  # arrived before the read returned
    # the connection's handshake, on its first read (t_acc needs libc's accept probe, which
    # the agent attaches per process: not this bare load)
    assert 0 < reads[0].t_est < reads[0].h.t
    assert len(resps) == 2 and all(r.data.startswith(b"HTTP/1.") for r in resps)
    # the Content-Length answer: head and body ("7 bytes") as the client got them
    assert captured["answers"][0].endswith(resps[0].data[resps[0].data.find(b"\r\n\r\n") + 4 :])
    # the stream: 3 chunk writes 20 ms apart and the terminator, aggregated in the kernel
    [w] = [x for x in waggs if x.n >= 3]
    gaps = [b - a for a, b in zip(w.times_ns(), w.times_ns()[1:], strict=False)]
    assert w.n == 3 and all(15_000_000 < g < 200_000_000 for g in gaps), gaps
    assert w.flags & events.WAGG_END
    assert closes and all(c.h.sk == reads[0].h.sk for c in closes)
    # and cut into the exchanges the agent exports
    recs = _records(captured["raws"], port)
    assert [r["trace_id"] for r in recs] == [c.trace_id for c in captured["ctxs"]]
    assert [r["status"] for r in recs] == [200, 200] and recs[1]["chunks"] == 3


def test_an_llm_streams_body_writes_come_with_their_bytes(captured: dict[str, Any]) -> None:
    """EV_BODY: each write of an event-stream response with its bytes — the events the
    client read, one per write, read as OpenAI chat tokens."""
    ctx, raws, answer, rport = captured["sse"]
    bodies = [r for r in raws if events.HDR.unpack_from(r)[0] == events.EV_BODY]
    chunks = []
    for r in bodies:
        n, caplen, tail, _ = events.BODY.unpack_from(r, events.HDR.size)
        assert caplen == n and tail == 0  # small writes: copied whole
        chunks.append(r[events.BODY_DATA : events.BODY_DATA + caplen])
    want = ev.openai_chat(4, False)
    assert [c.split(b"\r\n", 1)[1][:-2] for c in chunks if c != b"0\r\n\r\n"] == want
    [rec] = _records(raws, rport)
    assert rec["trace_id"] == ctx.trace_id and rec["llm_dialect"] == "openai.chat"
    assert rec["gen_ai_usage_output_tokens"] == 4 and rec["llm_end"] == "complete"
    assert answer.count(b"data:") == len(want)


def _records(raws: list[bytes], port: int) -> list[dict[str, Any]]:
    q = RecordQueue(100)
    a = Connections(4096, MonoClock(), q, lambda *_: ("comm", "svc"), lambda _: None, lambda: None)
    for r in raws:
        a.on_event(r)
    return list(q.q)
