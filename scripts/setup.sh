#!/bin/sh
# One-command set-up on a fresh Debian 12 machine, run as root by `make setup`.
# Idempotent: every step checks first, so a machine that is already set up takes seconds.
# Nothing here downloads a prebuilt binary or browser: Debian packages, the Python
# packages pinned in requirements.lock, and the npm packages in js_probe/package-lock.json.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
START=$(date +%s)
# each line says when it came, in seconds since the start: where a fresh machine's set-up
# time goes (122-159 s measured, docs/benchmarks.md)
say() { printf 'setup: [%3ss] %s\n' "$(($(date +%s) - START))" "$*"; }

# --- Debian packages ---------------------------------------------------------------
ARCH=$(dpkg --print-architecture)
# systemd: systemd-analyze, which tests/test_systemd.py runs on the VM units (deploy/systemd).
# prometheus (promtool) and prometheus-alertmanager: the real tools the tests check the
# /metrics, the rules (deploy/prometheus) and the alert lifecycle with (tests/prom_tools.py).
DAEMONS="prometheus prometheus-alertmanager"
# iproute2 (ip netns, nstat) and nftables (nft): the real packet loss between two network
# namespaces that tests/agent/netloss.py sets up for the retransmit counts.
PKGS="python3-bpfcc bpftool chromium nginx faketime wrk python3-venv ca-certificates openssl gcc libc6-dev systemd iproute2 nftables util-linux $DAEMONS"
# Kernel headers: bcc compiles against the running kernel's headers when it has them;
# otherwise Debian's generic linux-headers package feeds the fallback tree built below.
if [ ! -e "/lib/modules/$(uname -r)/build" ]; then
    PKGS="$PKGS linux-headers-$ARCH"
fi
command -v npm >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
MISSING=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || MISSING="$MISSING $p"
done
if [ -n "$MISSING" ]; then
    if [ "$(id -u)" != 0 ]; then
        say "missing Debian packages:$MISSING — run 'make setup' as root"; exit 1
    fi
    say "installing Debian packages:$MISSING"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $MISSING >/dev/null
    # Debian starts the two daemons it installs (ports 9090, 9093): the tests run their own
    # binaries on free loopback ports, so stop and disable those that this run installed.
    if [ -d /run/systemd/system ]; then
        for d in $DAEMONS; do
            case " $MISSING " in *" $d "*) systemctl disable --now "$d.service" >/dev/null 2>&1 || true ;; esac
        done
    fi
fi

# --- Browser probe (npm, from the lock file) ----------------------------------------
# It needs nothing from the Python side, so it runs in the background beside the venvs
# (it waited for them: 11-13 s more on a fresh machine); waited for at the end, its output
# in .cache/npm.log.
NPM_JOB=""
if [ -f js_probe/package-lock.json ]; then
    mkdir -p .cache
    if [ ! -f js_probe/node_modules/.package-lock.json ] \
        || [ js_probe/package-lock.json -nt js_probe/node_modules/.package-lock.json ]; then
        say "installing js_probe npm packages from package-lock.json (in the background)"
        NPM_CI=1
    else
        NPM_CI=0
    fi
    (
        cd js_probe
        if [ "$NPM_CI" = 1 ]; then npm ci --no-audit --no-fund --loglevel=error; fi
        npm run --silent build
    ) > .cache/npm.log 2>&1 &
    NPM_JOB=$!
fi

