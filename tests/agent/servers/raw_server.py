"""A one-connection-at-a-time raw socket server for the queue tests and the header-order
check. ``--accept-delay-ms``: sleep before each accept() (the connection waits in the accept
queue). ``--read-delay-ms``: sleep after accept() before reading (the request waits in the
receive queue, as behind a blocked event loop). ``--dump PATH``: append each raw request head
(JSON, latin-1) — used to record where Chromium puts traceparent among its headers.
The timing log has t_read_ns (recv returned) and t_writes_ns like the other servers.
``--tls-cert``/``--tls-key``: the handshake right after accept(), then the delay, then the
read (through SSL_read_ex, which reads the socket itself).
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--timing-log", required=True)
    ap.add_argument("--accept-delay-ms", type=float, default=0)
    ap.add_argument("--read-delay-ms", type=float, default=0)
    ap.add_argument("--dump")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    a = ap.parse_args()
    ctx = None
    if a.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.tls_cert, a.tls_key)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", a.port))
    ls.listen(64)
    print(ls.getsockname()[1], flush=True)
    log = open(a.timing_log, "a")  # noqa: SIM115
    while True:
        time.sleep(a.accept_delay_ms / 1000)
        c, _ = ls.accept()
        if ctx is not None:
            try:
                c = ctx.wrap_socket(c, server_side=True)  # (the handshake, at once)
            except (OSError, ssl.SSLError):
                c.close()
                continue
        time.sleep(a.read_delay_ms / 1000)
        data = c.recv(65536)
        t_read = time.monotonic_ns()
        if not data:
            c.close()
            continue
        if a.dump:
            with open(a.dump, "a") as f:
                f.write(json.dumps(data.decode("latin-1")) + "\n")
        line = data.split(b"\r\n", 1)[0].decode("latin-1")
        body = b"hello"
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            "Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Headers: traceparent\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        t_w = time.monotonic_ns()
        c.sendall(head + body)
        log.write(
            json.dumps(
                {
                    "path": line.split(" ")[1] if " " in line else "",
                    "t_read_ns": t_read,
                    "t_writes_ns": [t_w],
                }
            )
            + "\n"
        )
        log.flush()
        c.close()


if __name__ == "__main__":
    main()
