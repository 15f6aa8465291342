"""The NVML poller: per-GPU readings and the driver's sample buffers, kept for a while.

One thread calls :meth:`NvmlPoller.run`; the exporter reads what it kept
(:meth:`~NvmlPoller.devices`, :meth:`~NvmlPoller.process_samples`, …) from its own thread.
NVML comes through nvidia-ml-py (``import pynvml``), which loads ``libnvidia-ml.so.1`` —
the driver's library, so a node without a GPU simply has none.

Per device, each round: utilisation, memory, SM clock (and its maximum, read once), power
and its enforced limit, the clock-event ("throttle") reasons, the driver's GPU-utilisation
sample buffer (``nvmlDeviceGetSamples``) and process samples
(``nvmlDeviceGetProcessUtilization``), both read from the last-seen timestamp so every
sample arrives once, however long the poll period, as long as it is shorter than the
driver's buffer (about 100 samples: 16 s at 1/6 s), and the compute processes with their
GPU memory (``nvmlDeviceGetComputeRunningProcesses_v3``).

Sample times are CPU time in µs (Unix), the clock the agent's records use. A sample stamped
``t`` stands for the driver's sample period ending at ``t``: the span ``(t - period_us, t]``.
The period (1/6–1 s, by product) is measured from the spacing of the device's own
utilisation samples. NVML leaves a process out of a period it did not use the GPU in, so
within :attr:`NvmlPoller.covered_us` a missing pid means 0 %, not "unknown".

Failures degrade, never stop the agent: a function the driver lacks (old driver, MIG, vGPU)
or does not support turns that reading off (``disabled``, logged once); a lost device is
dropped and the others go on; other errors are counted (``errors``), logged once per
reading and code, and when a whole round fails the poller backs off.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("parallax.agent.gpu")

DEFAULT_PERIOD_US = 166_667  # NVML's fastest sample period (1/6 s), until one is measured
MAX_BACKOFF_S = 60.0  # longest wait between rounds while every call fails
MAX_SAMPLES = 100_000  # cap per sample list (process samples; each device's utilisation)
LOGGED_BACKOFFS = 5  # back-off episodes logged; later ones only counted

# NVML return codes (nvml.h; the same values as pynvml.NVML_ERROR_*)
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
GPU_NOT_FOUND = 28
LOST = frozenset({GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND})
NVML_CLOCK_SM = 1
NVML_GPU_UTILIZATION_SAMPLES = 1

# reading -> the pynvml function (named as the C symbol it calls) that gives it
READINGS = {
    "utilization": "nvmlDeviceGetUtilizationRates",
    "memory": "nvmlDeviceGetMemoryInfo",
    "sm_clock": "nvmlDeviceGetClockInfo",
    "sm_clock_max": "nvmlDeviceGetMaxClockInfo",
    "power": "nvmlDeviceGetPowerUsage",
    "power_limit": "nvmlDeviceGetEnforcedPowerLimit",
    "clock_event_reasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "util_samples": "nvmlDeviceGetSamples",
    "process_samples": "nvmlDeviceGetProcessUtilization",
    "gpu_processes": "nvmlDeviceGetComputeRunningProcesses_v3",
}
# readings read from a last-seen timestamp: NOT_FOUND there means "no new sample"
SAMPLED = frozenset({"util_samples", "process_samples"})


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """One poll of one device; None = not available (absent, never 0)."""

    t_us: int  # CPU µs (Unix time) of the poll
    index: int
    uuid: str
    name: str
    util_gpu_pct: float | None
    util_mem_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    sm_clock_mhz: int | None
    sm_clock_max_mhz: int | None
    power_mw: int | None
    power_limit_mw: int | None
    clock_event_reasons: int | None  # NVML bitmask


@dataclass(frozen=True, slots=True)
class UtilSample:
    """One driver sample of GPU utilisation (nvmlDeviceGetSamples): the share of the
    period (t_us - period_us, t_us] in which a kernel ran."""

    t_us: int
    uuid: str
    util_pct: float
    period_us: int = 0  # the device's sample period as measured; 0 only when built by hand


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One nvmlDeviceGetProcessUtilization sample: ``pid`` used ``sm_pct`` % of the SMs
    (``mem_pct`` % of the memory bandwidth) of GPU ``uuid`` over (t_us - period_us, t_us]."""

    t_us: int
    uuid: str
    pid: int
    sm_pct: int
    mem_pct: int
    period_us: int = 0  # the device's sample period as measured; 0 only when built by hand


