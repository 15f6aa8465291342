"""Run dashboard SQL on a real store filled with the generated scenario, in a process of its
own: chDB allows one embedded data path per process, and the test process holds others.

``python -m tests.dashboards_store DIR ANCHOR`` reads ``[[name, sql], …]`` as JSON on stdin
and prints ``{name: {"columns": […], "rows": […]} or "error text"}``: instants as Unix ms
(float), tuples as lists, NaN as null.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collector.sla import schema as sla_schema
from collector.store.client import Store, chdb_dsn
from tests import dashboards_scenario


def plain(v: Any) -> Any:
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).timestamp() * 1000
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    return v


def main() -> None:
    data_dir, anchor = Path(sys.argv[1]), datetime.fromtimestamp(float(sys.argv[2]), UTC)
    store = Store(chdb_dsn(data_dir))
    store.migrate(7)
    sla_schema.ensure(store.client(), store.database)
    dashboards_scenario.fill(store, dashboards_scenario.build(anchor))
    out: dict[str, Any] = {}
    for name, sql in json.load(sys.stdin):
        try:
            r = store.query(sql)
            out[name] = {"columns": list(r.column_names), "rows": plain(r.result_rows)}
        except Exception as e:  # noqa: BLE001 — reported per query by the test
            out[name] = str(e).splitlines()[0][:2000]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
