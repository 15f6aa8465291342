"""TLS through library uprobes (agent/kernel/tls_probes.py, bpf/agent/tls.h, tls_uprobes.h):
real servers terminating TLS themselves on 127.0.0.1, with a certificate made at test time,
timed against their own CLOCK_MONOTONIC as the HTTP/1 tests do (tests/agent/test_timing.py).

* uvicorn ``--ssl-*`` (demo/llm_app.py under asyncio's SSL transport: a memory BIO, the
  socket read by the event loop just before SSL_read_ex decrypts it);
* Node ``https`` (OpenSSL linked into the node binary, probed there);
* Python's http.server over ``ssl`` (a socket BIO: SSL_read_ex reads the socket itself),
  and a raw TLS server that waits before reading (the receive-queue wait).

One agent for the module, with an OTLP receiver (the privacy test reads every exit),
started after the servers: the probes go on at its start, on every server that maps
OpenSSL. Two of them (``first_uv``, ``first_py``) get no connection before their test,
which checks that their very first one is read.
"""

from __future__ import annotations

import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.stack import free_port
from parallax_contracts import trace_context
from tests.agent.helpers import (
    PY,
    Agent,
    Proc,
    ServerSet,
    attempts,
    check_node_timing,
    gaps,
    get_head,
    http_request,
    leaks,
    one_record,
    server_record,
    timing_log,
    tls_connect,
    uprobes,
    wait_log,
)

pytestmark = pytest.mark.ebpf
TOL_US = 1000
NO_BUDGET = ["--cpu-budget", "0"]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerSet]:
    e = ServerSet(tmp_path_factory.mktemp("tls"))
    cert, key = str(e.cert), str(e.key)
    tls = ["--timing-log", "@LOG", "--tls-cert", cert, "--tls-key", key]
    try:
        uv = ["--timing-log", "@LOG", "--cert", cert, "--key", key]
        e.start("uv", [PY, "-m", "tests.agent.servers.tls_app", *uv])
        e.start("py", [PY, "-m", "tests.agent.servers.py_server", *tls])
        e.start("rcv", [PY, "-m", "tests.agent.servers.raw_server", "--read-delay-ms", "300", *tls])
        if shutil.which("node"):
            e.start("node", ["node", "tests/agent/servers/node_server.mjs", "0", "@LOG", cert, key])
        # no connection before their test: their first one must be read (probes at start)
        e.start("first_uv", [PY, "-m", "tests.agent.servers.tls_app", *uv])
        e.start("first_py", [PY, "-m", "tests.agent.servers.py_server", *tls])
        # not traced: the upstream of the servers' own HTTPS calls
        e.start("up", [PY, "-m", "tests.agent.servers.py_server", *tls])
        traced = [p for n, p in e.ports.items() if n != "up"]
        # no CPU budget: the probes' attach (~0.1 s of CPU for node's symbols) must not make
        # the agent sample the requests the tests compare (its sampling: test_budget.py)
        e.agent = Agent(e.tmp, traced, ["--otlp", e.rx.url, *NO_BUDGET])
        for name in ("uv", "py", "rcv", "node"):
            if name in e.ports:
                warm_up(e, e.agent, name)
    except Exception:
        e.stop()
        raise
    yield e
    rc = e.agent.stop()
    stray = [r for r in e.agent.records() if r["local_port"] not in e.ports.values()]
    e.stop()
    assert not stray, stray[:3]
    assert rc == 0, e.agent.err.read_text()[-2000:]


def warm_up(e: ServerSet, agent: Agent, name: str) -> None:
    """A first TLS connection to server ``name``: the agent attaches the TLS probes to
    its process then (agent/kernel/tls_probes.py); wait for them. Also imports and
    first-request paths, so that the servers' clocks measure steady state as the kernel does."""
    path = "/v1/complete?first_token_ms=1&tokens=1" if name == "uv" else "/plain"
    with tls_connect(e.ports[name]) as c:
        http_request(0, get_head(path), sock=c)
    wait_log(agent, f"TLS: probes on pid {e.procs[name].p.pid} ")


