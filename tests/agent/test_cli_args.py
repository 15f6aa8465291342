"""Out-of-range command-line values are refused at parse time: one line, exit 2, nothing
loaded (`--port 70000` once got past the parser and raised IndexError in the loader after
the probes were attached). No BPF needed: the agent stops before loading anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent import cli

AGENT = str(Path(sys.executable).parent / "parallax-agent")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENT, "run", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port", "70000"], "--port: wants an integer from 1 to 65535, got '70000'"),
        (["--port", "-1"], "--port: wants an integer from 1 to 65535"),
        (["--port", "0"], "--port: wants an integer from 1 to 65535"),
        (["--port", "9" * 5000], "--port: wants an integer from 1 to 65535"),
        (["--port", "http"], "--port: wants an integer"),
        (["--pid", "0"], "--pid: wants an integer from 1 to 4194304"),
        (["--pid", "-5"], "--pid: wants an integer from 1"),
        (["--head-window", "100000"], "--head-window: wants an integer from 256 to 16384"),
        (["--head-window", "0"], "--head-window: wants an integer from 256 to 16384"),
        (["--stream-limit-s", "-1"], "--stream-limit-s: wants a number from 0 to 2592000"),
        (["--stream-limit-s", "nan"], "--stream-limit-s: wants a number"),
        (["--nice", "40"], "--nice: wants an integer from -20 to 19"),
        (["--cpu-budget", "inf"], "--cpu-budget: wants a number from 0 to 4096"),
        (["--cpu-budget", "0.01"], "--cpu-budget wants 0 (none) or at least 0.05 cores"),
        (["--drain-ms", "0"], "--drain-ms: wants a number from 1 to 1000"),
        (["--ringbuf-pages", "3"], "--ringbuf-pages: wants 0 or a power of two"),
        (["--port", "1", "--service-name", "70000=x"], "--service-name wants PORT=NAME"),
        (["--port", "1", "--service-name", "8000"], "--service-name wants PORT=NAME"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    p = _run(*args)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], p.stderr


def test_a_metrics_port_out_of_range_is_one_line() -> None:
    # bind() raises OverflowError for it, which the HOST:PORT check did not catch
    p = _run("--port", "1", "--metrics-addr", "127.0.0.1:70000")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "expected HOST:PORT" in lines[0], p.stderr


def test_the_limits_themselves_are_accepted() -> None:
    args = cli._parser().parse_args(
        [
            *("run", "--port", "1", "--port", "65535", "--pid", "1", "--head-window", "16384"),
            *("--nice", "-20", "--stream-limit-s", "0", "--ringbuf-pages", "1"),
        ]
    )
    assert args.port == [1, 65535] and args.pid == [1] and args.head_window == 16384
    assert args.nice == -20 and args.stream_limit_s == 0 and args.ringbuf_pages == 1
