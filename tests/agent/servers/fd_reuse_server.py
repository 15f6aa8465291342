"""A server for the socket-hook edge cases: a connection accepted before the agent starts
is closed unread on SIGUSR1 and its fd number reused by an outbound connection (to the
backend port given); then one request is answered and the socket closed with part of the
request still unread (the kernel sends a reset: the server's abortive close).

    python -m tests.agent.servers.fd_reuse_server BACKEND_PORT   # prints its port
"""

from __future__ import annotations

import signal
import socket
import sys
import threading


def main() -> None:
    backend = int(sys.argv[1])
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    print(ls.getsockname()[1], flush=True)
    early, _ = ls.accept()
    go = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: go.set())
    print("ready", flush=True)
    go.wait()
    fd = early.fileno()
    early.close()
    out = socket.create_connection(("127.0.0.1", backend))
    print(f"reused {out.fileno() == fd}", flush=True)
    for _ in range(3):
        out.sendall(b"GET /plain HTTP/1.1\r\nHost: b\r\n\r\n")
        out.recv(65536)
    c, _ = ls.accept()
    c.recv(200)  # the rest of the request stays unread: close() resets
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n12345")
    c.close()
    print("done", flush=True)
    threading.Event().wait(60)


if __name__ == "__main__":
    main()
