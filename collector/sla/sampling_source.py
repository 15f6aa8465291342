"""The agent's request counts of one evaluation window, read from ``request_counts``.

Only this module knows that table's columns (collector/store/schema.py). Two queries: the
counter series (``parallax.requests.seen`` / ``traced``) with their points from a little
before the window to its end, one series per (port, host, metric, start time) — a new start
time is a new accumulation (an agent restarted) — and the latest sampling probability per
host. The increases are computed in Python (collector/sla/sampling.py: resets, a series that
began inside the window); a series carries the service the agent named for its port (the
latest non-empty one: a port's first points may precede the first record that named it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from collector.sla.sampling import ServiceCounts, increase
from collector.store import schema
from parallax_contracts import agent_metrics as gm

Rows = Callable[[str], list[Sequence[Any]]]
# The agent exports every 10 s: a point up to a minute before the window is its baseline.
LOOKBACK = timedelta(minutes=1)


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S.%f")


def read(rows: Rows, db: str, start: datetime, end: datetime) -> dict[str, ServiceCounts]:
    """Per service: requests seen and traced after ``start`` up to ``end``, its ports and
    hosts, and each host's latest sampling probability."""
    seen, traced = gm.REQUESTS_SEEN.name, gm.REQUESTS_TRACED.name
    out: dict[str, ServiceCounts] = {}
    start_ns = int(start.timestamp() * 1e9)
    for service, port, host, metric, temporality, st, points in rows(
        f"""SELECT argMaxIf(toString(service), time, service != ''), port, toString(host),
       toString(metric), any(toString(temporality)),
       ifNull(toUnixTimestamp64Nano(start_time), 0) AS st,
       arraySort(x -> x.1, groupArray((toUnixTimestamp64Nano(time), value)))
FROM {db}.{schema.REQUEST_COUNTS} FINAL
WHERE metric IN ('{seen}', '{traced}') AND time > '{_ts(start - LOOKBACK)}'
  AND time <= '{_ts(end)}'
GROUP BY port, host, metric, st"""  # noqa: S608 — identifiers and names ours
    ):
        c = out.setdefault(str(service), ServiceCounts())
        inc = increase(
            [(int(t), float(v)) for t, v in points], start_ns, int(st), temporality == "delta"
        )
        if metric == seen:
            c.seen += inc
        else:
            c.traced += inc
        c.ports.add(int(port))
        c.hosts.add(str(host))
    if not out:
        return out
    latest = {
        str(h): float(p)
        for h, p in rows(
            f"""SELECT toString(host), argMax(value, time)
FROM {db}.{schema.REQUEST_COUNTS} FINAL
WHERE metric = '{gm.SAMPLING_PROBABILITY.name}' AND time > '{_ts(start - LOOKBACK)}'
  AND time <= '{_ts(end)}'
GROUP BY host"""  # noqa: S608
        )
    }
    for c in out.values():
        c.probability = {h: latest[h] for h in c.hosts if h in latest}
    return out
