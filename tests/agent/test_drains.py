"""The main loop's drain period (agent.run.next_drain): it follows the event rate."""

from __future__ import annotations

import pytest

from agent.run import BUSY_FILL, DRAIN_EVENTS, IDLE_DRAINS, next_drain

P = 0.05  # drain_ms


@pytest.mark.parametrize(
    ("events_per_s", "wait"),
    [
        (0, IDLE_DRAINS * P),  # idle: the longest wait
        (1_650, IDLE_DRAINS * P),  # 150 streams/s of 11 events: 1,024 due after 0.62 s
        (DRAIN_EVENTS / 0.1, 0.1),  # 1,024 due in 100 ms
        (50_000, P),  # more than the Python path takes: the shortest
    ],
)
def test_the_wait_is_that_of_drain_events_at_the_last_rate(
    events_per_s: float, wait: float
) -> None:
    for dt in (P, 0.1, IDLE_DRAINS * P):  # whatever the last wait was
        n = round(events_per_s * dt)
        assert next_drain(n, dt, 0.0, P) == pytest.approx(wait, rel=0.01), (n, dt)


def test_a_filling_ring_is_drained_at_the_shortest_period() -> None:
    assert next_drain(10, IDLE_DRAINS * P, BUSY_FILL * 1.01, P) == P
    assert next_drain(10, IDLE_DRAINS * P, BUSY_FILL * 0.99, P) == IDLE_DRAINS * P
    assert next_drain(10, IDLE_DRAINS * P, None, P) == IDLE_DRAINS * P  # (bcc's reader)
