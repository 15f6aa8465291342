"""The tracepoints the agent uses, the fields it reads from each, and what is lost without it.

One table, read by ``doctor`` (to report) and by the loader (to compile only what the
kernel has). Fields are checked, not only names: a tracepoint whose layout changed is as
unusable as a missing one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tracepoint:
    category: str
    name: str
    fields: tuple[str, ...]
    required: bool  # the agent cannot run without it
    degrade: str  # what is lost when it is missing (for doctor and the one-time log line)
    since: str = ""  # first Linux version that has it, where that matters

    @property
    def id(self) -> str:
        return f"{self.category}:{self.name}"


_SYS = "syscalls"
_RW = "request/response bytes on this path are not seen"


def _sys(name: str, fields: tuple[str, ...], required: bool, degrade: str) -> Tracepoint:
    return Tracepoint(_SYS, name, ("__syscall_nr", *fields), required, degrade)


_RAW = (
    "per-syscall tracepoints instead: the kernel builds a trace record for each traced"
    " syscall of every process before the program runs (more node-wide cost)"
)

TRACEPOINTS: tuple[Tracepoint, ...] = (
    # Used as raw tracepoints (x86-64): one program per side for the syscalls below.
    Tracepoint("raw_syscalls", "sys_enter", ("id", "args"), False, _RAW),
    Tracepoint("raw_syscalls", "sys_exit", ("id", "ret"), False, _RAW),
    _sys("sys_exit_accept4", ("ret",), True, "no new connections are followed"),
    _sys("sys_exit_accept", ("ret",), False, "servers using accept() (not accept4) are missed"),
    _sys(
        "sys_enter_accept4",
        ("fd", "upeer_sockaddr"),
        False,
        "before Linux 6.3 only: no fd→socket fallback by the accept peer address",
    ),
    _sys(
        "sys_enter_accept",
        ("fd", "upeer_sockaddr"),
        False,
        "before Linux 6.3 only: no fd→socket fallback for accept()",
    ),
    _sys("sys_enter_read", ("fd", "buf", "count"), True, _RW),
    _sys("sys_exit_read", ("ret",), True, _RW),
    _sys("sys_enter_readv", ("fd", "vec", "vlen"), False, f"readv: {_RW}"),
    _sys("sys_exit_readv", ("ret",), False, f"readv: {_RW}"),
    _sys("sys_enter_recvfrom", ("fd", "ubuf", "size"), False, f"recvfrom: {_RW}"),
    _sys("sys_exit_recvfrom", ("ret",), False, f"recvfrom: {_RW}"),
    _sys("sys_enter_recvmsg", ("fd", "msg"), False, f"recvmsg: {_RW}"),
    _sys("sys_exit_recvmsg", ("ret",), False, f"recvmsg: {_RW}"),
    _sys("sys_enter_write", ("fd", "buf", "count"), True, _RW),
    _sys("sys_exit_write", ("ret",), True, _RW),
    _sys("sys_enter_writev", ("fd", "vec", "vlen"), False, f"writev: {_RW}"),
    _sys("sys_exit_writev", ("ret",), False, f"writev: {_RW}"),
    _sys("sys_enter_sendto", ("fd", "buff", "len"), False, f"sendto: {_RW}"),
    _sys("sys_exit_sendto", ("ret",), False, f"sendto: {_RW}"),
    _sys("sys_enter_sendmsg", ("fd", "msg"), False, f"sendmsg: {_RW}"),
    _sys("sys_exit_sendmsg", ("ret",), False, f"sendmsg: {_RW}"),
    _sys("sys_enter_sendfile64", ("out_fd", "in_fd", "count"), False, "sendfile bodies not timed"),
    _sys("sys_exit_sendfile64", ("ret",), False, "sendfile bodies not timed"),
    _sys("sys_enter_close", ("fd",), True, "connection ends are seen only by the idle sweep"),
    Tracepoint(
        "sock",
        "inet_sock_set_state",
        (
            "skaddr",
            "oldstate",
            "newstate",
            "sport",
            "dport",
            "family",
            "protocol",
            "saddr",
            "daddr",
            "saddr_v6",
            "daddr_v6",
        ),
        True,
        "no handshake times (accept-queue wait) and no 4-tuple matching",
    ),
    Tracepoint(
        "sock",
        "sk_data_ready",
        ("skaddr", "family", "protocol"),
        False,
        "t_arr falls back to tcp_probe events with data (receive-queue wait less exact)",
        since="6.3",
    ),
    Tracepoint(
        "sock",
        "sock_send_length",
        ("sk", "family", "protocol", "ret", "flags"),
        False,
        "fd→socket link falls back to matching accept peers with the handshake 4-tuple",
        since="6.3",
    ),
    Tracepoint(
        "sock",
        "sock_recv_length",
        ("sk", "family", "protocol", "ret", "flags"),
        False,
        "fd→socket link falls back to matching accept peers with the handshake 4-tuple",
        since="6.3",
    ),
    Tracepoint(
        "tcp",
        "tcp_probe",
        ("saddr", "daddr", "sport", "dport", "family", "data_len", "srtt", "skaddr"),
        False,
        "no smoothed RTT per request (and no t_arr fallback on kernels before 6.3)",
    ),
    Tracepoint(
        "tcp",
        "tcp_retransmit_skb",
        ("skaddr", "sport", "dport", "family"),
        False,
        "retransmits not counted",
    ),
    Tracepoint(
        "tcp",
        "tcp_receive_reset",
        ("skaddr",),
        False,
        "socket hooks: a server's abortive close (unread data, SO_LINGER 0) is reported as"
        " the client's abort",
    ),
    Tracepoint(
        "tcp",
        "tcp_sendmsg_locked",
        ("skb_addr", "msg_left", "size_goal"),
        False,
        "socket hooks: a write is timed when its copy ends, not when it starts (later only"
        " for a write that blocks on a full send buffer)",
    ),
    Tracepoint(
        "sched",
        "sched_process_exit",
        ("pid",),
        False,
        "a server killed with unread request bytes (its exit resets the connection) is"
        " reported as the client's abort",
    ),
    Tracepoint(
        "tcp",
        "tcp_retransmit_synack",
        ("skaddr", "sport", "dport", "family"),
        False,
        "SYN-ACK retransmits per listening port not counted",
    ),
)
