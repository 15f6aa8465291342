"""The NVML poller against a fake libnvidia-ml.so.1 (tests/gpu/fake_nvml.c), through the
real pynvml: every scenario runs in a child process started with LD_LIBRARY_PATH on the
fake (the dynamic linker reads it at start, and pynvml keeps its library for the process's
life, so no two scenarios share one).

The ``scenario_*`` functions run in the child; the ``test_*`` functions start them. Most
scenarios freeze the fake's clock (``clock``) at a real, current time and give the poller
the same clock, so sample times are exact; the first and the thread scenario use the real
clock.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.gpu.nvml import DEFAULT_PERIOD_US, MAX_BACKOFF_S, NvmlPoller, ProcessSample, mean_sm_pct
from demo.gpu.nvml_double import (
    DRIVER_NOT_LOADED,
    GPU_IS_LOST,
    NOT_FOUND,
    NOT_SUPPORTED,
    TIMEOUT,
    UNKNOWN,
    FakeNvmlUnavailableError,
    NvmlScript,
    build_fake_nvml,
    fake_env,
    tick_floor,
)
from tests.gpu.fakes import run_in_child

P = 100_000  # the fake driver's sample period in the frozen-clock scenarios (10 a second)
UUID0, UUID1 = (
    "GPU-5f3c0a4e-0000-4000-8000-000000000000",
    "GPU-5f3c0a4e-0001-4000-8000-000000000001",
)


# --- child side -----------------------------------------------------------------------


class _Logs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        logging.getLogger("parallax.agent.gpu").addHandler(self)
        logging.getLogger("parallax.agent.gpu").setLevel(logging.DEBUG)

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.lines.append(record.getMessage())

    def matching(self, text: str) -> list[str]:
        return [x for x in self.lines if text in x]


def _frozen(devices: int = 1, buffer: int = 20) -> tuple[NvmlScript, int]:
    """A script with a frozen clock half a period after tick A (returned), near real now."""
    s = NvmlScript(os.environ["PARALLAX_FAKE_NVML"], period_us=P)
    s.buffer = buffer
    a = tick_floor(time.time_ns() // 1000, P)
    s.clock_us = a + P // 2
    for i in range(devices):
        s.device((UUID0, UUID1)[i], sm_mhz=1410 + i, power_mw=250_000 + i, reasons=0x4 * i)
    return s, a


def _poller(
    s: NvmlScript, poll_s: float = 0.5, history_s: float = 60.0, max_samples: int = 100_000
) -> NvmlPoller:
    """A poller on the script's frozen clock."""

    def wall() -> int:
        assert s.clock_us is not None
        return s.clock_us

    return NvmlPoller(poll_s, history_s, wall, max_samples)


def _advance(s: NvmlScript, us: int) -> None:
    assert s.clock_us is not None
    s.clock_us += us
    s.write()


def _returned(process: bool) -> int:
    """Samples the fake library has handed out (its test hook), through pynvml's handle."""
    import pynvml

    fn = pynvml.nvmlLib.fake_nvml_returned
    fn.restype = ctypes.c_ulonglong
    return int(fn(int(process)))


def _times(p: NvmlPoller, uuid: str = UUID0) -> list[tuple[int, float]]:
    return [(u.t_us, u.util_pct) for u in p.util_samples(uuid, 0, 2**62)]


