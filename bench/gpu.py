"""``make bench-gpu``: what the GPU side costs, on the C-ABI doubles (no GPU needed).

1. The CUDA uprobes per call: a C loop of cuLaunchKernel (entry uprobe) and of
   cuStreamSynchronize with no wait (entry + return probe) through the driver double, timed
   as is, with the agent's probes attached and the process followed, and with the probes
   attached but the process not followed (a uprobe fires in every process mapping the
   probed file; the program's pid filter then returns). Rounds alternate; medians.
2. The NVML poller's CPU per second at the default period (tests/gpu/measure_cpu.py).
3. The delay the GPU stage adds before a record is exported: the real agent with the fake
   NVML follows a GPU service and a service without GPU in one run; for each record, the
   time from its last write to its line appearing in the JSONL.

Figures go to docs/benchmarks.md (the bench:gpu section).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import report

ROOT = Path(__file__).resolve().parent.parent
LOOP_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
typedef int (*sync_t)(void *);
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}
int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW);
    launch_t launch = (launch_t)dlsym(lib, "cuLaunchKernel");
    sync_t sync = (sync_t)dlsym(lib, "cuStreamSynchronize");
    long n = atol(argv[2]);
    char line[16];
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {  /* one measurement per line read */
        double t0 = now();
        for (long i = 0; i < n; i++) launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        double t1 = now();
        for (long i = 0; i < n; i++) sync(0);
        double t2 = now();
        printf("%.1f %.1f\n", (t1 - t0) / n, (t2 - t1) / n);
        fflush(stdout);
    }
    return 0;
}
"""


def _loop_binary(tmp: Path) -> Path:
    src, exe = tmp / "loop.c", tmp / "loop"
    src.write_text(LOOP_C)
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src), "-ldl"], check=True)
    return exe


