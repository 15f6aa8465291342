"""The demo's inference service (demo/infer_app.py) on the NVIDIA stand-ins: it streams
tokens from its engine process, writes the engine's GPU steps into the NVML stand-in's
script, answers 503 once the engine is gone, and its engine dies with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from demo.gpu import cuda_double
from demo.infer_app import GPU_UUID

ROOT = Path(__file__).resolve().parent.parent


def _start(tmp: Path) -> tuple[subprocess.Popen[str], str, int]:
    cuda = cuda_double.build(tmp / "cuda")
    p = subprocess.Popen(
        [sys.executable, "-m", "demo.infer_app", "--cuda-lib-dir", str(cuda),
         "--nvml-script", str(tmp / "nvml.script")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert p.stdout is not None
    url = p.stdout.readline().split()[-1]
    kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
    return p, url, int(kids[0])


def test_streams_writes_the_gpu_and_fails_cleanly(tmp_path: Path) -> None:
    p, url, engine = _start(tmp_path)
    try:
        with urllib.request.urlopen(f"{url}/v1/generate?tokens=5", timeout=10) as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            assert r.headers["Timing-Allow-Origin"] == "*"
            body = r.read().decode()
        assert body.count("data: tok") == 5 and "event: done" in body
        script = (tmp_path / "nvml.script").read_text()
        assert GPU_UUID in script and f"running 0 {engine} " in script
        assert f"proc 0 {engine} " in script  # its steps, as busy stretches of its SMs
        os.kill(engine, signal.SIGKILL)
        deadline = time.monotonic() + 5
        code = 0
        while time.monotonic() < deadline and code != 503:
            try:
                urllib.request.urlopen(f"{url}/v1/generate?tokens=2", timeout=5).read()
            except urllib.error.HTTPError as e:
                code = e.code
        assert code == 503
    finally:
        p.terminate()
        p.wait(10)


def test_the_engine_dies_with_the_service(tmp_path: Path) -> None:
    p, _, engine = _start(tmp_path)
    p.kill()  # no clean-up code runs
    p.wait(10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{engine}").exists():
        time.sleep(0.05)
    stat = Path(f"/proc/{engine}/stat")
    assert not stat.exists() or stat.read_text().split(") ")[1][0] == "Z"
