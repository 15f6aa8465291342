"""The alert lifecycle in a real Alertmanager (Debian's 0.25, its v2 API): 20 scripted
lifecycles — fire, escalate, de-escalate, resolve, traffic dips — through the real SLA
service (tests/sla/lifecycle.py); after every evaluation, what Alertmanager shows.

Done when: no alert outlives its resolve (checked right after the resolving evaluation, so
by less than one interval), no severity appears that never fired (in Alertmanager's active
alerts and in every notification it sends, resolved ones included), and a traffic dip
leaves the alert firing, saying "insufficient data". Long runs: ``make bench-alerts``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import prom_tools
from tests.sla import lifecycle

LIFECYCLES, STEPS = 20, 12


@pytest.fixture
def am(tmp_path: Path) -> Any:
    try:
        prom_tools.tool("prometheus-alertmanager")
    except prom_tools.ToolMissingError as e:
        pytest.fail(str(e))
    with lifecycle.alertmanager(tmp_path / "alertmanager") as pair:
        yield pair


def test_twenty_scripted_lifecycles_in_a_real_alertmanager(
    chdb_store: tuple[Any, Path], am: tuple[prom_tools.Alertmanager, lifecycle.Sink]
) -> None:
    manager, sink = am
    scripts = [lifecycle.CANONICAL, *lifecycle.random_scripts(LIFECYCLES - 1, STEPS, seed=29)]
    run = lifecycle.Lifecycles(chdb_store[0], "am_lifecycles", manager.url, scripts)
    violations: list[str] = []
    seen: dict[str, int] = {}
    canonical: list[str] = []
    try:
        for i in range(STEPS):
            rep = run.step(i, manager)
            violations += rep.violations
            for t in rep.transitions.values():
                seen[t] = seen.get(t, 0) + 1
            canonical.append(rep.transitions["/lc/000"])
    finally:
        run.close()
    violations += run.check_notifications(sink)
    assert not violations, "\n".join(violations[:20]) + "\n" + manager.tail()
    # the canonical script, step by step, as the issue lists it
    assert canonical == [
        "pending", "fire", "escalate", "hold", "hold", "de-escalate", "resolve",
        "pending", "quiet", "pending", "fire", "resolve",
    ]  # fmt: skip
    # the scripts exercised every transition, several times: the checks above were not idle
    for t in ("fire", "escalate", "de-escalate", "resolve", "hold"):
        assert seen.get(t, 0) >= 3, (t, seen)
    assert len(sink.notifications) >= 20


def test_resolve_carries_the_label_set_that_fired(
    chdb_store: tuple[Any, Path], am: tuple[prom_tools.Alertmanager, lifecycle.Sink]
) -> None:
    """A warning that resolves is resolved as a warning: the same labels from first firing
    to resolve, and the resolve's annotations are the window that resolved it."""
    manager, sink = am
    run = lifecycle.Lifecycles(
        chdb_store[0], "am_warning", manager.url, [["warning", "warning", "ok"]], seed=3
    )
    try:
        for i in range(3):
            assert not run.step(i, manager).violations
    finally:
        run.close()
    sent = [
        a
        for n in sink.notifications
        for a in n["alerts"]
        if a["labels"]["route"] == "/lc/000" and a["labels"]["service"] == lifecycle.SERVICE
    ]
    assert {(a["labels"]["severity"], a["status"]) for a in sent} <= {
        ("warning", "firing"),
        ("warning", "resolved"),
    }
    assert not run.check_notifications(sink)