def test_probes_where_the_process_has_openssl(env: ServerSet) -> None:
    """Python maps the system's libssl.so.3; NodeSource's node links OpenSSL statically and
    exports its symbols: probed in the executable. The attach line says when probes go:
    from the agent's start, on every traced server that maps OpenSSL."""
    line = next(ln for ln in env.agent.err.read_text().splitlines() if "attached" in ln)
    assert "TLS: SSL_read/SSL_write probes on each traced server that maps OpenSSL, from" in line
    err = env.agent.err.read_text()
    before = ", before its first TLS connection"
    assert f"TLS: probes on pid {env.procs['uv'].p.pid} in libssl.so.3 " in err
    for name in ("uv", "py", "first_uv", "first_py"):
        pid = env.procs[name].p.pid
        assert any(f"TLS: probes on pid {pid} " in ln and before in ln for ln in err.splitlines())
    if "node" in env.ports:
        assert f"TLS: probes on pid {env.procs['node'].p.pid} in node " in err


def test_a_server_started_before_the_agent_is_read_from_its_first_connection(
    env: ServerSet,
) -> None:
    """Issue 29: a TLS server running before the agent starts, ten requests each on a new
    connection, the very first of the server's life included: ten records with their trace
    ids — asyncio's memory BIO (uvicorn) and a socket BIO (http.server)."""
    for name, path in (
        ("first_uv", "/v1/complete?first_token_ms=1&tokens=1"),
        ("first_py", "/plain"),
    ):
        port = env.ports[name]
        ctxs = [trace_context.generate() for _ in range(10)]
        for ctx in ctxs:
            with tls_connect(port) as c:
                resp = http_request(0, get_head(path, ctx.header()), sock=c)
            assert resp.startswith(b"HTTP/1.1 200"), resp[:100]
        ids = {c.trace_id for c in ctxs}
        recs = env.agent.wait_for(lambda r, ids=ids: r["trace_id"] in ids, count=10)  # type: ignore[misc]
        assert sorted(r["trace_id"] for r in recs) == sorted(ids), (name, len(recs))
        for r in recs:
            assert r["tls"] is True and r["local_port"] == port and r["status"] == 200, r
            assert r["path"] == path.partition("?")[0] and r["bytes_in"] > 0, r


def test_a_process_serving_no_tls_loses_its_probes(env: ServerSet, tmp_path: Path) -> None:
    """A plain-HTTP server that maps libssl and makes HTTPS calls of its own (an app behind
    a TLS-terminating ingress calling its model API) gets the TLS probes at the agent's start
    (it may serve TLS: nothing tells before its first connection) and loses them at its
    first connection, plaintext: each probe hit would cost it a trap. Its requests are
    recorded; then only libc's accept probes are attached."""
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t")])
    port = srv.port()
    agent = Agent(tmp_path, [port], NO_BUDGET)
    try:
        maps = Path(f"/proc/{srv.p.pid}/maps").read_text()
        assert "libssl.so.3" in maps  # it does map libssl
        wait_log(agent, f"TLS: probes on pid {srv.p.pid} in libssl.so.3 ")
        for _ in range(2):
            ctx = trace_context.generate()
            req = get_head(
                f"/fetch?port={env.ports['up']}&tls=1", ctx.header(), "Connection: close\r\n"
            )
            assert http_request(port, req).startswith(b"HTTP/1.1 200")
            r = one_record(agent, ctx)
            assert r["path"] == "/fetch" and r["tls"] is False and r["bytes_in"] == len(req)
            wait_log(agent, f"TLS: probes off pid {srv.p.pid} (libssl.so.3): its first connection")
        deadline = time.monotonic() + 10  # (a probe's close waits for an RCU grace period)
        while [p for p in uprobes(agent) if p[1] != "px_uret_accept"]:
            assert time.monotonic() < deadline, uprobes(agent)
            time.sleep(0.1)
        assert uprobes(agent) == [("uretprobe", "px_uret_accept")] * 2  # accept, accept4
    finally:
        assert agent.stop() == 0
        srv.stop()


