"""The demo's LLM app (demo/llm_app.py: SSE and chunked token streams, its own
CLOCK_MONOTONIC timing log) served by Hypercorn over HTTP/2: cleartext with prior knowledge
(h2c), or with ``--cert/--key`` TLS whose ALPN offers ``h2`` (then http/1.1).

    python -m tests.agent.servers.h2_app --timing-log PATH [--cert C --key K]   # prints the port
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from hypercorn.asyncio import serve
from hypercorn.config import Config

from demo.llm_app import LlmApp, Pacing, bind


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timing-log", type=Path, required=True)
    ap.add_argument("--cert")
    ap.add_argument("--key")
    a = ap.parse_args()
    sock = bind("127.0.0.1", 0)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1
    if a.cert:
        config.certfile, config.keyfile = a.cert, a.key
        config.alpn_protocols = ["h2", "http/1.1"]
    app = LlmApp(Pacing(60, 25, 8), a.timing_log)
    print(sock.getsockname()[1], flush=True)
    asyncio.run(serve(app, config))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
