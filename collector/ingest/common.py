"""What both ingest paths share: the parse result and the limits on a single record."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

MAX_DURATION_NS = 24 * 3600 * 10**9  # a record longer than a day is a bug upstream
FUTURE_SLACK_NS = 24 * 3600 * 10**9  # clocks may be off, but not by a day


def outside_window(t_ns: int, oldest_ns: int, now_ns: int) -> str | None:
    """The reject reason of a record dated ``t_ns`` (Unix ns), or None when it may be kept:
    older than the retention, or more than FUTURE_SLACK_NS ahead of the collector."""
    if t_ns < oldest_ns:
        return "older_than_retention"
    if t_ns > now_ns + FUTURE_SLACK_NS:
        return "in_future"
    return None


class BadRequestError(Exception):
    """The whole body is unusable: answered 400 with this one-line reason."""


@dataclass(slots=True)
class Parsed:
    """Rows in table column order, the trace ids they touch, and per-reason reject counts."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    trace_ids: list[str] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    ignored: int = 0  # well-formed records we do not store (e.g. non-SERVER spans)
    # the same, by reason, where there are several (OTLP metric points: docs/collector.md)
    ignored_reasons: Counter[str] = field(default_factory=Counter)
    # rows for other tables than the request's own, by source (OTLP metrics: the agent's
    # request counts beside its GPU series)
    more: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def row_count(self) -> int:
        """Rows of every table this request fills."""
        return len(self.rows) + sum(len(r) for r in self.more.values())
