"""Accept times on the socket-hook path: a uretprobe on libc's accept() and accept4().

Without syscall tracepoints nothing in the kernel marks the moment a server takes a
connection off its listen queue (t_acc). libc's accept functions do, and a uprobe costs only
the processes that run the probed instruction, nothing node-wide. A uprobe is attached to a
*file*: every process mapping that libc runs it and the program keeps the traced pids. A
containerised server maps its image's own libc, found through /proc/<pid>/maps and reached
through /proc/<pid>/root — opened there by the agent and handed to the kernel as
/proc/self/fd/<n>: the kernel's own lookup of another process's root link, when it creates
the probe, is refused without CAP_SYS_ADMIN (EACCES), which the DaemonSet does not grant.
Servers that make the syscall themselves (Go) are still followed;
their accept-queue wait is unknown (null).

Linux 6.11 made a uretprobe return through a new syscall; a seccomp filter that does not
know it (container runtimes' default profiles of that time) kills the process making it.
6.14 lets seccomp pass it. On 6.11–6.13 the probe is therefore not attached (stable
backports of the fix are not detected): accept times are unknown there, servers unharmed.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent import procinfo
from agent.loader import kernel_at_least

log = logging.getLogger("parallax.agent")

# glibc (libc.so.6, older libc-2.x.so) and musl (the dynamic loader is its libc)
_LIBC = re.compile(
    r"/(?:libc\.so\.6|libc-[0-9.]+\.so|ld-musl-[^/]+\.so\.1|libc\.musl-[^/]+\.so\.1)$"
)
SYMBOLS = ("accept4", "accept")
PROGRAM = "px_uret_accept"


def uretprobe_hazard(release: str | None = None) -> bool:
    """True on kernels where a uretprobe may get a seccomp-confined server killed."""
    return kernel_at_least(6, 11, release) and not kernel_at_least(6, 14, release)


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


@dataclass
class _Probe:
    fd: int  # kept open while attached: the probe's path names it
    path: str  # where it was found (for log lines)
    pids: set[int] = field(default_factory=set)  # live processes mapping it


class AcceptProbes:
    """One probe pair per libc *file*, shared by the processes that map it and detached
    when the last of them has exited (pods come and go; probes, fds and the overlay
    superblocks they pin must not pile up). A file is known by inode, size and mtime: an
    overlay mount gives each container its own st_dev for the same underlying file."""

    def __init__(self, bpf: Any) -> None:
        self._b = bpf
        self._probes: dict[tuple[int, int, int], _Probe] = {}
        self._pid_key: dict[int, tuple[tuple[int, int, int] | None, int | None]] = {}
        self.enabled = not uretprobe_hazard()
        if not self.enabled:
            log.warning(
                "degraded: Linux %s: no libc accept uretprobe (a seccomp filter of this era"
                " kills the process its return syscall runs in) → accept_queue_us null",
                platform.release(),
            )

    @property
    def attached(self) -> int:
        return len(self._probes)

    def add(self, pids: Iterable[int]) -> None:
        if not self.enabled:
            return
        for pid in pids:
            if pid in self._pid_key:
                continue
            self._pid_key[pid] = (self._probe_for(pid), procinfo.start_time(pid))

    def _probe_for(self, pid: int) -> tuple[int, int, int] | None:
        path = libc_path(pid)
        if path is None:
            return None  # a static binary, or gone: followed, accept times unknown
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            log.warning("no accept times for pid %d: cannot open its libc (%s)", pid, e)
            return None
        st = os.fstat(fd)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        probe = self._probes.get(key)
        if probe is not None:
            os.close(fd)
            probe.pids.add(pid)
            return key
        ok = 0
        for sym in SYMBOLS:
            try:
                self._b.attach_uretprobe(name=f"/proc/self/fd/{fd}", sym=sym, fn_name=PROGRAM)
                ok += 1
            except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
                log.warning("no accept times for users of %s (%s: %s)", path, sym, e)
        if not ok:
            os.close(fd)
            return None
        self._probes[key] = _Probe(fd, path, {pid})
        return key

    def sweep(self) -> None:
        """Forget exited processes (or reused pids); detach a file's probes with its last."""
        for pid, (key, start) in list(self._pid_key.items()):
            if procinfo.start_time(pid) == start and start is not None:
                continue
            del self._pid_key[pid]
            probe = self._probes.get(key) if key is not None else None
            if key is None or probe is None:
                continue
            probe.pids.discard(pid)
            if not probe.pids:
                del self._probes[key]
                for sym in SYMBOLS:
                    try:
                        self._b.detach_uretprobe(name=f"/proc/self/fd/{probe.fd}", sym=sym)
                    except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
                        log.debug("detach %s %s: %s", probe.path, sym, e)
                os.close(probe.fd)
