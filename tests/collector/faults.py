"""Fault injection against a real collector: a real tmpfs that fills, real kill -9, real
slow and hostile sockets on 127.0.0.1. Shared by tests/collector/test_faults.py and the
longer variants in bench/faults.py (``make bench-faults``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from parallax_contracts.trace_context import new_span_id, new_trace_id


class NoTmpfsError(Exception):
    """A tmpfs cannot be mounted here (not root, or no mount): the message says why."""


@contextlib.contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    """A real tmpfs of ``size_bytes`` at ``path`` for the duration: its ENOSPC, and its short
    writes at the edge, are the kernel's own."""
    if os.geteuid() != 0:
        raise NoTmpfsError("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        raise NoTmpfsError(f"mount -t tmpfs failed: {p.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(filler: Path, leave: int) -> None:
    """Fill the filesystem of ``filler`` to the last byte, then give ``leave`` bytes back."""
    with filler.open("ab") as f:
        chunk = b"\0" * (1 << 20)
        while True:
            try:
                f.write(chunk)
                f.flush()
            except OSError:
                break
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - leave))


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def otlp_request(n_spans: int) -> tuple[bytes, list[str]]:
    """A protobuf export of ``n_spans`` SERVER spans, each in a trace of its own."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "faults"
    ss = rs.scope_spans.add()
    now = time.time_ns()
    tids = []
    for _ in range(n_spans):
        sp = ss.spans.add()
        tid = new_trace_id()
        tids.append(tid)
        sp.trace_id, sp.span_id = bytes.fromhex(tid), bytes.fromhex(new_span_id())
        sp.kind, sp.name = Span.SpanKind.SPAN_KIND_SERVER, "POST /faults"
        sp.start_time_unix_nano, sp.end_time_unix_nano = now - 5_000_000, now
        a = sp.attributes.add()
        a.key, a.value.string_value = "url.path", "/faults/" + "x" * 40
    return req.SerializeToString(), tids


@dataclass
class Ledger:
    """What was sent and what was answered, per trace id: the promise to check."""

    sent: set[str] = field(default_factory=set)
    acked: set[str] = field(default_factory=set)
    codes: Counter[int] = field(default_factory=Counter)
    retry_after_missing: int = 0  # 503/429 answers without Retry-After
    errors: int = 0  # no answer (connection refused or reset: the collector was killed)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, tids: list[str], r: httpx.Response | None) -> None:
        with self.lock:
            self.sent.update(tids)
            if r is None:
                self.errors += 1
                return
            self.codes[r.status_code] += 1
            if r.status_code == 200:
                self.acked.update(tids)
            elif r.status_code in (429, 503) and "retry-after" not in r.headers:
                self.retry_after_missing += 1


def post_spans(
    ingest: str,
    ledger: Ledger,
    requests: int,
    spans: int,
    threads: int = 4,
    until: threading.Event | None = None,
) -> None:
    """``requests`` exports of ``spans`` spans from ``threads`` keep-alive clients (fewer
    if ``until`` is set first), each answer written in ``ledger``."""

    def worker(n: int) -> None:
        with httpx.Client(timeout=10) as client:
            for _ in range(n):
                if until is not None and until.is_set():
                    return
                body, tids = otlp_request(spans)
                try:
                    r: httpx.Response | None = client.post(
                        f"{ingest}/v1/traces",
                        content=body,
                        headers={"content-type": "application/x-protobuf"},
                    )
                except httpx.HTTPError:
                    r = None
                ledger.record(tids, r)

    per = [requests // threads + (1 if i < requests % threads else 0) for i in range(threads)]
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(worker, per))


_STORED = (
    "import json, sys, clickhouse_connect\n"
    "c = clickhouse_connect.get_client(dsn='chdb://' + sys.argv[1])\n"
    "rows = c.query('SELECT trace_id FROM parallax.server_spans').result_rows\n"
    "print(json.dumps([r[0] for r in rows]))\n"
)


def stored_trace_ids(chdb_dir: Path) -> list[str]:
    """Every server span's trace id in a stopped collector's store, repeats included (raw
    rows, no FINAL: exactness must not depend on a merge)."""
    p = subprocess.run(
        [sys.executable, "-c", _STORED, str(chdb_dir.resolve())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    ids: list[str] = json.loads(p.stdout.strip().splitlines()[-1])
    return ids


def wait_spool_empty(spool: Path, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not list(spool.glob("*.seg")):
            return True
        time.sleep(0.2)
    return False


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def hostile_head(port: int, header_bytes: int) -> bytes:
    """Send a request whose one header is ``header_bytes`` long; the status line answered
    (b"" when the server closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nX-Big: "
        try:
            s.sendall(head)
            chunk = b"a" * (1 << 20)
            sent = 0
            while sent < header_bytes:
                s.sendall(chunk[: header_bytes - sent])
                sent += len(chunk)
            s.sendall(b"\r\n\r\n")
        except OSError:
            pass  # the server answered and closed before it all went out
        try:
            return s.recv(200).split(b"\r\n", 1)[0]
        except OSError:
            return b""


@dataclass
class EarlyAnswers:
    """What clients read of answers given before their bodies were read (e.g. a 413)."""

    statuses: Counter[bytes] = field(default_factory=Counter)  # status lines read
    send_errors: int = 0  # the body's send failed: reset or broken pipe (answer or not)
    resets: int = 0  # no answer could be read: the connection broke first

    def __str__(self) -> str:
        codes = ", ".join(
            f"{n}×{s.decode()[9:12] or '?'}" for s, n in sorted(self.statuses.items())
        )
        return f"{codes}; {self.send_errors} send errors, {self.resets} resets"


def early_answer(port: int, path: str, body_bytes: int, ctype: str) -> tuple[bytes, bool]:
    """One request as most clients send it — head and the whole body, then read the answer —
    to a server that answers before reading the body. (The status line read, b"" when the
    connection broke before it could be read; whether sending the body failed.)"""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {body_bytes}\r\n\r\n"
        )
        failed = False
        try:
            s.sendall(head.encode())
            chunk = b"x" * (64 << 10)
            left = body_bytes
            while left > 0:
                s.sendall(chunk[:left])
                left -= len(chunk)
        except OSError:
            failed = True  # a client like httpx still reads what was answered
        try:
            return s.recv(200).split(b"\r\n", 1)[0], failed
        except OSError:
            return b"", failed


