"""The seam between the connection table and the protocols: what one connection's parser
does, whatever its protocol (agent/protocols/table.py lists the protocols).

A parser is fed one connection's kernel events in order and returns the exchanges
(agent.protocols.exchange) each event finished. The connection table (agent.connections)
owns what is common to every protocol: finding the connection, its addresses and identity,
lost events, TCP figures, close; everything between the bytes and the exchange lives in the
protocol's module.
"""

from __future__ import annotations

from typing import Protocol

from agent.protocols.exchange import Exchange
from agent.protocols.streams.stream import Engine


class ConnParser(Protocol):
    """One connection's parser for one protocol."""

    # requests seen on the connection, those the kernel did not sample included (the first
    # request alone carries the connection's accept-queue time)
    requests: int
    srtt_us: int  # the connection's TCP figures, refreshed by the table from each event
    retrans: int  # retransmitted segments (bpf/agent/tcp.h)
    rtx_wait_us: int  # ... the summed wait of those timed, and how many were
    rtx_timed: int
    # the protocol the connection switched to (WebSocket after a 101): the table replaces
    # the parser with it
    upgraded: ConnParser | None
    # the engine the connection's streams run on (its local port's: agent.protocols.streams)
    engine: Engine | None

    def on_event(self, typ: int, raw: bytes, t: int, sample_th: int) -> list[Exchange]:
        """One ring-buffer record of this protocol (its type: one of the table's events)."""
        ...

    def on_peer_fin(self, t: int) -> None:
        """The client's FIN arrived (the socket stays open until the app closes it)."""
        ...

    def on_close(self, t: int, server_gone: bool) -> list[Exchange]:
        """The connection ended; ``server_gone``: without a close() by the app (it died)."""
        ...

    def on_loss(self) -> None:
        """Events of the connection were lost: what is in flight can no longer be framed."""
        ...

    def flush_inflight(self) -> list[Exchange]:
        """The agent is stopping: what is in flight, as partial exchanges."""
        ...

    def in_flight(self) -> list[int]:
        """t1 of the requests answered and not finished (the GPU side's requests in
        flight)."""
        ...

    def after_error(self) -> ConnParser | None:
        """An event could not be handled (a bug, or input nothing anticipated): the parser
        to go on with (a fresh one that resynchronises), or None to give the connection up.
        What was in flight is counted as lost."""
        ...

    @property
    def gave_up_unparsed(self) -> bool:
        """The connection's first bytes were not this protocol: it is not followed."""
        ...
