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
import signal
import sys
import threading
import time
from collections.abc import Generator, Sequence
from typing import Any

import uvicorn
from fastapi import FastAPI

from collector.api.ingest import Ingest, IngestApp, build_ingest_app
from collector.api.query import build_query_app
from collector.config import Settings, split_hostport
from collector.ingest import otlp
from collector.metrics import Metrics
from collector.pairing.pairer import Pairer
from collector.pipeline import ENTRIES, SPANS, Pipeline, SpoolLockedError
from collector.plugins import Context, Plugin
from collector.plugins import load as load_plugins
from collector.store import native
from collector.store.client import Store, redact

log = logging.getLogger("parallax.collector")
GC_THRESHOLD0 = 50_000  # allocations between young-generation collections (default 700)
GC_EVERY_S = 30.0  # the cyclic GC runs on a timer, not by allocation counts: see start()
# The event loop releases the GIL at every socket and spool write and must win it back from
# the writer and pairer threads, which hold it for up to a switch interval (default 5 ms)
# each time: at saturation that wait, not the CPU, bounded the ingest rate. Measured at
# 60,000 rows/s offered, alternating: 34,300 / 36,800 rows/s delivered at 5 ms,
# 41,400 / 50,600 at 0.5 ms.
GIL_SWITCH_INTERVAL_S = 0.0005


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
        self.store = Store(self.dsn)
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

    # --- life cycle --------------------------------------------------------------
    def start(self) -> None:
        s = self.settings
        log.info("store: %s (database %s)", redact(self.dsn), self.store.database)
        log.info("%s; %s", otlp.DECODER, native.describe())
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


class _Server(uvicorn.Server):
    """Two servers share one loop; the collector handles the signals itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def _serve(collector: Collector) -> None:
    s = collector.settings
    servers = []
    for app, listen, default_host in (
        (collector.ingest_app, s.listen, "0.0.0.0"),  # noqa: S104 — public by design
        (collector.query_app, s.admin_listen, "127.0.0.1"),
    ):
        host, port = split_hostport(listen, default_host)
        cfg = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            http="httptools",
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
        servers.append(_Server(cfg))
    loop = asyncio.get_running_loop()

    def _exit() -> None:
        for x in servers:
            x.should_exit = True

    if threading.current_thread() is threading.main_thread():  # embedded runs have none
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _exit)
    tasks = [asyncio.create_task(x.serve()) for x in servers]
    while not all(x.started for x in servers):
        if any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.02)
    if all(x.started for x in servers):
        log.info("listening: ingest %s, query %s", s.listen, s.admin_listen)
        print(f"parallax-collector ready: ingest {s.listen} query {s.admin_listen}", flush=True)
    await asyncio.gather(*tasks, return_exceptions=True)
    for x in servers:
        x.should_exit = True
    failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
    if failed or not all(x.started for x in servers):
        raise SystemExit(1)


def run(settings: Settings, plugins: Sequence[Plugin] | None = None) -> int:
    collector = Collector(settings, plugins)
    for p in collector.plugins:
        if p.check is not None:
            try:
                p.check(settings)
            except Exception as e:  # noqa: BLE001 — the plugin's message is the one line
                log.error("%s: %s", p.name, str(e).splitlines()[0] if str(e) else type(e).__name__)
                return 2
    try:
        collector.start()
    except (StartupError, SpoolLockedError) as e:
        log.error("%s", e)
        return 2
    t = time.monotonic()
    try:
        asyncio.run(_serve(collector))
    except SystemExit:
        collector.stop(2.0)
        log.error("could not listen on %s / %s", settings.listen, settings.admin_listen)
        return 1
    collector.stop()
    log.info("stopped after %.0f s", time.monotonic() - t)
    return 0
