"""The agent's per-request Python path on its own: kernel events captured once, replayed.

``make bench-agent`` and ``bench.agent_threads`` measure the agent live, where this machine's
noise moves a run by 20-100 %. Here the agent's kernel program, loaded in this process (as
bench.tls does), records the ring events of nginx answering wrk — keep-alive GETs, each with
its own ``traceparent`` — and the same events are then replayed, in rounds, through the
agent's connection table (agent.connections: the HTTP/1 parser, the exchange, records.build
and the export queue's put), the GC on as in the agent. Left out: the ring drain
(agent.kernel.ringbuf), the export thread and the identity lookups (one per connection).

The replay is also a corpus: a compiled request path must give the same records from it.

    python -m bench.agent_replay [--server nginx|sse|h2c] [--requests 50000] [--seconds 6]
                                 [--rounds 5] [--cprofile PATH] [--save FILE | --load FILE]
                                 [--close]

``--close``: nginx's requests each on a new connection (``Connection: close``): a request is
then four events (the read, the response, the close, the socket's end) and a connection's
setup and end are in the figure.

``--server sse`` or ``h2c``: instead of nginx, bench.http2's LLM-shaped load — Hypercorn
serving demo/llm_app.py's 8-token streams over HTTP/1.1 (SSE) or h2c for ``--seconds``: a
record then takes a dozen events (a body event per token), and the per-event cost shows.

``--check``: one more pass with the HTTP/1 heads parsed by the Python reference
(agent.protocols.http1_head), whose records must equal the compiled parser's (all fields but
the generated ids): the corpus as a differential test of agent/protocols/_http1_fast.c.

``--save`` keeps the captured events, ``--load`` replays a kept capture (no root needed):
two trees compared on the same events, ``PYTHONPATH=<tree> python -m bench.agent_replay
--load FILE`` in turn. Root, wrk and nginx for a capture (make setup). Prints only;
docs/benchmarks.md holds a run's figures.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agent.connections import Connections
from agent.export.outputs import RecordQueue
from agent.kernel import loader
from agent.kernel.clock import MonoClock
from agent.protocols import http1_head
from bench import http2
from bench.agent import _wait_port, start_nginx
from demo.stack import free_port

CONNS = 8
# wrk's per-request hook: a fresh trace id each time, as a browser's probe would send
TRACEPARENT_LUA = """
local hex = "0123456789abcdef"
local function rnd(n)
  local t = {}
  for i = 1, n do local k = math.random(16) t[i] = hex:sub(k, k) end
  return table.concat(t)
end
request = function()
  wrk.headers["traceparent"] = "00-" .. rnd(32) .. "-" .. rnd(16) .. "-01"
  return wrk.format("GET", "/v1/chat?model=m")
