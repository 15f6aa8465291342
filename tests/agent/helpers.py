"""Shared plumbing for the agent's kernel tests: start servers and one agent, read records."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from demo.stack import free_port
from parallax_contracts import trace_context

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


class Proc:
    """A server process that prints its port on its first stdout line."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.p = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )

    def port(self, timeout: float = 15.0) -> int:
        assert self.p.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.p.stdout.readline()
            if line.strip().isdigit():
                return int(line)
            if self.p.poll() is not None:
                break
        raise RuntimeError(f"server did not start: {self.p.stderr.read() if self.p.stderr else ''}")

    def stop(self) -> None:
        """Ends the process and closes its pipes (left to the garbage collector, they
        surface as ResourceWarnings in whichever later test it runs in)."""
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        for pipe in (self.p.stdout, self.p.stderr):
            if pipe is not None:
                pipe.close()

    @classmethod
    def with_pid(
        cls, argv: list[str], pid: int, env: dict[str, str] | None = None, tries: int = 50
    ) -> Proc | None:
        """A process that gets ``pid`` (ns_last_pid = pid − 1, then fork): the reuse of a
        traced process's pid by an unrelated one. None when another fork kept taking it.
        Root; a test using it is marked ``serial`` (another worker's forks race with it)."""
        for _ in range(tries):
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
            p = cls(argv, env)
            if p.p.pid == pid:
                return p
            p.stop()
        return None


def wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


