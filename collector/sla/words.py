"""How the SLA checker writes numbers in its sentences (explanations and GPU findings alike):
milliseconds with one decimal below 10 ms, whole above; signs as + and − (U+2212)."""

from __future__ import annotations


def ms(v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v:.0f} ms" if abs(v) >= 10 else f"{v:.1f} ms"


def signed(v: float | None) -> str:
    if v is None:
        return "?"
    s = f"{abs(v):.0f}" if abs(v) >= 10 else f"{abs(v):.1f}"
    return ("+" if v >= 0 else "−") + s