def test_nothing_listening_on_the_ports_probes_no_one(env: ServerSet, tmp_path: Path) -> None:
    """--port with no listener yet (the agent started before its app, or on a node the app
    is not scheduled on): no process is probed, neither the other servers on the node
    (``env``'s map libssl and libc) nor the agent itself (its /metrics listens), until a
    server takes the port; then that one is. (Every listener on the node got the accept
    and TLS probes at start before: a trap per accept and per TLS call for processes the
    agent does not trace.)"""
    port = free_port()
    agent = Agent(tmp_path, [port], NO_BUDGET)
    srv = None
    try:
        time.sleep(1.5)  # a rescan or more
        assert uprobes(agent) == []
        assert "TLS: probes on pid" not in agent.err.read_text()
        log = str(tmp_path / "t")
        srv = Proc(
            [PY, "-m", "tests.agent.servers.py_server", "--port", str(port), "--timing-log", log]
        )
        assert srv.port() == port
        wait_log(agent, f"TLS: probes on pid {srv.p.pid} in libssl.so.3 ")
        assert ("uretprobe", "px_uret_accept") in uprobes(agent)
        probed = set(re.findall(r"TLS: probes on pid (\d+) ", agent.err.read_text()))
        assert probed == {str(srv.p.pid)}, probed
    finally:
        assert agent.stop() == 0
        if srv is not None:
            srv.stop()


def test_a_tls_server_started_after_the_agent_is_read(env: ServerSet, tmp_path: Path) -> None:
    """A TLS server that takes a traced port after the agent started (found by a rescan,
    probed then): its requests are recorded with their plaintext. The rescan marked the
    process traced after its probes' bit was set, and overwrote that bit: none was."""
    port = free_port()
    agent = Agent(tmp_path, [port], NO_BUDGET)
    tls = ["--tls-cert", str(env.cert), "--tls-key", str(env.key)]
    log = str(tmp_path / "t")
    srv = Proc(
        [PY, "-m", "tests.agent.servers.py_server", "--port", str(port), "--timing-log", log, *tls]
    )
    try:
        assert srv.port() == port
        wait_log(agent, f"TLS: probes on pid {srv.p.pid} in libssl.so.3 ")
        ctxs = [trace_context.generate() for _ in range(3)]
        for ctx in ctxs:
            with tls_connect(port) as c:
                resp = http_request(0, get_head("/plain", ctx.header()), sock=c)
            assert resp.startswith(b"HTTP/1.1 200"), resp[:100]
        ids = {c.trace_id for c in ctxs}
        recs = agent.wait_for(lambda r: r["trace_id"] in ids, count=3)
        assert sorted(r["trace_id"] for r in recs) == sorted(ids), agent.err.read_text()
        assert all(r["tls"] is True and r["path"] == "/plain" for r in recs), recs
    finally:
        assert agent.stop() == 0
        srv.stop()


def test_uvicorn_sse_over_tls(env: ServerSet) -> None:
    """asyncio's memory BIO: TTFB, TTFT and every token gap within 1 ms of the app's clock;
    the traceparent read from the decrypted head; the plaintext's byte count."""

    def check() -> None:
        ctx = trace_context.generate()
        req = get_head("/v1/stream", ctx.header(), "Accept: text/event-stream\r\n")
        with tls_connect(env.ports["uv"]) as c:
            resp = http_request(0, req, sock=c)
        assert b"text/event-stream" in resp and resp.endswith(b"0\r\n\r\n")
        r = one_record(env.agent, ctx)
        srv = server_record(env.logs["uv"], ctx.header())
        assert r["tls"] is True and r["path"] == "/v1/stream" and r["status"] == 200
        assert r["parent_span_id"] == ctx.span_id
        assert r["bytes_in"] == len(req)  # plaintext: not the TLS records' size
        # uvicorn writes the head, then each token, then the terminator: plaintext bytes
        assert r["bytes_out"] == len(resp), (r["bytes_out"], len(resp))
        assert abs(r["ttfb_us"] - (srv["t_headers_ns"] - srv["t_start_ns"]) / 1000) <= TOL_US
        writes = srv["t_writes_ns"]
        assert abs(r["ttft_us"] - (writes[0] - srv["t_start_ns"]) / 1000) <= TOL_US
        assert r["chunks"] >= len(writes) == 9  # 8 tokens and the done event
        for g, w in zip(gaps(r["chunk_offsets_us"][: len(writes)]), gaps(writes), strict=True):
            assert abs(g - w / 1000) <= TOL_US
        assert r["ttft_us"] >= 55_000  # the 60 ms first-token wait shows
        assert r["recv_queue_us"] is not None and r["arrival_unix_ns"]

    attempts(check)