end
"""
CLOSE_LUA = 'wrk.headers["Connection"] = "close"\n'


class _Recorder:
    """The agent's kernel program on ``port`` and ``pids``, its ring events kept in memory
    (drained every 20 ms, as the agent does) until ``close``."""

    def __init__(self, port: int, pids: list[int]) -> None:
        self.loaded = loader.load(loader.Options(ports=[port], pids=pids))
        self.raws: list[bytes] = []
        self.ring = loader.Ring(self.loaded, lambda raw: self.raws.append(bytes(raw)))
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._drain)
        self._t.start()

    def _drain(self) -> None:
        while not self._stop.wait(0.02):
            self.ring.drain()

    def close(self) -> list[bytes]:
        time.sleep(0.2)
        self._stop.set()
        self._t.join()
        self.ring.drain()
        self.ring.close()
        loader.detach(self.loaded.bpf)
        return self.raws


def capture(tmp: Path, requests: int, close: bool = False) -> list[bytes]:
    """The ring events of about ``requests`` requests to a fresh nginx (``close``: each on a
    new connection)."""
    per_request = 4 if close else 2  # (read, response; and the close, the socket's end)
    port = free_port()
    nginx = start_nginx(tmp, port)
    try:
        _wait_port(port)
        rec = _Recorder(port, [nginx.pid, *_children(nginx.pid)])
        lua = tmp / "traceparent.lua"
        lua.write_text(TRACEPARENT_LUA + (CLOSE_LUA if close else ""))
        seconds = 1
        while True:  # until the wanted requests' events
            subprocess.run(
                ["wrk", "-t1", f"-c{CONNS}", f"-d{seconds}s", "-s", str(lua),
                 f"http://127.0.0.1:{port}/"],
                capture_output=True, timeout=seconds + 30, check=True,
            )  # fmt: skip
            if len(rec.raws) >= per_request * requests:
                break
            seconds = min(30, seconds * 2)
        raws = rec.close()
    finally:
        nginx.terminate()
        nginx.wait(10)
    return raws[: per_request * requests]


def capture_stream(kind: str, seconds: float) -> list[bytes]:
    """The ring events of ``seconds`` of bench.http2's token streams (8 tokens, no wait) from
    Hypercorn serving demo/llm_app.py: ``kind`` "http1" (SSE over 10 keep-alive connections)
    or "h2c" (10 streams on one connection), paced as fast as its one client process goes."""
    port = free_port()
    srv = subprocess.Popen([sys.executable, "-c", http2.HYPERCORN, str(port)], cwd=http2.ROOT)
    try:
        _wait_port(port)
        rec = _Recorder(port, [srv.pid])
        # one client process a second: Hypercorn ends an h2 connection after 1,000 streams
        for _ in range(max(1, round(seconds))):
            p = subprocess.run(
                [sys.executable, "-c", http2.CLIENT, kind, str(port), "1", "900",
                 http2.PATH, str(http2.TOKENS)],
                cwd=http2.ROOT, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if p.returncode:
                rec.close()
                last = (p.stderr.strip().splitlines() or ["?"])[-1]
                raise SystemExit(f"bench.agent_replay: the {kind} client failed: {last}")
        return rec.close()
    finally:
        srv.terminate()
        srv.wait(10)


def save(path: Path, raws: list[bytes]) -> None:
    with open(path, "wb") as f:
        for raw in raws:
            f.write(len(raw).to_bytes(4, "little") + raw)


def load(path: Path) -> list[bytes]:
    data = path.read_bytes()
    raws, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 4], "little")
        raws.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return raws


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(x) for x in out.stdout.split()]


CLOCK = MonoClock()  # one for every pass: their records' wall-clock times compare


def replay(
    raws: list[bytes], prof: cProfile.Profile | None = None, keep: list[Any] | None = None
) -> tuple[float, int]:
    """One pass through a fresh connection table: (CPU seconds, records); ``keep`` gets the
    records."""
    q = RecordQueue(len(raws))
    conns = Connections(4096, CLOCK, q, lambda *_: ("nginx", "bench"), lambda _: None, lambda: None)
    on_event = conns.on_event
    if prof is not None:
        prof.enable()
    t = time.process_time()
    for raw in raws:
        on_event(raw)
    cpu = time.process_time() - t
    if prof is not None:
        prof.disable()
    if keep is not None:
        keep.extend(q.q)
    return cpu, len(q.q)


def check(raws: list[bytes]) -> str:
    """The records with the heads parsed by the module's parsers (compiled, when built) and
    by the Python reference: equal, but for the ids generated per record."""
    if http1_head.PARSER.startswith("HTTP/1 heads: Python"):
        return f"check: nothing to compare ({http1_head.PARSER})"
    ours: list[Any] = []
    replay(raws, keep=ours)
    ref: list[Any] = []
    saved = http1_head.parse_request, http1_head.parse_response
    http1_head.parse_request = http1_head._parse_request_py
    http1_head.parse_response = http1_head._parse_response_py
    try:
        replay(raws, keep=ref)
    finally:
        http1_head.parse_request, http1_head.parse_response = saved

    def key(rec: dict[str, Any]) -> dict[str, Any]:
        # span_id is generated per record; so is trace_id where no traceparent came
        gen = ("span_id",) if rec["parent_span_id"] is not None else ("span_id", "trace_id")
        return {k: v for k, v in rec.items() if k not in gen}

    diff = sum(1 for a, b in zip(ours, ref, strict=False) if key(a) != key(b))
    if len(ours) != len(ref) or diff:
        raise SystemExit(f"check: {len(ours)} records against {len(ref)}, {diff} differ")
    return f"check: {len(ours)} records, the same with the Python reference's heads"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cprofile", help="write one more round's cProfile stats here")
    ap.add_argument(
        "--server",
        choices=("nginx", "sse", "h2c"),
        default="nginx",
        help="nginx: `return 200` under wrk; sse, h2c: bench.http2's 8-token streams over"
        " HTTP/1.1 or h2c (Hypercorn)",
    )
    ap.add_argument("--seconds", type=float, default=6.0, help="sse, h2c: the load's length")
    ap.add_argument("--close", action="store_true", help="nginx: a new connection per request")
    ap.add_argument("--check", action="store_true", help="compare with the Python heads' records")
    ap.add_argument("--save", type=Path, help="keep the captured events in this file")
    ap.add_argument("--load", type=Path, help="replay the events kept in this file")
    a = ap.parse_args(argv)
    if a.load is not None:
        return run(load(a.load), a)
    if os.geteuid() != 0:
        print(
            "bench.agent_replay: needs root (it loads the agent's kernel program)", file=sys.stderr
        )
        return 2
    missing = [t for t in ("wrk", "nginx") if shutil.which(t) is None]
    if missing:
        print(
            f"bench.agent_replay: {', '.join(missing)} not found: run make setup", file=sys.stderr
        )
        return 2
    if a.server == "nginx":
        with tempfile.TemporaryDirectory() as d:
            raws = capture(Path(d), a.requests, a.close)
        conn = "Connection: close" if a.close else "keep-alive"
        what = f"nginx under wrk ({conn}, a traceparent each)"
    else:
        sse = a.server == "sse"
        raws = capture_stream("http1" if sse else "h2c", a.seconds)
        what = f"Hypercorn's 8-token streams over {'HTTP/1.1 (SSE)' if sse else 'h2c'}"
    print(f"captured {len(raws)} ring events of {what}")
    if a.save is not None:
        save(a.save, raws)
    return run(raws, a)


def run(raws: list[bytes], a: argparse.Namespace) -> int:
    per: list[float] = []
    for i in range(a.rounds):
        cpu, n = replay(raws)
        per.append(cpu / max(1, n) * 1e6)
        print(f"  round {i + 1}: {n} records, {per[-1]:.2f} µs CPU per record")
    print(
        f"replay: median {statistics.median(per):.2f} µs per record"
        f" (range {min(per):.2f}-{max(per):.2f}, {a.rounds} rounds)"
    )
    if a.check:
        print(check(raws))
    if a.cprofile:
        prof = cProfile.Profile()
        replay(raws, prof)
        prof.dump_stats(a.cprofile)
        print(f"cProfile of one more round: {a.cprofile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
