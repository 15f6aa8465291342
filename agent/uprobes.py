"""Accept times on the socket-hook path: a uretprobe on libc's accept() and accept4().

Without syscall tracepoints nothing in the kernel marks the moment a server takes a
connection off its listen queue (t_acc). libc's accept functions do, and a uprobe costs only
the processes that run the probed instruction, nothing node-wide. A uprobe is attached to a
*file*: every process mapping that libc runs it and the program keeps the traced pids. A
containerised server maps its image's own libc, found through /proc/<pid>/maps and reached
through /proc/<pid>/root. Servers that make the syscall themselves (Go) are still followed;
their accept-queue wait is unknown (null).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("parallax.agent")

# glibc (libc.so.6, older libc-2.x.so) and musl (the dynamic loader is its libc)
_LIBC = re.compile(
    r"/(?:libc\.so\.6|libc-[0-9.]+\.so|ld-musl-[^/]+\.so\.1|libc\.musl-[^/]+\.so\.1)$"
)
SYMBOLS = ("accept4", "accept")
PROGRAM = "px_uret_accept"


def libc_path(pid: int) -> str | None:
    """The libc process ``pid`` maps, as a path the agent can open (its root's view)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").partition("/")[2]
                if path and _LIBC.search("/" + path):
                    return f"/proc/{pid}/root/{path}"
    except OSError:  # gone, or not ours to read
        return None
    return None


class AcceptProbes:
    """The libc files probed so far (by device and inode: one probe per file, whatever
    path or namespace it was reached through)."""

    def __init__(self, bpf: Any) -> None:
        self._b = bpf
        self._files: set[tuple[int, int]] = set()
        self._pids: set[int] = set()
        self.attached = 0

    def add(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if pid in self._pids:
                continue
            self._pids.add(pid)
            path = libc_path(pid)
            if path is None:
                continue  # a static binary: followed, accept times unknown
            try:
                st = os.stat(path)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in self._files:
                continue
            self._files.add(key)
            for sym in SYMBOLS:
                try:
                    self._b.attach_uretprobe(name=path, sym=sym, fn_name=PROGRAM)
                    self.attached += 1
                except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
                    log.warning("no accept times for users of %s (%s: %s)", path, sym, e)

    def forget(self, pids: Iterable[int]) -> None:
        """Exited pids: a reused pid's libc is looked up again."""
        self._pids.difference_update(pids)
