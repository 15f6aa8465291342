"""The compiled program kept between agent starts (agent/kernel/objcache.py, docs/agent.md
"Start-up"): a second start loads what the first one compiled, and the kernel then holds
the same programs and maps, which trace the same; a damaged file, or a cache directory
others may write, is not read: the agent compiles as it did before."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, Proc, agent_progs, http_request, one_record

pytestmark = pytest.mark.ebpf

CACHE_ENV = "PARALLAX_AGENT_BPF_CACHE"  # (agent.kernel.objcache.ENV: that module imports bcc)
FROM_CACHE = "BPF program loaded from the cache"


@pytest.fixture
def server(tmp_path: Path) -> Any:
    srv = Proc(
        [PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t.jsonl")]
    )
    try:
        yield srv.port()
    finally:
        srv.stop()


def _start(tmp: Path, name: str, port: int, cache: Path) -> Agent:
    d = tmp / name
    d.mkdir()
    return Agent(d, [port], env={CACHE_ENV: str(cache)})


def _traced(agent: Agent, port: int) -> dict[str, Any]:
    """One streamed request through the traced server: the agent's record of it."""
    ctx = trace_context.generate()
    head = f"GET /stream?n=5&gap_ms=5 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n\r\n"
    assert http_request(port, head.encode()).startswith(b"HTTP/1.1 200")
    return one_record(agent, ctx)


def _held(agent: Agent) -> list[tuple[str, str, int]]:
    """The programs the kernel holds for the agent: type, name (in full where the program
    has its function's BTF, as bcc loads it) and translated size."""
    progs = agent_progs(agent)
    return sorted((p["type"], str(p.get("name")), int(p.get("bytes_xlated", 0))) for p in progs)


def test_a_second_start_loads_what_the_first_compiled(tmp_path: Path, server: int) -> None:
    cache = tmp_path / "cache"
    first = _start(tmp_path, "first", server, cache)
    try:
        rec1, held1 = _traced(first, server), _held(first)
    finally:
        assert first.stop() == 0
    assert FROM_CACHE not in first.err.read_text()
    [saved] = list(cache.iterdir())
    assert saved.suffix == ".json"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600

    second = _start(tmp_path, "second", server, cache)
    try:
        rec2, held2 = _traced(second, server), _held(second)
    finally:
        assert second.stop() == 0
    assert FROM_CACHE in second.err.read_text(), second.err.read_text()[-2000:]
    # the same programs, the same translated sizes: the verifier was given the same code
    assert held2 == held1 and len(held1) >= 10, (held1, held2)
    assert any(name.startswith("tracepoint__sock__") for _, name, _ in held2), held2
    for k in ("method", "path", "status", "chunks", "partial"):
        assert rec2[k] == rec1[k], (k, rec1, rec2)
    assert rec2["chunks"] >= 5

    # half the file (a disk filled while it was written by hand, say): compiled and saved
    saved.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    third = _start(tmp_path, "third", server, cache)
    try:
        assert _traced(third, server)["chunks"] >= 5
    finally:
        assert third.stop() == 0
    err = third.err.read_text()
    assert FROM_CACHE not in err and "not used" in err and "compiling" in err, err[-2000:]
    assert json.loads(saved.read_text())["funcs"], "the compile was saved again, whole"


def test_a_cache_others_may_write_is_not_read(tmp_path: Path, server: int) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    agent = _start(tmp_path, "agent", server, cache)
    try:
        assert _traced(agent, server)["chunks"] >= 5
    finally:
        assert agent.stop() == 0
    err = agent.err.read_text()
    assert "writable by others" in err and FROM_CACHE not in err, err[-2000:]
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
