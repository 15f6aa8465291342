"""The agent's BTF tracepoints against its classic ones, side by side (docs/agent.md, "Missed
runs"): the same paced nginx load as ``make bench-agent``, the agent started fresh for each
run with ``PARALLAX_AGENT_NO_TP_BTF=1`` (every hook a classic tracepoint) or without (the
socket hooks, the TCP state changes, retransmits, resets and ``sk_data_ready`` as tp_btf),
alternating. Per run: BPF ns per request in all and per hook, runs per request, the agent's
user-space CPU per request. Medians over the rounds; the ratio BTF/classic per round.

    python -m bench.tp_btf [--rounds 4] [--seconds 5] [--rate 2000]   # root
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from functools import partial
from pathlib import Path

from bench.agent import PACED_LUA, TracedRun, start_nginx, wrk
from demo.stack import free_port

# the hooks as each mode names them: classic (bcc's function) and BTF (ours)
HOOKS = {
    "sock_recv_length": ("sock__sock_recv_length", "px_recv_btf"),
    "sock_send_length": ("sock__sock_send_length", "px_send_btf"),
    "sk_data_ready": ("sock__sk_data_ready", "px_sdr_btf"),
    "inet_sock_set_state": ("sock__inet_sock_set_state", "px_state_btf"),
}


def _run(mode: str, port: int, tmp: Path, lua: Path, seconds: float) -> TracedRun:
    if mode == "classic":
        os.environ["PARALLAX_AGENT_NO_TP_BTF"] = "1"
    else:
        os.environ.pop("PARALLAX_AGENT_NO_TP_BTF", None)
    stats = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    try:
        return TracedRun(port, tmp, stats, partial(wrk, port, seconds, 10, lua), 0.0)
    finally:
        os.environ.pop("PARALLAX_AGENT_NO_TP_BTF", None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=int, default=2000, help="requests/s offered (10 connections)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench.tp_btf: needs root (the agent, bpf_stats)")
        return 2
    runs: dict[str, list[TracedRun]] = {"classic": [], "tp_btf": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        port = free_port()
        nginx = start_nginx(tmp, port)
        try:
            lua = tmp / "paced.lua"
            lua.write_text(PACED_LUA.format(delay_ms=max(1, round(10 * 1000 / a.rate))))
            for r in range(a.rounds):
                order = ("classic", "tp_btf") if r % 2 == 0 else ("tp_btf", "classic")
                for mode in order:
                    run = _run(mode, port, tmp / f"{mode}{r}", lua, a.seconds)
                    runs[mode].append(run)
                    print(
                        f"round {r + 1} {mode:7s}: {run.res['rps']:.0f} req/s,"
                        f" BPF {run.res['bpf_ns_per_req']:.0f} ns/request, agent CPU"
                        f" {run.res['cpu_us_per_req']:.1f} µs/request, {run.records} records",
                        flush=True,
                    )
        finally:
            nginx.terminate()
            nginx.wait(10)
    med = {m: statistics.median(r.res["bpf_ns_per_req"] for r in rs) for m, rs in runs.items()}
    ratios = [
        b.res["bpf_ns_per_req"] / c.res["bpf_ns_per_req"]
        for c, b in zip(runs["classic"], runs["tp_btf"], strict=True)
    ]
    print(f"BPF ns/request, median: classic {med['classic']:.0f}, tp_btf {med['tp_btf']:.0f};")
    print("  per round, tp_btf / classic: " + ", ".join(f"{x:.3f}" for x in ratios))
    print("per hook, ns/request (runs/request), median:")
    for hook, (classic_name, btf_name) in HOOKS.items():
        row = []
        for mode, name in (("classic", classic_name), ("tp_btf", btf_name)):
            ns = statistics.median(r.breakdown.get(name, (0.0, 0.0))[0] for r in runs[mode])
            cnt = statistics.median(r.breakdown.get(name, (0.0, 0.0))[1] for r in runs[mode])
            row.append(f"{mode} {ns:.0f} ({cnt:.2f})")
        print(f"  {hook}: " + ", ".join(row))
    cpu = {m: statistics.median(r.res["cpu_us_per_req"] for r in rs) for m, rs in runs.items()}
    print(f"agent CPU µs/request, median: classic {cpu['classic']:.1f}, tp_btf {cpu['tp_btf']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
