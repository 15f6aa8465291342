"""Building the agent's program for the running kernel: its text (bpf/agent.c with its
headers inlined), the tracepoints the kernel has (fields checked), the -D flags (windows,
counters, BTF offsets of the few fields read directly), and the hook variants to try in
order of preference until one compiles and loads (agent.kernel.loader uses these)."""

from __future__ import annotations

import logging
import platform
import re
import sys
from pathlib import Path
from typing import Any

from agent.kernel import btf, holdback, tracefs
from agent.kernel.tracepoints import TRACEPOINTS, Tracepoint

log = logging.getLogger("parallax.agent")
BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
BPF_SOURCE = BPF_DIR / "agent.c"
_INCLUDE = re.compile(rb'^#include "([a-z0-9_]+(?:/[a-z0-9_]+)+\.h)"[ \t]*$', re.MULTILINE)
# sk->sk_socket->file->f_flags: whether a socket blocks on writes (PX_LAZY_SEND_START)
_SOCKET_FLAGS = [("sock", "sk_socket"), ("socket", "file"), ("file", "f_flags")]
_SOCKET_FLAG_MACROS = ["PX_OFF_SK_SOCKET", "PX_OFF_SOCKET_FILE", "PX_OFF_FILE_FLAGS"]


# The kernel's counters (px_counters), in index order: (name in user space, C macro). The
# loader defines the macros (-DC_LOST=0 ...), so the two sides cannot disagree.
COUNTERS = (
    ("lost_events", "C_LOST"),
    ("conns_created", "C_CONNS"),
    ("conns_deleted", "C_CONNS_DEL"),
    ("aggs_created", "C_AGGS"),
    ("aggs_deleted", "C_AGGS_DEL"),
    ("sock_closes", "C_SOCK_CLOSE"),
    ("listen_changes", "C_LISTEN_CHG"),
    ("shed_reads", "C_SHED_READS"),
    ("blocking_conns", "C_BLOCKING"),
    ("requests_seen", "C_REQ_SEEN"),  # every request's first read (bpf/agent/sample.h)
    ("requests_kept", "C_REQ_KEPT"),  # ... of those, kept by sampling
    ("unfollowed_reads", "C_UNFOLLOWED"),  # reads on a traced port's unfollowed sockets
)
COUNTER_NAMES = tuple(name for name, _ in COUNTERS)


SDR_BTF_TYPEDEF = "btf_trace_sk_data_ready"
STATE_BTF_TYPEDEF = "btf_trace_inet_sock_set_state"
# The classic programs a tp_btf twin takes the place of where the kernel loads it (the
# loader attaches, doctor probes, this module compiles from this one table): tracepoint ->
# (its BTF typedef, the tp_btf function, the build flag that compiles it).
# - sk_data_ready: its socket's port by a direct load, before any map lookup;
# - the softirq side: a classic program is skipped when it lands on another BPF program
#   on its CPU (bpf/agent/tcp.h px_state_btf says why);
# - the socket hooks: a classic program of theirs holds the CPU against those while it
#   runs (bpf/agent/sock_hooks.h).
BTF_TWINS = {
    "sock:sk_data_ready": (SDR_BTF_TYPEDEF, "px_sdr_btf", "-DPX_SDR_BTF"),
    "sock:inet_sock_set_state": (STATE_BTF_TYPEDEF, "px_state_btf", "-DPX_STATE_BTF"),
    "tcp:tcp_retransmit_skb": ("btf_trace_tcp_retransmit_skb", "px_rtx_btf", "-DPX_STATE_BTF"),
    "tcp:tcp_retransmit_synack": (
        "btf_trace_tcp_retransmit_synack",
        "px_synack_btf",
        "-DPX_STATE_BTF",
    ),
    "tcp:tcp_receive_reset": ("btf_trace_tcp_receive_reset", "px_reset_btf", "-DPX_STATE_BTF"),
    "sock:sock_recv_length": ("btf_trace_sock_recv_length", "px_recv_btf", "-DPX_STATE_BTF"),
    "sock:sock_send_length": ("btf_trace_sock_send_length", "px_send_btf", "-DPX_STATE_BTF"),
}
# what px_state_btf reads from the socket (bpf/agent/tcp.h)
_STATE_FIELDS = [
    ("inet_sock", "inet_sport"),
    ("sock_common", "skc_num"),
    ("sock", "sk_protocol"),
    ("sock_common", "skc_dport"),
    ("sock_common", "skc_family"),
    ("sock_common", "skc_rcv_saddr"),
    ("sock_common", "skc_daddr"),
    ("sock_common", "skc_v6_rcv_saddr"),
    ("sock_common", "skc_v6_daddr"),
    ("sock_common", "skc_state"),  # (px_unfollowed_read: a connection still open)
]


