"""`make demo`: the whole pipeline on this machine, in about two minutes.

Starts the collector on the embedded store (data in .parallax/demo/), the eBPF agent, an
LLM-style streaming app (first-token wait, then tokens; Anthropic Messages over chunked fetch,
OpenAI chat over SSE, JSON token frames over WebSocket) whose event loop stalls now
and then, a real engine — llama.cpp's OpenAI-compatible server on a tiny random-weight model
written at start (demo/tiny_model.py), serving one request at a time — that the pages reach
through the app (a thin gateway forwarding ``traceparent``), an inference-like service whose
engine runs on stand-ins for the NVIDIA libraries (demo/gpu: no GPU needed; the agent's GPU
path is the real one), a twin of the app that leaves Nagle's algorithm on (its WebSocket
tokens leave in pairs), and headless Chromium running a chat page with the probe. It drives
chats for a while with a progress line — a few at once on the engine now and then, so that
its queue shows —, then prints the per-route SLA table with its explanations and
every address (the SLA page, the API, the agent's and the collector's /metrics), and keeps
serving until Ctrl-C, which stops every piece within a few seconds (DEMO_EXIT=1: exit once
the table is printed; PARALLAX_DEMO_DIR: data elsewhere).
Afterwards, `parallax-collector sla --once --json --data-dir .parallax/demo` shows the same
verdicts from the stored data.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from agent import doctor
from demo import tiny_model
from demo.browser import chat_url, chromium, flush_beacons
from demo.gpu import cuda_double
from demo.gpu.nvml_double import FakeNvmlUnavailableError, NvmlScript, build_fake_nvml, fake_env
from demo.infer_app import GPU_UUID
from demo.stack import Proc, Stack, StartError

ROOT = Path(__file__).resolve().parent.parent
# PARALLAX_DEMO_DIR: elsewhere (a test's own directory)
DEMO_DIR = Path(os.environ.get("PARALLAX_DEMO_DIR") or ROOT / ".parallax" / "demo")
# On Ctrl-C the pieces get this long, together, to stop before SIGKILL.
STOP_ON_CTRL_C_S = 2.0
SERVICE = "chat-demo"
# Realistic pacing, shortened so a minute gives the checker enough samples per route.
PACING = ["--first-token-ms", "120", "--token-gap-ms", "25", "--tokens", "12"]
# The injected trap: the app's event loop blocks 60 ms every 200 ms. Its own timings stay
# fast; users wait in the kernel's receive queue. The checker should say exactly that.
STALL = ["--block-ms", "60", "--block-every-ms", "200"]
# The holdback trap: a twin of the app (no stalls) that leaves Nagle's algorithm on, as many
# servers do, streaming a token every 10 ms over WebSocket in conversations of three turns.
# A prompt sent as the last answer ends puts the browser's kernel in delayed-ACK mode: Nagle
# holds the tokens written while the first one waits for its ACK (up to 40 ms), and they
# arrive in a burst; the agent names the holdback.
NAGLE = ["--nagle", "--first-token-ms", "120", "--token-gap-ms", "10", "--tokens", "12"]
NAGLE_SERVICE = "chat-nagle"
KINDS = ("fetch", "sse", "ws", "gen")  # gen: the inference service's /v1/generate
# What each kind of chat speaks: real dialects (demo/llm_app.py), never bare words
# (Anthropic over fetch, as its SDK reads it; OpenAI's unnamed events over EventSource)
DIALECTS = "fetch:anthropic,sse:openai,ws:frames,nagle:frames"
# The real engine (llama.cpp, one request at a time) gets chats from pages of its own, on a
# shared clock: every ENGINE_PERIOD_S one alone, and every ENGINE_BURST_EVERY-th period
# ENGINE_PAGES at once — all but the first wait in the engine's queue.
ENGINE_PAGES = 3
ENGINE_PERIOD_S = 3.0
ENGINE_BURST_EVERY = 3
ENGINE_TOKENS = 16  # greedy answers of the tiny model never end early: exactly this many
ENGINE_SERVICE = "llama_cpp.server"  # no OTEL_SERVICE_NAME: the agent's name for it
# one more page holds the Nagle twin's conversations (the others' share of chats unchanged)
NAGLE_KINDS = ("nagle",)
INFER_SERVICE = "infer-demo"
PAGES = 4
# The collector reads sla.yaml from its data directory, and so does `sla --once --data-dir`
# afterwards: both judge with the same thresholds. Visible TTFT's band includes the display
# (docs/sla.md); a short interval so the table reflects the whole run.
SLA_YAML = f"""\
interval: 5s
window: 5m
metrics:
  visible_ttft: {{band_ms: 50}}