class Agent:
    def __init__(
        self,
        tmp: Path,
        ports: list[int],
        extra: list[str] | None = None,
        wrapper: list[str] | None = None,  # e.g. setpriv with fewer capabilities
        env: dict[str, str] | None = None,  # added to this process's environment
    ) -> None:
        self.jsonl = tmp / "agent.jsonl"
        self.err = tmp / "agent.err"
        self.metrics_port = free_port()
        argv = [
            *(wrapper or []),
            PY,
            "-m",
            "agent.cli",
            "run",
            "--jsonl",
            str(self.jsonl),
            "--metrics-addr",
            f"127.0.0.1:{self.metrics_port}",
        ]
        for p in ports:
            argv += ["--port", str(p)]
        argv += extra or []
        with open(self.err, "w") as err:
            self.p = subprocess.Popen(
                argv,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **env} if env else None,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "attached" in self.err.read_text():
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"agent did not attach: {self.err.read_text()}")

    def records(self) -> list[dict[str, Any]]:
        return jsonl(self.jsonl)

    def wait_for(
        self, pred: Callable[[dict[str, Any]], bool], count: int = 1, timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            found = [r for r in self.records() if pred(r)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def metrics(self) -> dict[str, float]:
        """The agent's /metrics as {'name{labels}': value}."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def wait_metric(self, name: str, pred: Callable[[float], bool], timeout: float = 5.0) -> float:
        """Poll one sample until ``pred`` holds (NaN while it is absent); its last value."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.metrics().get(name, float("nan"))
            if pred(v) or time.monotonic() > deadline:
                return v
            time.sleep(0.2)

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                return self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                return self.p.wait(5)
        return int(self.p.returncode)


def perf_links(agent: Agent) -> list[dict[str, Any]]:
    """The agent's tracepoint and probe attachments, as bpftool lists them."""
    out = subprocess.run(
        ["bpftool", "-j", "perf", "list"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return [e for e in json.loads(out) if e.get("pid") == agent.p.pid]


def agent_progs(agent: Agent) -> list[dict[str, Any]]:
    """The BPF programs the agent holds (bpftool's view: name, type, run stats)."""
    ids = set()
    for fd in os.listdir(f"/proc/{agent.p.pid}/fdinfo"):
        try:
            text = Path(f"/proc/{agent.p.pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        ids |= {int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("prog_id:")}
    out = subprocess.run(
        ["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return [p for p in json.loads(out) if p.get("id") in ids]


def uprobes(agent: Agent) -> list[tuple[str, str]]:
    """The agent's uprobes and uretprobes: (kind, its program's name as bpftool gives it,
    15 characters at most) — libc's accept probes are px_uret_accept, the TLS ones px_ssl_*."""
    names = {p["id"]: p.get("name", "") for p in agent_progs(agent)}
    return [
        (e["fd_type"], names.get(e.get("prog_id"), ""))
        for e in perf_links(agent)
        if e["fd_type"] in ("uprobe", "uretprobe")
    ]


def tracepoints(agent: Agent) -> set[str]:
    """Names of the tracepoints (classic and raw) the agent has attached."""
    return {str(e.get("tracepoint", "")) for e in perf_links(agent) if "tracepoint" in e["fd_type"]}


def wait_log(agent: Agent, text: str, timeout: float = 10.0) -> None:
    """Until the agent's stderr says ``text`` (fails the test after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while text not in agent.err.read_text():
        assert time.monotonic() < deadline, agent.err.read_text()
        time.sleep(0.1)


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file another process appends to (the agent's records, a
    server's timing log): a batch is one write, but a read may meet it half-written, so
    whole lines only."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]
    return [json.loads(x) for x in lines if x.strip()]


timing_log = jsonl


def server_record(
    log: Path, match: str | Callable[[dict[str, Any]], bool], timeout: float = 5.0
) -> dict[str, Any]:
    """The first record of a test server's timing log that ``match`` accepts (a traceparent
    header value, or a predicate), waiting for the server to write it."""
    pred = match if callable(match) else (lambda r: r.get("traceparent") == match)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in timing_log(log):
            if pred(r):
                return r
        time.sleep(0.05)
    raise AssertionError(f"no server timing record in {log}")


def one_record(agent: Agent, ctx: trace_context.TraceContext) -> dict[str, Any]:
    """The agent's one record of this trace."""
    recs = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
    assert len(recs) == 1, recs
    return recs[0]


def http_request(
    port: int, raw: bytes, sock: socket.socket | None = None, timeout: float = 5.0
) -> bytes:
    """Send raw bytes and read one response (Content-Length, chunked or close framed)."""
    if sock is None:
        with socket.create_connection(("127.0.0.1", port), timeout) as s:
            return http_request(port, raw, s, timeout)
    sock.settimeout(timeout)
    sock.sendall(raw)
    return read_response(sock)


def get_head(path: str, tp: str | None = None, extra: str = "") -> bytes:
    """A GET request head, with a traceparent header when ``tp`` is given."""
    h = f"GET {path} HTTP/1.1\r\nHost: t\r\n"
    if tp:
        h += f"traceparent: {tp}\r\n"
    return (h + extra + "\r\n").encode()


def gaps(xs: list[int]) -> list[int]:
    return [b - a for a, b in itertools.pairwise(xs)]


def check_node_timing(r: dict[str, Any], srv: dict[str, Any], tol_us: float) -> None:
    """A record of tests/agent/servers/node_server.mjs against the server's own clock. Node
    sends the head together with the first body bytes: t2 = t_tok; a /stream's every chunk."""
    writes = srv["t_writes_ns"]
    assert abs(r["ttfb_us"] - (writes[0] - srv["t_read_ns"]) / 1000) <= tol_us, (r, srv)
    assert r["ttft_us"] == r["ttfb_us"]
    if r["path"] == "/stream":
        assert r["chunks"] == len(writes) == 5
        for got, want in zip(gaps(r["chunk_offsets_us"]), gaps(writes), strict=True):
            assert abs(got - want / 1000) <= tol_us


def leaks(exits: dict[str, bytes], secrets: dict[str, str]) -> list[tuple[str, str]]:
    """(exit, secret name) for each secret found in an exit's bytes."""
    return [(w, k) for w, text in exits.items() for k, v in secrets.items() if v.encode() in text]


def tls_cert(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made now (``openssl req``; the
    ``cryptography`` package is not installed here). Skips without openssl."""
    if not shutil.which("openssl"):
        pytest.skip("needs openssl to make a certificate")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]
    ip = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        ["openssl", "req", "-x509", *ec, *ip, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


def tls_connect(port: int, timeout: float = 5.0) -> ssl.SSLSocket:
    """A TLS client connection to 127.0.0.1:port (the test servers' self-signed certificate
    is not verified), handshake done."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout))


def read_response(s: socket.socket) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            return buf
        buf += d
    head, _, body = buf.partition(b"\r\n\r\n")
    lower = head.lower()
    if b"content-length:" in lower:
        n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < n:
            d = s.recv(65536)
            if not d:
                break
            body += d
    elif b"chunked" in lower:
        while not body.endswith(b"0\r\n\r\n"):
            d = s.recv(65536)
            if not d:
                break
            body += d
    else:
        while d := s.recv(65536):
            body += d
    return head + b"\r\n\r\n" + body


class OtlpReceiver:
    """An OTLP/HTTP endpoint on loopback that keeps every POST as (path, body) — the body
    decompressed, so tests search the protobuf bytes — and answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.posts: list[tuple[str, bytes]] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                posts.append((self.path, body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._srv.server_address[1]}"

    def traces(self) -> list[bytes]:
        """The bodies POSTed to /v1/traces (ExportTraceServiceRequest protobuf)."""
        return [b for p, b in self.posts if p == "/v1/traces"]

    def spans(self) -> list[Any]:
        """Every span received (opentelemetry.proto Span messages)."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        return [
            sp
            for body in self.traces()
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans
            for ss in rs.scope_spans
            for sp in ss.spans
        ]

    def metrics(self) -> dict[str, list[Any]]:
        """Every metric received, by name, in the order the exports came (the last is the
        latest: cumulative counters and gauges as of the agent's exit)."""
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )

        out: dict[str, list[Any]] = {}
        for p, body in self.posts:
            if p != "/v1/metrics":
                continue
            for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out.setdefault(m.name, []).append(m)
        return out

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()


def attempts(check: Callable[[], None], n: int = 3) -> None:
    """Run a timing comparison up to n times. The test servers read their clocks in user
    space, after the syscall returns: on a loaded machine (2 cores shared by parallel jobs) a
    preemption between the two can exceed the 1 ms tolerance. A systematic error in the
    agent fails every attempt; scheduler noise in the server's clock does not."""
    errors: list[str] = []
    for _ in range(n):
        try:
            check()
            return
        except AssertionError as e:
            errors.append((str(e).splitlines() or [repr(e)])[0][:300])
    raise AssertionError(f"all {n} attempts failed: {errors}")


# A client inside a server's network namespace (netns_client): one keep-alive connection;
# each stdin line is a request path and a traceparent, answered with the status line.
NETNS_CLIENT = r"""
import socket, sys
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port), 5)
for line in sys.stdin:
    path, tp = line.split()
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\ntraceparent: {tp}\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, _, body = buf.partition(b"\r\n\r\n")
    n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < n:
        body += s.recv(65536)
    print(head.split(b"\r\n")[0].decode(), flush=True)
"""


def netns_server(log: Path) -> tuple[Proc, int]:
    """py_server in a network namespace of its own, as a pod's, and its port (skips
    without the tools)."""
    tools = ("unshare", "nsenter", "ip")
    if os.geteuid() != 0 or not all(shutil.which(t) for t in tools):
        pytest.skip("needs root, unshare, nsenter and ip to make a network namespace")
    srv = Proc(
        [
            "unshare",
            "--net",
            "sh",
            "-c",
            f"ip link set lo up && exec {PY} -m tests.agent.servers.py_server --timing-log {log}",
        ]
    )
    port = srv.port()  # started: in its own namespace from here on
    assert os.stat(f"/proc/{srv.p.pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino
    return srv, port


def netns_client(pid: int, port: int) -> subprocess.Popen[str]:
    """A keep-alive client in the network namespace of process ``pid``."""
    return subprocess.Popen(
        ["nsenter", f"--net=/proc/{pid}/ns/net", PY, "-c", NETNS_CLIENT, str(port)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def netns_ask(client: subprocess.Popen[str], path: str) -> str:
    """One request on that client's connection; its trace id."""
    assert client.stdin is not None and client.stdout is not None
    ctx = trace_context.generate()
    client.stdin.write(f"{path} {ctx.header()}\n")
    client.stdin.flush()
    assert " 200 " in client.stdout.readline()
    return ctx.trace_id


class ServerSet:
    """Test servers by name, each with its timing log (``@LOG`` in its argv), a certificate
    for the TLS ones, an OTLP receiver, and the agent a module's tests share."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cert, self.key = tls_cert(tmp)
        self.procs: dict[str, Proc] = {}
        self.ports: dict[str, int] = {}
        self.logs: dict[str, Path] = {}
        self.agent: Agent
        self.rx = OtlpReceiver()

    def start(self, name: str, argv: list[str]) -> None:
        self.logs[name] = self.tmp / f"{name}.jsonl"
        p = Proc([a.replace("@LOG", str(self.logs[name])) for a in argv])
        self.procs[name] = p
        self.ports[name] = p.port()

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()
        self.rx.close()


def fresh_value(module: str, name: str, env: dict[str, str]) -> str:
    """``module.name`` as a fresh Python process with ``env`` added has it: what a compiled
    fast path's loader chose there (each loader runs once, at import)."""
    code = f"import {module} as m; print(m.{name})"
    return subprocess.run(
        [PY, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, check=True
    ).stdout


def build_compiled(source: Path, module: str) -> None:
    """Build a compiled fast path (parallax_contracts.compiled) for its tests: skipped
    without a C toolchain (the agent then runs the reference), failed where the build fails
    or where an older build of it was imported already (a shared object cannot be loaded
    again in one process: the tests would run the old one)."""
    from parallax_contracts import compiled

    missing = compiled.toolchain_missing()
    if missing is not None:
        pytest.skip(missing)
    loaded = module in sys.modules
    ok, msg = compiled.build(source)
    assert ok, msg
    if loaded and msg.startswith("built"):
        pytest.fail(f"{msg} after the old build was imported: run the tests again")