class LoadError(Exception):
    """An expected failure to load, in one line for the user."""


class NoVariant(Exception):  # noqa: N818  (the loader says it as its LoadError)
    """No hook variant compiled and loaded (bcc's last error)."""


_RAW_FALLBACK = "per-syscall tracepoints instead"
_RAW_FAILED = f"raw tracepoint programs did not load: {_RAW_FALLBACK}"


def _macro(tp: Tracepoint) -> str:
    return f"PX_HAVE_{tp.name.upper()}"


def available(disabled: frozenset[str] = frozenset()) -> tuple[list[Tracepoint], list[Tracepoint]]:
    """(present, missing) tracepoints, fields checked; ``disabled`` ids count as missing."""
    tfs, note = tracefs.ensure_mounted()
    if tfs is None:
        raise LoadError(f"tracefs {note}")
    have: list[Tracepoint] = []
    missing: list[Tracepoint] = []
    for tp in TRACEPOINTS:
        f = tracefs.fields(tfs, tp.category, tp.name)
        ok = f is not None and set(tp.fields) <= f and tp.id not in disabled
        (have if ok else missing).append(tp)
    return have, missing


def program_text(path: Path) -> bytes:
    """A BPF program as bcc must get it: one text. Its parts (headers by concern under
    bpf/, ``#include "agent/proto/http1.h"``) are inlined here because bcc generates tracepoint
    argument types and rewrites map calls in its main file only; ``#line`` markers keep the
    compiler's messages pointing at the header and line where the code lives."""
    rel = path.relative_to(BPF_DIR.parent).as_posix().encode()
    out: list[bytes] = []
    pos, line = 0, 1
    text = path.read_bytes()
    for m in _INCLUDE.finditer(text):
        out.append(text[pos : m.start()])
        line += text.count(b"\n", pos, m.end())
        part = program_text(BPF_DIR / m.group(1).decode())
        part_rel = (BPF_DIR / m.group(1).decode()).relative_to(BPF_DIR.parent).as_posix()
        out.append(b'#line 1 "%s"\n%s\n#line %d "%s"' % (part_rel.encode(), part, line + 1, rel))
        pos = m.end()
    out.append(text[pos:])
    return b"".join(out)


def _pow2(n: int) -> int:
    p = 256
    while p < n:
        p *= 2
    return min(p, 16384)


def macros(have: list[Tracepoint], missing: list[Tracepoint]) -> tuple[set[str], list[str]]:
    """``PX_HAVE_*`` for the tracepoints the kernel has, and one line per consequence of
    those it lacks."""
    have_ids = {tp.id for tp in have}
    macros: set[str] = set()
    for tp in have:
        name = tp.name
        paired = name.startswith("sys_enter_") and name not in (
            "sys_enter_accept",
            "sys_enter_accept4",
        )
        # a syscall is compiled only with both halves
        if paired and f"syscalls:sys_exit_{name[len('sys_enter_') :]}" not in have_ids:
            continue
        macros.add(_macro(tp))
    # one line per consequence, naming every tracepoint that causes it; logged once
    by_effect: dict[str, list[str]] = {}
    for tp in missing:
        by_effect.setdefault(tp.degrade, []).append(tp.id)
    degraded = [f"{', '.join(ids)}: {effect}" for effect, ids in by_effect.items()]
    for line in degraded:
        log.warning("degraded: %s", line)
    if "sched:sched_process_exit" in have_ids:
        tfs, _ = tracefs.ensure_mounted()
        exit_fields = tracefs.fields(tfs, "sched", "sched_process_exit") if tfs else None
        if exit_fields and "group_dead" in exit_fields:
            macros.add("PX_HAVE_EXIT_GROUP_DEAD")
    if "tcp:tcp_retransmit_skb" in have_ids:
        # Linux 6.12+: the tracepoint also fires for a retransmission that was not sent
        # (err): only those sent are counted, as before, when it fired for those alone
        tfs, _ = tracefs.ensure_mounted()
        rtx_fields = tracefs.fields(tfs, "tcp", "tcp_retransmit_skb") if tfs else None
        if rtx_fields and "err" in rtx_fields:
            macros.add("PX_HAVE_RETRANSMIT_ERR")
    return macros, degraded


