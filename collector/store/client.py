"""The store connection: one DSN, clickhouse-connect for every access (chDB or a server).

chDB allows one engine path per process and clients on that path share it; a server wants
one HTTP session per concurrent user. So each thread gets its own client (thread-local),
which is right for both.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import clickhouse_connect

from collector.store import native, schema
from collector.store.layout import check_cluster_name

DSN_ENV = "PARALLAX_STORE"
CLUSTER_ENV = "PARALLAX_STORE_CLUSTER"
# Every query and insert of a collector on a cluster store (docs/store.md, "A ClickHouse
# cluster"). Both settings exist under these names from 22.3 on.
CLUSTER_SETTINGS: dict[str, Any] = {
    # An insert into a Distributed table returns once every shard it touches has its rows
    # (on one replica), not once they are queued on the node the client reached: the spool
    # keeps the segment until then (its 200 stays a promise), and a collector looking for the
    # other side of a trace finds what another collector's insert returned. (Named
    # distributed_foreground_insert since 23.x, this name kept as its alias.)
    "insert_distributed_sync": 1,
    # A subquery over a Distributed table inside a query over another one (the pairer's
    # sweep, the pairing coverage) reads each shard's local table on that shard: correct,
    # because every table pairing reads is sharded by trace id (a trace's spans, entries and
    # pairs are on one shard). The default, 'deny', refuses such queries.
    "distributed_product_mode": "local",
}


def chdb_dsn(data_dir: Path) -> str:
    return f"chdb://{(data_dir / 'chdb').resolve()}"


class StoreInUseError(Exception):
    """Another process holds the embedded store's directory (chDB: one process per path)."""


def check_embedded_free(dsn: str) -> None:
    """Raise StoreInUseError, naming the path and the holder's pid, when another process has
    the embedded store at ``dsn`` open — chDB's own error is a raw two-line engine message.
    ClickHouse holds an flock on ``<path>/status`` while it runs and writes its pid there.
    Call it before this process opens the path (its own engine's lock would count too)."""
    if not dsn.startswith("chdb:"):
        return
    status = Path(urlparse(dsn).path) / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except OSError:
        return  # never opened: nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = next((ln.split(":", 1)[1].strip() for ln in _lines(fd) if ln.startswith("PID:")), "?")
        if pid == str(os.getpid()):
            return  # this process's own engine (an embedded collector restarted in a test)
        raise StoreInUseError(
            f"{status.parent} is in use by process {pid} (the embedded store opens in one "
            "process at a time)"
        ) from None
    finally:
        os.close(fd)  # closing the descriptor releases a lock taken here


def _lines(fd: int) -> list[str]:
    with contextlib.suppress(OSError):
        return os.pread(fd, 4096, 0).decode(errors="replace").splitlines()
    return []


def database_of(dsn: str) -> str:
    """The DSN's database for a server (``http://h:8123/db``), else ``parallax``."""
    u = urlparse(dsn)
    if u.scheme in ("http", "https") and u.path.strip("/"):
        return schema.check_database_name(unquote(u.path.strip("/").split("/")[0]))
    return schema.DEFAULT_DATABASE


def redact(dsn: str) -> str:
    """The DSN without its password, for logs."""
    u = urlparse(dsn)
    if u.password:
        netloc = f"{u.username}:***@{u.hostname}" + (f":{u.port}" if u.port else "")
        return u._replace(netloc=netloc).geturl()
    return dsn


