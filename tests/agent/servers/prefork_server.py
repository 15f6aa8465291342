"""A server whose worker is forked after the agent started: it listens, prints its port,
waits until the file given by ``--fork-when`` exists, then forks one worker that inherits the
listening socket and answers every request (the parent only waits). Prints the worker's pid.
"""

from __future__ import annotations

import argparse
import os
import socket
import time


def serve(ls: socket.socket) -> None:
    while True:
        c, _ = ls.accept()
        c.recv(65536)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fork-when", required=True)
    a = ap.parse_args()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    print(ls.getsockname()[1], flush=True)
    while not os.path.exists(a.fork_when):
        time.sleep(0.05)
    pid = os.fork()
    if pid == 0:
        serve(ls)
    print(pid, flush=True)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