def cflags(opts: Any, macros: set[str]) -> list[str]:
    hw = _pow2(opts.head_window)
    cflags = [
        f"-DPX_HEAD_WINDOW={hw}",
        f"-DPX_RESP_WINDOW={_pow2(opts.resp_window)}",
        f"-DPX_MAX_CONNS={opts.max_conns}",
        f"-DPX_RINGBUF_PAGES={opts.ringbuf_pages}",
        f"-DPX_PID_MAX={pid_max()}",
        f"-DPX_OFFS_SPAN_NS={int(opts.offs_span_ns)}ULL",
        *(f"-D{macro}={i}" for i, (_, macro) in enumerate(COUNTERS)),
        f"-DC_NCOUNTERS={len(COUNTERS)}",
        *(f"-D{m}" for m in sorted(macros)),
    ]
    return cflags


def variants(
    opts: Any, macros: set[str], have_ids: set[str], degraded: list[str]
) -> tuple[bool, bool, dict[str, int], list[tuple[str, list[str]]]]:
    """(socket hooks possible, raw syscalls possible, the BTF type ids of the tracepoints
    some programs attach to as tp_btf, by typedef name, the (hooks, cflags) to try in order
    of preference)."""
    x86 = platform.machine() == "x86_64"
    # Reads and writes seen from the socket layer, no syscall tracepoint at all (x86-64:
    # the syscall's arguments come from its user pt_regs; Linux >= 6.5). Else syscalls
    # through raw_syscalls:sys_enter/sys_exit (x86-64), else the per-syscall tracepoints.
    sock = (
        x86
        and opts.io_hooks != "syscalls"
        and {"sock:sock_recv_length", "sock:sock_send_length"} <= have_ids
        and kernel_at_least(6, 5)  # before, sendfile() bypassed sock_sendmsg (->sendpage)
    )
    sock_tps = {"sock:sock_recv_length", "sock:sock_send_length"} <= have_ids
    if x86 and opts.io_hooks != "syscalls" and sock_tps and not kernel_at_least(6, 5):
        line = "socket hooks need Linux 6.5 (sendfile reaches sock_sendmsg from 6.5): syscall"
        line += " tracepoints instead"
        log.warning("degraded: %s", line)
        degraded.append(line)
    raw = x86 and {"raw_syscalls:sys_enter", "raw_syscalls:sys_exit"} <= have_ids
    if not x86 and {"raw_syscalls:sys_enter", "raw_syscalls:sys_exit"} <= have_ids:
        line = f"raw_syscalls: not used on {platform.machine()} (x86-64 only): {_RAW_FALLBACK}"
        log.warning("degraded: %s", line)
        degraded.append(line)
    # (hooks, cflags) in order of preference. Per-thread state in task-local storage (no
    # hash lookups); kernels without it for tracepoint programs get the hash-map variant.
    variants: list[tuple[str, list[str]]] = []
    # every variant: the softirq side's programs as BTF tracepoints where the kernel has them
    tcp_flags, btf_ids = _tcp_btf_flags()
    if sock:
        sock_flags, sock_ids = _socket_flags(opts, macros, degraded)
        variants.append(("socket", sock_flags + tcp_flags))
        btf_ids |= sock_ids
    for use_raw in (True, False) if raw else (False,):
        for ts in (True, False):
            variants.append(
                (
                    "raw syscalls" if use_raw else "syscalls",
                    (["-DPX_RAW_SYSCALLS"] if use_raw else [])
                    + (["-DPX_TASK_STORAGE"] if ts else [])
                    + tcp_flags,
                )
            )
    return sock, raw, btf_ids, variants


def _tcp_btf_flags() -> tuple[list[str], dict[str, int]]:
    """The flags that compile the softirq side's tp_btf programs (bpf/agent/tcp.h
    px_state_btf: a classic program is skipped when it lands on another BPF program on its
    CPU) — the BTF offsets of the socket fields they read — and their tracepoints' BTF
    typedef ids; none where BTF lacks one of them (the classic programs stay)."""
    twins = [t for t, _, flag in BTF_TWINS.values() if flag == "-DPX_STATE_BTF"]
    off, typedef = btf.lookup(_STATE_FIELDS, twins)
    state = [off[k] for k in _STATE_FIELDS]
    # (the ports' byte swap in tcp.h is for a little-endian CPU)
    if typedef[STATE_BTF_TYPEDEF] is None or None in state or sys.byteorder != "little":
        return [], {}
    offsets = zip(_STATE_FIELDS, state, strict=True)
    flags = ["-DPX_STATE_BTF", *(f"-DPX_OFF_{member.upper()}={o}" for (_, member), o in offsets)]
    return flags, {t: tid for t in twins if (tid := typedef[t]) is not None}


