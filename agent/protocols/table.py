"""The protocols the agent follows, and which kernel events belong to each: the dispatch
table of the connection table (agent.connections).

The kernel decides a connection's protocol from its first bytes (bpf/agent/proto/: HTTP/2's
client preface, else HTTP/1) and sends that protocol's event types; the first event of a
connection chooses its parser here. A protocol entered by an upgrade inside another
(WebSocket after HTTP/1's 101) is not listed: the parser that upgrades hands over
(``ConnParser.upgraded``).

Adding a protocol (docs/ARCHITECTURE.md, "Adding a protocol"): its kernel header under
bpf/agent/proto/ with its event type, its module here with a ``ConnParser``, and one line
below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.kernel import events
from agent.protocols import http1, http2
from agent.protocols.base import ConnParser


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    events: tuple[int, ...]  # the kernel event types of its connections
    new_stats: Callable[[], Any]  # the protocol's counters, one object for all connections
    new_conn: Callable[[Any, int], ConnParser]  # (its stats, the head window) → a parser


PROTOCOLS: tuple[Entry, ...] = (
    Entry(
        "http1",
        (events.EV_READ, events.EV_RESP, events.EV_WAGG, events.EV_BODY),
        http1.Stats,
        lambda stats, window: http1.Conn(window, stats),
    ),
    Entry("http2", (events.EV_H2,), http2.H2Stats, lambda stats, window: http2.H2Conn(stats)),
)

BY_EVENT: dict[int, Entry] = {ev: e for e in PROTOCOLS for ev in e.events}