def early_answers(
    port: int,
    n: int,
    body_bytes: int,
    path: str = "/v1/beacons",
    ctype: str = "text/plain",
    threads: int = 8,
) -> EarlyAnswers:
    """``n`` early answers, ``threads`` clients at once (a new connection each)."""
    out = EarlyAnswers()
    with ThreadPoolExecutor(threads) as ex:
        for status, failed in ex.map(
            lambda _: early_answer(port, path, body_bytes, ctype), range(n)
        ):
            out.statuses[status] += 1
            out.send_errors += failed
            out.resets += not status
    return out


def slowloris(port: int, every_s: float, give_up_s: float) -> float:
    """Dribble a request head one header line every ``every_s``; seconds until the server
    closed the connection (``give_up_s`` if it never did)."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=give_up_s) as s:
            s.sendall(b"POST /v1/beacons HTTP/1.1\r\nHost: x\r\n")
            s.settimeout(every_s)
            i = 0
            while time.monotonic() - t0 < give_up_s:
                try:
                    if s.recv(200) == b"":
                        return time.monotonic() - t0  # closed by the server
                except TimeoutError:
                    pass
                s.sendall(b"X-%d: y\r\n" % i)
                i += 1
    except OSError:
        return time.monotonic() - t0  # reset by the server
    return give_up_s


def metric(text: str, name: str) -> float:
    """The value of one sample (full name with labels) in Prometheus text, 0 if absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