routes:
  # one request at a time: the engine answers 20–35 chats in the minute (fewer on a busy
  # machine), not the default 100
  - {{route: /v1/chat/completions, service: {ENGINE_SERVICE}, min_samples: 15}}
"""


def get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback)
        return json.load(r)


def fmt_ms(v: object) -> str:
    return f"{v:8.1f}" if isinstance(v, int | float) else f"{'—':>8}"


def wait_for_evaluation(query: str, after: float, timeout: float = 60.0) -> dict[str, Any]:
    """The first SLA document evaluated after ``after`` (Unix time): it covers the run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc: dict[str, Any] = get_json(f"{query}/v1/sla", timeout=30)
        at = datetime.fromisoformat(doc["window"]["evaluated_at"]).timestamp()
        if at >= after and doc.get("routes"):
            return doc
        time.sleep(1.0)
    raise TimeoutError(f"no evaluation within {timeout:.0f} s")


# An LLM route (its pairs read a stream dialect: the route's ``server.llm``) is judged on
# tokens: its first-byte and gap rows say so; a route in no dialect keeps the metric names.
TOKEN_METRICS = {"ttft": "first token", "itl": "token gap"}


def sla_table(report: dict[str, Any]) -> str:
    """The per-route SLA table with its sentences, as the on-call engineer reads it; each
    metric's band in its row (visible TTFT's is wider: it includes the display). An LLM
    route's rows and its server sentence are in tokens (queued, first token, tokens, gaps)."""
    lines = [
        f"{'route':28} {'metric':13} {'n':>5} {'user P95':>8} {'server P95':>10} "
        f"{'divergence [95% CI]':>26} {'band':>7}  verdict",
    ]
    sentences = []
    for r in report.get("routes", []):
        name = f"{r.get('service', '')} {r.get('route', '')}".strip()
        in_tokens = bool((r.get("server") or {}).get("llm"))
        for metric, m in r.get("metrics", {}).items():
            div = m.get("divergence_ms")
            ci = (
                f"{div:+7.1f} [{m['ci_low_ms']:+.1f}…{m['ci_high_ms']:+.1f}]"
                if isinstance(div, int | float) and m.get("ci_low_ms") is not None
                else "—"
            )
            band = m.get("band_ms")
            band_text = f"±{band:g} ms" if isinstance(band, int | float) else "—"
            lines.append(
                f"{name[:28]:28} {TOKEN_METRICS.get(metric, metric) if in_tokens else metric:13} "
                f"{m.get('n', 0):5d} {fmt_ms(m.get('user_p95_ms'))} "
                f"{fmt_ms(m.get('server_p95_ms')):>10} {ci:>26} {band_text:>7}  "
                f"{m.get('verdict')}"
            )
            if m.get("verdict") == "out_of_band" and m.get("sentence"):
                sentences.append(f"  • {m['sentence']}")
        server = r.get("server") or {}
        if server.get("sentence"):  # the server-time split and the GPU's state
            sentences.append(f"  • {server['sentence']}")
    return "\n".join([*lines, *([""] if sentences else []), *sentences])


