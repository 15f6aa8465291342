"""The export fan-out: a bounded record queue, filled by the main loop and emptied by one
exporter thread into every configured output (agent.export.spans: JSON lines, OTLP).

An output is anything with the :class:`Exporter` methods; adding one is a new module and
one line where the agent builds its list (agent.run).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Protocol

from agent.diagnostics import where

log = logging.getLogger("parallax.agent")
BATCH = 1024  # records per export_batch call
PERIOD_S = 0.05  # the exporter wakes at most 20 times a second


class Exporter(Protocol):
    """One output of records (the dicts of agent.records.build)."""

    def export_batch(self, recs: list[dict[str, Any]]) -> None:
        """Take a batch; may hand it to a background sender. Raises only on a bug."""

    def close(self) -> None:
        """Deliver what is buffered (bounded in time) and release the output."""

    @property
    def failed(self) -> int:
        """Records accepted but not delivered (a sender that gave up after its retries)."""


class Processor(Protocol):
    """A stage between the queue and the exporters (the GPU attribution): it may hold
    records back and release them at a later call."""

    @property
    def pending(self) -> bool:
        """Records are held: call again soon even if nothing new arrives."""

    def process(self, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Take records; return those ready for the exporters."""

    def flush(self) -> list[dict[str, Any]]:
        """Stopping: every record still held."""


class RecordQueue:
    """Records waiting for the exporter thread. Bounded: under overload the *oldest* record
    is dropped and counted (``n_shed``), never the queue grown — the one drop policy of the
    export path, the OTLP sender's own queue (agent.export.spans) drops its oldest too, so
    whatever falls behind, the freshest records survive. A deque (append and popleft are
    atomic: no lock or condition per record) polled by the exporter thread, which is woken
    when the main loop queued something."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.q: deque[dict[str, Any]] = deque()
        self.n_shed = 0
        self.n_requests: dict[str, int] = {}  # per service: records queued

    def put(self, rec: dict[str, Any], service: str) -> None:
        q = self.q
        if len(q) >= self.size:
            try:
                q.popleft()
                self.n_shed += 1
            except IndexError:  # (the exporter thread emptied it meanwhile)
                pass
        q.append(rec)
        n_req = self.n_requests
        n_req[service] = n_req.get(service, 0) + 1

    def __len__(self) -> int:
        return len(self.q)


class ExportThread:
    """The thread that moves queued records to the exporters, in batches."""

    def __init__(
        self,
        queue: RecordQueue,
        exporters: list[Exporter],
        processors: list[Processor] | None = None,
    ) -> None:
        self.queue = queue
        self.exporters = exporters
        self.processors = processors or []
        self._have_records = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="export", daemon=True)

    @property
    def failed(self) -> int:
        return sum(e.failed for e in self.exporters)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """The main loop queued records (cheap when nothing is waiting)."""
        if self.queue.q:
            self._have_records.set()

    def _loop(self) -> None:
        # Woken by the main loop when it queued records, then at most every 50 ms
        # (batches): an idle agent does not poll.
        q = self.queue.q
        while True:
            held = any(p.pending for p in self.processors)
            self._have_records.wait(PERIOD_S if held else 1.0)
            self._have_records.clear()
            stopping = self._stopping.is_set()
            while True:
                batch = [q.popleft() for _ in range(min(len(q), BATCH))]
                last = stopping and not q  # stopping: the stages give up what they hold
                for p in self.processors:
                    batch = self._through(p, batch, last)
                if batch:
                    self._export(batch)
                if not q:
                    break
            if stopping:
                return
            time.sleep(PERIOD_S)

    @staticmethod
    def _through(p: Processor, batch: list[dict[str, Any]], flush: bool) -> list[dict[str, Any]]:
        try:
            out = p.process(batch)
            return out + p.flush() if flush else out
        except Exception as exc:  # noqa: BLE001  (a failing stage must not lose records)
            log.warning("export stage failed: %s at %s", type(exc).__name__, where(exc))
            return batch

    def _export(self, batch: list[dict[str, Any]]) -> None:
        for e in self.exporters:
            try:
                e.export_batch(batch)
            except Exception as exc:  # noqa: BLE001  (one bad export must not stop us)
                # the type and place, not the message: it may quote a record
                log.warning("export failed: %s at %s", type(exc).__name__, where(exc))

    def finish(self, timeout: float = 10.0) -> None:
        """Everything is queued (the agent has flushed): export it, then close each
        output."""
        self._stopping.set()
        self._have_records.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
        for e in self.exporters:
            e.close()
