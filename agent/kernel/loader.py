"""Compile bpf/agent.c for the running kernel, attach it, and drain its ring buffer.

Only the tracepoints the kernel has (with the fields the program reads) are compiled in;
each missing optional one is logged once with what it degrades (agent.kernel.tracepoints).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.kernel import (
    btf,
    build,
    headers,
    holdback,
    perf_close,
    retransmits,
    ringbuf,
    sys_bpf,
    tpbtf,
)

# the build's names the loader's callers use (re-exported)
from agent.kernel.build import BPF_DIR as BPF_DIR  # noqa: PLC0414
from agent.kernel.build import BPF_SOURCE as BPF_SOURCE  # noqa: PLC0414
from agent.kernel.build import COUNTER_NAMES as COUNTER_NAMES  # noqa: PLC0414
from agent.kernel.build import COUNTERS as COUNTERS  # noqa: PLC0414
from agent.kernel.build import LoadError as LoadError  # noqa: PLC0414
from agent.kernel.build import available as available  # noqa: PLC0414
from agent.kernel.build import kernel_at_least as kernel_at_least  # noqa: PLC0414
from agent.kernel.build import pid_max as pid_max  # noqa: PLC0414
from agent.kernel.build import program_text as program_text  # noqa: PLC0414

log = logging.getLogger("parallax.agent")


@dataclass
class Options:
    ports: list[int] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    head_window: int = 4096
    resp_window: int = 4096  # whole heads (Set-Cookie, CSP run long) and the first body bytes
    stream_limit_s: float = 60.0
    max_conns: int = 16384
    disabled: list[str] = field(default_factory=list)  # tracepoint ids to treat as missing
    ringbuf_pages: int = 2048  # 8 MiB
    # span of one kernel write aggregate before it is flushed so that its u32 µs offsets
    # cannot wrap (~71 min); smaller only in tests
    offs_span_ns: int = 3_600_000_000_000
    # "auto": socket hooks where the kernel allows them, else syscall tracepoints;
    # "syscalls" forces the latter (tests of the fallback, kernels where the former misbehave)
    io_hooks: str = "auto"
    # write-to-wire holdback (agent.kernel.holdback): "auto" where the BTF has its fields, "off"
    # (while a write is held its departure hook runs for every packet on the node)
    holdback: str = "auto"


@dataclass
class Loaded:
    bpf: Any
    attached: list[str]
    degraded: list[str]
    ring_bytes: int = 0
    # how reads and writes are seen: "socket" (sock_*_length, no syscall tracepoint; accept
    # times from libc uretprobes, agent.kernel.uprobes), "raw syscalls" or "syscalls"
    hooks: str = "syscalls"
    # the write-start hook (tcp_sendmsg_locked) waits for a blocking socket: attach_send_start
    send_start_lazy: bool = False
    # reads on unfollowed connections are counted (the "unfollowed_reads" counter; the
    # socket's offsets from BTF: bpf/agent/state.h px_unfollowed_read)
    counts_unfollowed: bool = False


def load(opts: Options) -> Loaded:
    """Compile the agent's program for this kernel, load and attach it: the tracepoints
    it has (fields checked), the best hooks it allows, the BTF offsets it needs."""
    if os.geteuid() != 0:
        raise LoadError("needs root (or CAP_BPF+CAP_PERFMON): run with sudo; see `doctor`")
    have, missing = available(frozenset(opts.disabled))
    req_missing = [tp.id for tp in missing if tp.required]
    if req_missing:
        raise LoadError(f"required tracepoints missing: {', '.join(req_missing)}")
    src = headers.configure_bcc()
    if src is None:
        raise LoadError("no kernel headers: run `make setup` (builds the fallback tree)")
    try:
        from bcc import BPF  # noqa: PLC0415  (Debian's python3-bpfcc)
    except ImportError as e:
        raise LoadError(f"cannot import bcc ({e}): install python3-bpfcc") from e
    macros, degraded = build.macros(have, missing)
    # (one parse of the kernel's BTF serves the three readers below: dropped after compiling)
    # retransmits per request: the BTF fields their programs read (bpf/agent/tcp.h)
    cflags = build.cflags(opts, macros) + retransmits.cflags(degraded)
    text = program_text(BPF_SOURCE)
    have_ids = {tp.id for tp in have}
    sock, raw, btf_ids, variants = build.variants(opts, macros, have_ids, degraded)
    try:
        b, hooks, extra = build.compile_first(BPF, text, cflags, variants, sock, raw, degraded)
    except build.NoVariant as e:
        raise LoadError(f"BPF program failed to compile or load: {e}") from None
    finally:
        btf.forget()
    _configure(b, opts)
    attached_btf: list[str] = []
    for name, (typedef, fn, flag) in build.BTF_TWINS.items():
        tp = name.encode()
        # (only where bcc attached the classic program: the tp_btf one is compiled with it)
        if flag in extra and (btf_id := btf_ids.get(typedef)) and tp in b.tracepoint_fds:
            attached_btf += _use_btf(b, fn, tp, btf_id)
    lazy = "-DPX_LAZY_SEND_START" in extra
    if "PX_HAVE_TCP_SENDMSG_LOCKED" in macros and hooks == "socket" and not lazy:
        attach_send_start(b)
    if "-DPX_HOLDS" in extra:
        hold_id = btf_ids.get(holdback.XMIT_TYPEDEF) if "-DPX_HOLD_BTF" in extra else None
        attached_btf += holdback.attach(b, degraded, hold_id)
    attached = sorted(
        {
            k.decode() if isinstance(k, bytes) else str(k)
            for k in [*getattr(b, "tracepoint_fds", {}), *getattr(b, "raw_tracepoint_fds", {})]
        }
        | set(attached_btf)
    )
    ring_bytes = opts.ringbuf_pages * mmap.PAGESIZE
    return Loaded(b, attached, degraded, ring_bytes, hooks, lazy, "-DPX_STATE_BTF" in extra)


_SEND_START, _SEND_START_FN = b"tcp_sendmsg_locked", b"px_send_start"


def _use_btf(b: Any, fn: str, tp: bytes, btf_id: int) -> list[str]:
    """Put ``fn`` (tp_btf) in the place of the classic program that bcc attached to ``tp``:
    attached first, then the classic one detached. For that moment, one system call long
    at start-up, both run: an arrival stamped twice keeps the first; a state change handled
    twice at worst counts a listener twice or makes a connection's entry twice (without its
    SYN-ACK retransmits). Where the kernel refuses it, the classic one stays: px_sdr_btf
    saves a hash lookup per socket, px_state_btf keeps the state changes that a classic
    program misses when another BPF program runs on its CPU
    (``parallax_agent_bpf_missed_runs_total``)."""
    if tpbtf.attach_in_place(b, fn, tp.decode(), btf_id) is None:
        return []
    try:
        b.detach_tracepoint(tp=tp)  # (bcc attached it: the caller checked)
    except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
        # both stay attached: the classic program mostly finds the work done
        log.debug("detaching the classic %s: %s", tp.decode(), e)
    return [tp.decode()]


def _tp_btf(b: Any) -> dict[bytes, tpbtf.TpBtfProgram]:
    progs: dict[bytes, tpbtf.TpBtfProgram] = getattr(b, "px_tp_btf", {})
    return progs


def attach_send_start(b: Any) -> None:
    """Attach the write-start hook (raw tcp:tcp_sendmsg_locked) and tell the programs."""
    b.attach_raw_tracepoint(tp=_SEND_START, fn_name=_SEND_START_FN)
    cfg = b["px_config"]
    v = cfg[ctypes.c_int(0)]
    v.send_start = 1
    cfg[ctypes.c_int(0)] = v


def _configure(b: Any, opts: Options) -> None:
    cfg = b["px_config"]
    v = cfg.Leaf()
    v.all_pids = 0 if (opts.pids or opts.ports) else 1
    v.all_ports = 0 if opts.ports else 1
    v.self_tgid = os.getpid()
    if 0 < len(opts.ports) <= len(v.ports):  # few ports: held where px_sdr_btf reads them
        v.nports = len(opts.ports)
        for i, port in enumerate(opts.ports):
            v.ports[i] = port
    v.stream_limit_ns = int(opts.stream_limit_s * 1e9) if opts.stream_limit_s > 0 else 0
    # filters first, then the switch that may widen them (the programs are already live)
    ports = b["px_ports"]
    for p in opts.ports:
        ports[ports.Key(p)] = ports.Leaf(1)
    set_pids(b, opts.pids)
    cfg[ctypes.c_int(0)] = v


def paused_by_kernel(b: Any) -> bool:
    """The programs paused themselves: the ring buffer was full (px_lost)."""
    return int(b["px_config"][ctypes.c_int(0)].paused) == 2


def set_paused(b: Any, paused: bool) -> None:
    """Shedding load: the programs trace nothing (and count the traced processes' reads
    on followed connections as shed) until this is cleared."""
    cfg = b["px_config"]
    v = cfg[ctypes.c_int(0)]
    v.paused = 1 if paused else 0
    if not paused:
        v.epoch += 1  # what the programs wrote before the pause is stale from here on
    cfg[ctypes.c_int(0)] = v


def set_sample_th(b: Any, th32: int) -> None:
    """Per-request sampling: requests whose randomness is below this 32-bit threshold are
    not traced (bpf/agent/sample.h; 0 keeps all). Takes effect at the next request."""
    cfg = b["px_config"]
    v = cfg[ctypes.c_int(0)]
    v.sample_th = th32
    cfg[ctypes.c_int(0)] = v


@dataclass(frozen=True)
class PortStat:
    seen: int  # every request on the port, sampled or not
    kept: int
    ttfb_us: tuple[int, ...]  # every request's server TTFB: bucket i holds [2^(i-1), 2^i) µs
    ttfb_sum_us: int


def port_stats(b: Any) -> dict[int, PortStat]:
    """Per local port: the exact request counts and TTFB histogram (one batch read)."""
    out: dict[int, PortStat] = {}
    for k, v in b["px_port_stats"].items_lookup_batch():
        port = int(getattr(k, "value", k))  # (a ctypes integer, or already an int)
        out[port] = PortStat(
            int(v.seen), int(v.kept), tuple(int(x) for x in v.ttfb_us), int(v.ttfb_sum_us)
        )
    return out


# Hooks whose programs return at the pause flag (they record nothing while tracing is
# paused) yet still cost every process on the node a program run per TCP write or arrival:
# detached for the length of a pause. sock_recv_length stays (it counts the shed requests),
# and so do the connection-lifecycle hooks. hook → (a raw tracepoint?, its program)
_IDLE_WHILE_PAUSED = {
    b"sock:sock_send_length": (False, b"tracepoint__sock__sock_send_length"),
    b"sock:sk_data_ready": (False, b"tracepoint__sock__sk_data_ready"),
    _SEND_START: (True, _SEND_START_FN),
}


def detach_idle(b: Any) -> list[bytes]:
    """Detach the hooks that do nothing while paused; what was detached, for reattach.
    Never raises."""
    out: list[bytes] = []
    for tp, (raw, _) in _IDLE_WHILE_PAUSED.items():
        btf_prog = _tp_btf(b).get(tp)
        if btf_prog is not None:
            if btf_prog.attached:
                btf_prog.detach()
                out.append(tp)
            continue
        fds = b.raw_tracepoint_fds if raw else b.tracepoint_fds
        if tp not in fds:
            continue
        try:
            (b.detach_raw_tracepoint if raw else b.detach_tracepoint)(tp=tp)
        except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
            # bcc closes the perf event's fd before it reports a failed disable: the hook
            # is gone either way; forget the stale fd (its number may be reused)
            log.debug("detaching %s: %s", tp.decode(), e)
            fds.pop(tp, None)
        out.append(tp)
    return out


def reattach(b: Any, hooks: list[bytes]) -> None:
    """Attach again what detach_idle took off (bcc keeps the loaded programs)."""
    for tp in hooks:
        btf_prog = _tp_btf(b).get(tp)
        if btf_prog is not None:
            btf_prog.attach()
            continue
        raw, fn = _IDLE_WHILE_PAUSED[tp]
        if tp not in (b.raw_tracepoint_fds if raw else b.tracepoint_fds):
            (b.attach_raw_tracepoint if raw else b.attach_tracepoint)(tp=tp, fn_name=fn)


PID_TRACED = 1  # px_pids bit (bpf/agent/defs.h PX_PID_TRACED); PID_TLS: agent.kernel.tls_probes


def set_pids(b: Any, pids: list[int], on: bool = True) -> None:
    """Trace ``pids``, keeping their other bits (a server found by a rescan got its TLS
    probes' bit first: overwritten, its TLS connections went unread); with ``on`` False,
    clear them whole (gone, or the agent stopping)."""
    t = b["px_pids"]
    limit = len(t)
    for p in pids:
        if 0 <= p < limit:
            k = t.Key(p)
            t[k] = t.Leaf(int(t[k].value) | PID_TRACED if on else 0)


def remove_pids(b: Any, pids: list[int]) -> None:
    set_pids(b, pids, on=False)


def quiesce(b: Any, pids: list[int]) -> None:
    """Trace nothing new (shutdown): the configuration back to all-zero, then the pids."""
    cfg = b["px_config"]
    cfg[ctypes.c_int(0)] = cfg.Leaf()
    set_pids(b, pids, on=False)


def seed_fd(
    b: Any,
    tgid: int,
    fd: int,
    lport: int,
    family: int = 0,
    laddr: bytes = b"",
    raddr: bytes = b"",
    rport: int = 0,
) -> None:
    """Mark an fd of a connection older than the agent (linked at its next read/write),
    with its addresses from /proc/net/tcp{,6} (raw, network order)."""
    t = b["px_fds"]
    leaf = t.Leaf()
    leaf.seeded = 1
    leaf.lport = lport
    leaf.rport = rport
    leaf.family = family
    ctypes.memmove(leaf.laddr, laddr[:16], min(16, len(laddr)))
    ctypes.memmove(leaf.raddr, raddr[:16], min(16, len(raddr)))
    t[t.Key((tgid << 32) | fd)] = leaf


def seed_listen(b: Any, counts: dict[int, int]) -> None:
    """Listening sockets per port that existed before the probes (the kernel counts later
    ones itself from inet_sock_set_state); only an empty slot is written."""
    t = b["px_listen"]
    for port, n in counts.items():
        k = t.Key(port)
        if int(t[k].value) == 0:
            t[k] = t.Leaf(n)


def counters(b: Any, names: Iterable[str] = COUNTER_NAMES) -> dict[str, int]:
    """The kernel's counters (summed over CPUs), a map read each: all, or only ``names``."""
    t = b["px_counters"]
    return {n: int(sum(t[ctypes.c_int(COUNTER_NAMES.index(n))])) for n in names}


def missed_runs(b: Any) -> dict[str, int]:
    """Per program (its function's name), the runs the kernel skipped because another BPF
    program was running on that CPU (bpf_prog_info.recursion_misses, Linux >= 5.12; 0
    before). A classic tracepoint's program is skipped while any kprobe, tracepoint or
    perf program runs on its CPU — a softirq's TCP state change over a process-context
    program, ours or another tool's — and the event is gone: a connection whose start is
    missed is never followed. A tp_btf program is skipped only over itself."""
    fds = {k.decode(): f.fd for k, f in getattr(b, "funcs", {}).items() if f.fd >= 0}
    fds |= {p.fn_name: p.prog_fd for p in _tp_btf(b).values() if p.prog_fd >= 0}
    out = {}
    for name, fd in fds.items():
        try:
            out[name] = int(sys_bpf.prog_info(fd).recursion_misses)
        except OSError:
            continue  # (closed meanwhile: the agent is stopping)
    return out


def map_fill(c: dict[str, int], max_conns: int) -> dict[str, int]:
    """Entries of the connection maps from the kernel's create/delete counters (a walk of
    the maps costs a syscall per key). LRU evictions are not counted, so the estimate is
    capped at the map size; px_fds follows px_conns (one linked fd per connection)."""
    conns = max(0, min(max_conns, c["conns_created"] - c["conns_deleted"]))
    aggs = max(0, min(max_conns, c["aggs_created"] - c["aggs_deleted"]))
    return {"px_conns": conns, "px_aggs": aggs}


def synack_retransmits(b: Any) -> dict[int, int]:
    return {int(k.value): int(v.value) for k, v in b["px_synack"].items()}


def conn_tcp(b: Any, sk: int, ident: int) -> tuple[int, int, int] | None:
    """A followed connection's retransmit counts now (retransmitted segments, the summed
    wait of those timed, how many were: bpf/agent/tcp.h), open (px_conns) or closed by its
    app with its socket not ended yet (px_tails); None when the kernel no longer has it."""
    for name in ("px_conns", "px_tails"):
        t = b[name]
        try:
            v = t[t.Key(sk)]
        except KeyError:
            continue
        if int(v.ident) == ident:
            return int(v.retrans), int(v.rtx_wait_us), int(v.rtx_timed)
    return None


class Ring:
    """The event ring buffer, drained on a timer (records are submitted without wakeup).

    Read in place through mmap where the CPU's memory order allows it (agent.kernel.ringbuf: one
    Python loop, no ctypes callback per record); elsewhere, or with
    ``PARALLAX_AGENT_BCC_RING=1``, through bcc's ``ring_buffer_consume()`` (its
    ``ring_buffer_poll`` never delivers BPF_RB_NO_WAKEUP records in bcc 0.26)."""

    def __init__(self, loaded: Loaded, callback: Callable[[bytes], object]) -> None:
        self._b = loaded.bpf
        self._cb = callback
        self.reader: ringbuf.RingReader | None = None
        table = loaded.bpf["px_events"]
        if (
            ringbuf.supported()
            and loaded.ring_bytes
            and os.environ.get("PARALLAX_AGENT_BCC_RING") != "1"
        ):
            try:
                self.reader = ringbuf.RingReader(table.map_fd, loaded.ring_bytes)
            except (OSError, ValueError) as e:
                log.warning("ring buffer mmap failed (%s): bcc's consumer instead", e)
        if self.reader is None:

            def _cb(_ctx: Any, data: Any, size: int) -> int:
                callback(ctypes.string_at(data, size))
                return 0

            table.open_ring_buffer(_cb)

    def drain(self) -> None:
        if self.reader is not None:
            self.reader.consume(self._cb)
        else:
            self._b.ring_buffer_consume()

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


def detach(b: Any) -> None:
    """Every program off its hook. The perf events bcc attached (tracepoints, libc's accept
    uprobes) close all at once through bcc's own detach calls, waited for
    (agent.kernel.perf_close); bcc's clean-up then finds none left to close in turn."""
    for prog in _tp_btf(b).values():
        try:
            prog.close()
        except OSError as e:
            print(f"parallax-agent: detach: {e}", file=sys.stderr)
    closes = [functools.partial(b.detach_tracepoint, tp) for tp in list(b.tracepoint_fds)]
    closes += [functools.partial(b.detach_uprobe_event, ev) for ev in list(b.uprobe_fds)]
    for err in perf_close.in_parallel(closes, name="px-detach").wait():
        print(f"parallax-agent: detach: {str(err).splitlines()[0][:200]}", file=sys.stderr)
    try:
        b.cleanup()
    except Exception as e:  # noqa: BLE001  (shutdown must finish)
        print(f"parallax-agent: detach: {e}", file=sys.stderr)
