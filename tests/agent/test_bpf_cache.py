"""The compiled program kept between agent starts (agent/kernel/objcache.py, docs/agent.md
"Start-up"): a second start loads what the first one compiled, and the kernel then holds
the same programs and maps, which trace the same; a damaged file, or a cache directory
others may write, is not read: the agent compiles as it did before."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, Proc, agent_progs, http_request, one_record

pytestmark = pytest.mark.ebpf

CACHE_ENV = "PARALLAX_AGENT_BPF_CACHE"  # (agent.kernel.objcache.ENV: that module imports bcc)
FROM_CACHE = "BPF program loaded from the cache"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[int]:
    srv = Proc(
        [PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t.jsonl")]
    )
    try:
        yield srv.port()
    finally:
        srv.stop()


@dataclass
class Run:
    record: dict[str, Any]  # the agent's record of one streamed request
    held: list[tuple[str, str, int]]  # the programs the kernel held for it
    err: str  # what it said


def _run(tmp: Path, name: str, port: int, cache: Path) -> Run:
    """One agent with ``cache`` as its program cache: started, one streamed request through
    the traced server, the programs the kernel holds for it, stopped."""
    d = tmp / name
    d.mkdir()
    agent = Agent(d, [port], env={CACHE_ENV: str(cache)})
    try:
        ctx = trace_context.generate()
        head = f"GET /stream?n=5&gap_ms=5 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n\r\n"
        assert http_request(port, head.encode()).startswith(b"HTTP/1.1 200")
        record = one_record(agent, ctx)
        # type, name (in full where the program has its function's BTF, as bcc loads it)
        # and translated size
        progs = agent_progs(agent)
        held = sorted((p["type"], str(p.get("name")), int(p.get("bytes_xlated", 0))) for p in progs)
    finally:
        assert agent.stop() == 0
    return Run(record, held, agent.err.read_text())


def test_a_second_start_loads_what_the_first_compiled(tmp_path: Path, server: int) -> None:
    cache = tmp_path / "cache"
    first = _run(tmp_path, "first", server, cache)
    assert FROM_CACHE not in first.err
    [saved] = list(cache.iterdir())
    assert saved.suffix == ".json"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600

    second = _run(tmp_path, "second", server, cache)
    assert FROM_CACHE in second.err, second.err[-2000:]
    # the same programs, the same translated sizes: the verifier was given the same code
    assert second.held == first.held and len(first.held) >= 10, (first.held, second.held)
    assert any(name.startswith("tracepoint__sock__") for _, name, _ in second.held)
    for k in ("method", "path", "status", "chunks", "partial"):
        assert second.record[k] == first.record[k], (k, first.record, second.record)
    assert second.record["chunks"] >= 5

    # half the file (a disk filled while it was written by hand, say): compiled and saved
    saved.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    third = _run(tmp_path, "third", server, cache)
    assert third.record["chunks"] >= 5
    err = third.err
    assert FROM_CACHE not in err and "not used" in err and "compiling" in err, err[-2000:]
    assert json.loads(saved.read_text())["funcs"], "the compile was saved again, whole"


def test_a_cache_others_may_write_is_not_read(tmp_path: Path, server: int) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    run = _run(tmp_path, "agent", server, cache)
    assert run.record["chunks"] >= 5
    assert "writable by others" in run.err and FROM_CACHE not in run.err, run.err[-2000:]
    assert list(cache.iterdir()) == []  # nothing written there either


def test_only_the_most_recent_programs_are_kept(tmp_path: Path) -> None:
    """A kernel or bcc upgrade, or a changed flag, leaves a program behind: the directory
    keeps the KEEP most recently written ones (and always the one just written)."""
    import os

    from agent.kernel import objcache

    files = [tmp_path / f"{i:02d}.json" for i in range(objcache.KEEP + 3)]
    for i, f in enumerate(files):
        f.write_text("{}")
        os.utime(f, ns=(i * 10**9, i * 10**9))  # 00 the oldest
    objcache._prune(tmp_path, keep=files[0])
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([files[0].name] + [f.name for f in files[-objcache.KEEP :]]), left