def mean_sm_pct(samples: Iterable[ProcessSample], t0_us: int, t1_us: int) -> float | None:
    """Time-weighted mean SM % over [t0_us, t1_us] of the given samples (one GPU: filter
    by uuid first), summed over their pids: each sample weighs by the overlap of its span
    (t_us - period_us, t_us] with the window, and time without a sample counts 0 %, as
    NVML omits idle processes. Valid only where samples are complete: t1_us <= covered_us.
    None for an empty window."""
    if t1_us <= t0_us:
        return None
    busy = 0.0
    for s in samples:
        lo, hi = max(t0_us, s.t_us - s.period_us), min(t1_us, s.t_us)
        if hi > lo:
            busy += s.sm_pct * (hi - lo)
    return min(100.0, busy / (t1_us - t0_us))


def _wall_us() -> int:
    return time.time_ns() // 1000


class _DeviceLostError(Exception):
    """The device answered that it is gone."""


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str
    off: set[str] = field(default_factory=set)  # readings this device does not support
    util_seen_us: int = 0  # last-seen timestamps, one per sampled reading
    proc_seen_us: int = 0
    ticks: deque[int] = field(default_factory=lambda: deque(maxlen=17))  # newest sample times
    period_us: int = DEFAULT_PERIOD_US
    covered_us: int = 0  # samples of this device are complete up to here
    sm_max: int | None = None  # static: read until it answers
    pids: dict[int, int] = field(default_factory=dict)  # host pid -> GPU memory (bytes)


def _value(vtype: int, v: Any) -> float | None:
    """A c_nvmlValue_t as a number, by NVML's value type."""
    fields = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
    return float(getattr(v, fields[vtype])) if 0 <= vtype < len(fields) else None


def _overlapping(
    lst: list[Any], t0_us: int, t1_us: int, max_period_us: int, keep: Callable[[Any], bool]
) -> list[Any]:
    """Samples (time-ordered) whose span (t_us - period_us, t_us] meets [t0_us, t1_us]."""
    i = bisect.bisect_right(lst, t0_us, key=lambda s: s.t_us)
    out = []
    while i < len(lst) and lst[i].t_us - max_period_us < t1_us:
        s = lst[i]
        if s.t_us - s.period_us < t1_us and keep(s):
            out.append(s)
        i += 1
    return out


def _add_sorted(lst: list[Any], new: list[Any]) -> None:
    """Add time-ordered ``new`` to time-ordered ``lst``. Devices interleave by up to a
    period, so a batch may start before the list's end: only that tail is re-sorted."""
    if not new:
        return
    i = bisect.bisect_right(lst, new[0].t_us, key=lambda s: s.t_us)
    if i == len(lst):
        lst.extend(new)
    else:
        lst[i:] = sorted(lst[i:] + new, key=lambda s: s.t_us)


def _trim(lst: list[Any], cutoff_us: int, cap: int) -> None:
    del lst[: max(bisect.bisect_left(lst, cutoff_us, key=lambda s: s.t_us), len(lst) - cap)]


