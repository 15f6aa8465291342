"""Generated pairs of known distributions, written into a real chDB store.

Each route has a cause built in by construction (a constant-ish part added to the server's
distribution), so the true divergence is known; ``population_p95_shift`` recomputes it from
a large sample of the same generator.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from collector.store import schema as store_schema
from tests.sla import sampled
from tests.sla.gpu_timeline import Reading, Req, Timeline


def _recent_hour() -> datetime:
    """A whole hour one to three hours ago (never midnight): the scenario's data must be
    recent, as the store's retention and the window block's one-day TTL drop older rows
    at insert (a fixed date here failed every evaluation test a day later)."""
    h = (datetime.now(UTC) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    return h + timedelta(hours=1) if h.hour == 0 else h


NOW = _recent_hour() + timedelta(seconds=30)
SERVICE = "app"


@dataclass
class RouteData:
    route: str
    n: int
    cols: dict[str, Any] = field(default_factory=dict)


def _nr95(a: np.ndarray) -> float:
    """Nearest-rank P95 (rank ceil(0.95·n)), the evaluator's definition."""
    s = np.sort(a)
    return float(s[int(np.ceil(0.95 * len(s))) - 1])


def nearest_rank(a: Any, q: float = 0.95) -> float:
    s = np.sort(np.asarray(a, dtype=float))
    return float(s[max(1, int(np.ceil(q * len(s)))) - 1])


Gen = Callable[[np.random.Generator, int], dict[str, Any]]


def _base(rng: np.random.Generator, n: int, mu: float = 40.0, sd: float = 5.0) -> dict[str, Any]:
    server = rng.normal(mu, sd, n).clip(1)
    return {"server_ttfb_ms": server}


def gen_ok(rng: np.random.Generator, n: int) -> dict[str, Any]:
    server = rng.normal(40, 5, n).clip(1)
    net = 2 + rng.uniform(0, 1, n)
    queue = rng.uniform(0, 0.3, n)
    ttft = server + 5
    return {
        "server_ttfb_ms": server,
        "user_ttfb_ms": server + net + queue,
        "server_ttft_ms": ttft,
        "user_ttft_ms": ttft + net + queue,
        "user_visible_ttft_ms": ttft + net + queue + 2,
        "render_delay_ms": np.full(n, 2.0),
        "server_duration_ms": ttft + 900,
        "user_duration_ms": ttft + 900 + net + queue,
        "network_ms": net,
        "queue_ms": queue,
        "recv_queue_ms": queue,
        "accept_queue_ms": np.zeros(n),
    }


def gen_render(rng: np.random.Generator, n: int) -> dict[str, Any]:
    server = rng.normal(100, 10, n).clip(1)
    net = np.full(n, 1.0) + rng.uniform(0, 0.2, n)
    render = 28.9 + rng.uniform(0, 0.2, n)  # +1 network, +29 render = +30 visible TTFT
    return {
        "server_ttfb_ms": server - 20,
        "user_ttfb_ms": server - 20 + net,
        "server_ttft_ms": server,
        "server_duration_ms": server,  # answered in one write: no decode window
        "user_ttft_ms": server + net,
        "user_visible_ttft_ms": server + net + render,
        "render_delay_ms": render,
        "network_ms": net,
        "queue_ms": np.zeros(n),
        "recv_queue_ms": np.zeros(n),
        "accept_queue_ms": np.zeros(n),
    }


def gen_network(rng: np.random.Generator, n: int) -> dict[str, Any]:
    server = rng.normal(40, 5, n).clip(1)
    net = 24.9 + rng.uniform(0, 0.2, n)  # +25 ms TTFB from the network
    # every 5th request's connection sent bytes again after an RTO (200 or 205 ms), the
    # rest had none (their wait is absent, not 0)
    lossy = [i % 5 == 0 for i in range(n)]
    return {
        "server_ttfb_ms": server,
        "user_ttfb_ms": server + net,
        "network_ms": net,
        "queue_ms": np.zeros(n),
        "recv_queue_ms": np.zeros(n),
        "accept_queue_ms": np.zeros(n),
        "retransmits": [int(x) for x in lossy],
        "retransmit_wait_ms": [200.0 + i % 10 if x else None for i, x in enumerate(lossy)],
    }


def gen_event_loop(rng: np.random.Generator, n: int) -> dict[str, Any]:
    server = rng.normal(40, 5, n).clip(1)
    net = np.full(n, 0.5)
    lag = 19.4 + rng.uniform(0, 0.2, n)  # +20 ms = 0.5 network + 19.5 receive queue
    return {
        "server_ttfb_ms": server,
        "user_ttfb_ms": server + net + lag,
        "network_ms": net,
        "queue_ms": lag,
        "recv_queue_ms": lag,
        "accept_queue_ms": np.zeros(n),
    }


def gen_negative(rng: np.random.Generator, n: int) -> dict[str, Any]:
    server = rng.normal(80, 5, n).clip(25)
    return {
        "server_ttfb_ms": server,
        "user_ttfb_ms": server - 20,  # the server counts 20 ms the user never waits for
        "network_ms": np.full(n, 1.0),
    }