def _socket_flags(
    opts: Any, macros: set[str], degraded: list[str]
) -> tuple[list[str], dict[str, int]]:
    """The socket hooks' flags — the BTF offsets of the few fields they read directly —
    and the BTF typedef ids of the tracepoints their tp_btf programs attach to."""
    btf_ids: dict[str, int] = {}
    sock_flags = ["-DPX_SOCK_HOOKS", "-DPX_TASK_STORAGE"]
    # srtt read from the socket at each request (its offset from the kernel's BTF)
    # instead of tcp:tcp_probe, which runs for every segment of every TCP socket
    off, typedef = btf.lookup(
        [
            ("tcp_sock", "srtt_us"),
            ("sock_common", "skc_num"),
            ("msghdr", "msg_flags"),
            ("task_struct", "tgid"),
            ("task_struct", "pid"),
            *_SOCKET_FLAGS,
        ],
        [SDR_BTF_TYPEDEF],
    )
    if (srtt := off[("tcp_sock", "srtt_us")]) is not None:
        sock_flags.append(f"-DPX_OFF_TCP_SRTT={srtt}")
    # the local port, to tell a seeded fd from a later socket that reuses its number
    if (num := off[("sock_common", "skc_num")]) is not None:
        sock_flags.append(f"-DPX_OFF_SKC_NUM={num}")
        # ... and for sk_data_ready as a BTF tracepoint (agent.kernel.tpbtf): sockets on other
        # ports stop at a direct load of their port, before any map lookup
        sdr_btf_id = typedef[SDR_BTF_TYPEDEF]
        if sdr_btf_id is not None and "PX_HAVE_SK_DATA_READY" in macros:
            sock_flags.append("-DPX_SDR_BTF")
            btf_ids[SDR_BTF_TYPEDEF] = sdr_btf_id
    # the current task's ids by direct loads (the task pointer is fetched anyway)
    for member in ("tgid", "pid"):
        if (o := off[("task_struct", member)]) is not None:
            sock_flags.append(f"-DPX_OFF_TASK_{member.upper()}={o}")
    # a write's flags: only a blocking one needs its start stamped (tcp_sendmsg_locked)
    if (mf := off[("msghdr", "msg_flags")]) is not None:
        sock_flags.append(f"-DPX_OFF_MSG_FLAGS={mf}")
    # ... and event-loop servers never make one: that hook (every TCP write on the node
    # runs it) waits until a followed connection's socket turns out to block
    chain = [off[k] for k in _SOCKET_FLAGS]
    if "PX_HAVE_TCP_SENDMSG_LOCKED" in macros and None not in chain:
        sock_flags.append("-DPX_LAZY_SEND_START")
        sock_flags += [f"-D{m}={o}" for m, o in zip(_SOCKET_FLAG_MACROS, chain, strict=True)]
    if opts.holdback != "off":
        hold_flags, hold_id = holdback.cflags(degraded)
        sock_flags += hold_flags
        if hold_id is not None:
            btf_ids[holdback.XMIT_TYPEDEF] = hold_id
    return sock_flags, btf_ids


def compile_first(
    bpf_class: Any,
    text: bytes,
    cflags: list[str],
    variants: list[tuple[str, list[str]]],
    sock: bool,
    raw: bool,
    degraded: list[str],
) -> tuple[Any, str, list[str]]:
    """The first variant that compiles and loads: (the BPF object, its hooks, its flags)."""
    b = None
    hooks = ""
    err: Exception | None = None
    from agent.kernel import objcache  # noqa: PLC0415  (imports bcc, configured by now)

    for hooks, extra in variants:
        try:
            b = objcache.compile_or_load(bpf_class, text, [*cflags, *extra])
        except Exception as e:  # noqa: BLE001  (bcc raises bare Exception; next variant)
            err = e
            continue
        if sock and hooks != "socket":
            line = "socket hooks did not load: syscall tracepoints instead (node-wide cost)"
            log.warning("degraded: %s", line)
            degraded.append(line)
        if raw and hooks == "syscalls":
            line = f"raw_syscalls: {_RAW_FAILED}"
            log.warning("degraded: %s", line)
            degraded.append(line)
        if "-DPX_TASK_STORAGE" not in extra:
            log.warning("degraded: no task-local storage for tracepoints → per-thread hash map")
        break
    if b is None:  # its compiler log went to stderr
        raise NoVariant(str(err))
    return b, hooks, extra


def kernel_at_least(major: int, minor: int, release: str | None = None) -> bool:
    m = re.match(r"(\d+)\.(\d+)", release or platform.release())
    return m is not None and (int(m[1]), int(m[2])) >= (major, minor)


def pid_max() -> int:
    """Size of the traced-pid array (kernel.pid_max, at most 4M: 4 MiB of u8)."""
    try:
        return min(int(Path("/proc/sys/kernel/pid_max").read_text()), 1 << 22)
    except (OSError, ValueError):
        return 1 << 22
