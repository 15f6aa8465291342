"""TLS through library uprobes: the plaintext of the traced servers' TLS connections.

A server that terminates TLS itself (uvicorn ``--ssl-keyfile``, gunicorn, nginx, Node
``https``) reads and writes ciphertext on its sockets; the kernel side marks such a
connection at its first bytes (a TLS record) and copies nothing from it (bpf/agent/tls.h).
Its plaintext comes from uprobes on OpenSSL's ``SSL_read``/``SSL_read_ex`` (at the return:
the decrypted bytes) and ``SSL_write``/``SSL_write_ex`` (at the entry: the bytes before
encryption), which feed the same READ / response-head / body-write path as a socket's
bytes (bpf/agent/tls_uprobes.h). Where the probes go, per traced process:

* the ``libssl.so.3`` / ``libssl.so.1.1`` it maps (Python's ``_ssl`` module links the
  system's; nginx; a container's own libssl, reached through /proc/<pid>/root);
* else its executable, when that carries the symbols: Node links OpenSSL statically and
  exports ``SSL_read``/``SSL_write`` (checked here: NodeSource's node 20.20.2 on Debian 12,
  OpenSSL 3.0.19, all five in ``nm -D``);
* else nothing: Go's crypto/tls, rustls, a stripped static OpenSSL or BoringSSL. Their TLS
  connections are counted per executable (``parallax_agent_tls_unprobed_total{comm}``).

When: from the agent's start, on every traced server that maps OpenSSL (:meth:`preattach`:
the servers found at start, each server found later, and every RECHECK_S a server without
probes is looked at again — a library mapped later, an exec), so that a server's very first
TLS connection is read; and at a process's first TLS connection for a process that has none
(the kernel marks a connection TLS at its first bytes and tells user space: EV_TLS).
Most Python processes map libssl whether or not they serve TLS (http.server imports
http.client, which imports ssl; uvicorn, requests and the LLM SDKs do too), and a probe hit
costs the process a trap — measured here, on this Firecracker VM, ~13 µs per probed call
(bench.tls; ~38 on a loaded machine), most of it the single-step of the probed instruction
(a probe on an emulated instruction costs ~1-3 µs; docs/benchmarks.md). An app behind a
TLS-terminating ingress whose own HTTPS calls to its model API read a streamed answer in
hundreds of SSL_read calls must not pay that for long: a process probed before any TLS
connection loses its probes at its first plaintext connection (:meth:`on_plain`) unless it
has served TLS by then (a server with a plaintext and a TLS port that gets a plaintext
connection first is probed again at its first TLS connection; that connection's requests
read before the probes are there are lost, as they were for every server before probes
went on at start). A process without probes is looked at again at a later TLS connection,
at most every RECHECK_S (a Python app may import ssl late).

Unlike libc's accept probe (agent.kernel.uprobes, one probe per library *file*), these probes are
per *process* (a pid-filtered perf event): SSL_read runs for every request of every TLS
client and server on the node, and a probe on the host's libssl file would trap in all of
them. With a pid the kernel puts the breakpoint in that process's memory only (a forked
child's inherited breakpoint is removed at its first hit; the child is probed at its own
first TLS connection).

Closing a uprobe's perf event costs the kernel ~100 ms (an RCU grace period per probe,
measured here): probes of exited processes are closed on short-lived threads, in parallel,
never on the main loop.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.identity import procinfo
from agent.kernel import perf_close
from agent.kernel.uprobes import mapped_path, prepare_attach, uretprobe_hazard

log = logging.getLogger("parallax.agent")

# OpenSSL 3.x and 1.1 (not NSS's libssl3.so, whose API is another)
_LIBSSL = re.compile(r"/libssl\.so\.(?:3|1\.1)$")
# (symbol, entry program, return program, required): the _ex forms exist from OpenSSL 1.1.1
PROBES = (
    ("SSL_read", "px_ssl_read_enter", "px_ssl_read_ret", True),
    ("SSL_read_ex", "px_ssl_read_ex_enter", "px_ssl_read_ret", False),
    ("SSL_write", "px_ssl_write_enter", "px_ssl_write_ret", True),
    ("SSL_write_ex", "px_ssl_write_ex_enter", "px_ssl_write_ret", False),
)
RECHECK_S = 5.0  # a process without probes is looked at again at most this often
PID_TLS = 2  # px_pids bit (bpf/agent/defs.h PX_PID_TLS): the process carries the probes
_KPROBE = 2  # BPF_PROG_TYPE_KPROBE (uprobes)

FileKey = tuple[int, int, int]  # inode, size, mtime: overlay mounts vary st_dev


@dataclass
class _Proc:
    start: int | None  # process start time: a reused pid is another process
    looked: float  # when it was last looked at (monotonic)
    fd: int = -1  # the probed file, open while probed (the probes name /proc/self/fd/<fd>)
    key: FileKey | None = None
    name: str = ""  # the probed file's name, for the attach line
    perf_fds: list[int] = field(default_factory=list)
    server: bool = False  # a traced server (preattach): looked at again every RECHECK_S
    tls_seen: bool = False  # the kernel saw a TLS connection of it
    plain: bool = False  # its first connection was plaintext, before any TLS one
    exe: tuple[int, int] | None = None  # its executable (st_dev, st_ino): an exec changes it


class TlsProbes:
    """The TLS uprobes of the traced processes: :meth:`on_tls` at each TLS connection the
    kernel reports, :meth:`sweep` once a second, :meth:`close` at exit."""

    def __init__(self, bpf: Any, mode: str = "auto") -> None:
        self._b = bpf
        self._procs: dict[int, _Proc] = {}
        self._offsets: dict[FileKey, dict[str, int]] = {}  # file → symbol → file offset
        self._prog_fds: dict[str, int] = {}
        self._closing: list[perf_close.Closing] = []
        self._warned: set[int] = set()  # pids whose probes failed, said once each
        self.why = ""  # why there are no probes at all (the attach line)
        if mode == "off":
            self.why = "off (--tls off)"
        elif platform.machine() != "x86_64":
            self.why = (
                f"off (the uprobe programs read x86-64 registers; this is {platform.machine()})"
            )
        elif uretprobe_hazard():
            self.why = (
                f"off (Linux {platform.release()}: SSL_read's bytes need a uretprobe, and a"
                " seccomp filter of this era kills the process its return syscall runs in)"
            )
        else:
            self.why = self._load()
        self.enabled = not self.why

    def _load(self) -> str:
        """Load (verify) the six programs once; a reason when the kernel refuses one."""
        names = {p for _, entry, ret, _ in PROBES for p in (entry, ret)}
        try:
            for name in sorted(names):
                self._prog_fds[name] = self._b.load_func(name.encode(), _KPROBE).fd
        except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
            log.warning("TLS probes did not load: %s", str(e).splitlines()[0][:200])
            return "off (the uprobe programs did not load: see the log)"
        return ""

    # -- which processes -----------------------------------------------------------
    def probed(self, pid: int) -> bool:
        p = self._procs.get(pid)
        return p is not None and bool(p.perf_fds)

    def preattach(self, pids: Iterable[int]) -> None:
        """Traced servers (at start, and each found later): probes now on those that map
        OpenSSL, before their first TLS connection — its requests are read from its first
        byte. Those without are looked at again every RECHECK_S (:meth:`sweep`)."""
        if not self.enabled:
            return
        for pid in pids:
            if pid not in self._procs:
                self._look(pid, server=True)

    def on_tls(self, pid: int) -> bool:
        """The kernel saw a TLS connection of ``pid``: probe the process now if it has no
        probes (looked at again at most every RECHECK_S, at once when its probes came off
        at a plaintext connection). Whether it carries them now."""
        if not self.enabled:
            return False
        p = self._procs.get(pid)
        if p is not None and p.perf_fds:
            p.tls_seen = True
            return True
        if p is None or p.plain or time.monotonic() - p.looked >= RECHECK_S:
            self._procs.pop(pid, None)
            self._look(pid, server=p is not None and p.server)
        self._procs[pid].tls_seen = True
        return self.probed(pid)

    def on_plain(self, pid: int) -> None:
        """A plaintext connection of ``pid`` (its first bytes were no TLS record): a process
        probed before serving any TLS loses its probes (each of its own HTTPS calls would
        trap); a later TLS connection probes it again (:meth:`on_tls`)."""
        p = self._procs.get(pid)
        if p is None or p.tls_seen or p.plain:
            return
        p.plain = True
        if p.perf_fds:
            log.info(
                "TLS: probes off pid %d (%s): its first connection is plaintext, no TLS served",
                pid,
                p.name,
            )
            self._release(p)
            _set_pid_tls(self._b, pid, on=False)

    def _look(self, pid: int, server: bool = False) -> None:
        proc = self._procs[pid] = _Proc(procinfo.start_time(pid), time.monotonic(), server=server)
        proc.exe = _exe_id(pid)
        for path in self._candidates(pid):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                if pid not in self._warned:  # (a server is looked at again every RECHECK_S)
                    self._warned.add(pid)
                    log.warning("no TLS probes for pid %d: cannot open %s (%s)", pid, path, e)
                continue
            st = os.fstat(fd)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            offsets = self._symbols(key, fd)
            if not all(sym in offsets for sym, _, _, required in PROBES if required):
                os.close(fd)
                continue  # (an executable without OpenSSL's symbols: Python, Go)
            proc.fd, proc.key, proc.name = fd, key, os.path.basename(path)
            proc.perf_fds = self._attach(pid, fd, offsets)
            if proc.perf_fds:
                _set_pid_tls(self._b, pid)
                log.info(
                    "TLS: probes on pid %d in %s (%s)%s",
                    pid,
                    proc.name,
                    path,
                    ", before its first TLS connection" if server else "",
                )
                return
            os.close(fd)
            proc.fd, proc.key = -1, None

    @staticmethod
    def _candidates(pid: int) -> list[str]:
        """The libssl the process maps, else its executable (which may link OpenSSL
        statically with the symbols: Node)."""
        lib = mapped_path(pid, _LIBSSL)
        if lib is not None:
            return [lib]
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            return []
        if not exe.startswith("/") or exe.endswith(" (deleted)"):
            return []
        return [f"/proc/{pid}/root{exe}"]

    def _symbols(self, key: FileKey, fd: int) -> dict[str, int]:
        """Symbol → file offset, resolved once per file (bcc's resolver: the dynamic and
        the static symbol tables; ~10 ms on node's 98 MB binary)."""
        known = self._offsets.get(key)
        if known is not None:
            return known
        from bcc import BPF  # noqa: PLC0415  (Debian's python3-bpfcc; loaded already)

        out: dict[str, int] = {}
        for sym, _, _, _ in PROBES:
            try:
                _, off = BPF._check_path_symbol(
                    f"/proc/self/fd/{fd}".encode(), sym.encode(), None, -1
                )
            except Exception:  # noqa: BLE001, S112  (bcc raises bare Exception: no such symbol)
                continue
            out[sym] = int(off)
        if len(self._offsets) > 256:
            self._offsets.clear()
        self._offsets[key] = out
        return out

    def _attach(self, pid: int, fd: int, offsets: dict[str, int]) -> list[int]:
        """Entry and return probes for ``pid`` only (a pid-filtered perf event each). The
        return probe first: an entry never waits for a return that is not there."""
        from bcc import lib  # noqa: PLC0415

        prepare_attach()
        path = f"/proc/self/fd/{fd}".encode()
        fds: list[int] = []
        for sym, entry, ret, required in PROBES:
            off = offsets.get(sym)
            if off is None:
                continue
            pair: list[int] = []
            for fn, is_ret in ((ret, 1), (entry, 0)):
                ev = f"px_tls_{'r' if is_ret else 'p'}_{pid}_{off:x}".encode()
                pfd = lib.bpf_attach_uprobe(self._prog_fds[fn], is_ret, ev, path, off, pid)
                if pfd < 0:
                    break
                pair.append(pfd)
            if len(pair) == 2:
                fds += pair
                continue
            self._close_later(pair)
            if required:
                if pid not in self._warned:
                    self._warned.add(pid)
                    log.warning("no TLS probes for pid %d: %s did not attach", pid, sym)
                self._close_later(fds)
                return []
        return fds

    # -- lifecycle -------------------------------------------------------------------
    def sweep(self) -> None:
        """Forget exited processes (or reused pids); their probes closed off the loop.
        Every RECHECK_S a traced server is looked at again: one without probes may map
        OpenSSL now (a library loaded late, an exec), one with them may have exec'd (the
        probes then name a file it no longer maps)."""
        now = time.monotonic()
        for pid, p in list(self._procs.items()):
            if p.start is None or procinfo.start_time(pid) != p.start:
                del self._procs[pid]
                self._warned.discard(pid)
                self._release(p)
                continue
            if not p.server or p.plain or now - p.looked < RECHECK_S:
                continue
            p.looked = now
            exe = _exe_id(pid)
            if p.perf_fds and exe == p.exe:
                continue
            if p.perf_fds:  # exec'd: another program in the same process
                self._release(p)
                _set_pid_tls(self._b, pid, on=False)
            del self._procs[pid]
            self._look(pid, server=True)
            self._procs[pid].tls_seen = p.tls_seen and exe == p.exe

    def _release(self, p: _Proc) -> None:
        self._close_later(p.perf_fds, p.fd)
        p.perf_fds, p.fd = [], -1

    def _close_later(self, perf_fds: list[int], file_fd: int = -1) -> None:
        """Close perf events all at once, off the loop (agent.kernel.perf_close: each close
        waits for the kernel's grace period); the probed file's fd after them."""
        if not perf_fds and file_fd < 0:
            return
        from bcc import lib  # noqa: PLC0415

        closes = [functools.partial(lib.bpf_close_perf_event_fd, f) for f in perf_fds]
        then = functools.partial(os.close, file_fd) if file_fd >= 0 else None
        t = perf_close.in_parallel(closes, then, name="px-tls-close")
        self._closing = [x for x in self._closing if x.is_alive()] + [t]

    def close(self) -> None:
        """Every probe closed (in parallel), waited for."""
        for p in self._procs.values():
            self._release(p)
        self._procs.clear()
        for c in self._closing:
            for e in c.wait(10):
                log.warning("closing TLS probes: %s", e)
        self._closing.clear()

    def describe(self) -> str:
        """The attach line's TLS part."""
        if not self.enabled:
            return f"TLS: {self.why}"
        return (
            "TLS: SSL_read/SSL_write probes on each traced server that maps OpenSSL, from"
            " start, and on each process at its first TLS connection (off again at a first"
            " plaintext connection before any TLS one)"
        )

    def summary(self) -> str:
        """What is probed now: files and processes (logs, tests)."""
        probed = [p for p in self._procs.values() if p.perf_fds]
        names = sorted({p.name for p in probed})
        files = len({p.key for p in probed})
        return (
            f"probes on {files} file{'s' if files != 1 else ''} ({', '.join(names) or '-'})"
            f" in {len(probed)} process{'es' if len(probed) != 1 else ''}"
        )


def _set_pid_tls(b: Any, pid: int, on: bool = True) -> None:
    """The px_pids bit the socket hooks read: from now on the process's socket reads and
    writes are noted for its SSL calls (bpf/agent/tls.h px_tls_note). Cleared with the pid
    (agent.kernel.loader.remove_pids) when the process is gone, or here (``on`` False) when
    its probes come off."""
    t = b["px_pids"]
    if 0 <= pid < len(t):
        k = t.Key(pid)
        v = int(t[k].value)
        t[k] = t.Leaf(v | PID_TLS if on else v & ~PID_TLS)


def _exe_id(pid: int) -> tuple[int, int] | None:
    """The process's executable (device, inode); None when it cannot be read."""
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
