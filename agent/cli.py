"""Command line of the agent: ``parallax-agent {doctor,run}``."""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

DESCRIPTION = """\
Parallax agent: times every HTTP/1.x request the servers on this node handle, from the
kernel (eBPF tracepoints loaded with bcc; no kprobes, no change to the servers), including
every chunk of a streamed response, and exports one OpenTelemetry SERVER span per request.

Needs root (or CAP_BPF + CAP_PERFMON), tracefs, and kernel headers (the running kernel's, or
the fallback `make setup` builds). Start with `parallax-agent doctor`.

Privacy: request bytes are parsed in memory and dropped. Only method, path (no query string),
status, traceparent, timings, addresses and process identity leave the agent; never Cookie,
Authorization or other headers, never bodies.
"""


PORT_MAX = 65535
PID_MAX_LIMIT = 4194304  # the kernel's largest pid_max (PID_MAX_LIMIT on 64-bit)
HEAD_WINDOW_MIN, HEAD_WINDOW_MAX = 256, 16384  # the kernel's capture buffer, a power of two
MAX_CONNS_MIN, MAX_CONNS_MAX = 64, 1 << 20  # the kernel's connection maps (entries)
STREAM_LIMIT_MAX_S = 30 * 86400


class _Parser(argparse.ArgumentParser):
    """A bad value is one line and exit 2 (argparse's code), not the usage block: the
    values are checked here, at parse time, so that none reaches the loader (an out-of-range
    port once raised IndexError there after the probes were attached)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = lo - 1
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"wants an integer from {lo} to {hi}, got {text!r}")
        return n

    return parse


def _float_in(lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            x = math.nan
        if not lo <= x <= hi:  # NaN fails too
            raise argparse.ArgumentTypeError(
                f"wants a number from {lo:.10g} to {hi:.10g}, got {text!r}"
            )
        return x

    return parse


def _ring_pages(text: str) -> int:
    n = _int_in(0, 1 << 20)(text)
    if n & (n - 1):
        raise argparse.ArgumentTypeError(f"wants 0 or a power of two, got {text!r}")
    return n


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="parallax-agent",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _doctor_parser(sub)
    r = sub.add_parser(
        "run",
        help="trace HTTP/1.x servers on this node and export one record per request",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=RUN_DESCRIPTION,
    )
    for add in (_what_args, _output_args, _capture_args, _overload_args, _feature_args):
        add(r)
    _test_args(r)
    return ap


def _doctor_parser(sub: Any) -> None:
    d = sub.add_parser(
        "doctor",
        help="check what this host supports and what each missing piece degrades",
        description="Print one line per capability the agent needs (privileges, bpf(), tracefs,"
        " each tracepoint with its fields, uprobes, ring buffer, kernel headers, NVML)."
        " Exit 0 when the agent can run, 1 otherwise. Some tracepoints exist only from"
        " Linux 6.3 (sock:sk_data_ready, sock:sock_send_length/sock_recv_length); without"
        " them timings degrade as printed.",
    )
    d.add_argument("--json", action="store_true", help="machine-readable output")


def _what_args(r: argparse.ArgumentParser) -> None:
    """What is traced."""
    r.add_argument(
        "--port",
        type=_int_in(1, PORT_MAX),
        action="append",
        default=[],
        metavar="P",
        help="trace connections accepted on this local port (repeatable)",
    )
    r.add_argument(
        "--pid",
        type=_int_in(1, PID_MAX_LIMIT),
        action="append",
        default=[],
        metavar="N",
        help="trace this process (repeatable); with neither --port nor --pid,"
        " every process on the node is traced",
    )


def _output_args(r: argparse.ArgumentParser) -> None:
    """Where records and metrics go."""
    r.add_argument(
        "--jsonl",
        metavar="PATH|-",
        help="append one JSON object per completed request to PATH (- = stdout)",
    )
    r.add_argument(
        "--otlp",
        metavar="URL",
        help="export OTLP/HTTP spans to this collector base URL (/v1/traces added)",
    )
    r.add_argument(
        "--metrics-addr",
        default="127.0.0.1:9464",
        metavar="HOST:PORT",
        help="serve /metrics, /healthz, /readyz here (default %(default)s)",
    )


def _capture_args(r: argparse.ArgumentParser) -> None:
    """What is read of each connection, and how records are named."""
    r.add_argument(
        "--head-window",
        type=_int_in(HEAD_WINDOW_MIN, HEAD_WINDOW_MAX),
        default=4096,
        metavar="BYTES",
        help="request bytes captured per read for parsing (default %(default)s,"
        f" {HEAD_WINDOW_MIN}-{HEAD_WINDOW_MAX}, rounded up to a power of two); a traceparent"
        " beyond it is counted as missed",
    )
    r.add_argument(
        "--stream-limit-s",
        type=_float_in(0, STREAM_LIMIT_MAX_S),
        default=60.0,
        metavar="S",
        help="a response streaming longer than this emits a partial record at the"
        " limit, then the final one (default %(default)s; 0 = never; at most"
        f" {STREAM_LIMIT_MAX_S})",
    )
    r.add_argument(
        "--max-conns",
        type=_int_in(MAX_CONNS_MIN, MAX_CONNS_MAX),
        default=16384,
        metavar="N",
        help="connections followed at once on the node (the kernel's connection maps;"
        " default %(default)s): past it the least recently used is dropped, and reads on"
        " it are counted (parallax_agent_unfollowed_reads_total), its requests not recorded",
    )
    r.add_argument(
        "--service-name",
        action="append",
        default=[],
        metavar="PORT=NAME",
        help="service name for connections on PORT (default: the process's"
        " OTEL_SERVICE_NAME, else what an interpreter runs — `python -m llama_cpp.server`:"
        " llama_cpp.server, a script: its file name —, else its executable name)",
    )
    r.add_argument(
        "--disable-tracepoint",
        action="append",
        default=[],
        metavar="CAT:NAME",
        help="treat this optional tracepoint as missing (degrade as on an older kernel; e.g."
        " to test the fallbacks, or to drop tcp:tcp_probe's per-segment cost)",
    )


def _overload_args(r: argparse.ArgumentParser) -> None:
    """The agent's share of the node."""
    r.add_argument(
        "--nice",
        type=_int_in(-20, 19),
        default=10,
        metavar="N",
        help="scheduling niceness of the agent once attached (default %(default)s): under"
        " CPU contention the traced servers come first and the agent sheds (lost events are"
        " counted) rather than slowing them; 0 keeps the caller's",
    )
    r.add_argument(
        "--cpu-budget",
        type=_float_in(0, 4096),
        default=None,
        metavar="CORES",
        help="the agent's CPU budget in cores (default: 5%% of the node's CPUs, at least"
        " 0.05 and at most 0.4 — under the DaemonSet's 500m limit, so that it sheds before"
        " the kernel throttles it): above it, tracing pauses until the agent is back under,"
        " and the requests it skips are counted (parallax_agent_shed_requests_total);"
        " 0 = no budget",
    )


