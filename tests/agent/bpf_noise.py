"""Another eBPF tool on the node, at its worst for the agent: a classic tracepoint program
(syscalls:sys_enter_getppid) that spins ~100 µs per run, run by hog processes calling
getppid() in a loop, so that a CPU is inside a BPF program nearly all the time. A softirq on
that CPU's interrupt exit runs nested there, and the kernel skips every classic tracepoint
program it would run (bpf_prog_active): what the agent's tp_btf programs are for
(docs/agent.md, "Missed runs").

    python -m tests.agent.bpf_noise [HOGS]   # root; prints "ready", spins until killed
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys

_SPIN = r"""
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    u64 t0 = bpf_ktime_get_ns();
    for (int i = 0; i < 5000; i++) {
        if (bpf_ktime_get_ns() - t0 > 100000)
            break;
    }
    return 0;
}
"""


def _hog(parent: int) -> None:
    while os.getppid() == parent:  # (the spinning syscall; ends when its parent is gone)
        pass


def main() -> None:
    from agent.kernel import headers

    headers.configure_bcc()
    from bcc import BPF  # (after the header fallback is configured)

    b = BPF(text=_SPIN)
    hogs = [
        multiprocessing.Process(target=_hog, args=(os.getpid(),), daemon=True)
        for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    ]
    for h in hogs:
        h.start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    for h in hogs:
        h.terminate()
    b.cleanup()


if __name__ == "__main__":
    main()