class Store:
    """Thread-safe access to the store for one DSN (a client per thread)."""

    def __init__(
        self,
        dsn: str,
        connect_timeout_s: float = 3.0,
        send_timeout_s: float = 30.0,
        cluster: str | None = None,
    ):
        self.dsn = dsn
        self.database = database_of(dsn)
        # The ClickHouse cluster the store is (migrations ON CLUSTER, CLUSTER_SETTINGS), or
        # None: one server (or the embedded store).
        self.cluster = check_cluster_name(cluster) if cluster else None
        self.is_embedded = dsn.startswith("chdb:")
        self._timeouts = (connect_timeout_s, send_timeout_s)
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        if self.is_embedded:
            Path(urlparse(dsn).path).mkdir(parents=True, exist_ok=True)

    def client(self) -> Any:
        c = getattr(self._local, "client", None)
        if c is None:
            kw: dict[str, Any] = {}
            if not self.is_embedded:
                kw = {
                    "connect_timeout": self._timeouts[0],
                    "send_receive_timeout": self._timeouts[1],
                    "autogenerate_session_id": False,
                    "database": "default",
                }
            if self.cluster:
                kw["settings"] = dict(CLUSTER_SETTINGS)
            c = clickhouse_connect.get_client(dsn=self.dsn, **kw)
            self._local.client = c
            with self._lock:
                self._all.append(c)
        return c

    def reset(self) -> None:
        """Forget this thread's client (after a connection error, reconnect next time)."""
        c = getattr(self._local, "client", None)
        self._local.client = None
        if c is not None:
            with contextlib.suppress(Exception):  # a broken client may fail to close
                c.close()

    def migrate(self, retention_days: int) -> list[int]:
        return schema.migrate(self.client(), self.database, retention_days, self.cluster)

    def insert(
        self,
        table: str,
        columns: Sequence[Sequence[Any]],
        column_names: Sequence[str],
        token: str | None = None,
    ) -> None:
        """Column-oriented insert; ``token`` makes a repeat of the same batch a no-op."""
        # Our own list (emptied by _insert on the driver's path): the caller's stays intact.
        self._insert(table, list(columns), column_names, token, by_rows=False)

    def insert_rows(
        self,
        table: str,
        rows: Sequence[tuple[Any, ...]],
        column_names: Sequence[str],
        token: str | None = None,
    ) -> None:
        """The same from row tuples: the compiled encoder reads them as they are; only the
        driver's path (the fallback) needs them transposed into columns."""
        self._insert(table, list(rows), column_names, token, by_rows=True)

    def _insert(
        self,
        table: str,
        data: list[Any],
        column_names: Sequence[str],
        token: str | None,
        by_rows: bool,
    ) -> None:
        settings = {"insert_deduplication_token": token} if token else None
        # The compiled encoder (native.py) when it models every value; else the driver,
        # the reference, whose own DataError/TypeError for a bad value the writer's
        # bisection relies on (pipeline.is_permanent).
        block = native.encode(table, column_names, data, by_rows)
        if block is not None:
            self.client().raw_insert(
                f"{self.database}.{table}",
                list(column_names),
                insert_block=block,
                settings=settings,
                fmt="Native",
            )
            return
        if by_rows:
            data = list(zip(*data, strict=True))
        try:
            self.client().insert(
                f"{self.database}.{table}",
                data,
                column_names=list(column_names),
                column_oriented=True,
                settings=settings,
            )
        finally:
            # The driver's insert context keeps a bound method of itself (a reference
            # cycle), so it — and through it every value of the batch — lives until the
            # cyclic GC finds it: ~3 container objects per row scanned and freed by the GC
            # instead of by reference counting (docs/collector.md, Performance). Emptying
            # the one list it holds frees the batch now.
            data.clear()

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        return self.client().query(sql, parameters=parameters)

    def rows(self, sql: str, parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        r = self.query(sql, parameters)
        names = r.column_names
        return [dict(zip(names, row, strict=True)) for row in r.result_rows]

    def ping(self) -> bool:
        try:
            self.query("SELECT 1")
            return True
        except Exception:  # noqa: BLE001 — any failure means "not ready"
            self.reset()
            return False

    def close(self) -> None:
        with self._lock:
            for c in self._all:
                with contextlib.suppress(Exception):  # best effort at shutdown
                    c.close()
            self._all.clear()