def _feature_args(r: argparse.ArgumentParser) -> None:
    """The parts an SRE can turn off."""
    r.add_argument(
        "--gpu",
        choices=("auto", "off"),
        default="auto",
        help="GPU time beside each request (default %(default)s: on where NVML finds a GPU;"
        " without one the attach line says why and the agent runs without GPU parts)",
    )
    r.add_argument(
        "--gpu-poll-ms",
        type=_float_in(50, 10_000),
        default=500.0,
        metavar="MS",
        help="NVML poll period (default %(default)g ms; the driver's samples are read"
        " whole at each poll, so a longer period only delays records of GPU services)",
    )
    r.add_argument(
        "--gpu-uprobes",
        choices=("auto", "off"),
        default="auto",
        help="uprobes on the CUDA driver of the traced services' GPU processes: kernel"
        " launches and host waits per request (a few µs per CUDA call; off: NVML only)",
    )
    r.add_argument(
        "--gpu-pid",
        action="append",
        default=[],
        metavar="SERVER_PID=GPU_PID",
        help="the process doing SERVER_PID's GPU work, where the two do not share a cgroup"
        " (repeatable; default: the server's cgroup's processes that use a GPU)",
    )
    r.add_argument(
        "--holdback",
        choices=("auto", "off"),
        default="auto",
        help="write-to-wire holdback per response (default %(default)s: a body write the"
        " kernel holds — Nagle, cork, congestion or receive window, a full send buffer — timed"
        " to its departure; while a write is held every packet on the node runs one more"
        " program; off: not measured, the wire_hold fields absent)",
    )
    r.add_argument(
        "--tls",
        choices=("auto", "off"),
        default="auto",
        help="requests on TLS connections the servers terminate themselves (default"
        " %(default)s: uprobes on SSL_read/SSL_write in the libssl each traced process maps,"
        " or in its executable where OpenSSL is linked in with its symbols, as in Node; a few"
        " µs per SSL call in the traced processes only; off: TLS connections are counted,"
        " not recorded)",
    )


def _test_args(r: argparse.ArgumentParser) -> None:
    """For tests and benchmarks, hidden from --help."""
    # tests only: a fixed keep probability (the kernel's per-request sampling) instead of
    # the one that adapts to the budget; hidden from --help
    r.add_argument("--sample-fixed", type=_float_in(0.001, 1), default=None, help=argparse.SUPPRESS)
    # tests only: the Kubernetes API's URL (plain HTTP, no credentials) in place of the
    # in-cluster configuration, which is used only where KUBERNETES_SERVICE_HOST is set
    r.add_argument("--k8s-api", metavar="URL", default=None, help=argparse.SUPPRESS)
    # the ring-buffer drain period (default 50 ms; 5× when idle), hidden from --help
    r.add_argument("--drain-ms", type=_float_in(1, 1000), default=50.0, help=argparse.SUPPRESS)
    # tests only: the span after which a kernel write aggregate is flushed so its u32 µs
    # offsets cannot wrap (default about an hour); hidden from --help
    r.add_argument(
        "--offset-span-ms", type=_float_in(0, 3_600_000), default=0, help=argparse.SUPPRESS
    )
    # tests only: the ring buffer's size in pages (a power of two; default 2048 = 8 MiB)
    r.add_argument("--ringbuf-pages", type=_ring_pages, default=0, help=argparse.SUPPRESS)
    # tests of the fallback: syscall tracepoints even where socket hooks work; hidden
    r.add_argument(
        "--io-hooks", choices=("auto", "syscalls"), default="auto", help=argparse.SUPPRESS
    )


