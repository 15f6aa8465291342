"""``parallax-collector sla --once``: one evaluation now, printed; exit 0/1/2.

Exit 0 when no route is ``out_of_band``, 1 when any is, 2 on error (one line on stderr).
``--json`` prints the document of docs/sla.md (the same as ``GET /v1/sla``). ``for`` does
not apply to a single evaluation; the alert state stored by the running evaluator is shown
beside each verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from math import ceil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.sla.config import ConfigError, SlaConfig, load, locate, parse_duration

if TYPE_CHECKING:
    from collector.store.client import Store


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sla",
        help="evaluate the user-vs-server SLA now and print the verdicts",
        description=(
            "Evaluate the user-vs-server SLA now (one evaluation; `for` does not apply) and "
            "print the verdicts with the stored alert state. Exit 0 when no route is "
            "out_of_band, 1 when any is, 2 on error. --json prints the document of "
            "docs/sla.md (the same as GET /v1/sla)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--once", action="store_true", help="evaluate once and exit (required)")
    p.add_argument("--json", action="store_true", help="print the JSON document")
    p.add_argument("--window", default=None, help="window, e.g. 5m (default: config, else 5m)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--store", default=None, help="store DSN (chdb:///path or http(s)://…)")
    g.add_argument("--data-dir", default=None, help="a stopped collector's data directory")
    p.add_argument(
        "--cluster",
        default=None,
        metavar="NAME",
        help="the store is this ClickHouse cluster, as for serve (env PARALLAX_STORE_CLUSTER)",
    )
    p.add_argument(
        "--config",
        default=None,
        help="SLA config file, YAML or TOML (default: $PARALLAX_SLA_CONFIG, else sla.yaml "
        "in --data-dir)",
    )
    p.set_defaults(func=run)


def _text(doc: dict[str, Any]) -> str:
    lines = [f"window {doc['window']['start']} … {doc['window']['end']}"]
    for r in doc["routes"]:
        lines.append(f"{r['route']} ({r['service']}): {r['verdict']}")
        if r["sampling"].get("sentence"):  # the share of requests the agent traced
            lines.append(f"  {r['sampling']['sentence']}")
        if r["server"].get("sentence"):  # the server-time split and the GPU findings
            lines.append(f"  {r['server']['sentence']}")
        for name, m in r["metrics"].items():
            div = "?" if m["divergence_ms"] is None else f"{m['divergence_ms']:+.1f} ms"
            lo = "−∞" if m["ci_low_ms"] is None else f"{m['ci_low_ms']:+.1f}"
            hi = "+∞" if m["ci_high_ms"] is None else f"{m['ci_high_ms']:+.1f}"
            n = f"n={m['n']}" + (f" (n_eff={m['n_eff']})" if m["n_eff"] < m["n"] else "")
            lines.append(
                f"  {name:<13} {m['verdict']:<17} {div:>11}  CI {lo}…{hi}  {n}  "
                f"alert {m['alert_state']}"
            )
            if m["verdict"] == "out_of_band":
                lines.append(f"    {m['sentence']}")
    return "\n".join(lines)


def _utc(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def quiet_hint(
    window: timedelta, start: datetime, end: datetime, pairs: int, newest: datetime | None
) -> str:
    """One line for a window without a paired request: what the window holds, and what the
    store holds beyond it (a `--window` that reaches its newest pair)."""
    mins = window.total_seconds() / 60
    held = f"the last {mins:g} min: {_utc(start)} … {_utc(end)}"
    head = f"no paired requests in the window ({held})"
    if not pairs or newest is None:
        return (
            f"{head}, and none in the store: are the agent and the browser probe sending to "
            "this collector?"
        )
    if newest >= start:  # pairs in the window, none with both sides of a metric measured
        return (
            f"{head} with both sides of a metric measured; the store holds {pairs:,} pairs, "
            f"the newest from {_utc(newest)}"
        )
    age = (end - newest).total_seconds()
    reach = f"{ceil(age / 60) + 1}m" if age < 2 * 3600 else f"{ceil(age / 3600)}h"
    return (
        f"{head}; the store's newest pair is from {_utc(newest)}, {_age(age)} before its end "
        f"({pairs:,} pairs in all): widen the window to reach it, e.g. --window {reach}"
    )


def _age(s: float) -> str:
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.0f} h" if s < 2 * 86400 else f"{s / 86400:.0f} days"


def _store_pairs(store: Any, db: str) -> tuple[int, datetime | None]:
    rows = store.rows(f"SELECT count() AS n, max(time) AS newest FROM {db}.pairs")  # noqa: S608
    n = int(rows[0]["n"]) if rows else 0
    newest = rows[0]["newest"] if n else None
    if newest is not None and newest.tzinfo is None:
        newest = newest.replace(tzinfo=UTC)
    return n, newest


class _RefusedError(Exception):
    """Why the evaluation cannot run: one line on stderr after ``sla: ``, exit 2."""


def run(args: argparse.Namespace) -> int:
    if not args.once:
        print("sla: only --once is supported here; `serve` runs the evaluator", file=sys.stderr)
        return 2
    try:
        cfg, window = _config(args)
        dsn = _dsn(args)
        doc, hint, out_of_band = _evaluate(dsn, args.cluster, cfg, window)
    except _RefusedError as e:
        print(f"sla: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(doc, indent=2, ensure_ascii=False))
        if hint:  # stdout stays the document
            print(f"sla: {hint}", file=sys.stderr)
    else:
        print(_text(doc) + (f"\n{hint}" if hint else ""))
    return 1 if out_of_band else 0


def _config(args: argparse.Namespace) -> tuple[SlaConfig, timedelta]:
    """The SLA config (--config, else found beside the data) and the window to evaluate."""
    try:
        path = locate(args.config, args.data_dir)
        cfg = load(path) if path else SlaConfig()
        window = (
            timedelta(seconds=parse_duration(args.window, "--window"))
            if args.window
            else timedelta(seconds=cfg.window_s)
        )
    except ConfigError as e:
        raise _RefusedError(str(e)) from None
    return cfg, window


def _dsn(args: argparse.Namespace) -> str:
    """The store: --store, else --data-dir's embedded one, else $PARALLAX_STORE, else
    ./.parallax/data's; an embedded store a running collector holds is refused."""
    # imported here: the store stack is heavy and `--help` should stay fast
    from collector.store.client import (  # noqa: PLC0415
        DSN_ENV,
        StoreInUseError,
        chdb_dsn,
        check_embedded_free,
    )

    if args.store:
        dsn: str = args.store
    elif args.data_dir:
        d = Path(args.data_dir)
        if not d.is_dir():
            raise _RefusedError(f"{d}: no such directory")
        dsn = chdb_dsn(d)
    else:
        dsn = os.environ.get(DSN_ENV) or chdb_dsn(Path("./.parallax/data"))
    try:
        check_embedded_free(dsn)
    except StoreInUseError as e:
        raise _RefusedError(
            f"{e}: read the running collector's GET /v1/sla (its query port), or stop it "
            "and run this again"
        ) from None
    return dsn


