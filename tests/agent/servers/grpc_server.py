"""A gRPC server-streaming service (grpcio, a generic handler: no generated code), the way
a model server streams tokens. ``/parallax.test.Tokens/Stream`` takes a request of the form
``n=5,first_ms=40,gap_ms=20[,status=5][,fail_after=2][,size=N]`` (raw bytes, no protobuf)
and streams ``n`` messages (of ``size`` bytes if given): the first after ``first_ms``, then
one every ``gap_ms``. ``status``: abort
with that code before the first message; ``fail_after``: abort with INTERNAL after that
many messages. Each call's timing on the server's own CLOCK_MONOTONIC is appended to the
log as one JSON line: ``t_start_ns`` (the handler's entry), ``t_writes_ns`` (each message
handed to gRPC), ``traceparent`` (from the call's metadata).

    python -m tests.agent.servers.grpc_server --timing-log PATH   # prints the port
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

METHOD = "/parallax.test.Tokens/Stream"


class Tokens:
    def __init__(self, log: Path) -> None:
        self.log = log
        self.lock = threading.Lock()

    def stream(self, request: bytes, context: Any) -> Iterator[bytes]:
        t_start = time.monotonic_ns()
        args = dict(kv.split("=", 1) for kv in request.decode().split(",") if "=" in kv)
        tp = dict(context.invocation_metadata()).get("traceparent")
        rec: dict[str, Any] = {"traceparent": tp, "t_start_ns": t_start, "t_writes_ns": []}
        try:
            if "status" in args:
                rec["status"] = int(args["status"])
                context.abort(_code(int(args["status"])), "as asked")
            n = int(args.get("n", "5"))
            first, gap = float(args.get("first_ms", "40")), float(args.get("gap_ms", "20"))
            deadline = time.monotonic() + first / 1000
            for i in range(n):
                if "fail_after" in args and i == int(args["fail_after"]):
                    rec["status"] = 13
                    context.abort(grpc.StatusCode.INTERNAL, "failed mid-stream")
                time.sleep(max(0.0, deadline - time.monotonic()))
                rec["t_writes_ns"].append(time.monotonic_ns())
                yield b"m" * int(args["size"]) if "size" in args else f"token-{i} ".encode()
                deadline += gap / 1000
        finally:
            with self.lock, self.log.open("a") as f:
                f.write(json.dumps(rec) + "\n")


def _code(value: int) -> Any:
    return next(c for c in grpc.StatusCode if c.value[0] == value)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timing-log", type=Path, required=True)
    a = ap.parse_args()
    svc = Tokens(a.timing_log)
    handler = grpc.method_handlers_generic_handler(
        "parallax.test.Tokens", {"Stream": grpc.unary_stream_rpc_method_handler(svc.stream)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
