"""Command line of the agent: ``parallax-agent {doctor,run}``."""

from __future__ import annotations

import argparse
import sys

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


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="parallax-agent",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
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
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "doctor":
        from agent import doctor  # noqa: PLC0415  (keeps --help fast)

        return doctor.main(as_json=args.json)
    return 2


if __name__ == "__main__":
    sys.exit(main())
