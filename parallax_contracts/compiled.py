"""The compiled fast paths of the agent and the collector: their build and their loader.

Each is a C file beside the Python it speeds up, and that Python stays the reference a
differential test holds it to:

- ``agent/protocols/_http1_fast.c``: HTTP/1.x head parsing (``http1_head``);
- ``agent/export/_otlp_wire_fast.c``: a span's OTLP attributes (``otlp_wire``);
- ``collector/ingest/_otlp_fast.c``: the OTLP/protobuf span decoder;
- ``collector/store/_native_fast.c``: the Native insert encoder;
- ``collector/pairing/_derive_fast.c``: the one-hop pair derivation.

``python -m parallax_contracts.compiled [--force]``, run by scripts/setup.sh and the images'
builds, compiles each next to its source. Idempotent: only when the shared object is
missing or older than its .c. Without gcc or Python.h it says so in one line and exits 0 —
the agent and the collector then run the references, only slower. ``load`` imports one
unless it is missing, stale or turned off by its environment switch; its caller says which
it uses in its start-up log. One module for both sides: it sits with the contracts because
the agent and the collector import nothing of each other.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent  # where the agent and collector packages are
HTTP1_SOURCE = ROOT / "agent" / "protocols" / "_http1_fast.c"
OTLP_WIRE_SOURCE = ROOT / "agent" / "export" / "_otlp_wire_fast.c"
OTLP_SOURCE = ROOT / "collector" / "ingest" / "_otlp_fast.c"
NATIVE_SOURCE = ROOT / "collector" / "store" / "_native_fast.c"
DERIVE_SOURCE = ROOT / "collector" / "pairing" / "_derive_fast.c"
# Each compiled module and what runs without it.
WITHOUT = {
    HTTP1_SOURCE: "the agent parses HTTP/1 heads in pure Python",
    OTLP_WIRE_SOURCE: "the agent encodes OTLP spans in pure Python",
    OTLP_SOURCE: "OTLP is parsed in pure Python",
    NATIVE_SOURCE: "inserts are encoded by clickhouse-connect",
    DERIVE_SOURCE: "pairs are derived in pure Python",
}
REBUILD = "python -m parallax_contracts.compiled"


def load(name: str, source: Path, switch: str) -> tuple[ModuleType | None, str]:
    """(the module ``name``, "") or (None, why not: turned off, not built, stale)."""
    if os.environ.get(switch, "1") == "0":
        return None, f"turned off ({switch}=0)"
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None, f"not built ({REBUILD})"
    so = Path(module.__file__ or source)
    if so.suffix != ".so":  # a source checkout's stray module of that name: not a build
        return None, f"not built ({REBUILD})"
    # A build older than its source (a pull without `make setup`) may not match the Python
    # that calls it.
    if source.exists() and so.stat().st_mtime < source.stat().st_mtime:
        return None, f"{so.name} is older than {source.name}: rebuild it ({REBUILD})"
    return module, ""


def target(source: Path) -> Path:
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


def build(source: Path, force: bool = False) -> tuple[bool, str]:
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
    return True, f"built {out.relative_to(ROOT)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=REBUILD)
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = ap.parse_args(argv)
    for source in WITHOUT:
        _, msg = build(source, args.force)
        print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
