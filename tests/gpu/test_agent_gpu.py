"""The real agent, its real CUDA uprobes and NVML poller, on C-ABI doubles of the two NVIDIA
libraries (demo/gpu/fake_cuda.c, fake_nvml.c): the GPU attributes of each request of an
inference-like server (tests/gpu/infer_server.py) with a known pattern — prefill: 40 launches
and a 100 ms synchronize; each later token: 5 launches and a 20 ms device-to-host copy.
Launch counts exact, waits within 2 ms; the GPU work in a worker process of the same cgroup;
a server without a GPU (fields absent); no NVML at all (one attach-line word, no fields)."""

from __future__ import annotations

import contextlib
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.gpu import cuda_double
from demo.gpu.nvml_double import NvmlScript, build_fake_nvml
from tests.agent.helpers import PY, Agent, OtlpReceiver, Proc, timing_log
from tests.gpu import infer_server

pytestmark = pytest.mark.ebpf

GPU_UUID = "GPU-7e57c0de-0000-4000-8000-0000000000a1"
TOKENS = 3
SM_PCT = 70
WAIT_SLACK_US = 2000
CGROUP_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/pids")


@contextlib.contextmanager
def cgroup() -> Iterator[Path]:
    """A fresh cgroup (a container of its own for the processes started in it)."""
    for root in CGROUP_ROOTS:
        if not os.path.exists(f"{root}/cgroup.procs"):
            continue
        d = Path(root) / f"px-test-{uuid.uuid4().hex[:8]}"
        try:
            d.mkdir()
        except OSError:
            continue
        try:
            yield d
        finally:
            for _ in range(50):  # its processes must have exited
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        return
    pytest.fail("no writable cgroup hierarchy (tests run as root)")


def server(cg: Path, log: Path, *args: str) -> Proc:
    """infer_server.py started inside cgroup ``cg`` (its worker child is born there too),
    logging each request's host waits to ``log``."""
    argv = [PY, "-m", "tests.gpu.infer_server", "--log", str(log), *args]
    return Proc(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *argv])


def generate(port: int, tokens: int = TOKENS) -> bytes:
    url = f"http://127.0.0.1:{port}/generate?tokens={tokens}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body: bytes = r.read()
    return body


def gpu_fields(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k.startswith("gpu_")}


@pytest.fixture(scope="module")
def libs() -> tuple[Path, Path]:
    return cuda_double.build(), build_fake_nvml()


def nvml_env(tmp: Path, nvml_dir: Path, gpu_pids: list[int]) -> list[str]:
    """An NVML script where ``gpu_pids`` run on one GPU at SM_PCT from now on; the agent's
    environment to read it."""
    now = time.time_ns() // 1000
    script = NvmlScript(tmp / "nvml.script")
    dev = script.device(GPU_UUID)
    script.util(dev, now - 10_000_000, now + 600_000_000, gpu_pct=SM_PCT)
    for pid in gpu_pids:
        script.proc(dev, pid, now - 10_000_000, now + 600_000_000, sm_pct=SM_PCT)
        script.running(dev, pid, 2**30)
    script.write()
    env = script.env(nvml_dir)
    return ["env", f"LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}", f"PARALLAX_FAKE_NVML={script.path}"]


def probed(agent: Agent, n: int = 1) -> None:
    """Until the agent's CUDA probes are on ``n`` GPU processes (the GPU thread finds them
    within a poll period): a request before then has no launch counts, rightly."""
    v = agent.wait_metric('parallax_agent_gpu_processes{state="probed"}', lambda v: v >= n, 10)
    assert v >= n, agent.err.read_text()


def worker_of(p: Proc) -> int:
    kids = Path(f"/proc/{p.p.pid}/task/{p.p.pid}/children").read_text().split()
    assert len(kids) == 1, kids
    return int(kids[0])


