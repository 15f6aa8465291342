"""Where the agent's user-space CPU per request goes: the agent of this tree under
``make bench-agent``'s paced load (nginx, wrk, 10 connections, ``--cpu-budget 0``), its CPU
per request by thread (``/proc/<pid>/task/*/schedstat``) and its idle CPU before the load;
with ``--cprofile PATH`` the agent runs under cProfile (the main thread, ~2.4× slower) and
writes its stats there (read them with ``pstats``).

``--floor``: the same agent with the handling of each ring record replaced by a count (no
parsing, no record, nothing exported): what the loop around the request path costs — the
ring drain, the timers, the per-second work — i.e. the part of the per-request figure that
a request path in C would leave.

``--close``: every request on a new connection (``Connection: close``), where the per-second
work sees a connection accepted in every second.

``--otlp``: the records exported as OTLP spans (as the DaemonSet runs it) to a sink in this
process that takes every request with a 200, instead of JSON lines to /dev/null.

    python -m bench.agent_threads [--rate 2000] [--seconds 10] [--cprofile PATH] [--floor]
        [--close] [--otlp]

Root, wrk and nginx (make setup). Prints only; docs/benchmarks.md holds a run's figures.
"""

from __future__ import annotations

import argparse
import http.server
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.agent import PACED_LUA, ROOT, _cpu_ns, _wait_port, start_nginx, threads_ns, wrk
from demo.stack import free_port

CONNS = 10
# The agent with each ring record counted and dropped (--floor).
FLOOR = """
import sys
from agent import cli, connections
def _count(self, raw):
    self.n_events += 1
connections.Connections.on_event = _count
sys.exit(cli.main(sys.argv[1:]))
"""


class _Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that takes every request (an empty ExportTraceServiceResponse)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def _otlp_sink() -> str:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}"


def measure(tmp: Path, port: int, a: argparse.Namespace) -> None:
    lua = tmp / "paced.lua"
    lua.write_text(
        PACED_LUA.format(delay_ms=max(1, round(CONNS * 1000 / a.rate)))
        + ('wrk.headers["Connection"] = "close"\n' if a.close else "")
    )
    err = tmp / "agent.err"
    prof = ["-m", "cProfile", "-o", str(Path(a.cprofile).resolve())] if a.cprofile else []
    run = ["-c", FLOOR, "run"] if a.floor else ["-m", "agent.cli", "run"]
    out = ["--otlp", _otlp_sink()] if a.otlp else ["--jsonl", os.devnull]
    argv = [
        sys.executable, *prof, *run, "--port", str(port), *out,
        "--cpu-budget", "0", "--metrics-addr", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    with open(err, "w") as e:
        agent = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=e)
    try:
        while "attached" not in err.read_text():
            if agent.poll() is not None:
                raise RuntimeError(f"the agent did not start: {err.read_text()[-300:]}")
            time.sleep(0.1)
        time.sleep(2)  # the first rescan has picked up nginx
        c0 = _cpu_ns(agent.pid)
        time.sleep(5)
        idle_ms_s = (_cpu_ns(agent.pid) - c0) / 5e6
        c0, t0 = _cpu_ns(agent.pid), threads_ns(agent.pid)
        res = wrk(port, a.seconds, CONNS, lua)
        c1, t1 = _cpu_ns(agent.pid), threads_ns(agent.pid)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
    n = max(1.0, res["requests"])
    print(f"{n:.0f} requests ({n / a.seconds:.0f}/s); idle agent {idle_ms_s:.1f} ms CPU/s")
    for k in sorted(t1, key=lambda k: t0.get(k, 0) - t1[k]):
        if t1[k] - t0.get(k, 0) > 1e6:
            print(f"  thread {k}: {(t1[k] - t0.get(k, 0)) / 1e3 / n:.1f} µs/request")
    total = (c1 - c0) / 1e3 / n
    marginal = ((c1 - c0) / 1e3 - idle_ms_s * 1e3 * a.seconds) / n
    print(f"agent CPU {total:.1f} µs/request in all, {marginal:.1f} less the idle agent's")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.agent_threads", description=__doc__)
    ap.add_argument("--rate", type=int, default=2000, help="offered requests/s (paced)")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--cprofile", metavar="PATH", help="run the agent under cProfile")
    ap.add_argument("--floor", action="store_true", help="ring records counted, not handled")
    ap.add_argument("--close", action="store_true", help="a new connection per request")
    ap.add_argument("--otlp", action="store_true", help="export OTLP spans (to a sink here)")
    a = ap.parse_args(argv)
    if os.geteuid() != 0 or not shutil.which("wrk") or not shutil.which("nginx"):
        print("bench.agent_threads: needs root, wrk and nginx (make setup)", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="px-threads-"))
    port = free_port()
    ngx = start_nginx(tmp, port)
    try:
        _wait_port(port)
        wrk(port, 1, CONNS, None)  # warm-up
        measure(tmp, port, a)
    except RuntimeError as e:
        print(f"bench.agent_threads: {e}".splitlines()[0], file=sys.stderr)
        return 1
    finally:
        ngx.terminate()
        ngx.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
