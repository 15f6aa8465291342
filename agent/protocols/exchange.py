"""The neutral exchange: what every protocol module makes of a connection's kernel events,
and what records, spans and metrics are built from (agent.records).

One exchange is one request and its response — an HTTP/1 request, an HTTP/2 stream, a
WebSocket turn (a client message and the server frames until the next one). Its parts:
the request head, the response head, the body writes with their times (and, where the body
speaks an LLM stream dialect, its events: agent.protocols.streams), and the end state.
Times are CLOCK_MONOTONIC nanoseconds; 0 means "not seen".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.kernel.events import Hold, merge_hold
from agent.protocols.streams.body import BodyReader
from agent.protocols.streams.stream import Stream
from parallax_contracts import trace_context
from parallax_contracts.span_attributes import CHUNK_OFFSETS_CAP


@dataclass(slots=True)
class Exchange:
    # -- request head --
    method: str
    path: str
    version: str
    traceparent: trace_context.TraceContext | None
    traceparent_missed: bool
    # -- instants (the measurement model, docs/ARCHITECTURE.md) --
    t1: int  # the app's read returned the request
    t_arr: int = 0  # its bytes arrived on the socket
    t_acc: int = 0  # accept() returned (first request of a connection only)
    t_est: int = 0  # handshake complete (first request of a connection only)
    t2: int = 0  # the response head was written
    t_tok: int = 0  # the first body-carrying write
    t_end: int = 0  # the last write
    # -- response head --
    status: int = 0
    content_length: int | None = None
    chunked: bool = False
    # -- body writes: one form end to end, µs from t1 (the kernel's offsets are µs from its
    # aggregate's first write: each becomes µs from t1 once, where it arrives) --
    chunk_offs_us: list[int] = field(default_factory=list)  # the first CHUNK_OFFSETS_CAP
    t_last_chunk: int = 0  # the last body write (ns): gaps across the kernel's aggregates
    chunks: int = 0
    gap_max_ns: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    body_out: int = 0
    hold: Hold | None = None  # write-to-wire holdback of its body writes (None: unmeasured)
    # the body as an LLM stream (agent.protocols.streams): its events, when the response
    # head announced an event stream (None: a plain body)
    stream: Stream | None = None
    body: BodyReader | None = None  # HTTP/1: its writes' bytes → the stream
    # -- end state --
    ended: bool = False  # the protocol's own end was seen (chunked terminator, END_STREAM)
    partial: bool = False  # not finished: the stream limit's snapshot, or the agent stopped
    client_aborted: bool = False  # the client closed (or reset the stream) first
    t_peer_fin: int = 0  # when the client's FIN arrived, if it came before the end
    # -- the connection --
    srtt_us: int = 0
    # Its share of the connection's retransmits (bpf/agent/tcp.h counts them per connection,
    # with the SYN-ACK's, and the summed wait of those it could time): the counts where the
    # share starts and, once known, where it ends (``tcp_end``). ``tcp_hold``: the share ends
    # at the connection's next exchange, or at the socket's end — its record waits for that
    # (agent.connections); otherwise it ends where the exchange does.
    retrans_start: int = 0
    rtx_wait_start: int = 0
    rtx_timed_start: int = 0
    tcp_hold: bool = False
    tcp_end: tuple[int, int, int] | None = None
    retransmits: int = 0
    retransmit_wait_us: int | None = None  # None: no retransmit of its share was timed
    sample_th: int = 0  # the kernel's sampling threshold it was kept under (0: all kept)
    # -- protocol specifics --
    ws_seq: int = 0  # WebSocket: the turn's client message number
    upgrade: bool = False  # the request asked for a WebSocket upgrade
    head_request: bool = False
    rpc_system: str | None = None  # "grpc": an HTTP/2 stream of content-type application/grpc
    grpc_status: int | None = None  # its trailers' grpc-status

    def add_body_write(self, t: int) -> None:
        if self.t_tok == 0:
            self.t_tok = t
        elif self.chunks and t - self.t_last_chunk > self.gap_max_ns:
            self.gap_max_ns = t - self.t_last_chunk
        if len(self.chunk_offs_us) < CHUNK_OFFSETS_CAP:
            self.chunk_offs_us.append((t - self.t1) // 1000 if t > self.t1 else 0)
        self.t_last_chunk = t
        self.chunks += 1

    def merge_writes(
        self,
        t_last: int,
        t_first: int,
        offs_us: tuple[int, ...],
        n: int,
        nbytes: int,
        gap_max_ns: int,
        hold: Hold | None = None,
    ) -> None:
        """Body writes the kernel aggregated: ``offs_us`` the first of the ``n`` writes, µs
        from ``t_first`` (its first write); ``hold`` their write-to-wire holdback, merged
        with the response's earlier runs."""
        if offs_us:
            if self.t_tok == 0:
                self.t_tok = t_first
            elif self.chunks and t_first - self.t_last_chunk > self.gap_max_ns:
                self.gap_max_ns = t_first - self.t_last_chunk  # the gap before this aggregate
            room = CHUNK_OFFSETS_CAP - len(self.chunk_offs_us)
            if room > 0:
                base = t_first - self.t1
                self.chunk_offs_us += [
                    (base + o * 1000) // 1000 if base + o * 1000 > 0 else 0 for o in offs_us[:room]
                ]
            self.t_last_chunk = t_first + offs_us[-1] * 1000
        self.chunks += n
        self.gap_max_ns = max(self.gap_max_ns, gap_max_ns)
        self.bytes_out += nbytes
        self.t_end = max(self.t_end, t_last)
        if hold is not None:
            self.hold = merge_hold(self.hold, hold)

    def finish_tcp(self, srtt_us: int, retrans: int, wait_us: int = 0, timed: int = 0) -> Exchange:
        """The connection's TCP figures at the exchange's end: its srtt, and its
        retransmits so far (final unless its share ends later: ``tcp_hold``)."""
        if srtt_us:
            self.srtt_us = srtt_us
        if self.tcp_end is None:
            self._count(retrans, wait_us, timed)
        return self

    def end_tcp(self, retrans: int, wait_us: int, timed: int) -> None:
        """Where its share of the connection's retransmits ends (the connection's counts
        then): the next exchange's start, the socket's end, or as far as the wait for them
        went (agent.connections)."""
        if self.tcp_end is None:
            self.tcp_end = (retrans, wait_us, timed)
            self._count(retrans, wait_us, timed)

    def _count(self, retrans: int, wait_us: int, timed: int) -> None:
        d = (retrans - self.retrans_start) & 0xFFFFFFFF  # u32 counters in the kernel
        self.retransmits = d if d < 0x80000000 else 0
        n = (timed - self.rtx_timed_start) & 0xFFFFFFFF
        if self.retransmits and 0 < n < 0x80000000:
            self.retransmit_wait_us = (wait_us - self.rtx_wait_start) & 0xFFFFFFFF
        else:
            self.retransmit_wait_us = None
