"""On a machine with a GPU, what the real driver's sample buffers look like — the facts the
poller assumes and the fake cannot prove (docs/gpu.md, "Checked on the fake only"):

    python -m tests.gpu.nvml_probe [--seconds 10] [--poll-ms 500]

Run it while something computes on the GPU. Per device it prints the spacing of the
utilisation samples (the driver's sample period), and per pid the spacing of its process
samples, how far their timestamps fall from the device's ticks, and how late a sample is
seen after its timestamp.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections import defaultdict
from typing import Any


def _spacing(ts: list[int]) -> str:
    gaps = [b - a for a, b in itertools.pairwise(sorted(ts)) if b > a]
    if not gaps:
        return "n/a"
    return f"median {statistics.median(gaps):.0f} us (min {min(gaps)}, max {max(gaps)})"


def main() -> None:
    import pynvml

    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--poll-ms", type=float, default=500.0)
    args = ap.parse_args()
    pynvml.nvmlInit()
    handles: list[Any] = [
        pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
    ]
    seen_u = [0] * len(handles)
    seen_p = [0] * len(handles)
    ticks: list[list[int]] = [[] for _ in handles]
    procs: list[dict[int, list[int]]] = [defaultdict(list) for _ in handles]
    lag: list[int] = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        now = time.time_ns() // 1000
        for i, h in enumerate(handles):
            try:
                _, got = pynvml.nvmlDeviceGetSamples(
                    h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, seen_u[i]
                )
                ticks[i] += [int(s.timeStamp) for s in got]
                seen_u[i] = max([seen_u[i], *ticks[i]])
            except pynvml.NVMLError as e:
                print(f"GPU {i}: nvmlDeviceGetSamples: {e}")
            try:
                for s in pynvml.nvmlDeviceGetProcessUtilization(h, seen_p[i]):
                    t = int(s.timeStamp)
                    if t > seen_p[i] and s.smUtil <= 100:
                        procs[i][int(s.pid)].append(t)
                        if seen_p[i]:  # not the backlog the first read returns
                            lag.append(now - t)
                seen_p[i] = max([seen_p[i], *(t for v in procs[i].values() for t in v)])
            except pynvml.NVMLError as e:
                if e.value != pynvml.NVML_ERROR_NOT_FOUND:
                    print(f"GPU {i}: nvmlDeviceGetProcessUtilization: {e}")
        time.sleep(args.poll_ms / 1000)
    for i in range(len(handles)):
        print(f"GPU {i}: {len(ticks[i])} utilisation samples, spacing {_spacing(ticks[i])}")
        for pid, ts in sorted(procs[i].items()):
            off = [min(abs(t - k) for k in ticks[i]) for t in ts] if ticks[i] else []
            print(
                f"  pid {pid}: {len(ts)} samples, spacing {_spacing(ts)}, "
                f"distance to a device tick: median {statistics.median(off) if off else 'n/a'} us"
            )
    if lag:
        print(f"seen after their timestamp: median {statistics.median(lag):.0f} us, max {max(lag)}")
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
