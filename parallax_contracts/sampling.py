"""Per-request sampling: the rule the agent's kernel programs apply, and how a span states it.

The agent keeps a request when its randomness R >= a rejection threshold T, OpenTelemetry's
consistent probability sampling (tracestate ``ot=th:…``): keep probability p = 1 − T / 2^56.
R is the trace id's rightmost 56 bits when the request carries a ``traceparent`` — so every
hop of one trace (a proxy and the app behind it) is kept or dropped together and a browser
beacon still finds both — else a fresh random number. The kernel compares the top 32 bits of
R with a threshold it is given on 32 bits (T = th32 · 2^24), so every threshold the agent uses
is a multiple of 2^24 and the comparison on 32 bits is the comparison on 56.

A span states its sampling in its W3C ``tracestate``: ``ot=th:<hex>``, T in 14 hex digits
with trailing zeros dropped (``th:0`` = every request kept; ``th:e6666666`` ≈ 10 % kept).
Its adjusted count — how many requests it stands for — is 1/p. The agent's JSONL records
carry the same value as ``sample_th``.
"""

from __future__ import annotations

import re

MAX_TH = 1 << 56  # a threshold of 2^56 would reject everything: never used
TH32_SHIFT = 24
_TH = re.compile(r"^[0-9a-f]{1,14}$")
_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


def th_from_th32(th32: int) -> int:
    """The 56-bit threshold of the kernel's 32-bit one."""
    return (th32 & 0xFFFFFFFF) << TH32_SHIFT


def th32_for(p: float) -> int:
    """The kernel's 32-bit threshold keeping a share ``p`` (0 < p <= 1) of requests,
    rounded to the nearest it can express; 0 for p >= 1."""
    if p >= 1.0:
        return 0
    return min(0xFFFFFFFF, max(0, round((1.0 - p) * (1 << 32))))


def th_hex(th: int) -> str:
    """OpenTelemetry's ``th`` value: 14 hex digits, trailing zeros dropped ("0" for 0)."""
    if not 0 <= th < MAX_TH:
        raise ValueError(f"threshold {th} outside [0, 2^56)")
    return (f"{th:014x}".rstrip("0")) or "0"


def parse_th(value: str) -> int | None:
    """A ``th`` value back to the 56-bit threshold; None when it is not one."""
    if not _TH.match(value):
        return None
    return int(value.ljust(14, "0"), 16)


def probability(th: int) -> float:
    """Keep probability of a 56-bit threshold."""
    return 1.0 - th / MAX_TH


def adjusted_count(th: int) -> float:
    """How many requests a span kept under ``th`` stands for (1/p)."""
    return 1.0 / probability(th)


def tracestate(th: int) -> str:
    """The tracestate entry value for OpenTelemetry's key ``ot``."""
    return f"th:{th_hex(th)}"


def th_from_tracestate(header: str) -> int | None:
    """The threshold in a W3C tracestate's ``ot`` entry (``ot=th:…;rv:…``); None when it
    has none or an invalid one (then nothing is said about sampling)."""
    for member in header.split(","):
        key, _, value = member.strip().partition("=")
        if key != "ot":
            continue
        for field in value.split(";"):
            name, _, v = field.partition(":")
            if name == "th":
                return parse_th(v)
    return None


def randomness(trace_id: str) -> int | None:
    """R of a trace id: its rightmost 56 bits (None for an invalid id)."""
    if not _TRACE_ID.match(trace_id):
        return None
    return int(trace_id[18:], 16)


def keeps(trace_id: str, th: int) -> bool | None:
    """Would a request of this trace be kept under ``th`` (the rule the kernel applies to a
    request carrying this trace id)? None for an invalid id."""
    r = randomness(trace_id)
    return None if r is None else r >= th
