"""Start and stop the pieces of a Parallax topology on loopback, for the demo and the
end-to-end scenarios: the LLM app, the real engine (llama.cpp on the tiny model), the
delaying relay, nginx, the collector and the agent.

Each piece runs as its own process with its output in a log file; readiness is a line it
prints or an HTTP probe answering 200, with a deadline, so a piece that cannot start fails
the caller with its last log lines instead of hanging it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

VENV_BIN = Path(sys.executable).parent


def engine_argv(model: Path, port: int) -> list[str]:
    """llama-cpp-python's OpenAI-compatible server on ``model``: one request at a time (its
    model lock), and a request whose client left still runs to its end
    (``--interrupt_requests False``), as the engine tests and the demo want it."""
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(model)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192"]
    return [*argv, "--chat_format", "chatml", "--interrupt_requests", "False"]


def die_with_parent() -> None:
    """In the child: get SIGTERM when the parent dies, even by SIGKILL (a test timeout),
    so no app, proxy, agent or model worker outlives the run that started it."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class StartError(RuntimeError):
    """A piece did not become ready; the message carries the tail of its log."""


CGROUP_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/pids")


def new_cgroup(name: str) -> Path | None:
    """A fresh cgroup for processes that should look like a container of their own (the
    agent groups a server with the GPU processes of its cgroup); None where no hierarchy
    is writable (not root, a read-only cgroupfs)."""
    for root in CGROUP_ROOTS:
        if not os.path.exists(f"{root}/cgroup.procs"):
            continue
        d = Path(root) / f"{name}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        try:
            d.mkdir()
        except OSError:
            continue
        return d
    return None


def remove_cgroup(d: Path, timeout: float = 5.0) -> None:
    """Remove a cgroup once its processes have gone (rmdir fails while any is left)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            d.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)


_PORTS = random.SystemRandom()  # a test that seeds the module's random must not steer it


def free_port() -> int:
    """A loopback port free now, for a server started next, taken from below the kernel's
    ephemeral range: one from inside it can go to any outgoing connection before the server
    binds, and a connected socket blocks even an SO_REUSEADDR bind (CI lost a collector's
    start so: its query port became some client's local port while the store opened)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for _ in range(64 if low > 11000 else 0):
        port = _PORTS.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: TIME_WAIT counts as taken
            except OSError:
                continue
            return port
    with socket.socket() as s:  # an ephemeral range from 1024 up: the kernel's pick
        s.bind(("127.0.0.1", 0))
        picked: int = s.getsockname()[1]
        return picked


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback)
            status: int = r.status
            return 200 <= status < 300
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def reap(self, deadline: float) -> int | None:
        """Wait for the piece until ``deadline`` (monotonic), then SIGKILL it."""
        try:
            self.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)
        return self.popen.returncode

    def stop(self, timeout: float = 10.0) -> int | None:
        self.terminate()
        return self.reap(time.monotonic() + timeout)


# How long the pieces of a stack get, all together, to stop after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 5.0