# --- Python virtualenv (.venv) from the lock file -----------------------------------
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
# LiteLLM, the gateway the tests put in front of the engine: a venv of its own (it pins
# python-dateutil below what kubernetes needs), from its lock file. It shares nothing with
# .venv, so it is built in the background meanwhile (each install took ~1 min, one after
# the other) and waited for below; its pip output goes to .cache/venvs/litellm.log.
LSTAMP=.cache/venvs/litellm/.parallax-setup
LWANT=$(sha256sum tests/agent/llm/litellm.lock | cut -c1-16)
LITELLM_JOB=""
if [ ! -x .cache/venvs/litellm/bin/litellm ] || [ "$(cat "$LSTAMP" 2>/dev/null)" != "$LWANT" ]; then
    say "building .cache/venvs/litellm from tests/agent/llm/litellm.lock (in the background)"
    mkdir -p .cache/venvs
    (
        [ -x .cache/venvs/litellm/bin/python ] || "$PYTHON" -m venv .cache/venvs/litellm
        .cache/venvs/litellm/bin/pip install -q --disable-pip-version-check -r tests/agent/llm/litellm.lock
        echo "$LWANT" > "$LSTAMP"
    ) > .cache/venvs/litellm.log 2>&1 &
    LITELLM_JOB=$!
fi
STAMP=.venv/.parallax-setup
WANT=$(cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/python ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    say "building .venv with $PYTHON from requirements.lock"
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
    # --no-compile: pip would byte-compile all 2.2 GB of packages, one file at a time (117 s
    # against 49 s without, on 2 cores); Python compiles a module when it is first imported,
    # into the Makefile's bytecode cache (PYTHONPYCACHEPREFIX), once for every later process.
    .venv/bin/pip install -q --disable-pip-version-check --no-compile -r requirements.lock
    .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
    echo "$WANT" > "$STAMP"
    say ".venv built"
fi
# bcc comes from Debian (python3-bpfcc). Expose that one package to the venv, not all of
# Debian's dist-packages, so nothing else leaks in.
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
BCC_SRC=/usr/lib/python3/dist-packages/bcc
if [ -d "$BCC_SRC" ] && [ ! -e "$SITE/bcc" ]; then
    ln -s "$BCC_SRC" "$SITE/bcc"
fi

# --- The real LLM engine for the tests: llama-cpp-python, built once from its sdist -------
# (~10 min on 2 cores; no extra Debian packages: gcc, g++ and cmake from its build deps). The
# wheel is kept in .cache/wheels, so a venv rebuilt later installs it in seconds.
LLAMA=llama-cpp-python==0.3.36
if ! .venv/bin/python -c 'import llama_cpp' 2>/dev/null; then
    mkdir -p .cache/wheels
    if ! ls .cache/wheels/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
        say "building $LLAMA from its sdist (once, ~10 min on 2 cores)"
        .venv/bin/pip wheel -q --disable-pip-version-check --no-deps -w .cache/wheels "$LLAMA"
    fi
    .venv/bin/pip install -q --disable-pip-version-check --no-deps .cache/wheels/llama_cpp_python-0.3.36-*.whl
fi
# LiteLLM's venv, built by the background job started above: its result.
if [ -n "$LITELLM_JOB" ]; then
    if ! wait "$LITELLM_JOB"; then
        say "building .cache/venvs/litellm failed; the end of .cache/venvs/litellm.log:"
        tail -n 5 .cache/venvs/litellm.log
        exit 1
    fi
    say ".cache/venvs/litellm built"
fi

# --- Compiled fast paths (optional: without them the agent and collector run in Python) -
# parallax_contracts/compiled.py: each rebuilt only when its .c is newer; one line each.
.venv/bin/python -m parallax_contracts.compiled | while read -r line; do say "$line"; done

# --- Kernel-header fallback ----------------------------------------------------------
if [ ! -e "/lib/modules/$(uname -r)/build" ]; then
    .venv/bin/python -m agent.kernel.headers build --quiet
    say "kernel-header fallback ready"
fi

# The browser probe's npm packages and build, started above: their result.
if [ -n "$NPM_JOB" ]; then
    if ! wait "$NPM_JOB"; then
        say "installing or building js_probe failed; the end of .cache/npm.log:"
        tail -n 20 .cache/npm.log
        exit 1
    fi
    say "js_probe built"
fi
say "ok ($ROOT)"
