"""Decoding the ring-buffer records of bpf/agent.c: their layouts are read from its C
structs (agent.kernel.layout: one declaration), x86-64/arm64 natural alignment, little
endian. Pure Python: no bcc import, so the parsers and their tests run anywhere."""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass, field

from agent.kernel.layout import constant, layout

EV_READ = 1
EV_RESP = 2
EV_WAGG = 3
EV_CLOSE = 4
EV_PEER_FIN = 5
EV_SOCK_CLOSE = 6  # the socket closed without a close() of the app (killed, exited)
EV_TLS = 7  # the connection carries TLS: its plaintext comes from the SSL uprobes
EV_H2 = 8  # a read or write of an HTTP/2 connection (READ's layout; skipped = direction)
EV_BODY = 9  # a body write of an LLM stream: its first bytes and its last (proto/stream.h)
EV_TAIL = 10  # a closed connection's socket ended: its final TCP counts (tcp.h)

WAGG_END = 1
WAGG_PARTIAL = 2
WAGG_CLOSE = 4

# The layouts, from the C structs themselves (agent.kernel.layout): field names in the
# comments are the structs'.
_hdr, _read, _resp = layout("px_hdr"), layout("px_ev_read"), layout("px_ev_resp")
_agg, _h2, _body = layout("px_agg"), layout("px_ev_h2"), layout("px_ev_body")
CHUNKS = constant("PX_CHUNKS")
H2_HDRS = constant("PX_H2_HDRS")
# type tgid pid fd sk ident t srtt_us retrans lost sample_th rtx_wait_us rtx_timed
HDR = _hdr.fmt("type")
# t_est t_acc t_arr n caplen lport rport family skipped laddr raddr
READ = _read.fmt("t_est", "data")
# the same without the addresses (read once per connection): two bytes objects fewer
READ_NOADDR = _read.fmt("t_est", "laddr")
READ_ADDRS = _read.fmt("laddr", "data")
RESP = _resp.fmt("n", "data")  # n caplen
BODY = _body.fmt("n", "data")  # n caplen tail pad
Struct_Q = struct.Struct("<Q")  # one u64 (a WAGG's t_first, right after the header)
TLS = layout("px_ev_tls").fmt("lport")  # lport pad
AGG = _agg.fmt("t_first", "hold_block_t")  # t_first t_last bytes gap_max_ns n flags
# the write-to-wire holdback of the same writes (bpf/agent/hold.h): block_t max_us sum_us n
# untimed why mask pend on bytes
HOLD = _agg.fmt("hold_block_t", "offs_us")
HOLD_AT = HDR.size + _agg.field("hold_block_t").offset
# reasons (PX_WHY_*), by number
HOLD_WHY = ("", "nagle", "cork", "cwnd", "rwnd", "sndbuf", "stack")
READ_DATA = _read.field("data").offset  # where a read's captured bytes start
# EV_H2 (bpf/agent/proto/http2.h): READ's fields, then the kernel's frame walk — in step (walk),
# how many frame headers past the copy (nhdr), the event's last bytes after the copy
# (tail), the headers' offsets and their 9 bytes (12 each)
H2_WALK = _h2.fmt("walk", "hdr")
H2_DATA = _h2.field("data").offset
RESP_DATA = _resp.field("data").offset
BODY_DATA = _body.field("data").offset
OFFS_AT = HDR.size + _agg.field("offs_us").offset
assert _read.fmt("t_est", "data").size + HDR.size == READ_DATA  # no padding before data
_OFFS: dict[int, struct.Struct] = {}
AF_INET = 2


def offsets(buf: bytes, off: int, n: int) -> tuple[int, ...]:
    """The first ``min(n, CHUNKS)`` u32 write offsets at ``off`` (only those: a short
    stream's aggregate does not unpack all 256)."""
    k = min(n, CHUNKS)
    s = _OFFS.get(k)
    if s is None:
        s = _OFFS[k] = struct.Struct(f"<{k}I")
    return s.unpack_from(buf, off)


@dataclass(slots=True)
class Header:
    type: int
    tgid: int
    pid: int
    fd: int
    sk: int
    ident: int
    t: int
    srtt_us: int
    retrans: int
    lost: int = 0  # events of this connection were lost before this one (ring full)
    sample_th: int = 0  # READ: the sampling threshold its request was kept under
    rtx_wait_us: int = 0  # the connection's timed retransmits: their summed wait (mod 2^32)
    rtx_timed: int = 0  # ... and how many

    @property
    def conn(self) -> tuple[int, int]:
        """Sockets are reused: a connection is (socket address, first-seen time)."""
        return (self.sk, self.ident)


@dataclass(slots=True)
class ReadEv:
    h: Header
    t_est: int
    t_acc: int
    t_arr: int
    n: int
    data: bytes
    lport: int
    rport: int
    family: int
    laddr_raw: bytes
    raddr_raw: bytes
    skipped: int = 0  # requests of the connection not sampled since the last READ

    def addrs(self) -> tuple[str, str]:
        """(local, peer) as text; computed once per connection by the caller (slow)."""
        return addr_text(self.family, self.laddr_raw), addr_text(self.family, self.raddr_raw)


