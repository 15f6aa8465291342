"""Fault injection for tests/agent/test_resilience.py: imported at interpreter start-up only
where that test puts this directory on PYTHONPATH and sets PARALLAX_TEST_FAULT_DIR (never in
the product). It makes the real agent meet errors nothing in it anticipates:

* a read whose bytes contain ``/boom`` makes the cutter raise (a message quoting a cookie,
  which must never reach the log);
* once the file ``fail-loop`` exists in that directory, the main loop's once-a-second rescan
  raises.
"""

from __future__ import annotations

import os
from typing import Any

_DIR = os.environ.get("PARALLAX_TEST_FAULT_DIR")

if _DIR:
    from agent.identity import processes
    from agent.protocols import http1

    _on_read = http1.Conn.on_read
    _rescan = processes.Processes.rescan

    def on_read(self: http1.Conn, t: int, n: int, data: bytes, *rest: Any) -> Any:
        if b"/boom" in data:
            raise ValueError("bad header value: Cookie: s3cret-cookie")
        return _on_read(self, t, n, data, *rest)

    def rescan(self: processes.Processes, counters: dict[str, int]) -> None:
        if os.path.exists(os.path.join(str(_DIR), "fail-loop")):
            raise RuntimeError("injected failure of the main loop")
        _rescan(self, counters)

    http1.Conn.on_read = on_read  # type: ignore[method-assign,assignment]
    processes.Processes.rescan = rescan  # type: ignore[method-assign]