# Armed first, started after: each page waits for ``window.__t0`` (its shared clock's zero,
# Date.now() ms), set on every page once all are armed. Arming inside the 500 ms before a
# start given at once let a slow evaluate on a busy machine start a page after the burst
# (CI once saw no engine chat queued).
ENGINE_SCRIPT = """([page, ms, period, every]) => {
    window.__demo = {done: 0, errors: 0, finished: false};
    (async () => {
        while (window.__t0 === undefined) await new Promise((r) => setTimeout(r, 5));
        const t0 = window.__t0;
        for (let k = 0; t0 + k * period < t0 + ms; k++) {
            if (page > 0 && k % every !== 0) continue;  // page 0 every period, the rest in bursts
            await new Promise((r) => setTimeout(r, Math.max(0, t0 + k * period - Date.now())));
            try { await window.chat("engine"); window.__demo.done++; }
            catch (e) { window.__demo.errors++; }
        }
        window.__demo.finished = true;
    })();
}"""


def drive(browser_url: str, seconds: float, progress: Any) -> int:
    """Run chats on PAGES pages (and the engine's on ENGINE_PAGES) for ``seconds``; return
    how many completed."""
    script = """([kinds, ms, offset]) => {
        window.__demo = {done: 0, errors: 0, finished: false};
        (async () => {
            const end = performance.now() + ms;
            for (let i = offset; performance.now() < end; i++) {
                try { await window.chat(kinds[i % kinds.length]); window.__demo.done++; }
                catch (e) { window.__demo.errors++; }
                await new Promise((r) => setTimeout(r, 30));
            }
            window.__demo.finished = true;
        })();
    }"""
    with chromium() as browser:
        pages = []
        for i, kinds in enumerate([KINDS] * PAGES + [NAGLE_KINDS]):
            page = browser.new_page()
            page.goto(browser_url, wait_until="load")
            page.wait_for_function("typeof window.chat === 'function'")
            page.evaluate(script, [list(kinds), seconds * 1000, i])
            pages.append(page)
        engine_pages = [browser.new_page() for _ in range(ENGINE_PAGES)]
        for page in engine_pages:
            page.goto(browser_url, wait_until="load")
            page.wait_for_function("typeof window.chat === 'function'")
        for i, page in enumerate(engine_pages):
            args = [i, seconds * 1000, ENGINE_PERIOD_S * 1000, ENGINE_BURST_EVERY]
            page.evaluate(ENGINE_SCRIPT, args)
            pages.append(page)
        t0 = time.time() * 1000 + 500
        for page in engine_pages:
            page.evaluate("(t0) => { window.__t0 = t0; }", t0)
        start = time.monotonic()
        while True:
            states = [p.evaluate("window.__demo") for p in pages]
            done = sum(s["done"] for s in states)
            progress(time.monotonic() - start, done, sum(s["errors"] for s in states))
            if all(s["finished"] for s in states):
                break
            if time.monotonic() - start > seconds + 60:  # a chat that never ends: go on
                print("\n  demo: some chats never finished; judging what came", flush=True)
                break
            time.sleep(1.0)
        for p in pages:
            flush_beacons(p)  # what a closing tab does: hand the last beacons over
        time.sleep(1.0)
        total: int = done
        return total