def gen_sparse(rng: np.random.Generator, n: int) -> dict[str, Any]:
    server = rng.normal(40, 5, n).clip(1)
    return {"server_ttfb_ms": server, "user_ttfb_ms": server + 50, "network_ms": np.full(n, 50.0)}


def gen_proxy_stream(rng: np.random.Generator, n: int) -> dict[str, Any]:
    """Origin writes a token every 40 ms; a buffering proxy forwards 5 at a time."""
    tokens = 40
    server_itl = [list(40 + rng.normal(0, 0.5, tokens - 1)) for _ in range(n)]
    burst: list[list[float]] = []
    for _ in range(n):
        gaps = []
        for i in range(tokens - 1):
            gaps.append(
                float(199 + rng.uniform(0, 2)) if i % 5 == 4 else float(rng.uniform(0.05, 0.3))
            )
        burst.append(gaps)
    user_itl = [[g + float(rng.uniform(0, 0.2)) for g in b] for b in burst]
    server = rng.normal(30, 3, n).clip(1)
    return {
        "server_ttfb_ms": server,
        "user_ttfb_ms": server + 2,
        "network_ms": np.full(n, 1.0),
        "hops": np.full(n, 2),
        "hop_services": [["nginx", SERVICE]] * n,
        "hop_added_ms": [[1.0, float(s)] for s in server],
        "server_itl_ms": server_itl,
        "edge_itl_ms": burst,
        "user_itl_ms": user_itl,
    }


def gen_nagle(rng: np.random.Generator, n: int) -> dict[str, Any]:
    """The app writes a token every 20 ms on a socket without TCP_NODELAY; the client's
    delayed ACK (40 ms) releases them two at a time: the agent's write-to-wire holdback
    names Nagle for ~half the writes, the longest waiting ~40 ms."""
    tokens = 30
    server_itl = [list(20 + rng.normal(0, 0.3, tokens - 1)) for _ in range(n)]
    user_itl = [
        [
            float(40 + rng.uniform(0, 2)) if i % 2 else float(rng.uniform(0.05, 0.3))
            for i in range(tokens - 1)
        ]
        for _ in range(n)
    ]
    server = rng.normal(30, 3, n).clip(1)
    hold = rng.uniform(18, 42, n)
    return {
        "server_ttfb_ms": server,
        "user_ttfb_ms": server + 2,
        "network_ms": np.full(n, 1.0),
        "server_itl_ms": server_itl,
        "edge_itl_ms": server_itl,
        "user_itl_ms": user_itl,
        "wire_hold_ms": hold,
        "wire_hold_reason": ["nagle"] * n,
    }


ROUTES: dict[str, tuple[Gen, int]] = {
    "/v1/ok": (gen_ok, 1500),
    "/v1/render": (gen_render, 1500),
    "/v1/net": (gen_network, 1500),
    "/v1/loop": (gen_event_loop, 1500),
    "/v1/cached": (gen_negative, 1500),
    "/v1/rare": (gen_sparse, 40),
    "/v1/stream": (gen_proxy_stream, 600),
    "/v1/nagle": (gen_nagle, 600),
}
FAR_OFF_ROUTE, FAR_OFF_SESSIONS = "/v1/render", 12


def build(seed: int = 7, now: datetime = NOW, spread_s: float = 230.0) -> dict[str, RouteData]:
    rng = np.random.default_rng(seed)
    out: dict[str, RouteData] = {}
    for route, (gen, n) in ROUTES.items():
        cols = gen(rng, n)
        offs = rng.uniform(1.0, spread_s, n)
        cols["time"] = [now - timedelta(seconds=float(o)) for o in offs]
        if route == FAR_OFF_ROUTE:
            sess = [f"far{i % FAR_OFF_SESSIONS}" for i in range(n)]
            theta = [150.0 + (i % FAR_OFF_SESSIONS) for i in range(n)]
        else:
            sess = [f"{route}-s{i % 20}" for i in range(n)]
            theta = [float(rng.normal(0, 3)) for _ in range(n)]
        cols["session"] = sess
        cols["theta_ms"] = theta
        cols["theta_delay_ms"] = list(rng.uniform(1, 5, n))
        out[route] = RouteData(route, n, cols)
    return out


def population_shift(route: str, user: str, server: str, n: int = 400_000) -> float:
    """The P95 difference of the route's generator on a large sample (≈ the true value)."""
    gen, _ = ROUTES[route]
    c = gen(np.random.default_rng(12345), n)
    return _nr95(np.asarray(c[user])) - _nr95(np.asarray(c[server]))


