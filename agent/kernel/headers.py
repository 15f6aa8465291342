"""Kernel headers for bcc: the running kernel's when present, else a project-owned fallback.

bcc compiles every program against kernel headers. Where ``/lib/modules/$(uname -r)/build``
is missing (minimal and hardened hosts, these test machines), the fallback merges Debian's
generic ``linux-headers-<arch>`` trees (``-common`` then ``-<arch>``, symlinked with
``cp -rs``; either tree alone does not compile) into a cache directory Parallax owns, and
points bcc at it with ``BCC_KERNEL_SOURCE``. Nothing is written under /lib/modules or any
other path that DKMS and friends read.

The fallback is valid for **tracepoint programs only**: they read tracepoint arguments,
whose layout the kernel describes at run time, never kernel structs, whose layout the
mismatched headers would get wrong.

    python -m agent.kernel.headers build     # what `make setup` runs
    python -m agent.kernel.headers show
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

USR_SRC = Path("/usr/src")
_DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
_MARK = ".parallax-complete"


@dataclass(frozen=True, slots=True)
class HeaderSource:
    path: Path
    kind: str  # "running" | "env" | "fallback"

    def describe(self) -> str:
        if self.kind == "fallback":
            return (
                f"fallback {self.path} (Debian generic headers; valid for tracepoint programs only)"
            )
        if self.kind == "env":
            return f"BCC_KERNEL_SOURCE={self.path}"
        return f"running kernel's headers at {self.path}"


def cache_dir() -> Path:
    """PARALLAX_CACHE_DIR, else .cache in a source checkout, else /var/cache/parallax."""
    env = os.environ.get("PARALLAX_CACHE_DIR")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():
        return root / ".cache"
    return Path("/var/cache/parallax")


def running_kernel_build() -> Path:
    return Path("/lib/modules") / platform.release() / "build"


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", name))


def debian_trees(usr_src: Path = USR_SRC) -> tuple[Path, Path] | None:
    """The newest (common, arch) pair of Debian header trees, e.g.
    linux-headers-6.1.0-56-common + linux-headers-6.1.0-56-amd64."""
    arch = _DEB_ARCH.get(platform.machine(), platform.machine())
    pairs = []
    for common in usr_src.glob("linux-headers-*-common"):
        stem = common.name[: -len("-common")]
        arch_tree = usr_src / f"{stem}-{arch}"
        if arch_tree.is_dir():
            pairs.append((common, arch_tree))
    if not pairs:
        return None
    return max(pairs, key=lambda p: _version_key(p[0].name))


def fallback_dir() -> Path | None:
    trees = debian_trees()
    if trees is None:
        return None
    return cache_dir() / "kernel-headers" / trees[1].name


def build(quiet: bool = False) -> Path:
    """Build (once) the merged fallback tree; return its path. Raises RuntimeError when no
    Debian header package is installed."""
    trees = debian_trees()
    if trees is None:
        raise RuntimeError(
            "no Debian kernel headers under /usr/src: install linux-headers-"
            f"{_DEB_ARCH.get(platform.machine(), platform.machine())} (make setup does)"
        )
    common, arch_tree = trees
    target = cache_dir() / "kernel-headers" / arch_tree.name
    if (target / _MARK).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        # common first, then the arch tree over it (its generated headers and .config win)
        subprocess.run(["cp", "-rs", f"{common}/.", str(tmp)], check=True)
        subprocess.run(["cp", "-rsf", f"{arch_tree}/.", str(tmp)], check=True)
        (tmp / _MARK).write_text(f"{common}\n{arch_tree}\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    if not quiet:
        print(f"kernel headers: built fallback {target} (tracepoint programs only)")
    return target


def resolve() -> HeaderSource | None:
    """Where bcc will find headers: BCC_KERNEL_SOURCE, the running kernel's, or the fallback."""
    env = os.environ.get("BCC_KERNEL_SOURCE")
    if env:
        return HeaderSource(Path(env), "env")
    build_dir = running_kernel_build()
    fb = fallback_dir()
    try:
        if build_dir.exists():
            return HeaderSource(build_dir, "running")
        if fb is not None and (fb / _MARK).exists():
            return HeaderSource(fb, "fallback")
    except OSError:  # EACCES: a tree this user cannot read is no use to bcc either
        return None
    return None


def configure_bcc() -> HeaderSource | None:
    """Point bcc at the resolved headers (sets BCC_KERNEL_SOURCE for the fallback)."""
    src = resolve()
    if src is not None and src.kind == "fallback":
        os.environ["BCC_KERNEL_SOURCE"] = str(src.path)
    return src


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m agent.kernel.headers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("action", choices=["build", "show"])
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.action == "build":
        if running_kernel_build().exists():
            if not args.quiet:
                print(f"kernel headers: {running_kernel_build()} exists, no fallback needed")
            return 0
        try:
            build(quiet=args.quiet)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            print(f"kernel headers: {e}", file=sys.stderr)
            return 1
        return 0
    src = resolve()
    print(src.describe() if src else "no kernel headers: run make setup")
    return 0 if src else 1


if __name__ == "__main__":
    sys.exit(main())
