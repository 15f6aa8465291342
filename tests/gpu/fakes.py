"""Test plumbing for the NVML scenarios: each runs in a child process started on the fake
library (demo/gpu/nvml_double.py builds and scripts it): the dynamic linker reads
LD_LIBRARY_PATH once, at process start, and pynvml keeps its library for the process's life.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_in_child(
    target: Callable[[], object], env: Mapping[str, str], timeout: float = 60.0
) -> str:
    """Run the module-level function ``target`` in a fresh interpreter with ``env`` (the
    only way a process picks up LD_LIBRARY_PATH) and return its stdout; raise
    AssertionError with its stderr when it fails."""
    code = (
        "from tests.gpu.fakes import child_main; "
        f"child_main({target.__module__!r}, {target.__qualname__!r})"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if p.returncode != 0:
        raise AssertionError(f"{target.__qualname__} failed in its child:\n{p.stderr}{p.stdout}")
    return p.stdout


def child_main(module: str, name: str) -> None:
    """The child side of run_in_child: call the function; on a failed assert, print the
    failing frame's locals too (the child has no pytest assertion rewriting)."""
    try:
        getattr(importlib.import_module(module), name)()
    except AssertionError:
        traceback.print_exc()
        tb = sys.exc_info()[2]
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            for k, v in tb.tb_frame.f_locals.items():
                print(f"  {k} = {v!r:.400}", file=sys.stderr)
        sys.exit(1)