def test_uvicorn_keepalive_on_one_tls_connection(env: ServerSet) -> None:
    """Three requests on one TLS connection: three records in order, each TTFB on the
    app's clock; only the first carries the accept-queue wait."""

    def check() -> None:
        ctxs = [trace_context.generate() for _ in range(3)]
        with tls_connect(env.ports["uv"]) as c:
            for ctx in ctxs:
                q = "/v1/complete?first_token_ms=5&token_gap_ms=1&tokens=2"
                assert http_request(0, get_head(q, ctx.header()), sock=c).startswith(
                    b"HTTP/1.1 200"
                )
        recs = [one_record(env.agent, ctx) for ctx in ctxs]
        assert len({(r["peer_port"], r["local_port"]) for r in recs}) == 1  # one connection
        for r, ctx in zip(recs, ctxs, strict=True):
            srv = server_record(env.logs["uv"], ctx.header())
            want = (srv["t_headers_ns"] - srv["t_start_ns"]) / 1000
            assert abs(r["ttfb_us"] - want) <= TOL_US, (r, srv)
            assert r["ttfb_us"] >= 5_000 and r["tls"] is True
        assert recs[0]["accept_queue_us"] is not None
        assert recs[1]["accept_queue_us"] is None and recs[2]["accept_queue_us"] is None
        assert recs[0]["start_unix_ns"] < recs[1]["start_unix_ns"] < recs[2]["start_unix_ns"]

    attempts(check)


def test_node_https_plain_and_stream_keepalive(env: ServerSet) -> None:
    """Node's statically linked OpenSSL: head and first body bytes in one SSL_write (t2 =
    t_tok), every chunk on the server's clock."""
    if "node" not in env.ports:
        pytest.skip("node not installed")

    def check() -> None:
        port = env.ports["node"]
        a, b = trace_context.generate(), trace_context.generate()
        with tls_connect(port) as c:
            http_request(0, get_head("/plain?n=300", a.header()), sock=c)
            http_request(0, get_head("/stream?n=5&gap_ms=30", b.header()), sock=c)
        for ctx, path in ((a, "/plain"), (b, "/stream")):
            r = one_record(env.agent, ctx)
            assert r["path"] == path and r["comm"] == "node" and r["tls"] is True
            check_node_timing(r, server_record(env.logs["node"], ctx.header()), TOL_US)

    attempts(check)


def test_python_socket_bio_stream_and_keepalive(env: ServerSet) -> None:
    """Python's http.server over ssl: SSL_read_ex and SSL_write_ex read and write the socket
    themselves (the link made inside the call); a chunked stream and a second request."""

    def check() -> None:
        port = env.ports["py"]
        a, b = trace_context.generate(), trace_context.generate()
        with tls_connect(port) as c:
            resp = http_request(0, get_head("/stream?n=6&gap_ms=40", a.header()), sock=c)
            assert resp.endswith(b"0\r\n\r\n")
            http_request(0, get_head("/plain?n=100", b.header()), sock=c)
        r = one_record(env.agent, a)
        srv = server_record(env.logs["py"], a.header())
        t_read, writes = srv["t_read_ns"], srv["t_writes_ns"]
        assert r["tls"] is True and r["comm"].startswith("python")
        assert abs(r["ttfb_us"] - (writes[0] - t_read) / 1000) <= TOL_US
        body = writes[1:]  # the head write carries no body here
        assert r["chunks"] == len(body) == 6
        assert abs(r["ttft_us"] - (body[0] - t_read) / 1000) <= TOL_US
        for got, want in zip(gaps(r["chunk_offsets_us"]), gaps(body), strict=True):
            assert abs(got - want / 1000) <= TOL_US
        r2 = one_record(env.agent, b)
        srv2 = server_record(env.logs["py"], b.header())
        assert abs(r2["ttfb_us"] - (srv2["t_writes_ns"][0] - srv2["t_read_ns"]) / 1000) <= TOL_US
        assert r2["bytes_out"] > 100 and r2["accept_queue_us"] is None

    attempts(check)


def test_receive_queue_wait_under_tls(env: ServerSet) -> None:
    """The socket facts stay the socket hooks': a server that waits 300 ms after its
    handshake before reading shows it as receive-queue wait, not in TTFB."""

    def check() -> None:
        port = env.ports["rcv"]
        path = "/rcv-" + trace_context.new_span_id()
        with tls_connect(port) as c:
            assert http_request(0, get_head(path), sock=c).startswith(b"HTTP/1.1 200")
        [r] = env.agent.wait_for(lambda r: r["local_port"] == port and r["path"] == path)
        assert r["recv_queue_us"] >= 250_000, r
        assert r["ttfb_us"] < 50_000 and r["tls"] is True
        srv = next(x for x in timing_log(env.logs["rcv"]) if x["path"] == path)
        assert abs(r["ttfb_us"] - (srv["t_writes_ns"][0] - srv["t_read_ns"]) / 1000) <= TOL_US
        assert r["accept_queue_us"] is not None

    attempts(check)


