"""A delaying TCP relay: the network between browser and server, on loopback.

This kernel has no netem, so the network scenarios put this relay between the browser and
the app. Every chunk read in either direction is forwarded after a one-way delay plus a
uniform jitter, never reordered (a later chunk is never released before an earlier one), so
a request/response exchange pays about twice the one-way delay.

    python -m demo.relay --listen 127.0.0.1:9000 --upstream 127.0.0.1:8000 \
        --delay-ms 20 --jitter-ms 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Delay:
    one_way_ms: float
    jitter_ms: float = 0.0

    def sample_s(self, rng: random.Random) -> float:
        return (self.one_way_ms + rng.uniform(0.0, self.jitter_ms)) / 1000


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay, rng: random.Random
) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def release() -> None:
        while True:
            at, data = await queue.get()
            await asyncio.sleep(max(0.0, at - loop.time()))
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(release())
    last = 0.0
    try:
        while True:
            data = await reader.read(65536)
            last = max(loop.time() + delay.sample_s(rng), last)  # jitter never reorders
            queue.put_nowait((last, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()


async def _handle(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream: tuple[str, int],
    delay: Delay,
    rng: random.Random,
) -> None:
    try:
        up_r, up_w = await asyncio.open_connection(*upstream)
    except OSError:
        client_w.close()
        return
    await asyncio.gather(
        _pump(client_r, up_w, delay, rng),
        _pump(up_r, client_w, delay, rng),
        return_exceptions=True,
    )
    for w in (client_w, up_w):
        w.close()


async def run(listen: tuple[str, int], upstream: tuple[str, int], delay: Delay) -> None:
    rng = random.Random()  # noqa: S311 (network jitter, not cryptography)
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, upstream, delay, rng), listen[0], listen[1]
    )
    host, port = server.sockets[0].getsockname()[:2]
    print(
        f"relay: listening on {host}:{port} → {upstream[0]}:{upstream[1]}, "
        f"{delay.one_way_ms} ms one way + up to {delay.jitter_ms} ms jitter",
        flush=True,
    )
    async with server:
        await server.serve_forever()


def _addr(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m demo.relay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--listen", type=_addr, default=("127.0.0.1", 0), help="HOST:PORT (0: any)")
    ap.add_argument("--upstream", type=_addr, required=True, help="HOST:PORT of the app")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="one-way delay")
    ap.add_argument("--jitter-ms", type=float, default=0.0, help="uniform extra delay, 0..J")
    args = ap.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(args.listen, args.upstream, Delay(args.delay_ms, args.jitter_ms)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
