"""The agent's start and stop, wall-clock: what a DaemonSet rollout (and the test suite's
~60 agent starts) waits for.

    python -m bench.agent_lifecycle [--rounds 5] [--base TREE] [--no-write]

Start: from the process's launch to its "attached" line (the compile, the load, the
probes). Stop: from SIGTERM to the process's exit (the drain, the flush, closing every
attachment: agent.kernel.perf_close). Two cases: ``--port`` of a Python server (it maps
libssl: the agent puts the TLS probes on it, whose closes are the slowest), and ``--port``
nobody listens on (tracepoints only). ``--base TREE``: another checkout (a ``git worktree``
of an older commit) run alternately with this one, same venv, same cache, each round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import report
from demo.stack import free_port

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def one(tree: Path, port: int, cache: Path) -> tuple[float, float, bool]:
    """(start s, stop s, TLS probes attached) of one agent run from ``tree``."""
    d = Path(tempfile.mkdtemp(prefix="px-lifecycle-"))
    err = d / "agent.err"
    argv = [PY, "-m", "agent.cli", "run", "--port", str(port), "--jsonl", str(d / "a.jsonl")]
    argv += ["--metrics-addr", f"127.0.0.1:{free_port()}"]
    env = {**os.environ, "PARALLAX_CACHE_DIR": str(cache)}
    t0 = time.monotonic()
    with open(err, "w") as f:
        p = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=f)
    while "attached" not in err.read_text():
        if p.poll() is not None or time.monotonic() - t0 > 120:
            p.kill()
            raise SystemExit(f"agent from {tree} did not attach: {err.read_text()[-400:]}")
        time.sleep(0.01)
    started = time.monotonic() - t0
    time.sleep(1.0)  # a few main-loop ticks and a rescan
    t1 = time.monotonic()
    p.terminate()
    rc = p.wait(60)
    stopped = time.monotonic() - t1
    if rc != 0:
        raise SystemExit(f"agent from {tree} exited {rc}: {err.read_text()[-400:]}")
    return started, stopped, "TLS: probes on pid" in err.read_text()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.agent_lifecycle", description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--base", type=Path, help="another checkout to run alternately")
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.agent_lifecycle: needs root (the agent loads BPF programs)", file=sys.stderr)
        return 1
    cache = ROOT / ".cache"
    trees = [("this tree", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    srv_port = free_port()
    srv = subprocess.Popen(
        [PY, "-m", "http.server", str(srv_port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cases = [("Python server (TLS probes)", srv_port), ("no listener on the port", free_port())]
    got: dict[tuple[str, str], list[tuple[float, float, bool]]] = {}
    try:
        time.sleep(1.0)
        for r in range(args.rounds):
            for case, port in cases:
                for name, tree in trees if r % 2 == 0 else trees[::-1]:
                    res = one(tree, port, cache)
                    got.setdefault((case, name), []).append(res)
                    print(
                        f"round {r + 1} {case}, {name}: start {res[0]:.2f} s, stop {res[1]:.2f} s"
                    )
    finally:
        srv.terminate()
        srv.wait(10)
    rows = []
    for (case, name), v in got.items():
        starts, stops = [x[0] for x in v], [x[1] for x in v]
        tls = "yes" if all(x[2] for x in v) else ("no" if not any(x[2] for x in v) else "some")
        rows.append(
            f"| {case} | {name} | {statistics.median(starts):.2f} "
            f"({min(starts):.2f}–{max(starts):.2f}) | {statistics.median(stops):.2f} "
            f"({min(stops):.2f}–{max(stops):.2f}) | {tls} |"
        )
    base = f" --base {args.base}" if args.base else ""
    md = "\n".join(
        [
            "## Agent start and stop (`python -m bench.agent_lifecycle`)",
            "",
            f"Machine: {report.machine()}. Commit {report.git_rev()}. Command: "
            f"`python -m bench.agent_lifecycle --rounds {args.rounds}{base}`. Seconds, "
            f"median (min–max) of {args.rounds} runs, the trees alternating each round.",
            "",
            "| case | tree | start (launch → attached) | stop (SIGTERM → exit) | TLS probes |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    print(md)
    if not args.no_write:
        report.write_section("agent_lifecycle", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