@dataclass(slots=True)
class RespEv:
    h: Header
    n: int
    data: bytes


@dataclass(slots=True, frozen=True)
class Hold:
    """The write-to-wire holdback of a run of body writes (bpf/agent/hold.h): how long the
    held ones waited to leave the socket, and why."""

    writes: int  # held writes timed
    max_us: int
    sum_us: int
    untimed: int  # held writes whose departure was not seen
    why: str  # the reason of the longest ("" when none was held)
    reasons: tuple[str, ...]  # every reason seen
    bytes_max: int  # the most bytes left unsent at a write's return

    @staticmethod
    def of(
        max_us: int, sum_us: int, n: int, untimed: int, why: int, mask: int, nbytes: int
    ) -> Hold:
        names = tuple(w for i, w in enumerate(HOLD_WHY) if i and mask >> i & 1)
        name = HOLD_WHY[why] if 0 < why < len(HOLD_WHY) else ""
        return Hold(n, max_us, sum_us, untimed, name, names, nbytes)


def merge_hold(a: Hold | None, b: Hold | None) -> Hold | None:
    """Two runs of writes of one response (a stream flushed in parts)."""
    if a is None or b is None:
        return a or b
    top = b if b.writes and (not a.writes or b.max_us > a.max_us) else a
    return Hold(
        a.writes + b.writes,
        top.max_us,
        a.sum_us + b.sum_us,
        a.untimed + b.untimed,
        top.why,
        tuple(w for w in HOLD_WHY if w and (w in a.reasons or w in b.reasons)),
        max(a.bytes_max, b.bytes_max),
    )


def hold_at(buf: bytes, off: int = HOLD_AT) -> Hold | None:
    """The holdback part of a WAGG record; None where the writes were not checked."""
    _bt, max_us, sum_us, n, untimed, why, mask, _pend, on, nbytes = HOLD.unpack_from(buf, off)
    if not on:
        return None
    return Hold.of(max_us, sum_us, n, untimed, why, mask, nbytes)


@dataclass(slots=True)
class WaggEv:
    """Writes after a response head, aggregated in the kernel."""

    h: Header
    t_first: int
    t_last: int
    bytes: int
    gap_max_ns: int
    n: int
    flags: int
    offs_us: list[int] = field(default_factory=list)  # first min(n, 256) writes − t_first
    hold: Hold | None = None

    def times_ns(self) -> list[int]:
        return [self.t_first + o * 1000 for o in self.offs_us]


@dataclass(slots=True)
class CloseEv:
    h: Header


@dataclass(slots=True)
class TlsEv:
    """The connection carries TLS records (its plaintext comes from the SSL uprobes)."""

    h: Header
    lport: int


Event = ReadEv | RespEv | WaggEv | CloseEv | TlsEv


_V4_MAPPED = bytes(10) + b"\xff\xff"
_V6_ZERO_HEAD = bytes(12)


def addr_text(family: int, raw: bytes) -> str:
    """An address as ``ipaddress`` writes it (an IPv4-mapped IPv6 one as IPv4), by
    ``inet_ntop``: once per connection, where ``ipaddress`` cost ~3 µs a call."""
    if family == AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    head = raw[:12]
    if head == _V4_MAPPED:
        return socket.inet_ntop(socket.AF_INET, raw[12:16])
    if head == _V6_ZERO_HEAD:
        # (::a.b.c.d, the deprecated IPv4-compatible form: libc writes it dotted,
        # ipaddress in hex; these and ::1 are rare)
        return str(ipaddress.IPv6Address(raw[:16]))
    return socket.inet_ntop(socket.AF_INET6, raw[:16])


def decode(buf: bytes) -> Event | None:
    """One ring-buffer record → an event (None for an unknown type or a short record)."""
    if len(buf) < HDR.size:
        return None
    h = Header(*HDR.unpack_from(buf, 0))
    off = HDR.size
    if h.type == EV_READ:
        t_est, t_acc, t_arr, n, caplen, lport, rport, family, skipped, la, ra = READ.unpack_from(
            buf, off
        )
        data = bytes(buf[READ_DATA : READ_DATA + caplen])
        return ReadEv(h, t_est, t_acc, t_arr, n, data, lport, rport, family, la, ra, skipped)
    if h.type == EV_RESP:
        n, caplen = RESP.unpack_from(buf, off)
        return RespEv(h, n, bytes(buf[RESP_DATA : RESP_DATA + caplen]))
    if h.type == EV_WAGG:
        t_first, t_last, nbytes, gap, n, flags = AGG.unpack_from(buf, off)
        offs = list(offsets(buf, OFFS_AT, n))
        return WaggEv(h, t_first, t_last, nbytes, gap, n, flags, offs, hold_at(buf))
    if h.type in (EV_CLOSE, EV_PEER_FIN, EV_SOCK_CLOSE, EV_TAIL):
        return CloseEv(h)
    if h.type == EV_TLS and len(buf) >= off + TLS.size:
        return TlsEv(h, TLS.unpack_from(buf, off)[0])
    return None
