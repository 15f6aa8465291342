"""agent.kernel.perf_close: calls that each wait run at once; one failing stops none of the
others; the final call runs after all of them. (The real closes: tests/agent/test_tls.py and
test_lifecycle.py stop agents with tracepoints and uprobes attached.)"""

from __future__ import annotations

import functools
import threading

from agent.kernel import perf_close


def test_calls_wait_together_and_a_failure_stops_none() -> None:
    n = 4
    # every call waits until all of them are running: only calls on threads of their own
    # get past it (one after another, the first would time out)
    all_in = threading.Barrier(n, timeout=5)
    done: list[str] = []

    def close(i: int) -> None:
        all_in.wait()
        if i == 2:
            raise OSError(f"close {i} failed")
        done.append(f"close {i}")

    def then() -> None:
        done.append("then")

    closing = perf_close.in_parallel([functools.partial(close, i) for i in range(n)], then)
    errors = closing.wait(10)
    assert not closing.is_alive()
    assert [str(e) for e in errors] == ["close 2 failed"]
    assert sorted(done[:-1]) == ["close 0", "close 1", "close 3"] and done[-1] == "then"


def test_nothing_to_close() -> None:
    ran: list[int] = []
    assert perf_close.in_parallel([], lambda: ran.append(1)).wait(5) == []
    assert ran == [1]
