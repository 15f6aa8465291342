"""Process identity and /proc scans: service names, owners of listening ports, and the
connections that existed before the agent started (to seed the kernel's fd table).

Sockets are listed per network namespace: a pod has its own, and /proc/net is only the
agent's. The TCP tables are read from /proc/<pid>/net of one process in each namespace the
processes asked about are in (socket inodes are unique across namespaces, so an fd still
names its socket by inode alone)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"
_ESTABLISHED = "01"
_ONLY_LISTEN = frozenset((_LISTEN,))


AF_INET = 2
AF_INET6 = 10


@dataclass(frozen=True, slots=True)
class SockEntry:
    inode: int
    lport: int
    state: str
    family: int = AF_INET
    laddr: bytes = b""  # network order (4 or 16 bytes)
    raddr: bytes = b""
    rport: int = 0
    netns: int = 0  # network namespace inode


def _proc_addr(hexaddr: str) -> bytes:
    """/proc/net/tcp prints each 32-bit word of the address as a host-order integer."""
    raw = bytes.fromhex(hexaddr)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return raw


def _net_dirs(pids: Iterable[int] | None) -> dict[int, list[str]]:
    """netns inode → /proc/.../net directories in it (any one will do; the next is tried
    if its process has gone): the agent's own namespace and those of these processes. A
    process that is gone or not ours to see is skipped."""
    out = {os.stat("/proc/self/ns/net").st_ino: ["/proc/self/net"]}
    for pid in pids or ():
        try:
            out.setdefault(os.stat(f"/proc/{pid}/ns/net").st_ino, []).append(f"/proc/{pid}/net")
        except OSError:
            continue
    return out


def _tcp_table(
    states: frozenset[str] = frozenset((_LISTEN, _ESTABLISHED)),
    pids: Iterable[int] | None = None,
) -> list[SockEntry]:
    """Entries in the given states (hex, as printed) in the agent's network namespace and
    those of ``pids``: the rest (TIME_WAIT, often thousands of lines) is skipped before any
    parsing."""
    out: list[SockEntry] = []
    for netns, dirs in _net_dirs(pids).items():
        for net in dirs:
            got = _tcp_entries(states, net, netns)
            if got is not None:
                out += got
                break
    return out


def _tcp_entries(states: frozenset[str], net: str, netns: int) -> list[SockEntry] | None:
    """None when the directory is gone (its process exited)."""
    out = []
    for name, family in ((f"{net}/tcp", AF_INET), (f"{net}/tcp6", AF_INET6)):
        try:
            # listeners only: small reads, so that the kernel generates little past them
            fh = open(name, buffering=1024 if states == _ONLY_LISTEN else -1)  # noqa: SIM115
        except OSError:
            if family == AF_INET:
                return None  # the process has gone (or is not ours to see)
            continue  # no IPv6 in this kernel
        with fh:
            next(fh, None)  # the header
            for line in fh:
                f = line.split()
                if len(f) < 10:
                    continue
                if f[3] not in states:
                    if states == _ONLY_LISTEN and f[3] != _LISTEN:
                        # The kernel prints the listeners first, then walks the whole
                        # connection hash (every namespace's): stopping here spares that
                        # walk (measured here: 4.4 -> 2.0 ms per file)
                        break
                    continue
                la, _, lp = f[1].rpartition(":")
                ra, _, rp = f[2].rpartition(":")
                try:
                    out.append(
                        SockEntry(
                            int(f[9]),
                            int(lp, 16),
                            f[3],
                            family,
                            _proc_addr(la),
                            _proc_addr(ra),
                            int(rp, 16),
                            netns,
                        )
                    )
                except ValueError:
                    continue
    return out


def listen_counts(pids: Iterable[int] | None = None) -> dict[int, int]:
    """Listening TCP sockets per local port, in the agent's network namespace and those of
    ``pids`` (all_pids(): every namespace on the node with a process in it)."""
    out: dict[int, int] = {}
    for e in _tcp_table(_ONLY_LISTEN, pids):
        if e.state == _LISTEN:
            out[e.lport] = out.get(e.lport, 0) + 1
    return out


def _socket_fds(pid: int) -> dict[int, int]:
    """inode → fd for the sockets a process holds."""
    out: dict[int, int] = {}
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"{base}/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(name)
    return out


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def listener_inodes(ports: set[int] | None, pids: Iterable[int] | None = None) -> dict[int, int]:
    """inode → port of the listening sockets on the given ports (None: any), in the agent's
    network namespace and those of ``pids``."""
    table = _tcp_table(_ONLY_LISTEN, pids)
    return {
        e.inode: e.lport
        for e in table
        if e.state == _LISTEN and (ports is None or e.lport in ports)
    }


def holders(pids: list[int] | set[int], inodes: dict[int, int]) -> dict[int, set[int]]:
    """pid → the ports of the given listening sockets it holds (an fd on one of them)."""
    out: dict[int, set[int]] = {}
    if not inodes:
        return out
    for pid in pids:
        for inode in _socket_fds(pid):
            if inode in inodes:
                out.setdefault(pid, set()).add(inodes[inode])
    return out


def listeners(ports: set[int] | None) -> dict[int, set[int]]:
    """pid → the given ports (None: any) it listens on: every process's fds are looked at,
    in every network namespace."""
    pids = all_pids()
    return holders(pids, listener_inodes(ports, pids))


def children(pids: set[int]) -> set[int]:
    """The direct children of these processes (any of their threads may have forked)."""
    out: set[int] = set()
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
            except OSError:
                continue
            out.update(int(c) for c in text.split())
    return out


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def worker_children(parents: set[int]) -> set[int]:
    """The children of these processes that run the same executable as their parent: the
    workers of a server that accepts in one process and hands the connections to them
    (Node's cluster module, round-robin by default; PM2's cluster mode), which hold none
    of the listening sockets themselves."""
    out: set[int] = set()
    for parent in parents:
        exe = _exe(parent)
        if exe is None:
            continue
        out.update(kid for kid in children({parent}) if _exe(kid) == exe)
    return out


def established(pids: set[int], ports: set[int] | None) -> list[tuple[int, int, SockEntry]]:
    """(pid, fd, socket) of established server-side connections of these processes."""
    entries = _tcp_table(pids=pids)
    table = {e.inode: e for e in entries if e.state == _ESTABLISHED}
    listening = {(e.netns, e.lport) for e in entries if e.state == _LISTEN}
    out = []
    for pid in pids:
        for inode, fd in _socket_fds(pid).items():
            e = table.get(inode)
            if e is None or (e.netns, e.lport) not in listening:
                continue  # a client socket of this process, not one it serves
            if ports is None or e.lport in ports:
                out.append((pid, fd, e))
    return out


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot; field 22 of /proc/<pid>/stat):
    with the pid, it names one process — a pid reused later gets another start time."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(f[19])
    except (OSError, IndexError, ValueError):
        return None


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def exe_name(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return comm(pid)


# Interpreters whose executable names no service: the module or script they run does.
_INTERPRETERS = ("python", "node", "ruby", "perl", "php", "bun", "deno")
# Python options that take a value (the next argument is not the script)
_PY_OPTS_WITH_ARG = frozenset(("-W", "-X", "--check-hash-based-pycs"))


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def run_name(exe: str, argv: list[str]) -> str | None:
    """What an interpreter runs, as people name it: ``python -m llama_cpp.server`` →
    ``llama_cpp.server``, ``python /srv/app/serve.py`` → ``serve.py``, ``node server.mjs`` →
    ``server.mjs``; None for anything else (``python -c …``, a compiled server). Only the
    module or the script's file name is taken from the command line, never its arguments
    (they can carry keys)."""
    if not exe.startswith(_INTERPRETERS):
        return None
    args = iter(argv[1:])
    for a in args:
        if a == "-m":
            return next(args, None)
        if a.startswith("-m") and len(a) > 2:
            return a[2:]
        if a in ("-c", "-e", "--eval", "-p", "--print", "-"):
            return None
        if a in _PY_OPTS_WITH_ARG:
            next(args, None)
            continue
        if a.startswith("-"):
            continue
        return os.path.basename(a) or None
    return None


def service_name(pid: int) -> str:
    """OTEL_SERVICE_NAME from the process environment, else what an interpreter runs
    (:func:`run_name`), else the executable's name."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        env = b""
    for item in env.split(b"\0"):
        if item.startswith(b"OTEL_SERVICE_NAME="):
            value = item.split(b"=", 1)[1].decode("utf-8", "replace").strip()
            if value:
                return value
    exe = exe_name(pid)
    return run_name(exe, _cmdline(pid)) or exe
