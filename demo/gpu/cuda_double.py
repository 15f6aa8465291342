"""A stand-in for NVIDIA's CUDA driver library (fake_cuda.c) on machines without a GPU: built
on demand, and a ctypes handle on it for servers that play an inference server's pattern of
kernel launches and host waits (the demo's GPU route, the tests, bench-gpu)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SONAME = "libcuda.so.1"


def build(out_dir: Path | None = None) -> Path:
    """Compile fake_cuda.c into ``out_dir``/libcuda.so.1 (a fresh temporary directory by
    default) and return that directory. Rebuilt only when the source is newer."""
    d = out_dir or Path(tempfile.mkdtemp(prefix="px-fake-cuda-"))
    d.mkdir(parents=True, exist_ok=True)
    lib = d / SONAME
    src = HERE / "fake_cuda.c"
    if not lib.exists() or lib.stat().st_mtime < src.stat().st_mtime:
        cmd = ["gcc", "-O2", "-fno-omit-frame-pointer", "-shared", "-fPIC"]
        cmd += [f"-Wl,-soname,{SONAME}", "-o", str(lib), str(src)]
        subprocess.run(cmd, check=True, capture_output=True)
    return d


class FakeCuda:
    """The double loaded in this process (CUDA_LIB_DIR names its directory)."""

    def __init__(self, lib_dir: str | os.PathLike[str]) -> None:
        self.lib = ctypes.CDLL(str(Path(lib_dir) / SONAME))
        self.lib.fakecuda_set_wait_us.argtypes = [ctypes.c_uint]
        self.lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]

    def launch(self, n: int = 1) -> None:
        f = self.lib.cuLaunchKernel
        for _ in range(n):
            f(None, 1, 1, 1, 1, 1, 1, 0, None, None, None)

    def graph_launch(self, n: int = 1) -> None:
        for _ in range(n):
            self.lib.cuGraphLaunch(None, None)

    def synchronize(self, wait_us: int) -> None:
        """cuStreamSynchronize, blocking ``wait_us``."""
        self.lib.fakecuda_set_wait_us(wait_us)
        self.lib.cuStreamSynchronize(None)

    def copy_to_host(self, wait_us: int) -> None:
        """cuMemcpyDtoH_v2, blocking ``wait_us``."""
        self.lib.fakecuda_set_wait_us(wait_us)
        self.lib.cuMemcpyDtoH_v2(None, 0, 0)
