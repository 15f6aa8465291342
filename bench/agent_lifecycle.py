"""The agent's start and stop, wall-clock: what a DaemonSet rollout (and the test suite's
~60 agent starts) waits for.

    python -m bench.agent_lifecycle [--rounds 5] [--base TREE] [--no-write]

Start: from the process's launch to its "attached" line (the compile, the load, the
probes). Stop: from SIGTERM to its "stopped:" line (the drain, the flush, the records
exported) and to the process's exit (closing every attachment: agent.kernel.perf_close).
Three cases: ``--port`` of one Python server (it maps libssl: the agent puts 8 TLS uprobes
on it, whose closes are the slowest), of ``--servers`` of them (a node with many
TLS-serving processes, an ingress's workers), and ``--port`` nobody listens on
(tracepoints only). This tree runs twice: with its compiled program kept between starts
(the default) and with ``PARALLAX_AGENT_BPF_CACHE=off``. ``--base TREE``: another
checkout (a ``git worktree`` of an older commit) run alternately with this one, same venv,
same cache, each round.
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
CACHE_ENV = "PARALLAX_AGENT_BPF_CACHE"  # (agent.kernel.objcache.ENV: that module imports bcc)
Run = tuple[float, float, float, bool]


def one(tree: Path, ports: list[int], cache: Path, extra_env: dict[str, str]) -> Run:
    """(start, SIGTERM to the "stopped:" line, SIGTERM to exit, TLS probes attached) of one
    agent run from ``tree``, seconds."""
    d = Path(tempfile.mkdtemp(prefix="px-lifecycle-"))
    err = d / "agent.err"
    argv = [PY, "-m", "agent.cli", "run", "--jsonl", str(d / "a.jsonl")]
    argv += [a for p in ports for a in ("--port", str(p))]
    argv += ["--metrics-addr", f"127.0.0.1:{free_port()}"]
    env = {**os.environ, "PARALLAX_CACHE_DIR": str(cache), **extra_env}
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
    out = None
    while p.poll() is None:
        if out is None and "stopped:" in err.read_text():
            out = time.monotonic() - t1
        time.sleep(0.005)
    gone = time.monotonic() - t1
    if p.returncode != 0:
        raise SystemExit(f"agent from {tree} exited {p.returncode}: {err.read_text()[-400:]}")
    return started, gone if out is None else out, gone, "TLS: probes on" in err.read_text()


def _servers(n: int) -> tuple[list[int], list[subprocess.Popen[bytes]]]:
    ports = [free_port() for _ in range(n)]
    argv = [PY, "-m", "http.server", "--bind", "127.0.0.1"]
    out = subprocess.DEVNULL
    return ports, [subprocess.Popen([*argv, str(p)], stdout=out, stderr=out) for p in ports]


def _row(case: str, name: str, v: list[Run]) -> str:
    cells = []
    for i in range(3):
        xs = [x[i] for x in v]
        cells.append(f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})")
    tls = "yes" if all(x[3] for x in v) else ("no" if not any(x[3] for x in v) else "some")
    return f"| {case} | {name} | {' | '.join(cells)} | {tls} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.agent_lifecycle", description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--servers", type=int, default=8, help="Python servers in one case")
    ap.add_argument("--base", type=Path, help="another checkout to run alternately")
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.agent_lifecycle: needs root (the agent loads BPF programs)", file=sys.stderr)
        return 1
    cache = ROOT / ".cache"
    # this tree twice: its compiled program kept between starts (agent.kernel.objcache; the
    # first start of all fills it), and compiled at every start as before
    trees = [("this tree", ROOT, {}), ("this tree, compiling", ROOT, {CACHE_ENV: "off"})]
    trees += [("base", args.base.resolve(), {})] if args.base else []
    ports, srvs = _servers(args.servers)
    cases = [
        ("1 Python server (8 TLS uprobes)", ports[:1]),
        (f"{args.servers} Python servers ({8 * args.servers} TLS uprobes)", ports),
        ("no listener on the port", [free_port()]),
    ]
    got: dict[tuple[str, str], list[Run]] = {}
    try:
        time.sleep(1.0)
        for r in range(args.rounds):
            for case, on in cases:
                for name, tree, env in trees if r % 2 == 0 else trees[::-1]:
                    res = one(tree, on, cache, env)
                    got.setdefault((case, name), []).append(res)
                    print(f"round {r + 1}, {case}, {name}:", *(f"{x:.2f}" for x in res[:3]))
    finally:
        for srv in srvs:
            srv.terminate()
            srv.wait(10)
    base = f" --base {args.base}" if args.base else ""
    md = "\n".join(
        [
            "## Agent start and stop (`python -m bench.agent_lifecycle`)",
            "",
            f"Machine: {report.machine()}. Commit {report.git_rev()}. Command: "
            f"`python -m bench.agent_lifecycle --rounds {args.rounds} --servers "
            f"{args.servers}{base}`. Seconds, median (min–max) of {args.rounds} runs, the "
            "trees alternating each round.",
            "",
            "| case | tree | start (launch → attached) | SIGTERM → records out "
            '("stopped:") | SIGTERM → exit | TLS probes |',
            "|---|---|---|---|---|---|",
            *(_row(case, name, v) for (case, name), v in got.items()),
        ]
    )
    print(md)
    if not args.no_write:
        report.write_section("agent_lifecycle", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
