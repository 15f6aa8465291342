"""The running collector: store, spool pipeline, pairer, and the two HTTP apps.

Start-up: the spool left by a previous run is queued first (replayed in order), then the
ingest port opens. The store is migrated in the background, retried until it answers: while
it is unreachable ingest keeps accepting into the spool and /readyz says why it is not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.log import LogLevels
from granian.server.embed import Server as EdgeServer

from collector.api.ingest import Ingest, IngestApp, build_ingest_app
from collector.api.query import build_query_app
from collector.config import Settings, split_hostport
from collector.ingest import otlp
from collector.metrics import Metrics
from collector.pairing import rules
from collector.pairing.pairer import Pairer
from collector.pipeline import ENTRIES, SPANS, Pipeline, SpoolLockedError
from collector.plugins import Context, Plugin
from collector.plugins import load as load_plugins
from collector.store import native
from collector.store.client import Store, StoreInUseError, check_embedded_free, redact

log = logging.getLogger("parallax.collector")
GC_THRESHOLD0 = 50_000  # allocations between young-generation collections (default 700)
GC_EVERY_S = 30.0  # the cyclic GC runs on a timer, not by allocation counts: see start()
# The event loop releases the GIL at every socket and spool write and must win it back from
# the writer and pairer threads, which hold it for up to a switch interval (default 5 ms)
# each time: at saturation that wait, not the CPU, bounded the ingest rate. Measured at
# 60,000 rows/s offered, alternating: 34,300 / 36,800 rows/s delivered at 5 ms,
# 41,400 / 50,600 at 0.5 ms.
GIL_SWITCH_INTERVAL_S = 0.0005
# hyper refuses a smaller read buffer (and the header limit is that buffer).
MIN_HEADER_BYTES = 8192
# Completed handshakes the kernel queues while the ingest server is at its connection limit
# (beyond it new connections are refused by the kernel; clients retry).
LISTEN_BACKLOG = 1024


class StartupError(Exception):
    """The collector cannot start; the message is the one line the CLI prints."""


class _Hooks(Metrics):
    """Metrics plus the pipeline → pairer link."""

    pairer: Pairer | None = None

    def rows_written(self, rows: dict[str, list[tuple[Any, ...]]]) -> None:
        if self.pairer is not None:
            self.pairer.offer(rows[SPANS], rows[ENTRIES])


class Collector:
    def __init__(self, settings: Settings, plugins: Sequence[Plugin] | None = None):
        self.settings = settings
        self.plugins = list(load_plugins() if plugins is None else plugins)
        self.metrics = _Hooks()
        self.dsn = settings.store_dsn()
        self.store = Store(self.dsn, cluster=settings.cluster())
        self.ingest = Ingest(settings, self.metrics)
        self.pipeline = Pipeline(
            self.store,
            settings.spool_dir,
            self.ingest.parse,
            self.metrics,
            batch_rows=settings.batch_rows,
            flush_interval_s=settings.flush_interval_s,
            spool_max_bytes=settings.spool_max_bytes,
            fsync=settings.spool_fsync,
        )
        self.ingest.pipeline = self.pipeline
        self.pairer = Pairer(
            self.store,
            self.metrics,
            lookback_s=settings.pairing_lookback_s,
            interval_s=settings.pairing_interval_s,
            recheck_s=settings.pairing_recheck_s,
            coverage_interval_s=settings.coverage_interval_s,
        )
        self.metrics.pairer = self.pairer
        self.max_connections = connection_limit(settings.max_connections)
        self.migrate_error = "store not migrated yet"
        self._stop = threading.Event()
        self.ctx = Context(settings, self.store, self.metrics.registry)
        self.migrated = self.ctx.migrated
        self.ingest_app: IngestApp = build_ingest_app(settings, self.ingest, self.pipeline)
        self.query_app: FastAPI = build_query_app(
            self.ctx, self.plugins, self.ready, self.refresh_metrics
        )

    # --- state -------------------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        if not self.migrated.is_set():
            return False, self.migrate_error
        if self.pipeline.last_error:
            return False, f"store writes failing: {self.pipeline.last_error}"
        return True, "ready"

    def refresh_metrics(self) -> None:
        m = self.metrics
        m.queue_rows.set(self.pipeline.pending_rows)
        m.queue_segments.set(self.pipeline.queue_segments())
        m.spool_bytes.set(self.pipeline.spool_bytes)
        m.spool_disk_full.set(1 if self.pipeline.disk.full else 0)
        m.ingest_connection_limit.set(self.max_connections)
        port = split_hostport(self.settings.listen, "0.0.0.0")[1]  # noqa: S104
        in_use, waiting = ingest_connections(port)
        m.ingest_connections.labels("open").set(max(0, in_use - waiting))
        m.ingest_connections.labels("waiting").set(waiting)

    # --- life cycle --------------------------------------------------------------
    def start(self) -> None:
        s = self.settings
        log.info("store: %s (database %s)", redact(self.dsn), self.store.database)
        log.info("%s; %s; %s", otlp.DECODER, native.describe(), rules.DERIVATION)
        if not s.sites:
            log.warning("no site configured: beacons from any site key and any origin are accepted")
        # The collector keeps many live objects (queued rows, the pairer's recent traces),
        # and its garbage is almost never cyclic (reference counting frees it): a cyclic
        # collection mostly rescans rows that are still alive. With the default thresholds
        # that was about a third of the pairing CPU; a young collection each second still
        # scanned every row once while the pairer held it (35–110 ms per second at 25,000
        # rows/s). So: the start-up objects (modules, apps) are left out of every scan, and
        # one full collection runs every GC_EVERY_S. A row that lives less than that is
        # freed by its reference count and never scanned; the cost per collection is the
        # live set, bounded by the pairer's memory (≈ 0.25–0.5 s at 25,000 rows/s); cyclic
        # garbage waits at most GC_EVERY_S (measured: under 1,000 objects per collection).
        gc.collect()
        gc.freeze()
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        gc.set_threshold(GC_THRESHOLD0, 20, 10)
        gc.disable()
        threading.Thread(target=self._gc_loop, name="parallax-gc", daemon=True).start()
        self.pipeline.start()
        if self.store.is_embedded:
            # chDB: one process per directory; say so now rather than retry forever.
            try:
                check_embedded_free(self.dsn)
            except StoreInUseError as e:
                msg = f"{e}: stop it, or give this collector another --data-dir or --store"
                raise StartupError(msg) from None
            try:
                self.store.client()
            except Exception as e:  # noqa: BLE001 — reported as one line by the CLI
                msg = f"cannot open the embedded store: {str(e).splitlines()[0]}"
                raise StartupError(msg) from None
        threading.Thread(target=self._migrate_loop, name="parallax-migrate", daemon=True).start()

    def _gc_loop(self) -> None:
        while not self._stop.wait(GC_EVERY_S):
            gc.collect()

    def _migrate_loop(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            try:
                applied = self.store.migrate(self.settings.retention_days)
            except Exception as e:  # noqa: BLE001 — unreachable store: retry, say why once
                msg = f"store unreachable: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                if msg != self.migrate_error:
                    log.warning("%s (retrying)", msg)
                self.migrate_error = msg
                self.store.reset()
                self._stop.wait(delay)
                delay = min(5.0, delay * 2)
                continue
            if applied:
                log.info("store: applied migration(s) %s", applied)
            self.migrated.set()
            break
        if self.migrated.is_set():
            try:
                # What the store holds now; rows written from here on are added as written.
                self.pairer.load_index()
            except Exception as e:  # noqa: BLE001 — the index stays "maybe": store lookups
                log.warning("pairing: trace index not loaded: %s", str(e).splitlines()[0][:200])
            with contextlib.suppress(Exception):
                n = self.pairer.sweep()
                if n:
                    log.info("pairing: %d trace(s) of the look-back window to (re)pair", n)
            self.pairer.start()

    def stop(self, drain_s: float = 10.0) -> None:
        self._stop.set()
        drained = self.pipeline.stop(drain_s)
        if not drained:
            log.warning("store not drained at shutdown: the spool keeps the rest for next start")
        self.pairer.stop()
        self.store.close()
        gc.enable()  # an embedded collector (tests) leaves its host process as it found it


def connection_limit(wanted: int) -> int:
    """The ingest connection limit: ``wanted``, at most half the file-descriptor limit (the
    rest for the store's files, the spool, the query port). The soft fd limit is first
    raised to the hard one, as nginx and Go programs do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    cap = wanted if soft == resource.RLIM_INFINITY else min(wanted, soft // 2)
    if cap < wanted:
        log.warning("ingest: at most %d connections, half the fd limit (%d)", cap, soft)
    return max(1, cap)


_TCP_ESTABLISHED, _TCP_CLOSE_WAIT, _TCP_LISTEN = "01", "08", "0A"


def ingest_connections(port: int) -> tuple[int, int]:
    """(TCP connections to ``port`` holding a socket: established or closing; those of them
    still in the listener's accept queue), read from this network namespace's socket tables.
    The server's own count is not reachable from Python: its accept loop is in Rust."""
    in_use = waiting = 0
    local = f":{port:04X}"
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/self/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split(None, 5)
            if len(f) < 5 or not f[1].endswith(local):
                continue
            if f[3] == _TCP_LISTEN:
                waiting += int(f[4].rsplit(":", 1)[1], 16)  # rx_queue: the accept queue
            elif f[3] in (_TCP_ESTABLISHED, _TCP_CLOSE_WAIT):
                in_use += 1
    return in_use, waiting


class _Server(uvicorn.Server):
    """Two servers share one loop; the collector handles the signals itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _edge_server(collector: Collector) -> EdgeServer:
    """The public ingest port: granian (hyper, in Rust) bounds what a client may hold — the
    head's size (431 beyond it), the time to send it (the same timer closes an idle
    keep-alive connection), the connections served at once (more wait in the kernel's
    listen backlog, using no descriptor of ours). uvicorn has none of these but the idle
    timeout (docs/collector.md, "Limits at the edge")."""
    s = collector.settings
    host, port = split_hostport(s.listen, "0.0.0.0")  # noqa: S104 — public by design
    srv = EdgeServer(
        collector.ingest_app,
        address=host,
        port=port,
        interface=Interfaces.ASGINL,  # IngestApp has no start-up work
        http=HTTPModes.http1,
        websockets=False,
        backlog=LISTEN_BACKLOG,
        backpressure=collector.max_connections,
        http1_settings=HTTP1Settings(
            header_read_timeout=max(1, round(s.header_timeout_s * 1000)),
            keep_alive=True,
            max_buffer_size=s.max_header_bytes,
        ),
        # Its own lines go through the collector's handlers; its start-up banner (and the
        # "embedded server is experimental" notice) stay out of the log.
        log_level=LogLevels.error,
        log_dictconfig={
            "loggers": {
                "_granian": {"propagate": True},
                "granian.access": {"propagate": False, "level": "CRITICAL"},
            }
        },
    )
    srv.workers_kill_timeout = 5  # graceful stop: in-flight requests get 5 s
    return srv


def _listen(address: str, default_host: str, flag: str) -> socket.socket | None:
    """A listening socket on ``address`` (SO_REUSEADDR, as uvicorn and granian bind), or
    None with the one line that says why not."""
    try:
        host, port = split_hostport(address, default_host)
        family, _, _, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        return socket.create_server(addr, family=family, backlog=LISTEN_BACKLOG)
    except socket.gaierror as e:  # a name that does not resolve
        why = str(e.strerror)
    except OSError as e:  # create_server's message repeats the address: the errno's text
        why = os.strerror(e.errno) if e.errno else str(e)
    except ValueError as e:  # a port that is not a number
        why = str(e)
    log.error("could not listen on %s (%s): %s", address, flag, why)
    return None


def _bind(settings: Settings) -> socket.socket | None:
    """The query socket, bound before the store opens, and the ingest address checked the
    same way (granian binds it itself, a moment later): a taken port is one line and exit 1,
    where uvicorn's own failed bind exits from inside the loop with a traceback."""
    query = _listen(settings.admin_listen, "127.0.0.1", "--admin-listen")
    if query is None:
        return None
    ingest = _listen(settings.listen, "0.0.0.0", "--listen")  # noqa: S104 — public by design
    if ingest is None:
        query.close()
        return None
    ingest.close()
    return query


async def _serve(collector: Collector, query_sock: socket.socket) -> None:
    s = collector.settings
    host, port = split_hostport(s.admin_listen, "127.0.0.1")
    cfg = uvicorn.Config(
        collector.query_app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        http="httptools",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    query = _Server(cfg)
    edge = _edge_server(collector)
    loop = asyncio.get_running_loop()

    def _exit() -> None:
        query.should_exit = True
        edge.stop()  # type: ignore[no-untyped-call]

    if threading.current_thread() is threading.main_thread():  # embedded runs have none
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _exit)

    async def serve_query() -> None:
        try:
            await query.serve(sockets=[query_sock])
        except SystemExit as e:  # uvicorn's way to fail a start; a task must not raise it
            raise RuntimeError(f"query server did not start (uvicorn exit {e.code})") from None

    tasks = [asyncio.create_task(serve_query()), asyncio.create_task(edge.serve())]

    def started() -> bool:
        return query.started and bool(edge.wrks)

    while not started():
        if any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.02)
    up = started()
    if up:
        log.info(
            "listening: ingest %s (at most %d connections, head %d bytes in %.0f s, body in "
            "%.0f s), query %s",
            s.listen,
            collector.max_connections,
            s.max_header_bytes,
            s.header_timeout_s,
            s.body_timeout_s,
            s.admin_listen,
        )
        print(f"parallax-collector ready: ingest {s.listen} query {s.admin_listen}", flush=True)
    else:
        _exit()
    # Either server ending ends both (a failed one must not leave the other serving).
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    _exit()
    await asyncio.gather(*tasks, return_exceptions=True)
    if not up:
        raise ListenError(_why_not(tasks, s))