def write(client: Any, db: str, data: dict[str, RouteData], paired_at: datetime = NOW) -> None:
    """Column-oriented insert into ``pairs`` (every route, one batch per route)."""
    for route, rd in data.items():
        n = rd.n
        cols: dict[str, list[Any]] = {
            "version": [1] * n,
            "paired_at": [paired_at] * n,
            "site": ["test"] * n,
            "service": [SERVICE] * n,
            "route": [route] * n,
            "method": ["POST"] * n,
            "kind": ["fetch"] * n,
            "trace_id": [secrets.token_hex(16) for _ in range(n)],
            "span_id": [secrets.token_hex(8) for _ in range(n)],
            "hops": [1] * n,
            "hop_services": [[SERVICE]] * n,
        }
        for k, v in rd.cols.items():
            cols[k] = (
                [x.tolist() if isinstance(x, np.ndarray) else x for x in v]
                if k.endswith("itl_ms")
                else [(x.item() if hasattr(x, "item") else x) for x in v]
            )
        names = list(cols)
        client.insert(
            f"{db}.pairs", [cols[k] for k in names], column_names=names, column_oriented=True
        )


# A route served from a busy, power-capped GPU (server spans with the agent's GPU columns,
# their pairs and the GPU's clock readings: tests/sla/gpu_timeline.py), beside the others.
GPU_ROUTE, GPU_ID = "/v1/generate", "GPU-0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"


def gpu_timeline(now: datetime = NOW) -> Timeline:
    tl = Timeline(GPU_ROUTE, service=SERVICE)
    start = now - timedelta(seconds=230)
    for i in range(120):
        tl.reqs.append(
            Req(
                start + timedelta(seconds=1.9 * i),
                840.0,
                2400.0,
                queue_ms=3.0,
                gpu={
                    "gpu_prefill_sm_util_pct": 97.0,
                    "gpu_decode_sm_util_pct": 95.0,
                    "gpu_inflight_mean": 14.0,
                    "gpu_sample_coverage": 0.97,
                    "gpu_prefill_launches": 40,
                    "gpu_uuid": GPU_ID,
                },
            )
        )
    tl.readings = [
        Reading(start + timedelta(seconds=10 * k - 5), GPU_ID, 1089.0, 1980.0, 0x4)
        for k in range(25)
    ]
    return tl


# A sampled service: the agent traced every request while calm, then one in ten when busy
# (tests/sla/sampled.py), and counted every request on port 8080 of two nodes
# (request_counts, as /v1/metrics stores them).
SAMPLED_ROUTE, SAMPLED_SERVICE, SAMPLED_PORT = "/v1/sampled", "shop", 8080
SAMPLED_HOSTS = ("node-a", "node-b")


def sampled_population() -> sampled.Population:
    return sampled.overload(np.random.default_rng(99), 1500, 3000, 1.0, 0.1)


def write_sampled(client: Any, db: str, now: datetime = NOW) -> sampled.Population:
    pop = sampled_population()
    sampled.write(client, db, sampled.pair_rows(pop, now, SAMPLED_ROUTE, SAMPLED_SERVICE))
    ns = int(now.timestamp() * 1e9)
    start = ns - 400 * 10**9  # the agents started before the window
    rows: list[tuple[Any, ...]] = []
    for h, host in enumerate(SAMPLED_HOSTS):
        mine = np.arange(len(pop.server)) % 2 == h  # each node serves half the requests
        for k in range(37):  # an export every 10 s, from 6 min before now
            t = ns - (360 - 10 * k) * 10**9
            before = mine & (pop.offset_s * 1e9 > ns - t)  # arrived by t
            for metric, v in (
                ("parallax.requests.seen", before.sum()),
                ("parallax.requests.traced", (before & pop.kept).sum()),
            ):
                rows.append(
                    (t, start, host, SAMPLED_SERVICE, SAMPLED_PORT, metric, float(v), "cumulative")
                )
            rows.append((t, None, host, "", 0, "parallax.sampling.probability", 0.1, ""))
    names = [c.name for c in store_schema.REQUEST_COUNT_COLUMNS]
    client.insert(f"{db}.{store_schema.REQUEST_COUNTS}", rows, column_names=names)
    return pop


# A second route of the sampled service whose requests all came while the agent kept every
# one (p = 1), counted on a port of its own: its sentence says so, while its service's counts
# say the service was sampled — the sampling sentence is per route.
CALM_ROUTE, CALM_PORT, CALM_N = "/v1/browse", 8081, 300


def write_calm_route(client: Any, db: str, now: datetime = NOW) -> None:
    pop = sampled.overload(np.random.default_rng(5), CALM_N, 0, 1.0, 1.0)
    sampled.write(client, db, sampled.pair_rows(pop, now, CALM_ROUTE, SAMPLED_SERVICE))
    ns = int(now.timestamp() * 1e9)
    rows: list[tuple[Any, ...]] = []
    for k in range(37):  # an export every 10 s, from 6 min before now
        t = ns - (360 - 10 * k) * 10**9
        v = float((pop.offset_s * 1e9 > ns - t).sum())
        for metric in ("parallax.requests.seen", "parallax.requests.traced"):
            rows.append(
                (t, ns - 400 * 10**9, SAMPLED_HOSTS[0], SAMPLED_SERVICE, CALM_PORT, metric, v,
                 "cumulative")
            )  # fmt: skip
    names = [c.name for c in store_schema.REQUEST_COUNT_COLUMNS]
    client.insert(f"{db}.{store_schema.REQUEST_COUNTS}", rows, column_names=names)