def scenario_real_clock() -> None:
    """Start, one round, every reading; samples stamped on the real clock."""
    s = NvmlScript(os.environ["PARALLAX_FAKE_NVML"])  # the default 1/6 s period
    now = time.time_ns() // 1000
    d0 = s.device(UUID0, "NVIDIA H200", mem_total=150_000_000_000, mem_used=7_000_000_000,
                  sm_mhz=1755, sm_max_mhz=1980, power_mw=412_345, power_limit_mw=700_000,
                  reasons=0x4)  # fmt: skip
    d1 = s.device(UUID1, "NVIDIA A100 80GB PCIe", sm_mhz=1410, sm_max_mhz=1410)
    s.util(d0, now - 60_000_000, now + 60_000_000, gpu_pct=50, mem_pct=20)
    s.proc(d0, 4242, now - 60_000_000, now + 60_000_000, sm_pct=30, mem_pct=5)
    s.running(d0, 4242, 3 * 2**30).running(d0, 5151, 2**20).running(d1, 4242, 2**30)
    s.write()
    p = NvmlPoller(0.25)
    before = time.time_ns() // 1000
    line = p.start()
    after = time.time_ns() // 1000
    assert line == (
        "GPU: 2 devices (NVIDIA H200, NVIDIA A100 80GB PCIe), driver 550.54.15, "
        "NVML polled every 250 ms"
    ), line
    assert p.available and p.errors == 0 and p.disabled == {}
    r0, r1 = p.devices()
    assert before <= r0.t_us <= after
    assert (r0.index, r0.uuid, r0.name) == (0, UUID0, "NVIDIA H200")
    assert (r0.util_gpu_pct, r0.util_mem_pct) == (50.0, 20.0)
    assert (r0.mem_used_bytes, r0.mem_total_bytes) == (7_000_000_000, 150_000_000_000)
    assert (r0.sm_clock_mhz, r0.sm_clock_max_mhz) == (1755, 1980)
    assert (r0.power_mw, r0.power_limit_mw, r0.clock_event_reasons) == (412_345, 700_000, 0x4)
    assert (r1.util_gpu_pct, r1.sm_clock_max_mhz, r1.clock_event_reasons) == (0.0, 1410, 0)
    # the driver's whole buffer (100 samples), stamped at its ticks, on the real clock: read
    # between `before` and `after`, its last tick at most one period before the read (the
    # lower bound is from `before`: from `after` it failed when the read came more than a
    # tick's remainder before it, ~1 % of runs under load)
    us = p.util_samples(UUID0, 0, 2**62)
    assert len(us) == 100 and {u.util_pct for u in us} == {50.0}
    assert before - 100 * 166_667 < us[0].t_us and us[-1].t_us <= after
    assert all(b.t_us - a.t_us == 166_667 for a, b in itertools.pairwise(us))
    assert p.sample_period_us(UUID0) == 166_667 and us[-1].period_us == 166_667
    ps = p.process_samples([4242], before - 1_000_000, before)
    assert ps and all((x.pid, x.sm_pct, x.mem_pct, x.uuid) == (4242, 30, 5, UUID0) for x in ps)
    assert all(before - 1_000_000 < x.t_us < before + 166_667 for x in ps)
    assert p.gpu_pids() == {4242: 4 * 2**30, 5151: 2**20}
    assert us[-1].t_us <= p.covered_us <= after
    p.close()
    p.poll()  # after close: nothing, no exception
    assert not p.available


def scenario_samples_arrive_once() -> None:
    """Every driver sample once, from the last-seen timestamp; exact values and times."""
    s, a = _frozen()
    s.util(0, a - 10 * P, a + 10 * P, gpu_pct=40).util(0, a + 10 * P, a + 20 * P, gpu_pct=80)
    s.write()
    p = _poller(s)
    assert p.start().startswith("GPU: 1 device (NVIDIA H200), driver 550.54.15")
    # the buffer holds 20 ticks: a-19P … a; the span (t-P, t] of a-10P is before the segment
    first = [(a + k * P, 40.0 if k > -10 else 0.0) for k in range(-19, 1)]
    assert _times(p) == first
    _advance(s, 5 * P)
    p.poll()
    assert _times(p) == [*first, *[(a + k * P, 40.0) for k in range(1, 6)]]
    _advance(s, 7 * P)
    p.poll()
    tail = [(a + k * P, 40.0 if k <= 10 else 80.0) for k in range(6, 13)]
    assert _times(p)[-7:] == tail and len(_times(p)) == 32
    assert _returned(process=False) == 32  # each sample left the driver once: last-seen works
    # a window meets the samples whose span (t-P, t] overlaps it
    assert [u.t_us for u in p.util_samples(UUID0, a - 2 * P, a - P)] == [a - P]
    assert [u.t_us for u in p.util_samples(UUID0, a - 2 * P, a - P + 1)] == [a - P, a]
    assert p.errors == 0 and p.covered_us == a + 12 * P


