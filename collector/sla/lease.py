"""One evaluator among several collectors sharing one ClickHouse: a lease row.

ClickHouse has no compare-and-set, so the lease is a ReplacingMergeTree row per name: a
collector takes it when it is free or expired (or already its own) by writing a row with a
higher version, then reads it back after a short settle delay and evaluates only if the row
read back names it. Two collectors racing in the same instant can both evaluate once; from
the next renewal on the higher version wins and the other stands by. The holder renews on
every evaluation; a standby takes over once the lease expires (holder crashed or stopped).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from collector.sla import schema

NAME = "sla-evaluator"


class Lease:
    def __init__(
        self,
        get_client: Callable[[], Any],
        db: str,
        holder: str,
        ttl: timedelta,
        settle_s: float = 0.2,
    ) -> None:
        self._get, self.db, self.holder, self.ttl, self.settle_s = (
            get_client,
            db,
            holder,
            ttl,
            settle_s,
        )

    def current(self) -> tuple[str, datetime] | None:
        r = (
            self._get()
            .query(
                f"SELECT argMax(holder, version), argMax(expires, version) "  # noqa: S608
                f"FROM {self.db}.{schema.LEASE} WHERE name = {{n:String}} HAVING count() > 0",
                parameters={"n": NAME},
            )
            .result_rows
        )
        if not r:
            return None
        h, exp = r[0]
        return str(h), exp if exp.tzinfo else exp.replace(tzinfo=UTC)

    def acquire(self, now: datetime) -> bool:
        """Take or renew the lease; True when this collector holds it."""
        cur = self.current()
        if cur is not None and cur[0] != self.holder and cur[1] > now:
            return False
        self._get().insert(
            f"{self.db}.{schema.LEASE}",
            [[NAME, self.holder, now + self.ttl, time.time_ns()]],
            column_names=["name", "holder", "expires", "version"],
        )
        if cur is None or cur[0] != self.holder:
            time.sleep(self.settle_s)  # let a racing writer's row land before deciding
        after = self.current()
        return after is not None and after[0] == self.holder

    def release(self) -> None:
        cur = self.current()
        if cur is not None and cur[0] == self.holder:
            self._get().insert(
                f"{self.db}.{schema.LEASE}",
                [[NAME, self.holder, datetime.fromtimestamp(0, UTC), time.time_ns()]],
                column_names=["name", "holder", "expires", "version"],
            )
