"""The collector's settings, one dataclass (filled by the CLI or by tests)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from collector.store.client import CLUSTER_ENV, DSN_ENV, chdb_dsn
from collector.store.layout import check_cluster_name
from collector.store.schema import DEFAULT_RETENTION_DAYS


def split_hostport(value: str, default_host: str) -> tuple[str, int]:
    """'0.0.0.0:4318', ':4318' or '4318' → (host, port); ValueError saying why if not."""
    host, _, port = value.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{value!r} is not HOST:PORT with a port from 0 to 65535")
    return (host.strip("[]") or default_host), int(port)


@dataclass(slots=True)
class Settings:
    listen: str = "0.0.0.0:4318"
    admin_listen: str = "127.0.0.1:4319"
    store: str | None = None  # DSN; None = chdb in data_dir
    # --cluster: the ClickHouse cluster the store is; None = $PARALLAX_STORE_CLUSTER, else
    # one server (docs/store.md, "A ClickHouse cluster")
    store_cluster: str | None = None
    data_dir: Path = field(default_factory=lambda: Path("./.parallax/data"))
    retention_days: int = DEFAULT_RETENTION_DAYS
    otlp_token: str | None = None
    api_token: str | None = None
    # site key → allowed origins; empty = accept any key and origin (said once at start)
    sites: dict[str, list[str]] = field(default_factory=dict)
    max_otlp_bytes: int = 1 << 20
    max_beacon_bytes: int = 64 << 10
    # The edge (docs/collector.md, "Limits at the edge"): request line + headers, the time
    # to send them (also how long an idle keep-alive connection is kept), the time to send
    # the body, and connections served at once (kept below the fd limit).
    max_header_bytes: int = 32 << 10
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096
    rate_per_s: float = 50.0
    rate_burst: int = 100
    batch_rows: int = 20_000
    flush_interval_s: float = 1.0
    spool_max_bytes: int = 1 << 30
    spool_fsync: bool = False
    pairing_lookback_s: int = 900
    pairing_interval_s: float = 0.5
    pairing_recheck_s: float = 5.0
    coverage_interval_s: float = 30.0

    @property
    def spool_dir(self) -> Path:
        return self.data_dir / "spool"

    def store_dsn(self) -> str:
        return self.store or os.environ.get(DSN_ENV) or chdb_dsn(self.data_dir)

    def cluster(self) -> str | None:
        return self.store_cluster or os.environ.get(CLUSTER_ENV) or None

    def store_error(self) -> str | None:
        """Why the store settings cannot be served as given, or None."""
        name = self.cluster()
        if name is None:
            return None
        try:
            check_cluster_name(name)
        except ValueError as e:
            return f"--cluster: {e}"
        if self.store_dsn().startswith("chdb:"):
            return (
                f"--cluster {name}: a cluster is a ClickHouse server store "
                "(--store / PARALLAX_STORE http(s)://…); the embedded store is one process"
            )
        return None