def test_the_servers_own_https_calls_are_not_theirs_to_serve(env: ServerSet) -> None:
    """A traced server that is itself a TLS client (its LLM backend over HTTPS): asyncio's
    memory BIO on the server's own event-loop thread, and a socket BIO in a handler thread.
    The request served is recorded with its own bytes only; nothing of the call made."""
    up = env.ports["up"]
    for name, path in (("uv", f"/upstream?port={up}"), ("py", f"/fetch?port={up}&tls=1")):
        ctx = trace_context.generate()
        req = get_head(path, ctx.header())
        with tls_connect(env.ports[name]) as c:
            resp = http_request(0, req, sock=c)
        assert resp.startswith(b"HTTP/1.1 200"), resp[:200]
        recs = env.agent.wait_for(lambda r, c=ctx: r["trace_id"] == c.trace_id)  # type: ignore[misc]
        assert len(recs) == 1, (name, recs, env.agent.records()[-3:])
        r = recs[0]
        assert r["path"] == path.partition("?")[0] and r["status"] == 200
        # the upstream request (a write) and its response (a read) joined no exchange
        assert r["bytes_in"] == len(req) and r["bytes_out"] == len(resp), (r, len(resp))
        assert r["chunks"] == 1
    time.sleep(0.3)
    mine = [r for r in env.agent.records() if r["path"] == "/plain" and r["peer_port"] == up]
    assert not mine, mine


def test_sampling_decides_on_the_plaintext(env: ServerSet, tmp_path: Path) -> None:
    """Per-request sampling reads the traceparent from the decrypted head: at a fixed 50 %
    the trace ids whose random bits are low are dropped and the high ones kept, all of
    them (a decision on random numbers would mix them)."""
    agent = Agent(tmp_path, [env.ports["uv"]], ["--sample-fixed", "0.5"])
    try:
        warm_up(env, agent, "uv")
        port = env.ports["uv"]
        seen = f'parallax_agent_requests_seen_total{{port="{port}"}}'
        seen0 = agent.metrics().get(seen, 0.0)  # (the warm-up's, if its probes came first)
        # the random bits the kernel reads are hex digits 18-25 of the trace id (sample.h)
        tc = trace_context.TraceContext
        lo = [tc(f"{i:02x}" + "0" * 16 + f"{i:014x}", "1" * 16) for i in range(1, 7)]
        hi = [tc(f"{i:02x}" + "0" * 16 + "f" * 14, "1" * 16) for i in range(1, 7)]
        with tls_connect(env.ports["uv"]) as c:
            for ctx in [*lo, *hi]:
                q = "/v1/complete?first_token_ms=1&tokens=1"
                assert http_request(0, get_head(q, ctx.header()), sock=c).startswith(b"HTTP/1.1")
        ids = {c.trace_id for c in [*lo, *hi]}
        agent.wait_for(lambda r: r["trace_id"] in ids, len(hi))
        time.sleep(0.5)  # (a dropped one would have come by now)
        got = [r for r in agent.records() if r["trace_id"] in ids]
        assert sorted(r["trace_id"] for r in got) == sorted(c.trace_id for c in hi)
        assert all(r["sample_th"] != "0" for r in got)
        # every request counted, sampled or not
        assert agent.wait_metric(seen, lambda v: v >= seen0 + 12) == seen0 + 12
    finally:
        assert agent.stop() == 0


def test_syscall_hooks_path(env: ServerSet, tmp_path: Path) -> None:
    """The fallback hooks (syscall tracepoints) note the sockets for the SSL calls too."""
    agent = Agent(
        tmp_path, [env.ports["uv"], env.ports["py"]], ["--io-hooks", "syscalls", *NO_BUDGET]
    )
    try:
        warm_up(env, agent, "uv")
        warm_up(env, agent, "py")
        for name, path in (("uv", "/v1/complete?first_token_ms=1&tokens=1"), ("py", "/plain")):
            ctxs = [trace_context.generate() for _ in range(2)]
            with tls_connect(env.ports[name]) as c:
                for ctx in ctxs:
                    http_request(0, get_head(path, ctx.header()), sock=c)
            for ctx in ctxs:
                [r] = agent.wait_for(lambda r, c=ctx: r["trace_id"] == c.trace_id)  # type: ignore[misc]
                assert r["tls"] is True and r["status"] == 200
        assert "syscall" in agent.err.read_text()
    finally:
        assert agent.stop() == 0


