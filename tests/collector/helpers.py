"""Start real collectors (subprocesses on free ports) and talk to them over real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from demo.stack import free_port
from parallax_contracts.trace_context import new_span_id, new_trace_id

BIN = Path(sys.executable).parent / "parallax-collector"


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    ingest: str
    query: str
    data_dir: Path
    log: Path
    args: list[str] = field(default_factory=list)

    def wait_ready(self, timeout_s: float = 30.0, need_store: bool = True) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"{self.query}/readyz" if need_store else f"{self.ingest}/healthz"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"collector exited {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"collector not ready in {timeout_s}s: {self.tail()}")

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def start_collector(data_dir: Path, *extra: str, env: dict[str, str] | None = None) -> Running:
    ip, qp = free_port(), free_port()
    log = data_dir.parent / f"collector-{ip}.log"
    args = [
        str(BIN),
        "serve",
        "--listen",
        f"127.0.0.1:{ip}",
        "--admin-listen",
        f"127.0.0.1:{qp}",
        "--data-dir",
        str(data_dir),
        "--flush-interval",
        "0.2",
        *extra,
    ]
    e = {**os.environ, **(env or {})}
    e.pop("PARALLAX_STORE", None)
    with log.open("ab") as f:
        proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=e)
    return Running(proc, f"http://127.0.0.1:{ip}", f"http://127.0.0.1:{qp}", data_dir, log, args)


def beacon(
    entries: list[dict[str, Any]],
    time_origin: float | None = None,
    session: str = "sess-0001",
    site: str = "demo",
) -> dict[str, Any]:
    return {
        "v": 1,
        "site": site,
        "session": session,
        "page": "/",
        "time_origin": time.time() * 1000 - 5000 if time_origin is None else time_origin,
        "entries": entries,
    }


def entry(trace_id: str | None = None, span_id: str | None = None, **kw: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "trace_id": trace_id or new_trace_id(),
        "span_id": span_id or new_span_id(),
        "kind": "fetch",
        "start_ms": 100.0,
        "request_start_ms": 101.0,
        "response_start_ms": 150.0,
        "method": "GET",
        "url": "http://app.test/api/chat",
        "status": 200,
    }
    e.update(kw)
    return e


def post_beacon(base: str, doc: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/beacons",
        content=json.dumps(doc),
        headers={"content-type": "text/plain", **headers},
        timeout=10,
    )


def wait_for(pred: Any, timeout_s: float = 20.0, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(every_s)
    raise TimeoutError(f"condition not met in {timeout_s}s (last: {last!r})")


def run_store_script(script: str, data_dir: Path, *args: str) -> dict[str, Any]:
    """Run ``script`` (which prints one JSON line last) in a fresh interpreter against a
    chDB store in ``data_dir`` (its argv[1]; ``args`` follow): chDB allows one store path per
    process."""
    p = subprocess.run(
        [sys.executable, "-c", script, str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out
