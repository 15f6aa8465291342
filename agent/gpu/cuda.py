"""The CUDA driver uprobes (bpf/cuda.c): kernel launches and host waits on the GPU, per GPU
process and time bucket, read from the kernel as buckets close.

Probes go on ``libcuda.so.1`` as each GPU process maps it (CUDA loads its driver with
dlopen, often well after the process started: a process is looked at again until it maps
the library). Launch times are *enqueue* times on the host, not execution on the GPU.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import logging
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.kernel import headers, loader
from agent.kernel.uprobes import LibraryProbes, Probe, uretprobe_hazard

log = logging.getLogger("parallax.agent")
CUDA_SOURCE = loader.BPF_DIR / "cuda.c"
BUCKET_SHIFT = 20  # 2^20 ns ≈ 1.05 ms: a request window's edges are exact to a bucket
BUCKET_NS = 1 << BUCKET_SHIFT
MAX_BUCKETS = 65536  # ≈ a minute of one busy process's buckets between two reads
HISTORY_S = 60.0  # buckets kept in user space for attribution
_LIBCUDA = re.compile(r"/libcuda\.so(?:\.[0-9]+)*$")
LAUNCHES = ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz")
GRAPHS = ("cuGraphLaunch", "cuGraphLaunch_ptsz")
WAITS = ("cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2")
REQUIRED = {"cuLaunchKernel", "cuStreamSynchronize"}  # in every CUDA driver since 4.0


@dataclass(frozen=True, slots=True)
class Bucket:
    """One process's activity in one bucket of BUCKET_NS (monotonic ns). Launch times lie in
    [t_first, t_last]; the host-wait intervals that ended in the bucket (``waits`` of them,
    ``wait_ns`` in all) lie in [wait_first, wait_last]."""

    tgid: int
    start: int  # bucket start, monotonic ns
    launches: int
    graphs: int
    t_first: int
    t_last: int
    wait_ns: int
    wait_first: int
    wait_last: int
    waits: int


def probes(hazard: bool) -> list[Probe]:
    out = [Probe(s, "px_cu_launch", optional=s not in REQUIRED) for s in LAUNCHES]
    out += [Probe(s, "px_cu_graph", optional=True) for s in GRAPHS]
    if not hazard:  # waits need a uretprobe (see agent.kernel.uprobes.uretprobe_hazard)
        for s in WAITS:
            out.append(Probe(s, "px_cu_wait_enter", optional=s not in REQUIRED))
            out.append(Probe(s, "px_cu_wait_exit", ret=True, optional=s not in REQUIRED))
    return out


class CudaProbes:
    """Compiles bpf/cuda.c and follows the GPU processes it is given (``set_pids``)."""

    def __init__(self) -> None:
        if headers.configure_bcc() is None:
            raise loader.LoadError("no kernel headers: run `make setup`")
        from bcc import BPF  # noqa: PLC0415  (Debian's python3-bpfcc)

        from agent.kernel import objcache  # noqa: PLC0415  (imports bcc)

        cflags = [
            f"-DPX_GPU_PID_MAX={loader.pid_max()}",
            f"-DPX_GPU_BUCKETS={MAX_BUCKETS}",
            f"-DPX_GPU_BUCKET_SHIFT={BUCKET_SHIFT}",
        ]
        try:
            text = loader.program_text(Path(CUDA_SOURCE))
            self.bpf: Any = objcache.compile_or_load(BPF, text, cflags)
        except Exception as e:
            raise loader.LoadError(f"the CUDA probes did not compile: {e}") from e
        self.waits_seen = not uretprobe_hazard()
        self._files = LibraryProbes(
            self.bpf, _LIBCUDA, probes(not self.waits_seen), "CUDA probes", recheck=True
        )
        self._pids: set[int] = set()
        self._since: dict[int, int] = {}  # pid → when its probes were in place (mono ns)
        self._lock = threading.Lock()  # the history: the GPU thread writes, the exporter reads
        # per process, in time order (a bisect finds a window's buckets)
        self._history: dict[int, tuple[list[int], list[Bucket]]] = {}
        self.drained_to = 0  # monotonic ns up to which every bucket has been read
        self.launches_total: dict[int, int] = {}  # per tgid, for the process metrics
        self.graphs_total: dict[int, int] = {}
        self.wait_ns_total: dict[int, int] = {}

    @property
    def files(self) -> int:
        """libcuda files carrying the probes."""
        return self._files.attached

    def probed(self) -> set[int]:
        """GPU processes whose libcuda carries the probes."""
        return set(self._since)

    def probed_since(self, pids: Iterable[int]) -> int | None:
        """When the last of these processes to be probed got its probes (monotonic ns):
        launches and waits are complete from then on. None: none of them is probed."""
        times = [self._since[p] for p in pids if p in self._since]
        return max(times) if times else None

    def set_pids(self, pids: Iterable[int]) -> None:
        """The GPU processes to follow now: new ones enter the kernel's filter (and get the
        probes once they map libcuda), gone ones leave it."""
        want = set(pids)
        table = self.bpf["px_gpu_pids"]
        for p in want - self._pids:
            table[ctypes.c_int(p)] = ctypes.c_uint8(1)
        for p in self._pids - want:
            table[ctypes.c_int(p)] = ctypes.c_uint8(0)
            with contextlib.suppress(KeyError):
                del self.bpf["px_gpu_unions"][ctypes.c_uint32(p)]
        self._pids = want
        self._files.sweep()
        self._files.add(want)
        now = time.monotonic_ns()
        probed = self._files.probed_pids()
        self._since = {p: self._since.get(p, now) for p in probed}

    def drain(self, final: bool = False) -> list[Bucket]:
        """Read and delete the buckets that can no longer change (all but the last two:
        a program that read the clock just before a bucket boundary may still write the
        one before; ``final``: stopping, every bucket). Returns them, oldest first, and
        keeps them for attribution."""
        now = time.monotonic_ns()
        closed_before = (1 << 62) if final else (now >> BUCKET_SHIFT) - 1
        table = self.bpf["px_gpu_aggs"]
        done: list[Bucket] = []
        keys = []
        for k, v in table.items_lookup_batch():
            if k.bucket >= closed_before:
                continue
            keys.append(k)
            done.append(
                Bucket(
                    int(k.tgid),
                    int(k.bucket) << BUCKET_SHIFT,
                    int(v.launches),
                    int(v.graphs),
                    int(v.t_first),
                    int(v.t_last),
                    int(v.wait_ns),
                    int(v.wait_first),
                    int(v.wait_last),
                    int(v.waits),
                )
            )
        if keys:
            key_array = (type(keys[0]) * len(keys))(*keys)
            table.items_delete_batch(key_array)
        done.sort(key=lambda b: b.start)
        for b in done:
            self.launches_total[b.tgid] = self.launches_total.get(b.tgid, 0) + b.launches
            self.graphs_total[b.tgid] = self.graphs_total.get(b.tgid, 0) + b.graphs
            self.wait_ns_total[b.tgid] = self.wait_ns_total.get(b.tgid, 0) + b.wait_ns
        horizon = now - int(HISTORY_S * 1e9)
        with self._lock:
            for b in done:
                starts, kept = self._history.setdefault(b.tgid, ([], []))
                starts.append(b.start)
                kept.append(b)
            for tgid, (starts, kept) in list(self._history.items()):
                old = bisect.bisect_left(starts, horizon)
                if old:
                    del starts[:old], kept[:old]
                if not starts and tgid not in self._pids:
                    del self._history[tgid]
            self.drained_to = now if final else closed_before << BUCKET_SHIFT
        return done

    def buckets(
        self, tgids: Iterable[int], t0: int, t1: int, wait_tail: int = 10**10
    ) -> list[Bucket]:
        """The kept buckets of these processes with launches or host waits that may fall in
        [t0, t1] (monotonic ns). A wait is kept in the bucket where it ended, so buckets up
        to ``wait_tail`` ns after t1 are looked at too (a wait that began in the window)."""
        out: list[Bucket] = []
        with self._lock:
            for tgid in tgids:
                h = self._history.get(tgid)
                if h is None:
                    continue
                starts, kept = h
                lo = bisect.bisect_left(starts, t0 - BUCKET_NS)
                hi = bisect.bisect_left(starts, t1 + wait_tail)
                for b in kept[lo:hi]:
                    if (b.start < t1 and b.start + BUCKET_NS > t0) or (
                        b.waits and b.wait_first < t1 and b.wait_last > t0
                    ):
                        out.append(b)
        return out

    def counters(self) -> dict[str, int]:
        t = self.bpf["px_gpu_counters"]
        return {
            "dropped": int(sum(t[ctypes.c_int(0)])),
            "unmatched": int(sum(t[ctypes.c_int(1)])),
        }

    def close(self) -> None:
        self._files.close()
        self.bpf.cleanup()