def assert_pattern(rec: dict[str, Any], waited: dict[str, int], tokens: int = TOKENS) -> None:
    """``waited``: the server's own log of the request's host waits."""
    g = gpu_fields(rec)
    assert g["gpu_prefill_launches"] == infer_server.PREFILL_LAUNCHES, g
    assert g["gpu_decode_launches"] == infer_server.DECODE_LAUNCHES * (tokens - 1), g
    assert abs(g["gpu_prefill_wait_us"] - waited["prefill_wait_us"]) <= WAIT_SLACK_US, (g, waited)
    assert abs(g["gpu_decode_wait_us"] - waited["decode_wait_us"]) <= WAIT_SLACK_US, (g, waited)
    assert g["gpu_uuid"] == GPU_UUID
    assert (
        abs(g["gpu_prefill_sm_util_pct"] - SM_PCT) < 1
        and abs(g["gpu_decode_sm_util_pct"] - SM_PCT) < 1
    )
    assert g["gpu_sample_coverage"] > 0.95, g
    assert g["gpu_inflight_mean"] == pytest.approx(1.0, abs=0.05), g


@pytest.mark.parametrize("worker", [False, True], ids=["one-process", "gpu-worker"])
def test_prefill_and_decode_of_each_request(
    tmp_path: Path, libs: tuple[Path, Path], worker: bool
) -> None:
    cuda_dir, nvml_dir = libs
    with cgroup() as cg:
        args = ["--cuda-lib-dir", str(cuda_dir)] + (["--worker"] if worker else [])
        s = server(cg, tmp_path / "waits.jsonl", *args)
        try:
            port = s.port()
            gpu_pid = worker_of(s) if worker else s.p.pid
            env = nvml_env(tmp_path, nvml_dir, [gpu_pid])
            agent = Agent(tmp_path, [port], wrapper=env)
            try:
                err = agent.err.read_text()
                assert "GPU: 1 device" in err, err
                probed(agent)
                for _ in range(2):
                    assert b"token2" in generate(port)
                recs = agent.wait_for(lambda r: r["path"] == "/generate", 2, timeout=15)
                recs = agent.wait_for(lambda r: "gpu_decode_wait_us" in r, 2, timeout=15)
                assert len(recs) == 2, agent.records()
                waited = timing_log(tmp_path / "waits.jsonl")
                for rec, w in zip(
                    sorted(recs, key=lambda r: r["start_unix_ns"]), waited, strict=True
                ):
                    assert rec["pid"] == s.p.pid  # the server read it; the GPU work is the worker's
                    assert_pattern(rec, w)
                m = agent.metrics()
                assert m[f'parallax_agent_gpu_launches_total{{pid="{gpu_pid}"}}'] >= 2 * (40 + 10)
            finally:
                assert agent.stop() == 0
        finally:
            s.stop()


def test_a_server_without_gpu_gets_no_gpu_fields(tmp_path: Path, libs: tuple[Path, Path]) -> None:
    """Beside a GPU service (NVML on, CUDA probes attached), a service in another cgroup
    with no GPU process: its records carry no gpu_* field at all — absent, not zero."""
    cuda_dir, nvml_dir = libs
    with cgroup() as cg_gpu, cgroup() as cg_plain:
        gpu_srv = server(cg_gpu, tmp_path / "waits.jsonl", "--cuda-lib-dir", str(cuda_dir))
        plain = server(cg_plain, tmp_path / "plain.jsonl", "--no-gpu")
        try:
            gport, pport = gpu_srv.port(), plain.port()
            env = nvml_env(tmp_path, nvml_dir, [gpu_srv.p.pid])
            agent = Agent(tmp_path, [gport, pport], wrapper=env)
            try:
                probed(agent)
                generate(gport)
                generate(pport)
                [g] = agent.wait_for(lambda r: r["local_port"] == gport and "gpu_uuid" in r, 1, 15)
                assert_pattern(g, timing_log(tmp_path / "waits.jsonl")[0])
                [p] = agent.wait_for(lambda r: r["local_port"] == pport, 1, 15)
                assert gpu_fields(p) == {}, p
                assert p["ttft_us"] >= infer_server.PREFILL_WAIT_US  # it was timed all the same
            finally:
                assert agent.stop() == 0
        finally:
            gpu_srv.stop()
            plain.stop()