def background(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
    """Run ``fn(*args)`` in a daemon thread; the returned call waits for it and raises the
    StartError it raised."""
    errors: list[StartError] = []

    def run() -> None:
        try:
            fn(*args)
        except StartError as e:  # handed to the waiting caller
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def wait() -> None:
        t.join()
        if errors:
            raise errors[0]

    return wait


def start_engine(stack: Stack) -> tuple[Proc, str]:
    """The real engine on the tiny model, written now into the demo's directory (~90 MB,
    about a second); returns at once, while the engine loads (Stack.wait_engine)."""
    d = DEMO_DIR / "engine"
    d.mkdir(exist_ok=True)
    return stack.engine(tiny_model.write(d / "tiny.gguf"))


def start_infer(stack: Stack) -> tuple[dict[str, str], str]:
    """The inference service on the NVIDIA stand-ins: (the agent's environment that loads
    the NVML stand-in, the service's base URL)."""
    d = DEMO_DIR / "gpu"
    d.mkdir(exist_ok=True)
    try:
        nvml_dir = build_fake_nvml()
    except FakeNvmlUnavailableError as e:
        raise StartError(str(e)) from None
    cuda_dir = cuda_double.build(d / "cuda")
    script = NvmlScript(d / "nvml.script")
    script.device(GPU_UUID, "NVIDIA H200 (stand-in)")  # until the engine writes its own
    script.write()
    env = fake_env(nvml_dir, script.path)
    os.environ["OTEL_SERVICE_NAME"] = INFER_SERVICE
    try:
        url = stack.infer_app(cuda_dir, script.path)
    finally:
        os.environ["OTEL_SERVICE_NAME"] = SERVICE
    agent_env = {k: env[k] for k in ("LD_LIBRARY_PATH", "PARALLAX_FAKE_NVML")}
    return agent_env, url


def _shown(p: Path) -> str:
    """A path as the user typed it from the checkout (absolute when outside it)."""
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="make demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("DEMO_SECONDS", "60")))
    args = ap.parse_args(argv)
    exit_after = os.environ.get("DEMO_EXIT") == "1"

    checks = doctor.run_checks()
    if not doctor.can_run(checks):
        missing = "; ".join(f"{c.name}: {c.detail}" for c in checks if c.fatal)
        print(f"demo: the eBPF agent cannot run here ({missing}); see parallax-agent doctor")
        return 1
    if DEMO_DIR.exists():
        shutil.rmtree(DEMO_DIR)  # a fresh run: the table reflects this minute only
    DEMO_DIR.mkdir(parents=True)
    (DEMO_DIR / "sla.yaml").write_text(SLA_YAML)
    print(f"Parallax demo — data in {_shown(DEMO_DIR)}/, logs in {_shown(DEMO_DIR / 'logs')}/")
    stack = Stack(DEMO_DIR)
    interrupted: list[bool] = []

    def on_sigint(signum: int, frame: Any) -> None:
        interrupted.append(True)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        return run(stack, args.seconds, exit_after)
    except Exception:
        if not interrupted:  # a real failure: say it as it is
            raise
        return _stop(stack)  # the terminal's SIGINT also reached the browser's driver
    except KeyboardInterrupt:
        return _stop(stack)
    finally:
        stack.close()


def _stop(stack: Stack) -> int:
    """Ctrl-C: the pieces get SIGTERM together and SIGKILL after STOP_ON_CTRL_C_S; a second
    Ctrl-C meanwhile changes nothing; the browser driver's complaints (the terminal's SIGINT
    reached it too) are not the user's business."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    t = time.monotonic()
    print("\ndemo: stopping …", flush=True)
    stack.close(STOP_ON_CTRL_C_S)
    print(f"demo: stopped in {time.monotonic() - t:.1f} s", flush=True)
    return 130


def run(stack: Stack, seconds: float, exit_after: bool) -> int:
    try:
        up = _start_pieces(stack)
    except StartError as e:
        print(f"demo: {e}")
        return 1
    url = chat_url(
        up.app,
        up.ingest,
        gen=up.infer,
        nagle=up.nagle,
        dialects=DIALECTS,
        engine_tokens=ENGINE_TOKENS,
    )
    done = drive(url, seconds, _progress_line(seconds))
    print(f"\n  {done} chats done; waiting for the collector to pair and judge them …")
    try:
        report = wait_for_evaluation(up.query, after=time.time() + 2.0)
    except (urllib.error.URLError, OSError, ValueError, TimeoutError) as e:
        print(f"demo: could not read the SLA report from {up.query}/v1/sla: {e}")
        return 1
    _print_report(report, up.query, up.agent)
    if exit_after:
        return 0
    print("Serving until Ctrl-C …", flush=True)
    while all(p.alive() for p in stack.procs):
        time.sleep(1.0)
    print("demo: a piece stopped; see its log in " + _shown(DEMO_DIR / "logs"))
    return 1


@dataclass(frozen=True)
class _Pieces:
    """The running pieces' base URLs."""

    ingest: str  # the collector's ports
    query: str
    app: str  # the LLM app, its Nagle twin, the inference service
    nagle: str
    infer: str
    agent: str  # the agent's /metrics


def _start_pieces(stack: Stack) -> _Pieces:
    """Every piece started, each said in a line (StartError: one did not start)."""
    engine_proc, engine = start_engine(stack)
    # it loads and warms up while the rest starts (a daemon thread: Ctrl-C waits for none)
    engine_ready = background(stack.wait_engine, engine_proc, engine)
    ingest, query = stack.collector(DEMO_DIR)
    print(f"  collector   ingest {ingest}  ·  query {query}")
    os.environ["OTEL_SERVICE_NAME"] = SERVICE
    app = stack.llm_app(*PACING, *STALL, "--engine", engine)
    app_port = int(app.rsplit(":", 1)[1])
    print(
        f"  app         {app}  ({SERVICE}: Anthropic Messages over fetch, OpenAI chat over SSE,"
        " token frames over WebSocket; event loop stalls 60 ms every 200 ms)"
    )
    os.environ["OTEL_SERVICE_NAME"] = NAGLE_SERVICE
    try:
        nagle = stack.llm_app(*NAGLE, name="nagle_app")
    finally:
        os.environ["OTEL_SERVICE_NAME"] = SERVICE
    nagle_port = int(nagle.rsplit(":", 1)[1])
    print(
        f"  nagle app   {nagle}  ({NAGLE_SERVICE}: WebSocket, a token every 10 ms, TCP_NODELAY off)"
    )
    gpu_env, infer = start_infer(stack)
    infer_port = int(infer.rsplit(":", 1)[1])
    print(
        f"  inference   {infer}  ({INFER_SERVICE}: SSE from a batching engine on a"
        " stand-in GPU, power-capped)"
    )
    engine_ready()
    engine_port = int(engine.rsplit(":", 1)[1])
    print(
        f"  engine      {engine}  (llama_cpp.server: llama.cpp on a tiny random-weight"
        f" model, one request at a time; the pages reach it through {app}/v1/engine/…)"
    )
    ports = [app_port, nagle_port, infer_port, engine_port]
    agent = stack.agent(ports, ingest, env=gpu_env)
    print(
        f"  agent       tracing ports {', '.join(map(str, ports))}, exporting"
        f" OTLP to {ingest}  ·  metrics {agent}/metrics"
    )
    return _Pieces(ingest, query, app, nagle, infer, agent)


def _progress_line(seconds: float) -> Callable[[float, int, int], None]:
    """drive()'s progress callback: the browser's line."""
    tty = sys.stdout.isatty()
    last_line = [-10.0]

    def progress(elapsed: float, done: int, errors: int) -> None:
        bar = "#" * int(30 * min(1.0, elapsed / seconds))
        text = (
            f"  browser     [{bar:30}] {elapsed:4.0f}/{seconds:.0f} s"
            f"  chats {done}  errors {errors}"
        )
        if tty:  # one line redrawn in place; a log (CI) gets a line every 10 s
            sys.stdout.write(f"\r{text} ")
            sys.stdout.flush()
        elif elapsed - last_line[0] >= 10:
            last_line[0] = elapsed
            print(text, flush=True)

    return progress


def _print_report(report: dict[str, Any], query: str, agent: str) -> None:
    """The SLA table and where to look next."""
    print("\nSLA: user P95 vs server P95 per route (each metric's band in its row)\n")
    print(sla_table(report))
    print(f"\nSLA page: {query}/ui   ·   API: {query}/v1/sla, {query}/v1/requests")
    print(f"Agent metrics (Prometheus): {agent}/metrics   ·   collector's: {query}/metrics")
    print(
        "Afterwards, from the stored data: .venv/bin/parallax-collector sla --once --json "
        f"--data-dir {_shown(DEMO_DIR)}"
    )


if __name__ == "__main__":
    sys.exit(main())
