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

import ctypes as ct
import functools
import logging
import os
import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.identity import procinfo
from agent.kernel import perf_close, tracefs
from agent.kernel.loader import kernel_at_least

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


def mapped_path(pid: int, pattern: re.Pattern[str]) -> str | None:
    """The first file process ``pid`` maps whose path matches ``pattern``, as a path the
    agent can open (its root's view)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").partition("/")[2]
                if path and pattern.search("/" + path):
                    return f"/proc/{pid}/root/{path}"
    except OSError:  # gone, or not ours to read
        return None
    return None


def libc_path(pid: int) -> str | None:
    """The libc process ``pid`` maps (glibc or musl)."""
    return mapped_path(pid, _LIBC)


def fix_bcc_attach_abi() -> None:
    """Give bcc's Python binding of ``bpf_attach_uprobe`` its seventh argument.

    libbcc has taken ``ref_ctr_offset`` (a USDT semaphore's file offset) last since 0.17; the
    Python binding still declares six (iovisor/bcc#5236, open; Debian 12's 0.26 included),
    so every attach passes whatever the caller's stack holds there. The kernel refuses a
    probe at a place another holds with a different value (EINVAL, "ref_ctr_offset
    mismatch" in the kernel log: two agents, or one agent's accept() and a later run's, fail
    to attach by chance), and a value that lands in a writable mapping of the file would be
    incremented as a counter in every process that maps it. Rebound here with seven, always
    passing 0: none of the agent's probes is a USDT probe."""
    from bcc import libbcc  # noqa: PLC0415  (Debian's python3-bpfcc; bcc already imported)

    current = libbcc.lib.bpf_attach_uprobe
    if getattr(current, "px_fixed", False) or len(current.argtypes or ()) != 6:
        return  # fixed already, here or upstream
    raw = libbcc.lib["bpf_attach_uprobe"]  # a new function object, not the cached one
    raw.restype = ct.c_int
    raw.argtypes = [*current.argtypes, ct.c_uint32]

    def attach(prog_fd: int, kind: int, ev: bytes, path: bytes, addr: int, pid: int) -> int:
        return int(raw(prog_fd, kind, ev, path, addr, pid, 0))

    attach.px_fixed = True  # type: ignore[attr-defined]
    libbcc.lib.bpf_attach_uprobe = attach  # bcc looks it up on each call


@functools.cache
def prepare_attach() -> None:
    """Once per process, before the first uprobe attach (here or in agent.kernel.tls_probes)."""
    fix_bcc_attach_abi()
    n = tracefs.remove_stale_uprobes()
    if n:
        log.info("removed %d uprobe events left by agents that were killed", n)


@dataclass(frozen=True)
class Probe:
    sym: str
    fn_name: str  # the BPF function
    ret: bool = False  # a uretprobe
    optional: bool = False  # a library version may lack the symbol: skipped quietly


@dataclass
class _Attached:
    fd: int  # kept open while attached: the probe's path names it
    path: str  # where it was found (for log lines)
    probes: list[Probe]  # those that attached
    pids: set[int] = field(default_factory=set)  # live processes mapping it


class LibraryProbes:
    """Uprobes on one shared library, attached per *file*: shared by the processes that map
    it and detached when the last of them has exited (pods come and go; probes, fds and the
    overlay superblocks they pin must not pile up). A file is known by inode, size and
    mtime: an overlay mount gives each container its own st_dev for the same file.

    ``recheck``: a process that does not map the library yet is looked at again at the
    next ``add`` (a library loaded later, as CUDA's driver is, with dlopen)."""

    def __init__(
        self,
        bpf: Any,
        library: re.Pattern[str],
        probes: list[Probe],
        what: str,
        recheck: bool = False,
    ) -> None:
        prepare_attach()
        self._b = bpf
        self._library = library
        self._probe_list = probes
        self._what = what
        self._recheck = recheck
        self._files: dict[tuple[int, int, int], _Attached] = {}
        self._pid_key: dict[int, tuple[tuple[int, int, int] | None, int | None]] = {}
        self.enabled = True

    @property
    def attached(self) -> int:
        return len(self._files)

    def probed_pids(self) -> set[int]:
        """Processes whose mapping of the library carries the probes."""
        return {pid for pid, (key, _) in self._pid_key.items() if key is not None}

    def add(self, pids: Iterable[int]) -> None:
        if not self.enabled:
            return
        for pid in pids:
            known = self._pid_key.get(pid)
            if known is not None and (known[0] is not None or not self._recheck):
                continue
            self._pid_key[pid] = (self._probe_for(pid), procinfo.start_time(pid))

    def _probe_for(self, pid: int) -> tuple[int, int, int] | None:
        path = mapped_path(pid, self._library)
        if path is None:
            return None  # does not map it (a static binary, not yet, or gone)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            log.warning("no %s for pid %d: cannot open %s (%s)", self._what, pid, path, e)
            return None
        st = os.fstat(fd)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        known = self._files.get(key)
        if known is not None:
            os.close(fd)
            known.pids.add(pid)
            return key
        ok: list[Probe] = []
        for p in self._probe_list:
            attach = self._b.attach_uretprobe if p.ret else self._b.attach_uprobe
            try:
                attach(name=f"/proc/self/fd/{fd}", sym=p.sym, fn_name=p.fn_name)
                ok.append(p)
            except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
                if not p.optional:
                    log.warning("no %s for users of %s (%s: %s)", self._what, path, p.sym, e)
        if not ok:
            os.close(fd)
            return None
        self._files[key] = _Attached(fd, path, ok, {pid})
        return key

    def sweep(self) -> list[int]:
        """Forget exited processes (or reused pids); detach a file's probes with its last.
        Returns the pids forgotten."""
        gone: list[int] = []
        for pid, (key, start) in list(self._pid_key.items()):
            if procinfo.start_time(pid) == start and start is not None:
                continue
            del self._pid_key[pid]
            gone.append(pid)
            f = self._files.get(key) if key is not None else None
            if key is None or f is None:
                continue
            f.pids.discard(pid)
            if not f.pids:
                del self._files[key]
                self._detach(f)
        return gone

    def _detach(self, f: _Attached) -> None:
        for p in f.probes:
            self._detach_probe(f, p)
        os.close(f.fd)

    def _detach_probe(self, f: _Attached, p: Probe) -> None:
        detach = self._b.detach_uretprobe if p.ret else self._b.detach_uprobe
        try:
            detach(name=f"/proc/self/fd/{f.fd}", sym=p.sym)
        except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
            log.debug("detach %s %s: %s", f.path, p.sym, e)

    def close(self) -> None:
        """Every file's probes detached at once (agent.kernel.perf_close: each close waits
        out a grace period, ~0.1 s a uprobe), then the files closed; waited for."""
        files = list(self._files.values())
        self._files.clear()
        self._pid_key.clear()
        calls = [functools.partial(self._detach_probe, f, p) for f in files for p in f.probes]

        def close_files() -> None:
            for f in files:
                os.close(f.fd)

        perf_close.in_parallel(calls, close_files).wait()


class AcceptProbes(LibraryProbes):
    """The accept() and accept4() uretprobes on the libc files the traced servers map."""

    def __init__(self, bpf: Any) -> None:
        super().__init__(
            bpf, _LIBC, [Probe(sym, PROGRAM, ret=True) for sym in SYMBOLS], "accept times"
        )
        self.enabled = not uretprobe_hazard()
        if not self.enabled:
            log.warning(
                "degraded: Linux %s: no libc accept uretprobe (a seccomp filter of this era"
                " kills the process its return syscall runs in) → accept_queue_us null",
                platform.release(),
            )