def test_no_nvml_no_gpu_parts(tmp_path: Path, libs: tuple[Path, Path]) -> None:
    """No libnvidia-ml.so.1 (a node without a GPU driver): one word in the attach line, no
    GPU field on any record, the agent otherwise unchanged; --gpu off says so too."""
    cuda_dir, _ = libs
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    with cgroup() as cg:
        s = server(cg, tmp_path / "waits.jsonl", "--cuda-lib-dir", str(cuda_dir))
        try:
            port = s.port()
            for extra, word in (([], "GPU: none"), (["--gpu", "off"], "GPU: off")):
                agent = Agent(tmp_path, [port], extra, wrapper=["env", f"LD_LIBRARY_PATH={empty}"])
                try:
                    assert word in agent.err.read_text()
                    generate(port)
                    [rec] = agent.wait_for(lambda r: r["path"] == "/generate", 1, timeout=10)
                    assert gpu_fields(rec) == {}
                finally:
                    assert agent.stop() == 0
                    agent.jsonl.unlink()
        finally:
            s.stop()


def test_otlp_spans_and_metrics(tmp_path: Path, libs: tuple[Path, Path]) -> None:
    """--otlp: the GPU attributes on the SERVER span under their contract names; on
    /v1/metrics the device series (hw.id = the GPU's UUID), the GPU process's launch
    counter and the GenAI TTFT / time-per-output-token histograms of the route."""
    from parallax_contracts import agent_metrics as gm
    from parallax_contracts import span_attributes as sa

    cuda_dir, nvml_dir = libs
    rx = OtlpReceiver()
    with cgroup() as cg:
        s = server(cg, tmp_path / "waits.jsonl", "--cuda-lib-dir", str(cuda_dir))
        try:
            port = s.port()
            env = nvml_env(tmp_path, nvml_dir, [s.p.pid])
            agent = Agent(tmp_path, [port], ["--otlp", rx.url], wrapper=env)
            try:
                probed(agent)
                generate(port, tokens=4)
                agent.wait_for(lambda r: "gpu_uuid" in r, 1, timeout=15)
            finally:
                assert agent.stop() == 0  # flushes spans and metrics
        finally:
            s.stop()
            rx.close()
    [span] = rx.spans()
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs[sa.GPU_PREFILL_LAUNCHES.name].int_value == infer_server.PREFILL_LAUNCHES
    assert attrs[sa.GPU_DECODE_LAUNCHES.name].int_value == 3 * infer_server.DECODE_LAUNCHES
    assert attrs[sa.GPU_UUID.name].string_value == GPU_UUID
    assert abs(attrs[sa.GPU_DECODE_SM_UTIL_PCT.name].double_value - SM_PCT) < 1
    metrics = rx.metrics()
    util = metrics[gm.HW_GPU_UTILIZATION.name][-1].gauge.data_points[-1]
    assert {a.key: a.value.string_value for a in util.attributes}[gm.HW_ID] == GPU_UUID
    assert util.as_double == pytest.approx(SM_PCT / 100)
    launches = metrics[gm.GPU_LAUNCHES.name][-1].sum
    assert launches.is_monotonic
    assert max(p.as_int for p in launches.data_points) >= 40 + 3 * 5
    ttft = metrics[gm.GEN_AI_TTFT.name][-1].histogram.data_points[-1]
    assert ttft.count == 1 and ttft.sum >= infer_server.PREFILL_WAIT_US / 1e6
    route = {a.key: a.value.string_value for a in ttft.attributes}[sa.HTTP_ROUTE.name]
    assert route == "/generate"
    tpot = metrics[gm.GEN_AI_TPOT.name][-1].histogram.data_points[-1]
    assert tpot.count == 1
    assert tpot.sum == pytest.approx(infer_server.DECODE_WAIT_US / 1e6, rel=0.3)
