"""The attribution rules on scripted timelines (pure Python): which launches, waits and
samples fall in a request's prefill and decode windows, checked against hand-computed
values and, for launches, against a brute force over the individual launch times."""

from __future__ import annotations

import random

from agent.gpu import attribution as at
from agent.gpu.cuda import BUCKET_NS, Bucket
from agent.gpu.nvml import ProcessSample

MS = 1_000_000


def bucket_of(
    tgid: int, launches: list[int], waits: tuple[tuple[int, int], ...] = ()
) -> list[Bucket]:
    """What the kernel builds from these launch times and (union) wait intervals."""
    by: dict[int, dict[str, list[int]]] = {}
    for t in launches:
        by.setdefault(t // BUCKET_NS, {"l": [], "w": []})["l"].append(t)
    out = []
    for a, z in waits:
        by.setdefault(z // BUCKET_NS, {"l": [], "w": []})["w"].extend([a, z])
    for b, d in sorted(by.items()):
        ls, ws = d["l"], d["w"]
        pairs = list(zip(ws[::2], ws[1::2], strict=True))
        out.append(
            Bucket(
                tgid, b * BUCKET_NS, len(ls), 0, min(ls, default=0), max(ls, default=0),
                sum(z - a for a, z in pairs), min(ws, default=0), max(ws, default=0), len(pairs),
            )
        )  # fmt: skip
    return out


def test_launches_exact_unless_a_bucket_straddles_an_edge() -> None:
    rng = random.Random(7)
    for _ in range(200):
        times = sorted(rng.randrange(0, 50 * MS) for _ in range(rng.randrange(1, 300)))
        a = rng.randrange(0, 50 * MS)
        w = at.Window(a, a + rng.randrange(1, 20 * MS))
        truth = sum(w.start <= t < w.end for t in times)
        got = at.launches_in(bucket_of(1, times), w)
        # only buckets cut by an edge can be off, each by less than its own count
        cut = {t // BUCKET_NS for t in (w.start, w.end)}
        slack = sum(1 for t in times if t // BUCKET_NS in cut)
        assert abs(got - truth) <= slack
        if not any(t // BUCKET_NS in cut for t in times):
            assert got == truth


def test_a_burst_right_after_an_edge_is_counted_whole() -> None:
    """The decode step's launches come microseconds after the first token's write, in the
    bucket holding that write: first/last launch times keep them out of prefill."""
    tok = 100 * MS + BUCKET_NS // 2
    prefill_launches = [1 * MS + i * 1000 for i in range(40)]
    decode_launches = [tok + 20_000 + i * 1000 for i in range(5)]
    bs = bucket_of(9, prefill_launches + decode_launches)
    assert at.launches_in(bs, at.Window(0, tok)) == 40
    assert at.launches_in(bs, at.Window(tok, tok + 30 * MS)) == 5


def test_waits_exact_for_one_interval_per_bucket_and_merged_across_processes() -> None:
    w = at.Window(10 * MS, 110 * MS)
    one = bucket_of(1, [], ((5 * MS, 40 * MS),))  # began before the window
    two = bucket_of(2, [], ((30 * MS, 60 * MS), (100 * MS, 130 * MS)))  # another process
    assert at.wait_in(one, w) == 30 * MS
    # union: [10, 60] from both processes, then [100, 110]
    assert at.wait_in(one + two, w) == 50 * MS + 10 * MS


def test_several_waits_in_one_bucket_are_spread_over_their_span() -> None:
    b = Bucket(1, 0, 0, 0, 0, 0, wait_ns=400_000, wait_first=0, wait_last=1_000_000, waits=2)
    assert at.wait_in([b], at.Window(0, 500_000)) == 200_000
    assert at.wait_in([b], at.Window(0, 100_000)) <= 100_000  # never more than the window


def sample(t_ms: int, pid: int, pct: int, uuid: str = "GPU-a") -> ProcessSample:
    return ProcessSample(t_ms * 1000, uuid, pid, pct, 0, period_us=100_000)


def test_sm_util_counts_missing_samples_as_idle_within_the_known_stretch() -> None:
    # samples every 100 ms; pid 1 busy 80 % in (0,100], idle (no sample) in (100,200],
    # pid 2 busy 40 % in (100, 200]: the service's share is the sum, per moment
    samples = [sample(100, 1, 80), sample(200, 2, 40)]
    known = {"GPU-a": (0, 200 * MS)}
    pct, covered = at.sm_util(samples, known, at.Window(50 * MS, 150 * MS))
    assert covered == 100 * MS
    assert pct == (80 * 50 + 40 * 50) / 100
    # beyond what is known: the mean is over the known part, coverage says how much
    pct, covered = at.sm_util(samples, known, at.Window(150 * MS, 250 * MS))
    assert (pct, covered) == (40.0, 50 * MS)
    assert at.sm_util(samples, known, at.Window(300 * MS, 400 * MS)) == (None, 0)


def test_sm_util_averages_gpus_and_caps_each_at_100() -> None:
    samples = [
        sample(100, 1, 90, "GPU-a"),
        sample(100, 2, 30, "GPU-a"),
        sample(100, 1, 20, "GPU-b"),
    ]
    known = {"GPU-a": (0, 100 * MS), "GPU-b": (0, 100 * MS)}
    pct, _ = at.sm_util(samples, known, at.Window(0, 100 * MS))
    assert pct == (100 + 20) / 2


def test_inflight_mean() -> None:
    w = at.Window(0, 100)
    assert at.inflight_mean(w, []) == 1.0
    assert at.inflight_mean(w, [(-50, 50), (0, 100), (90, 200)]) == 1 + (50 + 100 + 10) / 100
    assert at.inflight_mean(at.Window(5, 5), [(0, 10)]) is None
