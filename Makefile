# Parallax — the two commands a new user runs are `make demo` and `make test`;
# both run `make setup` first (Debian packages, .venv, npm, kernel-header fallback).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Tests that need eBPF fail instead of skipping when this is 1 (.ci/run sets it).
export PARALLAX_REQUIRE_EBPF ?= 0
# Bytecode, kept in one cache outside the sources. Where the environment sets
# PYTHONDONTWRITEBYTECODE (these machines do) and setup installs with --no-compile, every
# Python process compiled each module it imported from source, every time: the suite starts
# hundreds (collectors, agents, apps, CLIs, pytest workers). tests/sla/test_cli.py took 47 s
# so and 23 s with the cache (docs/benchmarks.md, "Bytecode").
export PYTHONPYCACHEPREFIX := $(CURDIR)/.cache/pyc
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup demo test test-py test-js lint manifests bench bench-llm bench-agent bench-collector bench-sla bench-accuracy bench-gpu bench-faults bench-sampling bench-store bench-alerts clean lock

setup:
	@./scripts/setup.sh

demo: setup
	@$(PY) -m demo

test: setup lint test-js test-py
# lint has type-checked the probe's tests already (npm run typecheck): test-js only runs them
test: JS_TEST = test:run

# Two phases. First every test but the browser and serial ones, in two workers that each
# take whole files (a module's agent or store stays in the process that made it): those
# tests wait on servers and agents much of their time, so two workers on 2 cores finish
# them in three quarters of it (605 s against ~820 s). Then the browser tests and the
# serial ones, one at a time: the browser tests time paints and chunks in Chromium against
# tolerances of a few ms, and a neighbour on the same cores made two of them miss
# (docs/benchmarks.md, "Where `make test`'s time goes"); the serial ones set node-wide
# state (ns_last_pid) that a neighbour's forks race with, and would skip. The second
# phase runs even when the first fails, so one run shows every failure. TEST_WORKERS=0
# runs the first phase in one process too.
TEST_WORKERS ?= 2
test-py:
	@rc=0; \
	echo "test-py 1/2: every test but the browser and serial ones, in $(TEST_WORKERS) workers"; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not browser and not serial" || rc=$$?; \
	echo "test-py 2/2: the browser and serial tests, one at a time"; \
	$(PY) -m pytest -m "browser or serial" || rc=$$?; \
	exit $$rc

JS_TEST ?= test
test-js:
	cd js_probe && npm run --silent $(JS_TEST)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check agent collector parallax_contracts demo tests bench dashboards
	$(VENV)/bin/mypy -n 2  # two worker processes: 18 s against 29 s cold on 2 cores
	cd js_probe && npm run --silent typecheck

bench: bench-agent bench-llm bench-collector bench-sla bench-accuracy bench-gpu bench-faults bench-sampling bench-store bench-alerts

# bench.tls, bench.http2: the same per-request costs over TLS, and over HTTP/2 and gRPC,
# beside plaintext HTTP/1 (~5 min, ~3 min); bench.tp_btf: the BTF tracepoints against the
# classic ones (~2 min); bench.agent_threads --otlp: the agent as the DaemonSet runs it,
# exporting OTLP spans (bench.agent exports JSON lines), its CPU per request by thread, at
# bench-agent's rate and at 200 requests/s (where a drain's fixed costs show)
bench-agent: setup
	$(PY) -m bench.agent
	$(PY) -m bench.agent_threads --otlp
	$(PY) -m bench.agent_threads --otlp --rate 200
	$(PY) -m bench.tls
	$(PY) -m bench.http2
	$(PY) -m bench.agent_lifecycle
	$(PY) -m bench.tp_btf

bench-collector: setup
	$(PY) -m bench.collector

# LLM streams (~4 min, root: the real agent): parsing cost per event, first-token time per
# dialect against the client, queue waits on the real serial engine, endings, memory.
bench-llm: setup
	$(PY) -m bench.llm

bench-sla: setup
	$(PY) -m bench.sla

# The alert lifecycle in a real Alertmanager, long (~2 min): 200 scripted lifecycles x 30
# evaluations, the violations counted (tests/sla/test_alertmanager.py runs 20 x 12)
bench-alerts: setup
	$(PY) -m bench.alerts

# Bytes per request on disk, the pairer's store look-ups, pairing through the store: the
# figures of docs/store.md's capacity arithmetic (a ClickHouse cluster).
bench-store: setup
	$(PY) -m bench.store

# The GPU side on the C-ABI doubles (~2 min): CUDA uprobe cost per call, NVML poller CPU,
# the export delay of a GPU service's records.
bench-gpu: setup
	$(PY) -m bench.gpu

# Sampling under overload (~2 min): traced P95 against every request's, the traced share
# per 0.5 s, the exact counts, the CPU saved.
bench-sampling: setup
	$(PY) -m bench.sampling

# Faults and hostile clients, the long variants of tests/collector/test_faults.py (~5 min;
# root, for the tmpfs): disk full, kill -9 under load, 64 MB heads, 1000 slowloris clients.
bench-faults: setup
	$(PY) -m bench.faults

# Accuracy against injected ground truth (~4 min). The demo plot (docs/img/demo-p95.png) is
# drawn from the store a `DEMO_EXIT=1 make demo` run leaves: `$(PY) -m bench.demo_plot`.
bench-accuracy: setup
	$(PY) -m bench.accuracy

# deploy/k8s/parallax.yaml from the Helm chart's defaults (helm from the pinned dev
# dependency; tests/test_helm.py fails while the two differ).
manifests: setup
	$(PY) -m tests.k8s_tools manifests

# Re-pin requirements.lock from pyproject.toml (maintainers; needs the package registry).
lock:
	rm -rf .cache/lock-venv && python3 -m venv .cache/lock-venv
	.cache/lock-venv/bin/pip install -q -e '.[dev]'
	.cache/lock-venv/bin/pip freeze --exclude-editable | grep -v '^-e' > requirements.lock

clean:
	rm -rf .parallax js_probe/dist js_probe/build