class NvmlPoller:
    """Polls every GPU through NVML; see the module docstring. Never raises into the
    agent: every NVML failure is a disabled reading, a dropped device or a counted error."""

    def __init__(
        self,
        poll_s: float,
        history_s: float = 60.0,
        wall_us: Callable[[], int] = _wall_us,
        max_samples: int = MAX_SAMPLES,
    ) -> None:
        if poll_s <= 0:
            raise ValueError(f"poll period {poll_s} s: must be positive")
        self.poll_s = poll_s
        self.history_s = history_s
        self.max_samples = max_samples
        self._wall_us = wall_us
        self.available = False
        self.covered_us = 0
        self.disabled: dict[str, str] = {}
        self.errors = 0
        self.driver = ""
        self._nv: Any = None  # the pynvml module once NVML is up
        self._devs: list[_Device] = []
        self._missing: set[str] = set()  # readings whose function this NVML lacks
        self._off_on: dict[str, list[int]] = {}  # reading -> devices that do not support it
        self._logged: set[tuple[object, ...]] = set()
        self._bad_rounds = 0  # consecutive rounds in which every call failed
        self._backoffs = 0
        self._round_ok = 0
        self._round_failed = 0
        self._lock = threading.Lock()  # the history and readings (exporter vs poller)
        self._poll_lock = threading.Lock()  # NVML itself: a round vs close()
        self._readings: dict[int, DeviceReading] = {}
        self._util: dict[str, list[UtilSample]] = {}
        self._procs: list[ProcessSample] = []
        self._max_period_us = DEFAULT_PERIOD_US
        self._first_round_us = 0  # the first round's time: samples are known from then

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> str:
        """Initialise NVML and read the devices once; one line for the attach message."""
        try:
            import pynvml  # noqa: PLC0415 (optional at run time: --gpu off needs none)
        except ImportError:
            return "GPU: none (nvidia-ml-py not installed)"
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            return "GPU: none (libnvidia-ml.so.1 not found)"
        except Exception as e:  # noqa: BLE001 (NVMLError, or OSError from a broken library)
            return f"GPU: off (NVML init failed: {e})"
        self._nv = pynvml
        try:
            self.driver = str(pynvml.nvmlSystemGetDriverVersion())
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception as e:  # noqa: BLE001
            self._shutdown()
            return f"GPU: off (NVML failed: {e})"
        for i in range(count):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                dev = _Device(
                    i, h, str(pynvml.nvmlDeviceGetUUID(h)), str(pynvml.nvmlDeviceGetName(h))
                )
            except Exception as e:  # noqa: BLE001 (one bad device does not hide the others)
                log.warning("GPU %d: left out: %s", i, e)
                continue
            self._devs.append(dev)
        if not self._devs:
            self._shutdown()
            return (
                "GPU: none (NVML lists no usable device)"
                if count
                else "GPU: none (NVML lists no device)"
            )
        self.available = True
        self.poll()  # the first round also finds what this driver lacks, for the line
        names = ", ".join(dict.fromkeys(d.name for d in self._devs))
        n = len(self._devs)
        line = (
            f"GPU: {n} device{'s' if n > 1 else ''} ({names}), driver {self.driver}, "
            f"NVML polled every {self.poll_s * 1000:.0f} ms"
        )
        if self.disabled:
            line += f"; not available: {', '.join(sorted(self.disabled))}"
        return line

    def close(self) -> None:
        """Shut NVML down (idempotent); no round runs after it."""
        with self._poll_lock:
            self.available = False
            self._shutdown()

    def _shutdown(self) -> None:
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception as e:  # noqa: BLE001
                log.debug("nvmlShutdown: %s", e)
            self._nv = None

    def delay_s(self) -> float:
        """The wait before the next round: the poll period, doubled for every consecutive
        round in which every NVML call failed (at most MAX_BACKOFF_S)."""
        if not self._bad_rounds:
            return self.poll_s
        return min(self.poll_s * 2.0 ** min(self._bad_rounds, 16), max(self.poll_s, MAX_BACKOFF_S))

    def run(self, stop: threading.Event) -> None:
        """Poll every ``delay_s()`` (a steady cadence) until ``stop`` is set or no GPU is
        left."""
        due = time.monotonic()
        while self.available and not stop.is_set():
            self.poll()
            due = max(due + self.delay_s(), time.monotonic())
            if stop.wait(due - time.monotonic()):
                break

    # --- one round ----------------------------------------------------------------------

    def poll(self) -> None:
        """One round over every device. Never raises."""
        with self._poll_lock:
            if not self.available:
                return
            try:
                self._round()
            except Exception as e:  # noqa: BLE001 (a bug here must not stop the agent)
                self.errors += 1
                self._log_once(("round", type(e).__name__), "GPU: poll failed: %r", e)

    def _round(self) -> None:
        t = self._wall_us()
        if not self._first_round_us:
            self._first_round_us = t
        self._round_ok = self._round_failed = 0
        readings: dict[int, DeviceReading] = {}
        utils: dict[str, list[UtilSample]] = {}
        procs: list[ProcessSample] = []
        for dev in list(self._devs):
            try:
                readings[dev.index] = self._poll_device(dev, t, utils, procs)
            except _DeviceLostError as e:
                self._drop(dev, str(e))
        self._backoff()
        with self._lock:
            self._readings = readings
            for uuid, new in utils.items():
                _add_sorted(self._util.setdefault(uuid, []), new)
            _add_sorted(self._procs, sorted(procs, key=lambda s: s.t_us))
            cutoff = t - int(self.history_s * 1e6)
            for lst in self._util.values():
                _trim(lst, cutoff, self.max_samples)
            _trim(self._procs, cutoff, self.max_samples)
            self._max_period_us = max([d.period_us for d in self._devs] or [DEFAULT_PERIOD_US])
            if self._devs:
                self.covered_us = max(self.covered_us, min(d.covered_us for d in self._devs))
            else:
                self.covered_us = t

    def _poll_device(
        self, dev: _Device, t: int, utils: dict[str, list[UtilSample]], procs: list[ProcessSample]
    ) -> DeviceReading:
        u = self._call(dev, "utilization")
        mem = self._call(dev, "memory")
        sm = self._call(dev, "sm_clock", NVML_CLOCK_SM)
        if dev.sm_max is None:
            v = self._call(dev, "sm_clock_max", NVML_CLOCK_SM)
            dev.sm_max = None if v is None else int(v)
        power = self._call(dev, "power")
        limit = self._call(dev, "power_limit")
        reasons = self._call(dev, "clock_event_reasons")
        complete = True  # did every sampled reading answer (data or "none new")?
        got = self._call(dev, "util_samples", NVML_GPU_UTILIZATION_SAMPLES, dev.util_seen_us)
        complete &= got is not None or self._off(dev, "util_samples")
        if got:
            utils[dev.uuid] = self._util_samples(dev, t, got)
        got = self._call(dev, "process_samples", dev.proc_seen_us)
        complete &= got is not None or self._off(dev, "process_samples")
        if got:
            procs += self._process_samples(dev, t, got)
        running = self._call(dev, "gpu_processes")
        if running is not None:
            pids: dict[int, int] = {}
            for p in running:
                # usedGpuMemory None: not available (Windows WDDM only, per pynvml)
                used = int(p.usedGpuMemory) if p.usedGpuMemory is not None else 0
                pids[int(p.pid)] = pids.get(int(p.pid), 0) + used
            dev.pids = pids  # one assignment: gpu_pids() reads it from another thread
        elif self._off(dev, "gpu_processes"):
            dev.pids = {}
        if complete:
            # Complete up to the newest driver tick; a sampler that went quiet (nothing
            # new for two periods) still covers up to two periods ago.
            newest = dev.ticks[-1] if dev.ticks else 0
            dev.covered_us = max(dev.covered_us, newest, t - 2 * dev.period_us)
        return DeviceReading(
            t_us=t,
            index=dev.index,
            uuid=dev.uuid,
            name=dev.name,
            util_gpu_pct=None if u is None else float(u.gpu),
            util_mem_pct=None if u is None else float(u.memory),
            mem_used_bytes=None if mem is None else int(mem.used),
            mem_total_bytes=None if mem is None else int(mem.total),
            sm_clock_mhz=None if sm is None else int(sm),
            sm_clock_max_mhz=dev.sm_max,
            power_mw=None if power is None else int(power),
            power_limit_mw=None if limit is None else int(limit),
            clock_event_reasons=None if reasons is None else int(reasons),
        )

    def _util_samples(self, dev: _Device, t: int, got: Any) -> list[UtilSample]:
        vtype, raw = got
        fresh = sorted(
            {
                (ts, v)
                for s in raw
                if dev.util_seen_us < (ts := int(s.timeStamp)) <= t + DEFAULT_PERIOD_US
                and (v := _value(int(vtype), s.sampleValue)) is not None
                and 0 <= v <= 100
            }
        )
        if not fresh:
            return []
        dev.util_seen_us = fresh[-1][0]
        dev.ticks.extend(ts for ts, _ in fresh)
        gaps = [b - a for a, b in itertools.pairwise(dev.ticks) if b > a]
        if gaps:
            dev.period_us = int(statistics.median(gaps))
        return [UtilSample(ts, dev.uuid, v, dev.period_us) for ts, v in fresh]

    def _process_samples(self, dev: _Device, t: int, got: Any) -> list[ProcessSample]:
        # The real driver also returns stale entries (older than lastSeen), bogus ones
        # (utilisation above 100 %, pid 0) and repeats: keep only fresh, sane samples.
        fresh = sorted(
            {
                (ts, int(s.pid), int(s.smUtil), int(s.memUtil))
                for s in got
                if dev.proc_seen_us < (ts := int(s.timeStamp)) <= t + DEFAULT_PERIOD_US
                and int(s.pid) > 0
                and int(s.smUtil) <= 100
                and int(s.memUtil) <= 100
            }
        )
        if not fresh:
            return []
        dev.proc_seen_us = fresh[-1][0]
        return [ProcessSample(ts, dev.uuid, pid, sm, m, dev.period_us) for ts, pid, sm, m in fresh]

    # --- calls and their failures -------------------------------------------------------

    def _off(self, dev: _Device, reading: str) -> bool:
        return reading in dev.off or reading in self._missing

    def _call(self, dev: _Device, reading: str, *args: Any) -> Any:
        """The reading's pynvml function on this device; for a sampled reading () when
        there is no sample newer than the last seen; None when it is turned off or failed.
        Raises _DeviceLostError."""
        if self._off(dev, reading):
            return None
        fn = getattr(self._nv, READINGS[reading], None)
        if fn is None:  # an older nvidia-ml-py
            self._turn_off(reading, None, f"nvidia-ml-py has no {READINGS[reading]}")
            return None
        try:
            out = fn(dev.handle, *args)
        except self._nv.NVMLError as e:
            return self._failed(dev, reading, int(getattr(e, "value", -1)), e)
        self._round_ok += 1
        return out

    def _failed(self, dev: _Device, reading: str, code: int, e: Exception) -> tuple[()] | None:
        fn = READINGS[reading]
        if code == NOT_FOUND and reading in SAMPLED:
            self._round_ok += 1  # no new sample since the last seen: a normal answer
            return ()
        if code == INSUFFICIENT_SIZE and reading in SAMPLED | {"gpu_processes"}:
            # more entries arrived between pynvml's size query and its read: the
            # last-seen timestamp did not move, so the next round gets them
            self._log_once((reading, code), "GPU %d: %s: %s (retried next round)", dev.index, fn, e)
        elif code == FUNCTION_NOT_FOUND:
            self._turn_off(reading, None, f"{fn} missing from this driver's NVML")
        elif code in (NOT_SUPPORTED, NO_PERMISSION):
            dev.off.add(reading)
            self._turn_off(reading, dev, f"{fn}: {e}")
        elif code in LOST or code == NOT_FOUND:  # NOT_FOUND outside a sample read: its handle
            raise _DeviceLostError(f"{fn}: {e}")
        else:
            self.errors += 1
            self._round_failed += 1
            self._log_once(
                (reading, code), "GPU %d: %s failed: %s (counted; logged once)", dev.index, fn, e
            )
        return None

    def _turn_off(self, reading: str, dev: _Device | None, why: str) -> None:
        said = why
        if dev is None:
            self._missing.add(reading)
        else:
            on = self._off_on.setdefault(reading, [])
            on.append(dev.index)
            said = f"{why} (GPU {', '.join(map(str, sorted(on)))})"
        # a new dict, not an update: another thread may be iterating the old one
        self.disabled = {**self.disabled, reading: said}
        self._log_once(
            ("off", reading, None if dev is None else dev.index),
            "GPU%s: no %s: %s",
            "" if dev is None else f" {dev.index}",
            reading,
            why,
        )

    def _drop(self, dev: _Device, why: str) -> None:
        with self._lock:
            self._devs.remove(dev)
        log.warning("GPU %d (%s) is gone (%s): dropped, the others go on", dev.index, dev.uuid, why)
        if not self._devs:
            log.warning("GPU: no device left: NVML polling stops")
            self.available = False

    def _backoff(self) -> None:
        if self._round_failed and not self._round_ok:
            self._bad_rounds += 1
            if self._bad_rounds == 1:
                self._backoffs += 1
                if self._backoffs <= LOGGED_BACKOFFS:
                    log.warning(
                        "GPU: every NVML call failed: polling backs off (at most %.0f s)",
                        MAX_BACKOFF_S,
                    )
        elif self._bad_rounds:
            if self._backoffs <= LOGGED_BACKOFFS:
                log.warning("GPU: NVML answers again after %d failed rounds", self._bad_rounds)
            self._bad_rounds = 0

    def _log_once(self, key: tuple[object, ...], msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)

    # --- what the exporter reads (any thread) -------------------------------------------

    def devices(self) -> list[DeviceReading]:
        """The latest reading of every device still present, by index."""
        with self._lock:
            return sorted(self._readings.values(), key=lambda r: r.index)

    def util_samples(self, uuid: str, t0_us: int, t1_us: int) -> list[UtilSample]:
        """GPU ``uuid``'s utilisation samples whose span meets [t0_us, t1_us], by time."""
        with self._lock:
            lst = self._util.get(uuid, [])
            return _overlapping(lst, t0_us, t1_us, self._max_period_us, lambda _: True)

    def process_samples(self, pids: Iterable[int], t0_us: int, t1_us: int) -> list[ProcessSample]:
        """The samples of ``pids`` (host pids, any GPU) whose span (t_us - period_us, t_us]
        meets [t0_us, t1_us], by time. A pid without a sample in a period used no SM then."""
        want = set(pids)
        with self._lock:
            return _overlapping(
                self._procs, t0_us, t1_us, self._max_period_us, lambda s: s.pid in want
            )

    def gpu_pids(self) -> dict[int, int]:
        """Host pid -> GPU memory used (bytes, summed over GPUs) of the compute processes
        in the latest poll (0 where NVML cannot say)."""
        with self._lock:
            out: dict[int, int] = {}
            for d in self._devs:
                for pid, used in d.pids.items():
                    out[pid] = out.get(pid, 0) + used
            return out

    def uuids_of(self, pids: Iterable[int]) -> set[str]:
        """The GPUs on which any of ``pids`` is a compute process (latest poll)."""
        want = set(pids)
        with self._lock:
            return {d.uuid for d in self._devs if want & d.pids.keys()}

    def known_from_us(self, uuid: str) -> int:
        """Samples of GPU ``uuid`` are complete from here (to covered_us): the start of its
        oldest utilisation sample kept — the driver hands its whole buffer, seconds of
        history, at the first read — else the first poll round."""
        with self._lock:
            lst = self._util.get(uuid)
            if lst:
                return lst[0].t_us - (lst[0].period_us or DEFAULT_PERIOD_US)
            return self._first_round_us

    def sample_period_us(self, uuid: str) -> int | None:
        """The driver's sample period on GPU ``uuid`` as measured (DEFAULT_PERIOD_US until
        two samples arrived); None for an unknown or dropped device."""
        for d in list(self._devs):
            if d.uuid == uuid:
                return d.period_us
        return None
