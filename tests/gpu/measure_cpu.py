"""The NVML poller's CPU cost per second of wall time, at several poll periods, against the
fake library (docs/gpu.md has the figures):

    python -m tests.gpu.measure_cpu [--seconds 20] [--devices 1 8] [--pids 4]

Each (devices, period) runs in a child started on the fake: ``run()`` in a thread for
``--seconds`` on the real clock, driver sample period 1/6 s, every GPU busy and ``--pids``
processes on each; CPU = the child's ``time.process_time()`` over the run (the main thread
only sleeps). The fake answers in microseconds; the real library's calls cost more (they
go to the driver), so these figures are the poller's own Python, not NVML's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from demo.gpu.nvml_double import NvmlScript, build_fake_nvml
from tests.gpu.fakes import ROOT

PERIODS_MS = (100, 250, 500, 1000)


def child() -> None:
    """One measurement: argv = [poll_ms, seconds]; prints one JSON line."""
    from agent.gpu.nvml import NvmlPoller

    poll_ms, seconds = float(sys.argv[1]), float(sys.argv[2])
    p = NvmlPoller(poll_ms / 1000)
    p.start()
    stop = threading.Event()
    t = threading.Thread(target=p.run, args=(stop,))
    c0, w0 = time.process_time(), time.monotonic()
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join()
    cpu, wall = time.process_time() - c0, time.monotonic() - w0
    n = len(p.process_samples(p.gpu_pids(), 0, 2**62))
    print(json.dumps({"cpu_ms_per_s": 1000 * cpu / wall, "process_samples": n, "errors": p.errors}))
    p.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--pids", type=int, default=4)
    args = ap.parse_args()
    lib = build_fake_nvml()
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.devices:
            script = NvmlScript(Path(tmp) / "nvml.script")
            now = time.time_ns() // 1000
            for d in range(n):
                script.device(f"GPU-{d:08x}-0000-4000-8000-000000000000")
                script.util(d, now - 60_000_000, now + 3_600_000_000, gpu_pct=70)
                for k in range(args.pids):
                    pid = 1000 + 10 * d + k
                    script.proc(d, pid, now - 60_000_000, now + 3_600_000_000, 15)
                    script.running(d, pid, 2**30)
            script.write()
            for ms in PERIODS_MS:
                out = subprocess.run(
                    [sys.executable, "-m", "tests.gpu.measure_cpu", "--child", str(ms),
                     str(args.seconds)],
                    cwd=ROOT, env=script.env(lib), capture_output=True, text=True, check=True,
                )  # fmt: skip
                r = json.loads(out.stdout)
                print(
                    f"{n} GPU(s) x {args.pids} pids, poll {ms:4d} ms: "
                    f"{r['cpu_ms_per_s']:.2f} ms CPU/s ({r['cpu_ms_per_s'] / 10:.3f} % of a core), "
                    f"{r['process_samples']} process samples kept, {r['errors']} errors",
                    flush=True,
                )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        del sys.argv[1]
        child()
    else:
        main()
