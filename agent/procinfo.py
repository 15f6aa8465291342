"""Process identity and /proc scans: service names, owners of listening ports, and the
connections that existed before the agent started (to seed the kernel's fd table)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"
_ESTABLISHED = "01"


@dataclass(frozen=True, slots=True)
class SockEntry:
    inode: int
    lport: int
    state: str


def _tcp_table() -> list[SockEntry]:
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10:
                continue
            lport = int(f[1].rsplit(":", 1)[1], 16)
            out.append(SockEntry(int(f[9]), lport, f[3]))
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


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def listeners(ports: set[int]) -> dict[int, set[int]]:
    """pid → the given ports it listens on."""
    table = _tcp_table()
    wanted = {e.inode: e.lport for e in table if e.state == _LISTEN and e.lport in ports}
    out: dict[int, set[int]] = {}
    if not wanted:
        return out
    for pid in _pids():
        for inode in _socket_fds(pid):
            if inode in wanted:
                out.setdefault(pid, set()).add(wanted[inode])
    return out


def established(pids: set[int], ports: set[int] | None) -> list[tuple[int, int, int]]:
    """(pid, fd, local port) of established server-side connections of these processes."""
    table = {e.inode: e for e in _tcp_table() if e.state == _ESTABLISHED}
    listen_ports = {e.lport for e in _tcp_table() if e.state == _LISTEN}
    out = []
    for pid in pids:
        for inode, fd in _socket_fds(pid).items():
            e = table.get(inode)
            if e is None or e.lport not in listen_ports:
                continue  # a client socket of this process, not one it serves
            if ports is None or e.lport in ports:
                out.append((pid, fd, e.lport))
    return out


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


def service_name(pid: int) -> str:
    """OTEL_SERVICE_NAME from the process environment, else the executable's name."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        env = b""
    for item in env.split(b"\0"):
        if item.startswith(b"OTEL_SERVICE_NAME="):
            value = item.split(b"=", 1)[1].decode("utf-8", "replace").strip()
            if value:
                return value
    return exe_name(pid)