class ListenError(Exception):
    """A server ended before both were up; the message is the one line that says which."""


def _why_not(tasks: list[asyncio.Task[None]], s: Settings) -> str:
    # Only the message's first line: granian's error carries a Rust backtrace where
    # RUST_BACKTRACE is set, which once pushed the reason out of a failed test's log tail.
    for t, address, flag in zip(
        tasks, (s.admin_listen, s.listen), ("--admin-listen", "--listen"), strict=True
    ):
        e = t.exception() if t.done() and not t.cancelled() else None
        if e is not None:
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            return f"could not listen on {address} ({flag}): {why}"
    return f"could not listen on {s.listen} / {s.admin_listen}"


def edge_settings_error(s: Settings) -> str | None:
    """Why the ingest limits cannot be served as given, or None."""
    if s.max_header_bytes < MIN_HEADER_BYTES:
        return f"--max-header-bytes must be at least {MIN_HEADER_BYTES}"
    if s.header_timeout_s <= 0 or s.body_timeout_s <= 0:
        return "--header-timeout and --body-timeout must be positive"
    if s.max_connections < 1:
        return "--max-connections must be at least 1"
    return None


def run(settings: Settings, plugins: Sequence[Plugin] | None = None) -> int:
    bad = edge_settings_error(settings) or settings.store_error()
    if bad:
        log.error("%s", bad)
        return 2
    collector = Collector(settings, plugins)
    for p in collector.plugins:
        if p.check is not None:
            try:
                p.check(settings)
            except Exception as e:  # noqa: BLE001 — the plugin's message is the one line
                log.error("%s: %s", p.name, str(e).splitlines()[0] if str(e) else type(e).__name__)
                return 2
    query_sock = _bind(settings)
    if query_sock is None:
        return 1
    with query_sock:
        return _run(collector, query_sock)


def _run(collector: Collector, query_sock: socket.socket) -> int:
    try:
        collector.start()
    except (StartupError, SpoolLockedError) as e:
        log.error("%s", e)
        return 2
    t = time.monotonic()
    try:
        asyncio.run(_serve(collector, query_sock))
    except ListenError as e:
        collector.stop(2.0)
        log.error("%s", e)
        return 1
    collector.stop()
    log.info("stopped after %.0f s", time.monotonic() - t)
    return 0