@dataclass
class Stack:
    """A set of processes stopped together on exit (``close``)."""

    workdir: Path
    procs: list[Proc] = field(default_factory=list)
    cgroups: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Stack:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to every piece at once (in reverse start order), one deadline for all,
        then SIGKILL to what still runs. Stopped one after another, each allowed 10 s (the
        agent takes 2–5 s to detach and flush), the demo took over 30 s to stop on Ctrl-C."""
        procs = list(reversed(self.procs))
        for p in procs:
            p.terminate()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.reap(deadline)
        self.procs.clear()
        for d in self.cgroups:
            remove_cgroup(d)
        self.cgroups.clear()

    # -- generic ----------------------------------------------------------------------------
    def spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        cgroup: Path | None = None,
        unset: tuple[str, ...] = (),
    ) -> Proc:
        """Start one piece (in ``cgroup`` when given: it and its children), without the
        environment variables named in ``unset``."""
        if cgroup is not None:
            argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *argv]
        log = self.workdir / "logs" / f"{name}.log"
        f = log.open("wb")  # a fresh log per start: readiness must not match an old run
        popen = subprocess.Popen(
            argv,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset},
            start_new_session=True,  # Ctrl-C in the demo's terminal reaches only the demo
            preexec_fn=die_with_parent,  # noqa: PLW1509 (one prctl call, no locks taken)
        )
        f.close()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def wait_line(self, proc: Proc, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in proc.log.read_text(errors="replace").splitlines():
                if needle in line:
                    return line
            if not proc.alive():
                break
            time.sleep(0.05)
        raise StartError(f"{proc.name} did not print {needle!r}:\n{proc.tail()}")

    def wait_http(self, proc: Proc, url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if http_ok(url):
                return
            if not proc.alive():
                break
            time.sleep(0.1)
        raise StartError(f"{proc.name} did not answer {url}:\n{proc.tail()}")

    # -- the pieces ---------------------------------------------------------------------------
    def llm_app(self, *extra: str, name: str = "llm_app", node: bool = False, port: int = 0) -> str:
        """Start the LLM-style app (Python, or the Node.js twin) on ``port`` (0: any);
        return its base URL."""
        timing = self.workdir / f"{name}.timing.jsonl"
        if node:
            argv = ["node", str(Path(__file__).parent / "llm_app.mjs")]
        else:
            argv = [sys.executable, "-m", "demo.llm_app"]
        p = self.spawn(name, [*argv, "--port", str(port), "--timing-log", str(timing), *extra])
        return self.wait_line(p, "listening on").split()[-1]

    def engine(self, model: Path, name: str = "engine") -> tuple[Proc, str]:
        """Start llama.cpp's server on ``model`` (a GGUF: demo/tiny_model.py writes one);
        return it and its base URL at once — loading takes a second or two: wait_engine."""
        port = free_port()
        # no OTEL_SERVICE_NAME: the agent names it as people do, "llama_cpp.server"
        p = self.spawn(name, engine_argv(model, port), unset=("OTEL_SERVICE_NAME",))
        return p, f"http://127.0.0.1:{port}"

    def wait_engine(self, proc: Proc, url: str, timeout: float = 60.0) -> None:
        """Until the engine answers, then one answer of one token: llama.cpp's first
        evaluation sets itself up (1.4 s measured, against 0.2 s for the next ones), which
        is no request's wait."""
        self.wait_http(proc, f"{url}/v1/models", timeout=timeout)
        body = {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 1}
        req = urllib.request.Request(  # noqa: S310 (loopback)
            f"{url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310
                r.read()
        except (urllib.error.URLError, OSError) as e:
            raise StartError(f"{proc.name} did not answer a chat: {e}\n{proc.tail()}") from None

    def infer_app(self, cuda_dir: Path, nvml_script: Path) -> str:
        """Start the inference-like service (demo/infer_app.py) in a cgroup of its own, as
        its container would be; return its base URL."""
        cg = new_cgroup("parallax-demo-infer")
        if cg is not None:
            self.cgroups.append(cg)
        argv = [sys.executable, "-m", "demo.infer_app", "--port", "0"]
        argv += ["--cuda-lib-dir", str(cuda_dir), "--nvml-script", str(nvml_script)]
        p = self.spawn("infer_app", argv, cgroup=cg)
        return self.wait_line(p, "listening on").split()[-1]

    def relay(self, upstream_port: int, delay_ms: float, jitter_ms: float = 0.0) -> int:
        p = self.spawn(
            "relay",
            [
                sys.executable,
                "-m",
                "demo.relay",
                "--upstream",
                f"127.0.0.1:{upstream_port}",
                "--delay-ms",
                str(delay_ms),
                "--jitter-ms",
                str(jitter_ms),
            ],
        )
        line = self.wait_line(p, "relay: listening on")
        return int(line.split()[3].rsplit(":", 1)[1])

    def collector(
        self, data_dir: Path, *extra: str, env: dict[str, str] | None = None
    ) -> tuple[str, str]:
        """Start the collector on the embedded store; return (ingest URL, query URL)."""
        ingest, admin = free_port(), free_port()
        p = self.spawn(
            "collector",
            [
                str(VENV_BIN / "parallax-collector"),
                "serve",
                "--listen",
                f"127.0.0.1:{ingest}",
                "--admin-listen",
                f"127.0.0.1:{admin}",
                "--data-dir",
                str(data_dir),
                *extra,
            ],
            env=env,
        )
        self.wait_http(p, f"http://127.0.0.1:{ingest}/healthz")
        self.wait_http(p, f"http://127.0.0.1:{admin}/readyz")
        return f"http://127.0.0.1:{ingest}", f"http://127.0.0.1:{admin}"

    def agent(
        self,
        ports: list[int],
        otlp: str | None = None,
        *extra: str,
        env: dict[str, str] | None = None,
    ) -> str:
        """Start the agent on the given server ports; return its metrics URL once attached."""
        metrics = free_port()
        argv = [
            str(VENV_BIN / "parallax-agent"),
            "run",
            "--metrics-addr",
            f"127.0.0.1:{metrics}",
            "--jsonl",
            str(self.workdir / "agent.jsonl"),
        ]
        for port in ports:
            argv += ["--port", str(port)]
        if otlp:
            argv += ["--otlp", otlp]
        p = self.spawn("agent", [*argv, *extra], env=env)
        self.wait_http(p, f"http://127.0.0.1:{metrics}/readyz", timeout=120)
        return f"http://127.0.0.1:{metrics}"

    def nginx(self, upstream_port: int, buffering: bool, name: str = "nginx", port: int = 0) -> int:
        """nginx (Debian's) as a reverse proxy in front of the app, on its own config and on
        ``port`` (0: a free one); ``buffering`` toggles ``proxy_buffering``, the classic way
        to break token streams. It forwards ``traceparent`` unchanged, so the agent sees two
        hops with one parent."""
        port = port or free_port()
        d = self.workdir / name
        (d / "tmp").mkdir(parents=True, exist_ok=True)
        conf = d / "nginx.conf"
        conf.write_text(
            NGINX_CONF.format(
                dir=d, port=port, upstream=upstream_port, buffering="on" if buffering else "off"
            )
        )
        p = self.spawn(name, [NGINX, "-e", str(d / "error.log"), "-p", str(d), "-c", str(conf)])
        self.wait_http(p, f"http://127.0.0.1:{port}/favicon.ico")
        return port


NGINX = "/usr/sbin/nginx"
# Test/demo configuration only: workers run as root so they can use the private temp dirs.
NGINX_CONF = """\
user root;
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp/body;
    proxy_temp_path {dir}/tmp/proxy;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;
    upstream app {{ server 127.0.0.1:{upstream}; keepalive 16; }}
    map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            # With gzip on (as most sites have it), proxy_buffering on holds a token stream
            # until gzip's buffers fill or it ends; off flushes each upstream read at once.
            proxy_buffering {buffering};
            gzip on;
            gzip_types text/event-stream text/plain application/json;
            gzip_min_length 0;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""