def test_without_probes_tls_is_counted_not_guessed(env: ServerSet, tmp_path: Path) -> None:
    """--tls off (as for Go's crypto/tls or a stripped static OpenSSL): no record, no
    ciphertext in the cutter; the connection counted per executable, and as unparsed once
    it closed without a request seen."""
    agent = Agent(tmp_path, [env.ports["py"]], ["--tls", "off", *NO_BUDGET])
    try:
        line = next(ln for ln in agent.err.read_text().splitlines() if "attached" in ln)
        assert "TLS: off (--tls off)" in line, line
        ctx = trace_context.generate()
        with tls_connect(env.ports["py"]) as c:
            assert http_request(0, get_head("/plain", ctx.header()), sock=c).startswith(b"HTTP/1.1")
        comm = Path(f"/proc/{env.procs['py'].p.pid}/comm").read_text().strip()
        name = f'parallax_agent_tls_unprobed_total{{comm="{comm}"}}'
        assert agent.wait_metric(name, lambda v: v >= 1) == 1
        port = env.ports["py"]
        unparsed = f'parallax_agent_unparsed_connections_total{{port="{port}"}}'
        assert agent.wait_metric(unparsed, lambda v: v >= 1) == 1
        assert "serves TLS without probes" in agent.err.read_text()
        assert not [r for r in agent.records() if r["trace_id"] == ctx.trace_id]
    finally:
        assert agent.stop() == 0


def test_privacy_on_tls(env: ServerSet) -> None:
    """Decrypted bytes leave the agent only as the documented fields: the cookie,
    authorization, other headers, body, query and path parameters of a TLS request are in
    none of JSONL, stderr, /metrics and the OTLP export, while its span arrives; and no
    ciphertext reached the cutter (the connection not counted as unparsed)."""
    uid = trace_context.new_span_id()
    secrets = {k: f"secret-{k}-{uid}" for k in ("cookie", "auth", "body", "query", "param", "hdr")}
    ctx = trace_context.generate()
    path = f"/v1/chat-{uid}"
    body = f'{{"prompt": "{secrets["body"]}"}}'.encode()
    target = f"{path};jsessionid={secrets['param']}?{secrets['query']}&traceparent={ctx.header()}"
    head = (
        f"POST {target} HTTP/1.1\r\nHost: t\r\nCookie: session={secrets['cookie']}\r\n"
        f"Authorization: Bearer {secrets['auth']}\r\nX-Api-Key: {secrets['hdr']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    unparsed = f'parallax_agent_unparsed_connections_total{{port="{env.ports["uv"]}"}}'
    before = env.agent.metrics().get(unparsed, 0.0)
    with tls_connect(env.ports["uv"]) as c:
        assert http_request(0, head + body, sock=c).startswith(b"HTTP/1.1 404")
    r = one_record(env.agent, ctx)
    assert r["path"] == path and r["method"] == "POST" and r["tls"] is True
    assert r["bytes_in"] == len(head) + len(body)
    deadline = time.monotonic() + 10
    while not any(path.encode() in b for b in env.rx.traces()) and time.monotonic() < deadline:
        time.sleep(0.1)
    otlp = b"".join(env.rx.traces())
    assert path.encode() in otlp and bytes.fromhex(ctx.trace_id) in otlp
    url = f"http://127.0.0.1:{env.agent.metrics_port}/metrics"
    metrics = urllib.request.urlopen(url, timeout=5).read()
    exits = {
        "jsonl": env.agent.jsonl.read_bytes(),
        "stderr": env.agent.err.read_bytes(),
        "metrics": metrics,
        "otlp": otlp,
    }
    found = leaks(exits, secrets)
    assert not found, found
    # ciphertext in the cutter would have made the connection count as unparsed
    assert env.agent.metrics().get(unparsed, 0.0) == before
    assert b"parallax_agent_tls_unprobed_total{" not in metrics
