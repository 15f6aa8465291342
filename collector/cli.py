"""Command line of the collector: ``parallax-collector``."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Parallax collector: receives both lines of sight on one request — server spans over
OTLP/HTTP (from parallax-agent or any OpenTelemetry SDK) and browser beacons from js_probe —
stores them in ClickHouse, pairs them by trace id, and explains where the user's latency
diverges from the server's.

Store: one DSN from --store or PARALLAX_STORE, read by clickhouse-connect:
  chdb:///path            embedded (default: chdb in --data-dir; one process per directory)
  http(s)://user:pass@host:8123/db   a ClickHouse server (production)
"""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="parallax-collector",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    return ap


def main(argv: list[str] | None = None) -> int:
    _parser().parse_args(argv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