def scenario_no_new_samples() -> None:
    """Polling twice within one driver period: NVML answers "not found", which is normal."""
    logs = _Logs()
    s, a = _frozen()
    s.util(0, a - 5 * P, a + 5 * P, gpu_pct=25).proc(0, 77, a - 5 * P, a + 5 * P, sm_pct=20)
    s.write()
    p = _poller(s)
    p.start()
    utils, procs = _times(p), p.process_samples([77], 0, 2**62)
    assert len(procs) == 5 and _returned(process=True) == 5
    for _ in range(3):
        _advance(s, P // 8)  # still before tick a + P
        p.poll()
    assert _times(p) == utils and p.process_samples([77], 0, 2**62) == procs
    assert _returned(process=True) == 5 and _returned(process=False) == len(utils)
    assert p.errors == 0 and p.disabled == {} and logs.lines == []
    assert p.devices()[0].t_us == s.clock_us and p.covered_us == a
    assert p.delay_s() == 0.5


def scenario_pid_without_samples() -> None:
    """NVML leaves idle processes out: a pid with no sample used no SM (0 %, not unknown)."""
    s, a = _frozen()
    s.proc(0, 100, a - 10 * P, a + 10 * P, sm_pct=60, mem_pct=9)
    s.proc(0, 300, a - 10 * P, a - 5 * P, sm_pct=40)
    s.proc(0, 400, a - 3 * P + P // 4, a - 2 * P, sm_pct=100)  # 3/4 of one period
    s.running(0, 100, 5 * 2**30).running(0, 200, 2**30)  # 200 holds memory, never computes
    s.write()
    p = _poller(s)
    p.start()
    assert p.gpu_pids() == {100: 5 * 2**30, 200: 2**30}
    assert p.process_samples([200], 0, 2**62) == []
    got = p.process_samples([100], a - 10 * P, a)
    assert [(x.t_us, x.sm_pct, x.mem_pct, x.period_us) for x in got] == [
        (a + k * P, 60, 9, P) for k in range(-9, 1)
    ]
    assert [(x.t_us, x.sm_pct) for x in p.process_samples([400], 0, 2**62)] == [(a - 2 * P, 75)]
    window = p.process_samples([100, 200, 300], a - 10 * P, a)
    assert {x.pid for x in window} == {100, 300}
    assert mean_sm_pct(window, a - 10 * P, a) == pytest.approx(60 + 40 / 2)
    assert mean_sm_pct(p.process_samples([300], a - 5 * P, a), a - 5 * P, a) == 0.0
    assert mean_sm_pct(p.process_samples([200], a - 5 * P, a), a - 5 * P, a) == 0.0
    assert mean_sm_pct(p.process_samples([400], a - 3 * P, a - 2 * P), a - 3 * P, a - 2 * P) == 75


def scenario_two_gpus_in_time_order() -> None:
    """A pid on two GPUs; one GPU's samples arrive a round late: the history stays in
    time order (the exporter bisects it)."""
    s, a = _frozen(devices=2)
    s.proc(0, 100, a - 20 * P, a + 20 * P, sm_pct=50).proc(1, 100, a - 20 * P, a + 20 * P, 20)
    s.fail("nvmlDeviceGetProcessUtilization", TIMEOUT, dev=1, from_us=a + P, to_us=a + 3 * P)
    s.write()
    p = _poller(s)
    p.start()
    for _ in range(3):
        _advance(s, P)
        p.poll()
    got = [(x.t_us, x.uuid, x.sm_pct) for x in p.process_samples([100], a - 2 * P, a + 3 * P)]
    want = [(a + k * P, u, pct) for k in range(-1, 4) for u, pct in ((UUID0, 50), (UUID1, 20))]
    assert sorted(got) == want and [t for t, _, _ in got] == [t for t, _, _ in want]
    assert p.errors == 2 and p.covered_us == a + 3 * P


def scenario_driver_lacks() -> None:
    """A function missing from the library turns off only its reading, logged once."""
    missing = os.environ["OMITTED"]
    reading = {
        "nvmlDeviceGetCurrentClocksEventReasons": "clock_event_reasons",
        "nvmlDeviceGetProcessUtilization": "process_samples",
        "nvmlDeviceGetSamples": "util_samples",
    }[missing]
    logs = _Logs()
    s, a = _frozen(devices=2)
    s.util(0, a - 5 * P, a + 5 * P, gpu_pct=30).proc(0, 9, a - 5 * P, a + 5 * P, sm_pct=30)
    s.write()
    p = _poller(s)
    line = p.start()
    assert line.endswith(f"; not available: {reading}"), line
    for _ in range(3):
        _advance(s, P)
        p.poll()
    assert p.disabled == {reading: f"{missing} missing from this driver's NVML"}
    assert len(logs.matching(f"no {reading}")) == 1 and len(logs.lines) == 1, logs.lines
    assert p.errors == 0
    r0, r1 = p.devices()
    assert (r0.util_gpu_pct, r0.power_mw, r1.power_mw, r1.sm_clock_mhz) == (
        30.0, 250_000, 250_001, 1411
    )  # fmt: skip
    assert r1.clock_event_reasons == (None if reading == "clock_event_reasons" else 0x4)
    procs = p.process_samples([9], 0, 2**62)
    utils = _times(p)
    if reading == "process_samples":
        assert procs == [] and len(utils) == 23
    elif reading == "util_samples":
        # no device ticks: the period stays NVML's fastest; coverage trails by two
        assert utils == [] and len(procs) == 5 + 3
        assert p.sample_period_us(UUID0) == DEFAULT_PERIOD_US
        assert p.covered_us == s.clock_us - 2 * DEFAULT_PERIOD_US  # type: ignore[operator]
    else:
        assert len(procs) == 8 and len(utils) == 23 and p.covered_us == a + 3 * P


def scenario_not_supported_on_one_device() -> None:
    """NOT_SUPPORTED on one GPU turns that reading off there only; on both, on both."""
    logs = _Logs()
    s, a = _frozen(devices=2)
    s.fail("nvmlDeviceGetPowerUsage", NOT_SUPPORTED, dev=1)
    s.fail("nvmlDeviceGetEnforcedPowerLimit", NOT_SUPPORTED).write()
    p = _poller(s)
    assert p.start().endswith("; not available: power, power_limit")
    for _ in range(3):
        _advance(s, P)
        p.poll()
    r0, r1 = p.devices()
    assert (r0.power_mw, r1.power_mw, r0.power_limit_mw, r1.power_limit_mw) == (
        250_000, None, None, None
    )  # fmt: skip
    assert p.disabled == {
        "power": "nvmlDeviceGetPowerUsage: Not Supported (GPU 1)",
        "power_limit": "nvmlDeviceGetEnforcedPowerLimit: Not Supported (GPU 0, 1)",
    }
    assert sorted(logs.lines) == [
        "GPU 0: no power_limit: nvmlDeviceGetEnforcedPowerLimit: Not Supported",
        "GPU 1: no power: nvmlDeviceGetPowerUsage: Not Supported",
        "GPU 1: no power_limit: nvmlDeviceGetEnforcedPowerLimit: Not Supported",
    ]
    assert p.errors == 0 and p.covered_us == a + 3 * P


def scenario_device_lost() -> None:
    """A GPU that answers GPU_IS_LOST (or NOT_FOUND on its handle) is dropped; the other
    goes on; its samples so far stay readable; once the last one is gone, polling stops."""
    code = int(os.environ["LOST_CODE"])
    logs = _Logs()
    s, a = _frozen(devices=2)
    s.util(0, a - 20 * P, a + 20 * P, gpu_pct=10).util(1, a - 20 * P, a + 20 * P, gpu_pct=90)
    s.lose(1, a + 2 * P, code).write()
    p = _poller(s)
    p.start()
    assert [r.index for r in p.devices()] == [0, 1]
    for _ in range(4):
        _advance(s, P)
        p.poll()
    assert [r.index for r in p.devices()] == [0]
    assert len(logs.matching(f"GPU 1 ({UUID1}) is gone")) == 1 and len(logs.lines) == 1
    assert _times(p)[-1] == (a + 4 * P, 10.0)
    assert _times(p, UUID1)[-1] == (a + P, 90.0)  # read before the loss
    assert p.errors == 0 and p.covered_us == a + 4 * P and p.sample_period_us(UUID1) is None
    s.lose(0, a + 5 * P, GPU_IS_LOST).write()
    _advance(s, P)
    p.poll()
    assert not p.available and p.devices() == [] and logs.matching("no device left")
    stop = threading.Event()
    p.run(stop)  # returns at once: nothing left to poll
    p.close()


def scenario_errors_counted() -> None:
    """An unexpected error: that reading is None for the round, counted, logged once; a
    failed sample read loses nothing (the last-seen timestamp did not move)."""
    logs = _Logs()
    s, a = _frozen()
    s.proc(0, 55, a - 20 * P, a + 20 * P, sm_pct=70)
    s.fail("nvmlDeviceGetMemoryInfo", UNKNOWN, from_us=a + P, to_us=a + 4 * P)
    s.fail("nvmlDeviceGetProcessUtilization", TIMEOUT, from_us=a + P, to_us=a + 4 * P)
    s.write()
    p = _poller(s)
    p.start()
    assert p.devices()[0].mem_used_bytes == 2**30 and p.covered_us == a
    for _ in range(3):
        _advance(s, P)
        p.poll()
        r = p.devices()[0]
        assert r.mem_used_bytes is None and r.mem_total_bytes is None and r.power_mw == 250_000
    assert p.errors == 6 and p.covered_us == a  # process samples incomplete since a
    assert len(logs.matching("nvmlDeviceGetMemoryInfo failed: Unknown Error")) == 1
    assert len(logs.matching("nvmlDeviceGetProcessUtilization failed")) == 1
    assert len(logs.lines) == 2
    assert p.delay_s() == 0.5  # other calls answered: no back-off
    _advance(s, P)
    p.poll()
    assert p.devices()[0].mem_used_bytes == 2**30 and p.errors == 6
    times = [x.t_us for x in p.process_samples([55], a - P, a + 4 * P)]
    assert times == [a + k * P for k in range(0, 5)]  # the failed rounds' samples came late
    assert p.covered_us == a + 4 * P


def scenario_backoff() -> None:
    """Every call failing: the poller waits longer and longer; the log stays short."""
    logs = _Logs()
    s, a = _frozen(devices=2)
    s.fail("*", UNKNOWN, from_us=a + P).write()
    p = _poller(s, poll_s=0.5)
    p.start()
    delays = []
    for _ in range(12):
        _advance(s, P)
        p.poll()
        delays.append(p.delay_s())
    assert delays[:5] == [1.0, 2.0, 4.0, 8.0, 16.0] and delays[-1] == MAX_BACKOFF_S
    assert p.errors == 12 * 2 * 9  # 9 calls per device per round (the max clock was read)
    assert len(logs.matching("polling backs off")) == 1
    assert len(logs.lines) == 1 + 9, logs.lines  # one per reading and code, one back-off
    assert p.devices()[1].util_gpu_pct is None and p.devices()[1].uuid == UUID1
    s.rows.clear()
    s.write()
    _advance(s, P)
    p.poll()
    assert p.delay_s() == 0.5 and logs.matching("NVML answers again after 12 failed rounds")
    assert p.devices()[1].util_gpu_pct == 0.0


def scenario_junk_filtered() -> None:
    """The driver's bogus process entries (older than the last seen, >100 %, pid 0, in the
    future) are dropped; the one in the future does not move the last-seen timestamp."""
    s, a = _frozen()
    s.proc(0, 31, a - 3 * P, a + 10 * P, sm_pct=12).write()
    p = _poller(s)
    p.start()
    s.junk(0, 31, a - 30 * P, 50).junk(0, 32, a, 4_294_967_295).junk(0, 0, a + P, 5)
    s.junk(0, 33, a + 1000 * P, 5)
    _advance(s, P)
    p.poll()
    _advance(s, P)
    p.poll()
    got = [(x.t_us, x.pid, x.sm_pct) for x in p.process_samples([0, 31, 32, 33], 0, 2**62)]
    assert got == [(a + k * P, 31, 12) for k in range(-2, 3)]
    assert p.errors == 0


def scenario_history_bounded() -> None:
    """History keeps history_s and at most max_samples entries per list."""
    s, a = _frozen(buffer=100)
    s.util(0, a - 200 * P, a + 200 * P, gpu_pct=5).proc(0, 8, a - 200 * P, a + 200 * P, sm_pct=5)
    s.write()
    p = _poller(s, history_s=1.0, max_samples=1000)
    p.start()
    assert len(_times(p)) == 10  # 100 in the buffer, 1 s kept
    assert _times(p)[0][0] >= s.clock_us - 1_000_000  # type: ignore[operator]
    q = _poller(s, history_s=60.0, max_samples=7)
    q.start()
    assert len(_times(q)) == 7 and _times(q)[-1][0] == a
    assert len(q.process_samples([8], 0, 2**62)) == 7


def scenario_run_thread() -> None:
    """run() in a thread on the real clock: samples accumulate once each, and it stops."""
    s = NvmlScript(os.environ["PARALLAX_FAKE_NVML"], period_us=20_000)
    now = time.time_ns() // 1000
    s.device(UUID0)
    s.util(0, now - 10_000_000, now + 60_000_000, gpu_pct=66).write()
    p = NvmlPoller(0.05)
    p.start()
    n0 = len(_times(p))
    stop = threading.Event()
    t = threading.Thread(target=p.run, args=(stop,))
    t.start()
    time.sleep(0.6)
    seen = p.util_samples(UUID0, 0, 2**62)  # read while the poller writes
    stop.set()
    t.join(2.0)
    assert not t.is_alive()
    us = _times(p)
    assert len(us) >= n0 + 20 and len({x for x, _ in us}) == len(us)
    assert all(b - a == 20_000 for (a, _), (b, _) in itertools.pairwise(us))
    assert len(seen) <= len(us) and p.sample_period_us(UUID0) == 20_000
    assert time.time_ns() // 1000 - 500_000 < p.covered_us  # the last rounds covered
    p.close()


def scenario_no_library() -> None:
    p = NvmlPoller(0.5)
    assert p.start() == "GPU: none (libnvidia-ml.so.1 not found)"
    p.poll()
    assert not p.available and p.devices() == [] and p.gpu_pids() == {}
    assert p.process_samples([1], 0, 2**62) == [] and p.errors == 0
    p.close()


def scenario_init_fails() -> None:
    s = NvmlScript(os.environ["PARALLAX_FAKE_NVML"])
    s.device(UUID0)
    s.init_error = DRIVER_NOT_LOADED
    s.write()
    p = NvmlPoller(0.5)
    assert p.start() == "GPU: off (NVML init failed: Driver Not Loaded)"
    p.poll()
    assert not p.available and p.devices() == []
    p.close()


def scenario_no_device() -> None:
    NvmlScript(os.environ["PARALLAX_FAKE_NVML"]).write()
    p = NvmlPoller(0.5)
    assert p.start() == "GPU: none (NVML lists no device)"
    assert not p.available
    p.close()


# --- parent side ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def fake() -> Path:
    try:
        return build_fake_nvml()
    except FakeNvmlUnavailableError as e:
        pytest.skip(str(e))


def _run(target: Callable[[], None], lib: Path, tmp_path: Path, **env: str) -> None:
    run_in_child(target, {**fake_env(lib, tmp_path / "nvml.script"), **env})


@pytest.mark.parametrize(
    "scenario",
    [
        scenario_real_clock,
        scenario_samples_arrive_once,
        scenario_no_new_samples,
        scenario_pid_without_samples,
        scenario_two_gpus_in_time_order,
        scenario_not_supported_on_one_device,
        scenario_errors_counted,
        scenario_backoff,
        scenario_junk_filtered,
        scenario_history_bounded,
        scenario_run_thread,
        scenario_init_fails,
        scenario_no_device,
    ],
    ids=lambda f: f.__name__.removeprefix("scenario_"),
)
def test_poller(scenario: Callable[[], None], fake: Path, tmp_path: Path) -> None:
    _run(scenario, fake, tmp_path)


@pytest.mark.parametrize(
    "missing",
    [
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetSamples",
    ],
)
def test_driver_lacks_a_function(missing: str, fake: Path, tmp_path: Path) -> None:
    lib = build_fake_nvml([missing])
    _run(scenario_driver_lacks, lib, tmp_path, OMITTED=missing)


@pytest.mark.parametrize("code", [GPU_IS_LOST, NOT_FOUND])
def test_device_lost(code: int, fake: Path, tmp_path: Path) -> None:
    _run(scenario_device_lost, fake, tmp_path, LOST_CODE=str(code))


def test_no_library(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed here")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    run_in_child(scenario_no_library, env)


def test_mean_sm_pct() -> None:
    """Each sample weighs by the overlap of its span with the window; gaps count 0 %."""
    s = [ProcessSample(t, "GPU-x", 1, pct, 0, 100) for t, pct in ((100, 50), (200, 100))]
    assert mean_sm_pct(s, 0, 200) == 75.0
    assert mean_sm_pct(s, 50, 150) == 75.0  # half of each span
    assert mean_sm_pct(s, 0, 400) == 37.5  # (200, 400] has no sample: idle
    assert mean_sm_pct(s[:1], 150, 250) == 0.0
    assert mean_sm_pct(s, 10, 10) is None


def test_poll_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        NvmlPoller(0)
