"""A stand-in for NVIDIA's NVML on machines without a GPU: build fake_nvml.c into a
libnvidia-ml.so.1 and script what it answers (the demo's GPU route and the tests use it).

    lib = build_fake_nvml()                       # a directory holding libnvidia-ml.so.1
    script = NvmlScript(tmp / "nvml.script")
    dev = script.device("GPU-0000", "NVIDIA H200")
    script.util(dev, t0_us, t1_us, gpu_pct=60).proc(dev, 4242, t0_us, t1_us, sm_pct=40)
    script.write()
    env = script.env(lib)                         # LD_LIBRARY_PATH + PARALLAX_FAKE_NVML

A process started with ``env`` loads the fake through the real pynvml (the dynamic linker
reads LD_LIBRARY_PATH once, at process start: a running process cannot switch to it, so
tests run each scenario in a child: tests/gpu/fakes.py). The library re-reads the script
whenever it is written again, so a scenario changes the GPU's story while it runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIB = "libnvidia-ml.so.1"
MAX_DEVICES, MAX_ROWS = 16, 512  # fake_nvml.c's MAXDEV, MAXROWS ("util" and "proc" share)

# NVML return codes a script injects (nvml.h)
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
GPU_IS_LOST = 15
UNKNOWN = 999


class FakeNvmlUnavailableError(RuntimeError):
    """No C compiler here: the fake cannot be built."""


def build_fake_nvml(omit: Iterable[str] = ()) -> Path:
    """The directory of a libnvidia-ml.so.1 built from fake_nvml.c without the C functions
    in ``omit`` (playing a driver that lacks them). Built once per source and variant, in
    the temp directory, and reused across sessions."""
    return _build(frozenset(omit))


@cache
def _build(omit: frozenset[str]) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise FakeNvmlUnavailableError("no gcc/cc to build demo/gpu/fake_nvml.c")
    flags = [f"-DOMIT_{name}" for name in sorted(omit)]
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"parallax-fake-nvml-{os.getuid()}-{key}"
    lib = out / LIB
    if lib.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{LIB}.{os.getpid()}"
    try:
        subprocess.run(
            [cc, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
             f"-Wl,-soname,{LIB}", *flags, "-o", str(tmp), str(SOURCE)],
            check=True,
            capture_output=True,
            text=True,
        )  # fmt: skip
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"building {SOURCE.name} failed:\n{e.stderr}") from e
    tmp.replace(lib)  # atomic: a concurrent build of the same key just wins or loses
    return out


def fake_env(lib_dir: Path, script: Path | None) -> dict[str, str]:
    """The environment of a process that should load the fake (and read ``script``)."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(lib_dir), os.environ.get("LD_LIBRARY_PATH", "")) if p
    )
    if script is None:
        env.pop("PARALLAX_FAKE_NVML", None)
    else:
        env["PARALLAX_FAKE_NVML"] = str(script)
    return env


class NvmlScript:
    """Builds the fake's script (the format is in fake_nvml.c). Times are Unix µs."""

    def __init__(self, path: Path | str, period_us: int = 166_667) -> None:
        self.path = Path(path)
        self.period_us = period_us
        self.buffer = 100
        self.driver = "550.54.15"
        self.clock_us: int | None = None  # None: the real clock
        self.init_error: int | None = None
        self.devices: list[str] = []
        self.rows: list[str] = []
        self._mtime_ns = 0

    def device(
        self,
        uuid: str,
        name: str = "NVIDIA H200",
        mem_total: int = 141 * 2**30,
        mem_used: int = 2**30,
        sm_mhz: int = 1980,
        sm_max_mhz: int = 1980,
        power_mw: int = 120_000,
        power_limit_mw: int = 700_000,
        reasons: int = 0,
    ) -> int:
        """Add a GPU; returns its index."""
        self.devices.append(
            f"device {uuid} {mem_total} {mem_used} {sm_mhz} {sm_max_mhz} {power_mw} "
            f"{power_limit_mw} {reasons:#x} {name}"
        )
        return len(self.devices) - 1

    def util(self, dev: int, t0_us: int, t1_us: int, gpu_pct: int, mem_pct: int = 0) -> NvmlScript:
        """GPU ``dev`` busy ``gpu_pct`` % over [t0_us, t1_us)."""
        self.rows.append(f"util {dev} {t0_us} {t1_us} {gpu_pct} {mem_pct}")
        return self

    def proc(
        self, dev: int, pid: int, t0_us: int, t1_us: int, sm_pct: int, mem_pct: int = 0
    ) -> NvmlScript:
        """Process ``pid`` used ``sm_pct`` % of GPU ``dev``'s SMs over [t0_us, t1_us)."""
        self.rows.append(f"proc {dev} {pid} {t0_us} {t1_us} {sm_pct} {mem_pct}")
        return self

    def running(self, dev: int, pid: int, used_bytes: int) -> NvmlScript:
        """A compute process on GPU ``dev`` (nvmlDeviceGetComputeRunningProcesses)."""
        self.rows.append(f"running {dev} {pid} {used_bytes}")
        return self

    def junk(self, dev: int, pid: int, t_us: int, sm_pct: int) -> NvmlScript:
        """A bogus process sample the driver returns whatever the last-seen timestamp."""
        self.rows.append(f"junk {dev} {pid} {t_us} {sm_pct}")
        return self

    def fail(
        self, function: str, code: int, dev: int = -1, from_us: int = 0, to_us: int = 0
    ) -> NvmlScript:
        """The C function ``function`` ("*": every one but init) returns ``code`` on
        ``dev`` (-1: any) while from_us <= now < to_us (to_us 0: from then on)."""
        self.rows.append(f"fail {function} {code} {dev} {from_us} {to_us}")
        return self

    def lose(self, dev: int, from_us: int, code: int = GPU_IS_LOST) -> NvmlScript:
        """Every call on GPU ``dev`` returns ``code`` from ``from_us`` on."""
        self.rows.append(f"lost {dev} {from_us} {code}")
        return self

    def text(self) -> str:
        kinds = Counter(k if (k := row.split()[0]) != "proc" else "util" for row in self.rows)
        if self.devices[MAX_DEVICES:] or max(kinds.values(), default=0) > MAX_ROWS:
            raise ValueError(f"the fake keeps {MAX_DEVICES} devices, {MAX_ROWS} rows of a kind")
        head = [f"period {self.period_us}", f"buffer {self.buffer}", f"driver {self.driver}"]
        if self.clock_us is not None:
            head.append(f"clock {self.clock_us}")
        if self.init_error is not None:
            head.append(f"init {self.init_error}")
        return "\n".join([*head, *self.devices, *self.rows]) + "\n"

    def write(self) -> Path:
        """Replace the script atomically. The library re-reads it when its inode, size or
        mtime change; file times tick coarsely (a few ms), so each write sets a fresh,
        strictly later mtime in ns."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(self.text())
        self._mtime_ns = max(self._mtime_ns + 1, time.time_ns())
        os.utime(tmp, ns=(self._mtime_ns, self._mtime_ns))
        tmp.replace(self.path)
        return self.path

    def env(self, lib_dir: Path) -> dict[str, str]:
        return fake_env(lib_dir, self.path)


def tick_floor(t_us: int, period_us: int) -> int:
    """The driver tick at or before ``t_us`` (the fake stamps samples at k * period)."""
    return t_us // period_us * period_us
