"""Command line of the collector: ``parallax-collector``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collector.config import Settings

DESCRIPTION = """\
Parallax collector: receives both lines of sight on one request — server spans over
OTLP/HTTP (from parallax-agent or any OpenTelemetry SDK) and browser beacons from js_probe —
stores them in ClickHouse, pairs them by trace id, and explains where the user's latency
diverges from the server's.

Store: one DSN from --store or PARALLAX_STORE, read by clickhouse-connect:
  chdb:///path            embedded (default: chdb in --data-dir; one process per directory)
  http(s)://user:pass@host:8123/db   a ClickHouse server (production)
  --cluster NAME (or PARALLAX_STORE_CLUSTER) with a server DSN: that server's cluster NAME
"""


def _site(value: str) -> tuple[str, list[str]]:
    key, sep, origins = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected KEY=ORIGIN[,ORIGIN…]")
    return key, [o.strip().rstrip("/") for o in origins.split(",") if o.strip()]


def _positive(value: str) -> float:
    v = float(value)
    if not v > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return v


def _add_serve(sub: Any) -> None:
    from collector.config import Settings  # noqa: PLC0415 — keep --help fast

    d = Settings()
    p = sub.add_parser(
        "serve",
        help="run the collector (ingest port + query port)",
        description="Ingest: POST /v1/traces (OTLP/HTTP), POST /v1/beacons, /healthz. "
        "Query: /v1/requests, /metrics, /readyz, /openapi.json (+ plugin routes).",
    )
    # in this order: the order of --help
    _add_places(p, d)
    _add_access(p)
    _add_ingest_limits(p, d)
    _add_writes(p, d)
    _add_pairing(p, d)
    p.add_argument(
        "--no-plugins", action="store_true", help="serve without plugins (e.g. the SLA checker)"
    )
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=_serve)


def _add_places(p: argparse.ArgumentParser, d: Settings) -> None:
    """Where it listens and where it keeps data: the two ports, the store, the data dir."""
    p.add_argument("--listen", default=d.listen, help="ingest address (public) [%(default)s]")
    p.add_argument(
        "--admin-listen", default=d.admin_listen, help="query address (private) [%(default)s]"
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--store", help="store DSN (default: $PARALLAX_STORE, else chdb in --data-dir)")
    p.add_argument(
        "--cluster",
        metavar="NAME",
        default=None,
        help="the server store is this ClickHouse cluster: tables created ON CLUSTER, "
        "replicated and sharded by trace id behind Distributed tables "
        "(env PARALLAX_STORE_CLUSTER; docs/store.md)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=d.data_dir,
        help="spool and embedded store directory [%(default)s]",
    )
    p.add_argument("--retention-days", type=int, default=d.retention_days)


def _add_access(p: argparse.ArgumentParser) -> None:
    """Who may send and read: the bearer tokens of the two ports, the beacon sites."""
    p.add_argument(
        "--otlp-token",
        default=os.environ.get("PARALLAX_OTLP_TOKEN"),
        help="require this bearer token on /v1/traces (env PARALLAX_OTLP_TOKEN)",
    )
    p.add_argument(
        "--api-token",
        default=os.environ.get("PARALLAX_API_TOKEN"),
        help="require this bearer token on the query port (env PARALLAX_API_TOKEN)",
    )
    p.add_argument(
        "--site",
        type=_site,
        action="append",
        default=[],
        metavar="KEY=ORIGIN[,ORIGIN]",
        help="a site key and its allowed origins (repeat); none = accept any",
    )


def _add_ingest_limits(p: argparse.ArgumentParser, d: Settings) -> None:
    """What one request and one client may cost the ingest port: sizes, times, connections,
    rate."""
    p.add_argument("--max-otlp-bytes", type=int, default=d.max_otlp_bytes)
    p.add_argument("--max-beacon-bytes", type=int, default=d.max_beacon_bytes)
    p.add_argument(
        "--max-header-bytes",
        type=int,
        default=d.max_header_bytes,
        help="ingest: request line + headers, beyond it 431 (at least 8192) [%(default)s]",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=d.header_timeout_s,
        help="ingest: seconds to send the headers, and to keep an idle connection [%(default)s]",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=d.body_timeout_s,
        help="ingest: seconds to send the body, beyond it 408 [%(default)s]",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        help="ingest: connections served at once (at most half the fd limit); more wait "
        "in the listen backlog [%(default)s]",
    )
    p.add_argument("--rate", type=float, default=d.rate_per_s, help="requests/s per client IP")
    p.add_argument("--burst", type=int, default=d.rate_burst)


def _add_writes(p: argparse.ArgumentParser, d: Settings) -> None:
    """How accepted rows reach the store: batches, and the spool that holds them until then."""
    p.add_argument("--batch-rows", type=int, default=d.batch_rows)
    p.add_argument("--flush-interval", type=float, default=d.flush_interval_s, help="seconds")
    p.add_argument("--spool-max-mb", type=int, default=d.spool_max_bytes >> 20)
    p.add_argument(
        "--spool-fsync", action="store_true", help="fsync every accepted request (power-loss safe)"
    )


def _add_pairing(p: argparse.ArgumentParser, d: Settings) -> None:
    """How often and how far back spans and browser entries are paired."""
    p.add_argument("--pairing-lookback", type=int, default=d.pairing_lookback_s, help="seconds")
    p.add_argument(
        "--pairing-interval",
        type=_positive,
        default=d.pairing_interval_s,
        help="seconds between pairing rounds; on a server store each round looks the "
        "one-sided traces up in the store (docs/store.md, capacity) [%(default)s]",
    )
    p.add_argument(
        "--coverage-interval",
        type=float,
        default=d.coverage_interval_s,
        help="seconds between pairing-coverage updates [%(default)s]",
    )


def _serve(args: argparse.Namespace) -> int:
    from collector.config import Settings  # noqa: PLC0415 — keep --help fast
    from collector.service import run  # noqa: PLC0415

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The driver logs every failed attempt; the collector says it once, in one line.
    for noisy in ("urllib3.connectionpool", "clickhouse_connect"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    settings = Settings(
        listen=args.listen,
        admin_listen=args.admin_listen,
        store=args.store,
        store_cluster=args.cluster,
        data_dir=args.data_dir,
        retention_days=args.retention_days,
        otlp_token=args.otlp_token or None,
        api_token=args.api_token or None,
        sites=dict(args.site),
        max_otlp_bytes=args.max_otlp_bytes,
        max_beacon_bytes=args.max_beacon_bytes,
        max_header_bytes=args.max_header_bytes,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_connections=args.max_connections,
        rate_per_s=args.rate,
        rate_burst=args.burst,
        batch_rows=args.batch_rows,
        flush_interval_s=args.flush_interval,
        spool_max_bytes=args.spool_max_mb << 20,
        spool_fsync=args.spool_fsync,
        pairing_lookback_s=args.pairing_lookback,
        pairing_interval_s=args.pairing_interval,
        coverage_interval_s=args.coverage_interval,
    )
    return run(settings, [] if args.no_plugins else None)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="parallax-collector",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(sub)
    # Plugins (collector/plugins.py) add their own subcommands, e.g. `sla`.
    from collector import plugins  # noqa: PLC0415 — plugins may import heavy modules

    plugins.add_cli(sub, plugins.load())
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        return 2
    try:
        return int(func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