def _evaluate(
    dsn: str, cluster: str | None, cfg: SlaConfig, window: timedelta
) -> tuple[dict[str, Any], str | None, bool]:
    """(the evaluation's document, a hint when it found no route, whether any route is
    out of band); any failure is one line."""
    from collector.sla import alerts as alerts_mod  # noqa: PLC0415
    from collector.sla.evaluate import evaluate  # noqa: PLC0415
    from collector.sla.service import utcnow  # noqa: PLC0415
    from collector.sla.source import SlaSource  # noqa: PLC0415

    try:
        store = _open_store(dsn, cluster)
        db = store.database
        source = SlaSource(store.client, db, cluster=store.cluster)
        source.ensure_schema()
        states = alerts_mod.Alerts(cfg)
        states.load(alerts_mod.load_states(store.client, db))
        ev = evaluate(source, cfg, utcnow(), window, states.state_of)
        doc = ev.to_json()
        hint = None
        if not doc["routes"]:
            w = doc["window"]
            start, end = datetime.fromisoformat(w["start"]), datetime.fromisoformat(w["end"])
            hint = quiet_hint(window, start, end, *_store_pairs(store, db))
    except _RefusedError:
        raise
    except Exception as e:  # noqa: BLE001 — one clear line, no traceback
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _RefusedError(msg) from None
    return doc, hint, ev.any_out_of_band


def _open_store(dsn: str, cluster: str | None) -> Store:
    """The store, when it is a Parallax store this version can read without migrating it."""
    from collector.store.client import CLUSTER_ENV, Store  # noqa: PLC0415

    store = Store(dsn, cluster=cluster or os.environ.get(CLUSTER_ENV) or None)
    db = store.database
    have = store.rows(
        "SELECT count() AS c FROM system.tables WHERE database = {db:String} AND name = 'pairs'",
        {"db": db},
    )
    if not have or not have[0]["c"]:
        raise _RefusedError(f"{dsn}: no {db}.pairs table (not a Parallax store?)")
    weighted = store.rows(
        "SELECT count() AS c FROM system.columns WHERE database = {db:String} "
        "AND table = 'pairs' AND name = 'sample_th'",
        {"db": db},
    )
    if not weighted or not weighted[0]["c"]:
        # migrating here would also reset the retention the collector was started with
        raise _RefusedError(
            f"{dsn}: the store was made by an earlier version; start "
            "`parallax-collector serve` on it once to migrate it"
        )
    return store
