"""An HTTP/2 server on the ``h2`` package and a plain socket, one thread per connection,
that writes a whole response at once: HEADERS, then ``size`` body bytes as DATA frames of
at most 16 KiB, in a single ``sendall`` — the later frame headers lie far past the agent's
copy window, where only the kernel's frame walk finds them. ``GET /bulk?size=N``
(``&trailers=1``: trailers with ``grpc-status: 0`` end it, in the same write); the
request's ``traceparent`` and the times (``t_start_ns`` at the request's HEADERS,
``t_write_ns`` before the write) go to the timing log.

    python -m tests.agent.servers.h2_raw_server --timing-log PATH   # prints the port
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import h2.config
import h2.connection
import h2.events

LOCK = threading.Lock()


def _text(x: str | bytes) -> str:
    return x.decode() if isinstance(x, bytes) else x


def serve_conn(s: socket.socket, log: Path) -> None:
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
    )
    conn.initiate_connection()
    s.sendall(conn.data_to_send())
    with s:
        while data := s.recv(65536):
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    t_start = time.monotonic_ns()
                    headers = {_text(k): _text(v) for k, v in ev.headers or []}
                    q = parse_qs(urlsplit(headers[":path"]).query)
                    size = int(q.get("size", ["40000"])[0])
                    trailers = q.get("trailers", ["0"])[0] == "1"
                    sid = ev.stream_id
                    assert sid is not None
                    conn.send_headers(sid, [(":status", "200"), ("content-length", str(size))])
                    left = size
                    while left:
                        n = min(left, conn.local_settings.max_frame_size, 16384)
                        conn.send_data(sid, b"x" * n, end_stream=left == n and not trailers)
                        left -= n
                    if trailers:  # as a gRPC server ends a call: in the same write
                        conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
                    t_write = time.monotonic_ns()
                    s.sendall(conn.data_to_send())
                    rec = {
                        "traceparent": headers.get("traceparent"),
                        "t_start_ns": t_start,
                        "t_write_ns": t_write,
                    }
                    with LOCK, log.open("a") as f:
                        f.write(json.dumps(rec) + "\n")
            out = conn.data_to_send()
            if out:
                s.sendall(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timing-log", type=Path, required=True)
    a = ap.parse_args()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    print(ls.getsockname()[1], flush=True)
    while True:
        s, _ = ls.accept()
        threading.Thread(target=serve_conn, args=(s, a.timing_log), daemon=True).start()


if __name__ == "__main__":
    main()
