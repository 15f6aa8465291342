"""Listen-queue overflows per listening port, from the kernel's sock_diag netlink interface.

No tracepoint fires when a full accept queue drops a connection (``tcp_listendrop`` only bumps
counters), and /proc/net/netstat's ListenOverflows is node-wide. But the kernel also counts
the drop on the listening socket itself (``sk_drops``), which ``inet_diag`` reports in the
socket's memory info (what ``ss -ltm`` prints as ``d<n>``), together with the accept queue's
current length and its limit. Read-only and unprivileged within a network namespace; the
agent asks in the namespace of each traced process (a pod has its own), through a thread
that enters it only to open the netlink socket. Entering a namespace needs CAP_SYS_ADMIN,
which the DaemonSet does not grant: without it a namespace's listeners are reported as one
(port 0) with the namespace's own ListenDrops from /proc/<pid>/net/netstat (a pod usually
listens on one port).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
INET_DIAG_SKMEMINFO = 7
SK_MEMINFO_DROPS = 8
CLONE_NEWNET = 0x40000000

_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states; then inet_diag_sockid (48 bytes)
_REQ = struct.Struct("=BBBxI48x")
# inet_diag_msg (72 bytes): family, state, timer, retrans (4); sockid (48: sport and dport
# big-endian first); expires, rqueue, wqueue, uid, inode (20). Then netlink attributes.
_MSG_SIZE = 72
_RTA = struct.Struct("=HH")


@dataclass(frozen=True, slots=True)
class Listener:
    netns: int  # network namespace inode (a pod has its own: one port, several listeners)
    port: int
    drops: int  # connections the full accept queue dropped (since the socket was created)
    queued: int  # connections waiting in the accept queue now
    backlog: int  # the accept queue's limit


def _parse(data: bytes, netns: int, out: dict[int, Listener]) -> bool:
    """Add the listeners of one netlink read to ``out``; True once the dump is done."""
    pos = 0
    while pos + _NLMSG.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, pos)
        if length < _NLMSG.size:
            return True
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, pos + _NLMSG.size)
            if err:
                raise OSError(-err, os.strerror(-err))
            return True
        body = pos + _NLMSG.size
        sport = int.from_bytes(data[body + 4 : body + 6], "big")
        rqueue, wqueue = struct.unpack_from("=II", data, body + 56)
        drops = 0
        a = body + _MSG_SIZE
        while a + _RTA.size <= pos + length:
            alen, atype = _RTA.unpack_from(data, a)
            if alen < _RTA.size:
                break
            if atype == INET_DIAG_SKMEMINFO and alen >= _RTA.size + 4 * (SK_MEMINFO_DROPS + 1):
                (drops,) = struct.unpack_from("=I", data, a + _RTA.size + 4 * SK_MEMINFO_DROPS)
            a += (alen + 3) & ~3
        prev = out.get(sport)
        # one port, several sockets (IPv4 and IPv6, SO_REUSEPORT): add them up
        if prev:
            drops, rqueue, wqueue = drops + prev.drops, rqueue + prev.queued, wqueue + prev.backlog
        out[sport] = Listener(netns, sport, drops, rqueue, wqueue)
        pos += (length + 3) & ~3
    return False


def _dump(sock: socket.socket, netns: int) -> dict[int, Listener]:
    out: dict[int, Listener] = {}
    for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
        req = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_SKMEMINFO - 1), 1 << TCP_LISTEN)
        sock.send(
            _NLMSG.pack(
                _NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
            )
            + req
        )
        while not _parse(sock.recv(1 << 16), netns, out):
            pass
    return out


def _netlink_socket() -> socket.socket:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    s.settimeout(2.0)
    return s


def _socket_in(netns_path: str) -> socket.socket:
    """A sock_diag socket in another network namespace (a socket stays in the namespace it
    was created in; only the short-lived thread that creates it enters the namespace)."""
    libc = ctypes.CDLL(None, use_errno=True)
    box: list[socket.socket | BaseException] = []

    def enter() -> None:
        try:
            fd = os.open(netns_path, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, os.strerror(e))
            finally:
                os.close(fd)
            box.append(_netlink_socket())
        except BaseException as e:  # noqa: BLE001 — handed to the caller
            box.append(e)

    # The thread's namespace changes for good; it ends right after, the process's stays.
    t = threading.Thread(target=enter, name="parallax-netns", daemon=True)
    t.start()
    t.join(5.0)
    if not box:
        raise TimeoutError(f"entering {netns_path} timed out")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _netns_drops(netns_path: str) -> int | None:
    """TcpExt ListenDrops of the namespace of /proc/<pid>/ns/net (no privilege beyond
    reading that process's /proc)."""
    try:
        with open(netns_path.replace("/ns/net", "/net/netstat")) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:") and "ListenDrops" in names.split():
            return int(values.split()[names.split().index("ListenDrops")])
    return None


class ListenerStats:
    """Listeners per network namespace of the traced processes; sockets kept open."""

    def __init__(self) -> None:
        self._socks: dict[int, socket.socket] = {}  # netns inode → sock_diag socket
        self.own_netns = os.stat("/proc/self/ns/net").st_ino

    def read(self, pids: list[int] | None = None) -> list[Listener]:
        """Listeners in the agent's network namespace and in those of ``pids``. A pid that
        is gone or a namespace that cannot be entered is skipped."""
        spaces: dict[int, str] = {self.own_netns: "/proc/self/ns/net"}
        for pid in pids or []:
            path = f"/proc/{pid}/ns/net"
            try:
                spaces.setdefault(os.stat(path).st_ino, path)
            except OSError:
                continue
        out: list[Listener] = []
        for ino, path in spaces.items():
            try:
                s = self._socks.get(ino)
                if s is None:
                    s = _netlink_socket() if ino == self.own_netns else _socket_in(path)
                    self._socks[ino] = s
                out += _dump(s, ino).values()
            except OSError:
                self._socks.pop(ino, None)
                if ino != self.own_netns and (drops := _netns_drops(path)) is not None:
                    out.append(Listener(ino, 0, drops, 0, 0))
        for ino in set(self._socks) - set(spaces):  # namespaces whose processes are gone
            self._socks.pop(ino).close()
        return out

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._socks.clear()