RUN_DESCRIPTION = """\
Attach the eBPF probes and follow every TCP connection of the traced servers: cut the bytes
into HTTP/1.x exchanges (keep-alive, pipelining, chunked, SSE, WebSocket after 101) and
time each from the kernel: ttfb_us, recv_queue_us, accept_queue_us, ttft_us,
chunk_offsets_us, duration_us, srtt_us, retransmits. Prints one line on stderr when the
probes are attached (/readyz turns 200). SIGTERM/SIGINT: detach, flush, exit 0.

examples:
  parallax-agent run --port 8000 --jsonl -
  parallax-agent run --port 8000 --otlp http://collector:4318 --service-name 8000=chat
"""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "doctor":
        from agent import doctor  # noqa: PLC0415  (keeps --help fast)

        return doctor.main(as_json=args.json)
    if args.command == "run":
        # SIGTERM/SIGINT set one event from here on: a signal during the imports and set-up
        # in _run is neither lost nor raised into whatever runs then (a KeyboardInterrupt in a
        # finalizer is printed and swallowed, and the agent would go on to attach); the
        # agent leaves quietly at its next look at the event.
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        return _run(args, stop)
    return 2


def _run(args: argparse.Namespace, stop: threading.Event) -> int:
    """``run``: the arguments the parser cannot check, then the agent until ``stop``."""
    from agent import budget, run  # noqa: PLC0415
    from agent.gpu.side import GpuConfig  # noqa: PLC0415

    names: dict[int, str] = {}
    for item in args.service_name:
        port, sep, name = item.partition("=")
        try:
            names[_int_in(1, PORT_MAX)(port)] = name
        except argparse.ArgumentTypeError:
            sep = ""
        if not sep or not name:
            print(
                f"parallax-agent: --service-name wants PORT=NAME (PORT 1-{PORT_MAX}),"
                f" got {item[:80]!r}",
                file=sys.stderr,
            )
            return 2
    gpu_pids: dict[int, set[int]] = {}
    for item in args.gpu_pid:
        server, sep, worker = item.partition("=")
        try:
            ids = (_int_in(1, PID_MAX_LIMIT)(server), _int_in(1, PID_MAX_LIMIT)(worker))
        except argparse.ArgumentTypeError:
            sep = ""
        if not sep:
            print(
                f"parallax-agent: --gpu-pid wants SERVER_PID=GPU_PID, got {item[:80]!r}",
                file=sys.stderr,
            )
            return 2
        gpu_pids.setdefault(ids[0], set()).add(ids[1])
    if args.cpu_budget is None:
        args.cpu_budget = budget.default_cores()
    if not (args.cpu_budget == 0 or args.cpu_budget >= budget.MIN_CORES):  # NaN too
        # the agent's own idle work (drains, /metrics, rescans) takes ~0.01 cores:
        # below this a paused agent could never earn its way back to tracing
        print(
            f"parallax-agent: --cpu-budget wants 0 (none) or at least {budget.MIN_CORES}"
            f" cores, got {args.cpu_budget:g}",
            file=sys.stderr,
        )
        return 2
    return run.main(
        run.RunConfig(
            ports=args.port,
            pids=args.pid,
            jsonl=args.jsonl,
            otlp=args.otlp,
            metrics_addr=args.metrics_addr,
            # rounded as the kernel's buffer is, so that both cut heads alike
            head_window=1 << (args.head_window - 1).bit_length(),
            stream_limit_s=args.stream_limit_s,
            max_conns=args.max_conns,
            service_names=names,
            disabled_tracepoints=args.disable_tracepoint,
            offs_span_ns=int(args.offset_span_ms * 1e6),
            nice=args.nice,
            drain_ms=args.drain_ms,
            io_hooks=args.io_hooks,
            cpu_budget=args.cpu_budget,
            ringbuf_pages=args.ringbuf_pages,
            gpu=GpuConfig(args.gpu, args.gpu_poll_ms, args.gpu_uprobes, gpu_pids),
            sample_fixed=args.sample_fixed,
            k8s_api=args.k8s_api,
            tls=args.tls,
            holdback=args.holdback,
        ),
        stop,
    )


if __name__ == "__main__":
    sys.exit(main())
