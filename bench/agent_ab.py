"""Side-by-side A/B of agent versions: BPF and CPU cost per request, alternated in one run.

Each round runs every version once, in shuffled order, against one nginx under wrk's paced
load (the same server, load and measurement as ``make bench-agent``'s fixed loads): the
agent started fresh from that version's tree, bpf_stats on for the run only. A version's
figure in a round is taken as a ratio to the first version's in the same round, so the
VM's drifting speed (a whole run moves by 20-100 % on these machines) cancels; the median
ratio and how many rounds were lower are what an A/B can claim.

    python -m bench.agent_ab REV|. [REV|. ...] [--rounds 8] [--rate 2000] [--seconds 5]

A REV is checked out in a temporary git worktree (removed afterwards); ``.`` is the working
tree as it is, uncommitted changes included. The first version is the baseline. Prints
only; record conclusions in docs/agent.md with the command.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.agent import (
    NGINX_CONF,
    PACED_LUA,
    ROOT,
    _bpf_stats,
    _cpu_ns,
    _wait_port,
    bpf_breakdown,
    wrk,
)
from demo.stack import free_port

CONNS = 10  # as bench.agent's fixed loads
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def checkout(rev: str, into: Path) -> Path:
    """The tree for a version: the working tree for ``.``, else a detached worktree."""
    if rev == ".":
        return ROOT
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(into), rev],
        check=True,
    )
    cache = ROOT / ".cache"  # the kernel-header fallback: built once by make setup
    if cache.exists():
        (into / ".cache").symlink_to(cache)
    return into


def one_run(tree: Path, port: int, lua: Path, seconds: float, tmp: Path) -> dict[str, float]:
    """One paced wrk run with this tree's agent attached: BPF ns, CPU µs, per request, and
    each program's ns per request (keys ``prog:<name>``)."""
    err = tmp / "agent.err"
    with open(err, "w") as e:
        p = subprocess.Popen(
            [
                sys.executable, "-m", "agent.cli", "run", "--port", str(port),
                "--jsonl", os.devnull, "--cpu-budget", "0",
                "--metrics-addr", f"127.0.0.1:{free_port()}",
            ],
            cwd=tree,  # `-m agent.cli` resolves in this tree first
            stdout=subprocess.DEVNULL,
            stderr=e,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "attached" not in err.read_text():
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent from {tree} did not start: {err.read_text()}")
            time.sleep(0.1)
        time.sleep(1.5)  # the first rescan has picked up nginx
        prev = STATS.read_text().strip()
        STATS.write_text("1")
        try:
            ns0, _ = _bpf_stats(p.pid)
            b0, cpu0 = bpf_breakdown(p.pid), _cpu_ns(p.pid)
            res = wrk(port, seconds, CONNS, lua)
            ns1, _ = _bpf_stats(p.pid)
            b1, cpu1 = bpf_breakdown(p.pid), _cpu_ns(p.pid)
        finally:
            STATS.write_text(prev)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    n = max(1.0, res["requests"])
    out = {"bpf_ns": (ns1 - ns0) / n, "cpu_us": (cpu1 - cpu0) / 1e3 / n}
    for name, (ns, _cnt) in b1.items():
        out[f"prog:{name}"] = (ns - b0.get(name, (0, 0))[0]) / n
    return out


def summary(label: str, runs: list[dict[str, float]], ratios: list[float]) -> str:
    med = statistics.median
    progs = sorted(
        (k for k in runs[0] if k.startswith("prog:")), key=lambda k: -med(r[k] for r in runs)
    )[:4]
    lower = sum(x < 1 for x in ratios)
    return (
        f"{label}: BPF median {med(r['bpf_ns'] for r in runs):.0f} ns/req, ratio median"
        f" {med(ratios):.3f} (lower in {lower}/{len(ratios)}); CPU median"
        f" {med(r['cpu_us'] for r in runs):.1f} µs/req; "
        + ", ".join(f"{k[5:]} {med(r[k] for r in runs):.0f}" for k in progs)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.agent_ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("versions", nargs="+", metavar="REV|.", help="the first is the baseline")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--rate", type=int, default=2000, help="offered requests/s (paced)")
    ap.add_argument("--seconds", type=float, default=5)
    a = ap.parse_args(argv)
    if os.geteuid() != 0 or not shutil.which("wrk") or not shutil.which("nginx"):
        print("bench.agent_ab: needs root, wrk and nginx (make setup)", file=sys.stderr)
        return 1
    if len(a.versions) < 2 or a.rounds < 1 or a.rate < 1:
        print("bench.agent_ab: two versions or more, --rounds and --rate ≥ 1", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="px-ab-"))
    labels = [f"{i}:{v}" for i, v in enumerate(a.versions)]
    trees: dict[str, Path] = {}
    port = free_port()
    (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, port=port, servers=""))
    lua = tmp / "paced.lua"
    lua.write_text(PACED_LUA.format(delay_ms=max(1, round(CONNS * 1000 / a.rate))))
    ngx = None
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in labels}
    ratios: dict[str, list[float]] = {k: [] for k in labels}
    try:
        for i, (label, rev) in enumerate(zip(labels, a.versions, strict=True)):
            trees[label] = checkout(rev, tmp / f"tree{i}")
        ngx = subprocess.Popen(
            ["nginx", "-c", str(tmp / "nginx.conf"), "-p", str(tmp)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(port)
        wrk(port, 1, CONNS, None)  # warm-up
        for rnd in range(a.rounds):
            order = labels[:]
            random.shuffle(order)
            got = {k: one_run(trees[k], port, lua, a.seconds, tmp) for k in order}
            for k in labels:
                runs[k].append(got[k])
                ratios[k].append(got[k]["bpf_ns"] / got[labels[0]]["bpf_ns"])
            print(
                f"round {rnd + 1}/{a.rounds}: "
                + "  ".join(f"{k} {got[k]['bpf_ns']:.0f} ns" for k in labels),
                file=sys.stderr,
                flush=True,
            )
    except KeyboardInterrupt:
        print("bench.agent_ab: interrupted; the rounds so far:", file=sys.stderr)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        # a version that does not check out or whose agent does not start: one line
        print(f"bench.agent_ab: {e}".splitlines()[0], file=sys.stderr)
        return 1
    finally:
        if ngx is not None:
            ngx.terminate()
            ngx.wait(10)
        for tree in trees.values():
            if tree != ROOT:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    check=False,
                )
        shutil.rmtree(tmp, ignore_errors=True)
    if not runs[labels[0]]:
        return 1
    print(
        f"{len(runs[labels[0]])} rounds at ~{a.rate} req/s offered, {a.seconds:g} s each,"
        " shuffled; ratio = BPF ns/req over the baseline's in the same round"
    )
    for k in labels:
        print(summary(k, runs[k], ratios[k]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
