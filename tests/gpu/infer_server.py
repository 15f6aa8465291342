"""An inference-like streaming server on the CUDA driver double, for the agent's GPU tests.

``GET /generate?tokens=N`` answers with Server-Sent Events, one token per write, in a known
pattern of CUDA driver calls:

* prefill (before the head and first token): PREFILL_LAUNCHES kernel launches, then a
  stream synchronize that blocks PREFILL_WAIT_US;
* decode (before each later token): DECODE_LAUNCHES launches, then a device-to-host copy
  that blocks DECODE_WAIT_US.

``--worker``: the CUDA calls run in a child process (the model process of an inference
server such as vLLM), told over a pipe; this process only reads requests and writes tokens.
``--no-gpu``: the same stream with no CUDA at all. ``--log``: each request's host waits as
they happened (a sleep overshoots on a loaded machine). Prints its port on the first line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from urllib.parse import parse_qs, urlparse

from demo import sse_events as ev
from demo.gpu.cuda_double import FakeCuda
from demo.stack import die_with_parent

PREFILL_LAUNCHES = 40
PREFILL_WAIT_US = 100_000
DECODE_LAUNCHES = 5
DECODE_WAIT_US = 20_000


def prefill(cuda: FakeCuda) -> int:
    """The step's GPU work; returns how long the host was blocked (ns, as it happened: a
    sleep overshoots under load)."""
    cuda.launch(PREFILL_LAUNCHES)
    t = time.monotonic_ns()
    cuda.synchronize(PREFILL_WAIT_US)
    return time.monotonic_ns() - t


def decode(cuda: FakeCuda) -> int:
    cuda.launch(DECODE_LAUNCHES)
    t = time.monotonic_ns()
    cuda.copy_to_host(DECODE_WAIT_US)
    return time.monotonic_ns() - t


def worker(lib_dir: str, conn: Connection, server_end: Connection) -> None:
    die_with_parent()  # the server gone (even killed by a test's SIGTERM): so is its worker
    server_end.close()
    cuda = FakeCuda(lib_dir)
    while True:
        step = conn.recv()
        if step is None:
            return
        conn.send((prefill if step == "prefill" else decode)(cuda))


class Gpu:
    """The GPU work of one step: here, in a worker process, or none."""

    def __init__(self, lib_dir: str | None, in_worker: bool) -> None:
        self.cuda = FakeCuda(lib_dir) if lib_dir and not in_worker else None
        self.conn: Connection | None = None
        if lib_dir and in_worker:
            ours, theirs = mp.Pipe()
            self.proc = mp.get_context("fork").Process(target=worker, args=(lib_dir, theirs, ours))
            self.proc.start()
            theirs.close()  # the worker's end is the worker's
            self.conn = ours
        self.lock = threading.Lock()  # one step at a time, as one model would

    def step(self, kind: str) -> int:
        """One step; the host wait it took (ns)."""
        with self.lock:
            if self.cuda is not None:
                return (prefill if kind == "prefill" else decode)(self.cuda)
            if self.conn is not None:
                self.conn.send(kind)
                waited: int = self.conn.recv()
                return waited
            time.sleep((PREFILL_WAIT_US if kind == "prefill" else DECODE_WAIT_US) / 1e6)
            return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda-lib-dir")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--log", help="append one JSON line per request: its host waits (us)")
    args = ap.parse_args()
    gpu = Gpu(None if args.no_gpu else args.cuda_lib_dir, args.worker)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            q = parse_qs(urlparse(self.path).query)
            tokens = int(q.get("tokens", ["3"])[0])
            waits = {"prefill_wait_us": gpu.step("prefill") // 1000, "decode_wait_us": 0}
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(tokens):
                if i:
                    waits["decode_wait_us"] += gpu.step("decode") // 1000
                # an inference server's stream: OpenAI chat chunks (a dialect the agent reads)
                data = ev.sse(ev.content_chunk(f"token{i}"))
                # head and first token in one write (as Node and uvicorn do)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            for last in (ev.sse(ev.finish_chunk("length")), ev.sse(b"[DONE]")):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(last), last))
                self.wfile.flush()
            if args.log:  # before the last write: the log is complete when the client is
                with open(args.log, "a") as f:
                    f.write(json.dumps(waits) + "\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def log_message(self, format: str, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    finally:
        if gpu.conn is not None:
            gpu.conn.send(None)


if __name__ == "__main__":
    main()
