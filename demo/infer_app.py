"""An inference-like streaming service on the NVIDIA stand-ins: the demo's GPU route.

``GET /v1/generate?tokens=N`` streams Server-Sent Events, one token per write, from an API
process (the one that reads requests: what the agent traces) fed by an *engine* process —
its child, in the same cgroup, as vLLM's API server and engine core are. The engine runs a
continuous-batching loop on the "GPU" (demo/gpu/fake_cuda.c, through the real CUDA driver
entry points the agent's uprobes watch): new requests are prefilled (kernel launches and a
synchronize that lasts PREFILL_MS each), then every running request gets one decode step
per iteration (launches, and a device-to-host copy lasting DECODE_MS plus PER_REQUEST_MS
per request in the batch). Under the demo's load the engine is rarely idle: the GPU is
the bottleneck, as it is when an inference service runs out of capacity.

The engine also writes the fake NVML's script (demo/gpu/nvml_double.py): each of its steps
as a stretch in which the GPU, and its process's share of the SMs, are busy, on a GPU held
at 55 % of its maximum SM clock by a power cap — so the agent's NVML poller sees what the
engine does, throttled, and the SLA page says so.

    python -m demo.infer_app --port 0 --cuda-lib-dir DIR --nvml-script PATH
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from demo.gpu.cuda_double import FakeCuda
from demo.gpu.nvml_double import NvmlScript
from demo.stack import die_with_parent

PREFILL_LAUNCHES, PREFILL_MS = 40, 40.0
DECODE_LAUNCHES, DECODE_MS, PER_REQUEST_MS = 6, 12.0, 1.5
GPU_UUID = "GPU-dem0c0de-0000-4000-8000-000000000001"
SM_MAX_MHZ, SM_MHZ = 1980, 1089  # 55 % of max: a power cap (NVML reason 0x4)
KEEP_S = 10.0  # of scripted history
MAX_STRETCHES = 200  # the fake keeps 512 rows in all: a util and a proc row per stretch


class Engine:
    """The engine process: requests in, tokens out, the GPU busy in between."""

    def __init__(self, cuda_dir: str, script_path: str, conn: Connection) -> None:
        self.cuda = FakeCuda(cuda_dir)
        self.conn = conn
        self.script = Path(script_path)
        self.running: dict[int, int] = {}  # request id → tokens still to produce
        self.waiting: list[tuple[int, int]] = []
        self.busy: list[tuple[int, int]] = []  # (start, end) Unix µs of GPU work, recent
        self.warned = False

    def run(self) -> None:
        while True:
            self._take(block=not self.running)
            if self.waiting:  # prefill the new ones (the first token comes out of it)
                new, self.waiting = self.waiting, []
                for rid, tokens in new:
                    self._gpu(PREFILL_MS)
                    self.cuda.launch(PREFILL_LAUNCHES)
                    self.cuda.synchronize(int(PREFILL_MS * 1000))
                    self.running[rid] = tokens
                    self._emit(rid)
            elif self.running:  # one decode step for the whole batch
                n = len(self.running)
                step_ms = DECODE_MS + PER_REQUEST_MS * n
                self._gpu(step_ms)
                self.cuda.launch(DECODE_LAUNCHES * n)
                self.cuda.copy_to_host(int(step_ms * 1000))
                for rid in list(self.running):
                    self._emit(rid)

    def _take(self, block: bool) -> None:
        while block or self.conn.poll():
            msg = self.conn.recv()
            if msg is None:
                raise SystemExit(0)
            self.waiting.append(msg)
            block = False

    def _emit(self, rid: int) -> None:
        self.running[rid] -= 1
        done = self.running[rid] <= 0
        self.conn.send((rid, done))
        if done:
            del self.running[rid]

    def _gpu(self, ms: float) -> None:
        """Before a step: the GPU busy for ``ms`` from now, in the NVML stand-in's script
        (its samples are made when the agent's poller reads them, so the step is in them)."""
        t = time.time_ns() // 1000
        z = t + int(ms * 1000)
        if self.busy and t - self.busy[-1][1] < 2000:  # back to back: one stretch
            self.busy[-1] = (self.busy[-1][0], z)
        else:
            self.busy.append((t, z))
        horizon = t - int(KEEP_S * 1e6)
        self.busy = [b for b in self.busy if b[1] > horizon][-MAX_STRETCHES:]
        script = NvmlScript(self.script)
        dev = script.device(
            GPU_UUID, "NVIDIA H200 (stand-in)", sm_mhz=SM_MHZ, sm_max_mhz=SM_MAX_MHZ, reasons=0x4
        )
        pid = os.getpid()
        for a, b in self.busy:
            script.util(dev, a, b, gpu_pct=100).proc(dev, pid, a, b, sm_pct=100)
        script.running(dev, pid, 40 * 2**30)
        try:
            script.write()
        except (OSError, ValueError) as e:  # the stand-in's trouble must not stop the engine
            if not self.warned:
                self.warned = True
                print(f"infer_app: cannot write the NVML stand-in's script: {e}", flush=True)


def engine_main(cuda_dir: str, script_path: str, conn: Connection, api_end: Connection) -> None:
    die_with_parent()  # the API process gone (even killed): so is its engine
    api_end.close()  # (the fork's copy of the API's end: the pipe closes with the API)
    Engine(cuda_dir, script_path, conn).run()


class Api:
    """The API process's side: one queue per request, fed by a thread reading the engine."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.queues: dict[int, queue.Queue[bool | None]] = {}
        self.next_id = 0
        self.engine_gone = False
        threading.Thread(target=self._route, daemon=True).start()

    def submit(self, tokens: int) -> queue.Queue[bool | None] | None:
        """A queue of the request's tokens (True: the last; None: the engine died), or
        None when there is no engine to ask."""
        with self.lock:
            if self.engine_gone:
                return None
            self.next_id += 1
            rid = self.next_id
            q: queue.Queue[bool | None] = queue.Queue()
            try:
                self.conn.send((rid, tokens))
            except OSError:  # the engine died before the router noticed
                self.engine_gone = True
                return None
            self.queues[rid] = q
        return q

    def _route(self) -> None:
        while True:
            try:
                rid, done = self.conn.recv()
            except (EOFError, OSError):  # the engine died: every request waiting fails
                with self.lock:
                    self.engine_gone = True
                    for q in self.queues.values():
                        q.put(None)
                    self.queues.clear()
                return
            with self.lock:
                q = self.queues.pop(rid) if done else self.queues[rid]
            q.put(done)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--cuda-lib-dir", required=True)
    ap.add_argument("--nvml-script", required=True)
    args = ap.parse_args()
    ours, theirs = mp.Pipe()
    engine = mp.get_context("fork").Process(
        target=engine_main, args=(args.cuda_lib_dir, args.nvml_script, theirs, ours), daemon=True
    )
    engine.start()
    theirs.close()  # the engine's end is the engine's: its death then closes the pipe
    api = Api(ours)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_OPTIONS(self) -> None:  # (EventSource sends none; kept for fetch clients)
            self.send_response(204)
            self._cors()
            self.send_header("Access-Control-Allow-Headers", "traceparent")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _cors(self) -> None:
            # the chat page is served from another origin; Timing-Allow-Origin lets the
            # probe read its Resource Timing
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Timing-Allow-Origin", "*")

        def do_GET(self) -> None:
            u = urlparse(self.path)
            if u.path != "/v1/generate":
                self.send_error(404)
                return
            tokens = max(1, min(200, int(parse_qs(u.query).get("tokens", ["12"])[0])))
            q = api.submit(tokens)
            done = q.get() if q is not None else None  # the first token: after prefill
            if q is None or done is None:
                self.send_error(503, "the engine is gone")
                return
            self.send_response(200)
            self._cors()
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            i = 0
            while True:
                self._chunk(f"data: tok{i} \n\n".encode())
                i += 1
                if done:
                    break
                done = q.get()
                if done is None:  # the engine died mid-stream: the stream ends without "done"
                    break
            if done is not None:
                self._chunk(b"event: done\ndata: \n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def log_message(self, format: str, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    print(f"infer_app: listening on http://127.0.0.1:{srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever()
    finally:
        ours.send(None)


if __name__ == "__main__":
    main()
