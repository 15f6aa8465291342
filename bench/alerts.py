"""The alert lifecycle in a real Alertmanager, long: many scripted lifecycles, many steps
(tests/sla/lifecycle.py; the test runs 20 × 12). Counts the issue's violations (an alert
outliving its resolve, a severity that never fired, a traffic dip resolving an alert) and
times each round: one evaluation of every route, then the delivery until Alertmanager holds
its result — how long, in wall time, an alert can outlive its resolve.

    python -m bench.alerts [--lifecycles 200] [--steps 30] [--seed 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import clickhouse_connect

from tests import prom_tools
from tests.sla import lifecycle


def run(lifecycles: int, steps: int, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-alerts-") as tmp:
        d = Path(tmp)
        client: Any = clickhouse_connect.get_client(dsn=f"chdb://{d / 'chdb'}")
        scripts = [
            lifecycle.CANONICAL,
            *lifecycle.random_scripts(lifecycles - 1, steps, seed=seed),
        ]
        with lifecycle.alertmanager(d / "alertmanager") as (am, sink):
            lc = lifecycle.Lifecycles(client, "bench", am.url, scripts, seed=seed)
            reports = []
            try:
                for i in range(steps):
                    reports.append(lc.step(i, am))
                    print(
                        f"step {i + 1}/{steps}: evaluate {reports[-1].evaluate_s:.2f} s, "
                        f"deliver {reports[-1].deliver_s:.3f} s",
                        file=sys.stderr,
                    )
            finally:
                lc.close()
            violations = [v for r in reports for v in r.violations]
            violations += lc.check_notifications(sink, settle_s=10.0)
            notifications = len(sink.notifications)
    transitions: dict[str, int] = {}
    for r in reports:
        for t in r.transitions.values():
            transitions[t] = transitions.get(t, 0) + 1
    ev = [r.evaluate_s for r in reports]
    dl = [r.deliver_s for r in reports]
    return {
        "violations": violations,
        "transitions": transitions,
        "notifications": notifications,
        "evaluate_median_s": statistics.median(ev),
        "evaluate_max_s": max(ev),
        "deliver_median_s": statistics.median(dl),
        "deliver_max_s": max(dl),
    }


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.alerts", description=__doc__)
    ap.add_argument("--lifecycles", type=int, default=200)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    from bench import report

    try:
        r = run(args.lifecycles, args.steps, args.seed)
    except prom_tools.ToolMissingError as e:
        print(f"bench.alerts: {e}", file=sys.stderr)
        return 2
    t = r["transitions"]
    cmd = (
        "make bench-alerts"
        if (args.lifecycles, args.steps) == (200, 30)
        else f"python -m bench.alerts --lifecycles {args.lifecycles} --steps {args.steps}"
    )
    moves = ", ".join(
        f"{t.get(k, 0)} {words}"
        for k, words in (
            ("fire", "fire"),
            ("escalate", "escalate"),
            ("de-escalate", "de-escalate"),
            ("resolve", "resolve"),
            ("hold", "evaluations held firing for lack of data"),
        )
    )
    ev = f"median {r['evaluate_median_s']:.2f} s, max {r['evaluate_max_s']:.2f} s"
    dl = f"median {r['deliver_median_s'] * 1000:.0f} ms, max {r['deliver_max_s'] * 1000:.0f} ms"
    md = f"""## Alert lifecycle in a real Alertmanager (`{cmd}`)

{args.lifecycles} scripted lifecycles (one route each, the issue's canonical one and random
ones, seed {args.seed}) × {args.steps} evaluations of the real SLA service on a scripted
clock, notifying Debian's Alertmanager 0.25 (tests/sla/lifecycle.py): after every
evaluation, Alertmanager's active alerts against the rules — one alert per firing route,
with the severity that fired, saying "insufficient data" through a traffic dip, none after a
resolve —, and at the end every notification it sent (resolved ones included).

| | |
|---|---|
| violations | **{len(r["violations"])}** |
| transitions | {moves} |
| notifications from Alertmanager | {r["notifications"]:,} |
| one round: write the pairs and evaluate every route | {ev} |
| then until Alertmanager holds the round's result | {dl} |

The last line bounds, in wall time, how long an alert outlives its resolve (the evaluation
interval is 15 s).

Machine: {report.machine()} · commit {report.git_rev()} · command `{cmd}`
"""
    report.write_section("alerts", md)
    print(md)
    for v in r["violations"][:20]:
        print(v, file=sys.stderr)
    return 1 if r["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
