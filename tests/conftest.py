"""Shared test plumbing: capability gates for eBPF, browser and nginx tests, and the time
each test file took (printed after ``--durations``' slowest tests: where ``make test``'s
minutes go).

A test marked ``ebpf`` skips with the missing capability named, except under
PARALLAX_REQUIRE_EBPF=1 (.ci/run sets it), where the same condition fails the test: on a
machine that can run eBPF, those tests must run.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from functools import cache

import pytest
from hypothesis import settings

from agent import doctor

# The property tests draw a fixed set of examples per test (derandomize): a test run gates
# a landing, and a fresh random draw must not fail it for a change it has nothing to do
# with (a fresh clone's run drew a header value of CR LF that a test's oracle did not allow
# for: the test was wrong, not the parser). HYPOTHESIS_PROFILE=explore draws new examples
# each run, to look for bugs.
settings.register_profile("gate", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))


@cache
def ebpf_missing() -> str | None:
    """Why eBPF tests cannot run here, or None when they can."""
    checks = doctor.run_checks()
    missing = [f"{c.name}: {c.detail}" for c in checks if c.fatal]
    return "; ".join(missing) if missing else None


def require_ebpf_strict() -> bool:
    return os.environ.get("PARALLAX_REQUIRE_EBPF") == "1"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("ebpf"):
        why = ebpf_missing()
        if why:
            if require_ebpf_strict():
                pytest.fail(f"PARALLAX_REQUIRE_EBPF=1 but eBPF is unavailable: {why}")
            pytest.skip(f"eBPF unavailable: {why}")
    if item.get_closest_marker("browser") and not shutil.which("chromium"):
        pytest.skip("no /usr/bin/chromium (Debian package chromium; make setup installs it)")
    if item.get_closest_marker("nginx") and not (
        shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")
    ):
        pytest.skip("no nginx binary (Debian package nginx; make setup installs it)")


# Seconds per test file, set-up and teardown included: a shared fixture's start counts in the
# file of the first test that needed it.
_FILE_SECONDS: defaultdict[str, float] = defaultdict(float)
FILES_SHOWN = 15


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _FILE_SECONDS[report.nodeid.partition("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    top = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:FILES_SHOWN]
    tr = terminalreporter
    tr.write_sep("=", f"time by test file: the {len(top)} largest of {total:.0f} s in tests")
    for path, seconds in top:
        tr.write_line(f"{seconds:8.1f}s {100 * seconds / total:5.1f}%  {path}")