class _Loop:
    def __init__(self, exe: Path, lib: Path, n: int) -> None:
        self.p = subprocess.Popen(
            [str(exe), str(lib), str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.p.stdout is not None and self.p.stdout.readline().strip() == "ready"

    def measure(self) -> tuple[float, float]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        a, b = self.p.stdout.readline().split()
        return float(a), float(b)

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


def uprobe_cost(rounds: int, n: int) -> dict[str, tuple[float, float]]:
    """Median ns per call (launch, synchronize) per case."""
    from agent.gpu.cuda import CudaProbes
    from demo.gpu import cuda_double as fake_cuda

    tmp = Path(tempfile.mkdtemp(prefix="px-bench-gpu-"))
    probed_lib = fake_cuda.build(tmp / "probed") / fake_cuda.SONAME
    plain_lib = fake_cuda.build(tmp / "plain") / fake_cuda.SONAME  # another file: no probe
    exe = _loop_binary(tmp)
    loops = {
        "untraced": _Loop(exe, plain_lib, n),
        "traced": _Loop(exe, probed_lib, n),
        "not followed": _Loop(exe, probed_lib, n),  # maps the probed file, not followed
    }
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in loops}
    probes = CudaProbes()
    try:
        probes.set_pids([loops["traced"].p.pid])
        assert probes.probed() == {loops["traced"].p.pid}
        for r in range(rounds):
            print(f"  uprobe round {r + 1}/{rounds}", file=sys.stderr, flush=True)
            for k, loop in loops.items():
                out[k].append(loop.measure())
            probes.drain()
    finally:
        probes.close()
        for loop in loops.values():
            loop.close()
    return {
        k: (statistics.median(x for x, _ in v), statistics.median(y for _, y in v))
        for k, v in out.items()
    }


def poller_cpu(seconds: float) -> str:
    p = subprocess.run(
        [sys.executable, "-m", "tests.gpu.measure_cpu", "--seconds", str(seconds)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return p.stdout.strip()


def export_delay(requests: int) -> dict[str, list[float]]:
    """Seconds from a record's last write to its JSONL line, per service kind."""
    from demo.gpu import cuda_double as fake_cuda
    from demo.gpu.nvml_double import build_fake_nvml
    from tests.agent.helpers import PY, Agent, Proc
    from tests.gpu.test_agent_gpu import cgroup, generate, nvml_env

    tmp = Path(tempfile.mkdtemp(prefix="px-bench-gpu-delay-"))
    cuda_dir, nvml_dir = fake_cuda.build(), build_fake_nvml()
    seen: set[str] = set()
    delays: dict[str, list[float]] = {"GPU service": [], "no GPU": []}
    with cgroup() as cg_gpu, cgroup() as cg_plain:
        argv = [PY, "-m", "tests.gpu.infer_server", "--cuda-lib-dir", str(cuda_dir)]
        gpu = Proc(["sh", "-c", f'echo $$ > {cg_gpu}/cgroup.procs && exec "$@"', "sh", *argv])
        argv = [PY, "-m", "tests.gpu.infer_server", "--no-gpu"]
        plain = Proc(["sh", "-c", f'echo $$ > {cg_plain}/cgroup.procs && exec "$@"', "sh", *argv])
        try:
            gport, pport = gpu.port(), plain.port()
            agent = Agent(tmp, [gport, pport], wrapper=nvml_env(tmp, nvml_dir, [gpu.p.pid]))
            try:
                agent.wait_metric('parallax_agent_gpu_processes{state="probed"}', lambda v: v >= 1)
                for i in range(requests):
                    print(f"  request {i + 1}/{requests}", file=sys.stderr, flush=True)
                    for port in (gport, pport):
                        generate(port, tokens=2)
                        deadline = time.monotonic() + 5
                        while time.monotonic() < deadline:
                            lines = agent.jsonl.read_text().split("\n")[:-1]
                            recs = [json.loads(x) for x in lines if x]
                            new = [r for r in recs if r["trace_id"] not in seen]
                            if new:
                                now = time.time_ns()
                                for r in new:
                                    seen.add(r["trace_id"])
                                    kind = "GPU service" if r["local_port"] == gport else "no GPU"
                                    delays[kind].append((now - r["end_unix_ns"]) / 1e9)
                                break
                            time.sleep(0.005)
            finally:
                agent.stop()
        finally:
            gpu.stop()
            plain.stop()
    return delays


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--poller-seconds", type=float, default=5.0)
    ap.add_argument("--no-write", action="store_true", help="print, do not update the doc")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench-gpu: needs root (uprobes, cgroups)", file=sys.stderr)
        return 1
    print("bench-gpu: CUDA uprobe cost", file=sys.stderr)
    cost = uprobe_cost(args.rounds, args.calls)
    print("bench-gpu: NVML poller CPU", file=sys.stderr)
    cpu = poller_cpu(args.poller_seconds)
    print("bench-gpu: export delay", file=sys.stderr)
    delays = export_delay(args.requests)
    base_l, base_s = cost["untraced"]
    rows = "\n".join(
        f"| {k} | {launch:,.0f} | {launch - base_l:+,.0f} | {sync:,.0f} | {sync - base_s:+,.0f} |"
        for k, (launch, sync) in cost.items()
    )
    delay_rows = "\n".join(
        f"| {k} | {len(v)} | {statistics.median(v) * 1000:.0f} | {max(v) * 1000:.0f} |"
        for k, v in delays.items()
        if v
    )
    md = f"""## GPU side (`make bench-gpu`)

Machine: {report.machine()} · commit {report.git_rev()} · command `python -m bench.gpu`
(on the C-ABI doubles of libcuda and libnvidia-ml: no GPU here).

CUDA driver uprobes, ns per call through the double (a C loop of {args.calls:,} calls,
median of {args.rounds} alternating rounds; the double's own call is a few ns):

| case | cuLaunchKernel | added | cuStreamSynchronize (no wait) | added |
|---|---|---|---|---|
{rows}

"traced": probes attached, the process a followed GPU process (the launch's entry probe
updates its bucket; the synchronize's entry and return probes keep the wait union).
"not followed": another process mapping the same probed file — it pays the uprobe trap,
then the pid filter returns. `--gpu-uprobes off` removes both.

NVML poller CPU (`python -m tests.gpu.measure_cpu --seconds {args.poller_seconds:g}`, fake
library, driver sample period 1/6 s, 4 busy processes per GPU):

```
{cpu}
```

Delay before a record is exported (its last write → its JSONL line, {args.requests}
requests each, one run; the GPU stage holds a GPU service's record until the NVML samples
and CUDA buckets of its windows are read, at the 500 ms poll):

| service | records | median ms | max ms |
|---|---|---|---|
{delay_rows}
"""
    print(md)
    if not args.no_write:
        report.write_section("gpu", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
