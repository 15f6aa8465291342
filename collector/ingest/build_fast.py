"""Builds the compiled OTLP span decoder (collector/ingest/_otlp_fast.c), the Native insert
encoder (collector/store/_native_fast.c) and the one-hop pair derivation
(collector/pairing/_derive_fast.c), each next to its source.

``python -m collector.ingest.build_fast [--force]``, run by scripts/setup.sh. Idempotent:
compiles only when the shared object is missing or older than the .c. Without gcc or
Python.h it says so in one line and exits 0 — the collector then parses OTLP in Python
(collector/ingest/otlp.py) and encodes inserts with clickhouse-connect, only slower.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_otlp_fast.c"
NATIVE_SOURCE = HERE.parent / "store" / "_native_fast.c"
DERIVE_SOURCE = HERE.parent / "pairing" / "_derive_fast.c"
# Each compiled module and what the collector does without it.
WITHOUT = {
    SOURCE: "OTLP is parsed in pure Python",
    NATIVE_SOURCE: "inserts are encoded by clickhouse-connect",
    DERIVE_SOURCE: "pairs are derived in pure Python",
}


def target(source: Path = SOURCE) -> Path:
    """Where the import system looks for it (the running Python's extension suffix)."""
    return source.with_name(source.stem + str(sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def toolchain_missing() -> str | None:
    """Why nothing can be compiled here (no Python.h, no gcc), or None: it can."""
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        return f"Python.h not found in {include}"
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        return "no C compiler (gcc)"
    return None


def build(force: bool = False, source: Path = SOURCE) -> tuple[bool, str]:
    """(built or up to date, one-line message)."""
    out, without = target(source), WITHOUT[source]
    if not force and out.exists() and out.stat().st_mtime >= source.stat().st_mtime:
        return True, f"{out.name} is up to date"
    missing = toolchain_missing()
    if missing is not None:
        return False, f"{missing}: {without}"
    include = sysconfig.get_paths()["include"]
    cc = shutil.which(os.environ.get("CC", "gcc")) or "gcc"
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    cmd = [cc, "-O2", "-Wall", "-Wextra", "-shared", "-fPIC", f"-I{include}"]
    cmd += ["-o", str(tmp), str(source), "-lm"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"compiling {source.name} failed ({e}): {without}"
    if p.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = (p.stderr.strip().splitlines() or ["?"])[0]
        return False, f"compiling {source.name} failed: {first}"
    # Renamed into place: a process importing it meanwhile never sees half a file.
    tmp.replace(out)
    return True, f"built {out.relative_to(HERE.parent.parent)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m collector.ingest.build_fast")
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = ap.parse_args(argv)
    for source in WITHOUT:
        _, msg = build(args.force, source)
        print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
