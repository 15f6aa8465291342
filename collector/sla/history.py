"""One route's metric minute by minute, user and server P95 side by side: the on-call
chart's read (``/v1/sla/history``), from the minutes' sketches the checker keeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from collector.sla import quantize, schema
from collector.sla.source import WEIGHT_SCALE, SlaSource, as_utc


class HistoryPoint(NamedTuple):
    """One minute: each side's P95 in ms (None where that side had no pair that minute) and
    the user side's count."""

    minute: datetime
    user_p95_ms: float | None
    server_p95_ms: float | None
    n: int


def read(
    source: SlaSource, service: str, route: str, metric: str, now: datetime, minutes: int
) -> list[HistoryPoint]:
    """The last ``minutes`` minutes of one route and metric that either side has."""
    start = (now - timedelta(minutes=minutes)).astimezone(UTC).replace(second=0, microsecond=0)
    p = {"service": service, "route": route, "u": f"{metric}:user", "s": f"{metric}:server"}
    rows = source.rows(
        f"""SELECT minute, ser, sum(cc.2), quantileExactWeighted(0.95)(cc.1,
       toUInt64(round(cc.3 * {WEIGHT_SCALE})))
FROM (SELECT minute, toString(series) AS ser, arrayJoin(arrayZip(cells, counts, weights)) AS cc
      FROM {source.db}.{schema.MINUTES} FINAL
      WHERE service = {{service:String}} AND route = {{route:String}}
        AND series IN ({{u:String}}, {{s:String}}) AND minute >= '{start:%Y-%m-%d %H:%M:%S}'
        AND n > 0)
GROUP BY minute, ser ORDER BY minute""",  # noqa: S608 — identifiers and the time are ours
        p,
    )
    user: dict[datetime, tuple[float, int]] = {}
    server: dict[datetime, float] = {}
    for minute, series, n, q in rows:
        if str(series).endswith(":user"):
            user[as_utc(minute)] = (quantize.decode(int(q)), int(n))
        else:
            server[as_utc(minute)] = quantize.decode(int(q))
    points = []
    for m in sorted(user.keys() | server.keys()):
        u, count = user.get(m, (None, 0))
        points.append(HistoryPoint(m, u, server.get(m), count))
    return points
