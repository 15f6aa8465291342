"""The value grid of the SLA histograms.

Per-minute summaries store counts per grid cell instead of raw values, so an evaluation
costs the number of occupied cells, not the number of pairs. The grid is log-linear:
0.1 ms cells below 25.6 ms, then 256 cells per doubling (cell width 0.27 % of the value).
A quantile read from the grid is the cell's midpoint, off by at most half a cell:
0.05 ms below 25.6 ms, 0.135 % above (0.54 ms at 400 ms, 1.35 ms at 1 s, 6.8 ms at 5 s).
The confidence bounds are widened by that half cell so they stay valid (``half_width_ms``).
Finer grids cost more cells per minute (512 per doubling doubled the cells an evaluation
reads for the benchmark's distributions) for precision far below the sampling error.

Why not ClickHouse's own sketches: ``quantileTiming`` rounds to 16 ms above 1 s and takes
integer ms; ``quantileTDigest``/``quantileDD`` states merge fast but their error is in rank
or relative value with no exact rank convention, and the confidence bounds need exact
order statistics (rank k of n). ``quantilesExactWeighted`` over grid cells gives exactly
that: the value at rank ceil(n·q) of the gridded sample.
"""

from __future__ import annotations

import math

LINEAR_LIMIT_MS = 25.6  # below: fixed 0.1 ms cells
LINEAR_STEP_MS = 0.1
CELLS_PER_OCTAVE = 256
_LINEAR_CELLS = round(LINEAR_LIMIT_MS / LINEAR_STEP_MS)  # 256
_REL_HALF = 2 ** (1 / (2 * CELLS_PER_OCTAVE)) - 1  # half a log cell, relative


def code_sql(expr: str) -> str:
    """SQL for the signed Int32 cell of ``expr`` (ms); must agree with ``encode``."""
    a = f"abs({expr})"
    return (
        f"toInt32(sign({expr}) * if({a} < {LINEAR_LIMIT_MS}, floor({a} * {1 / LINEAR_STEP_MS:g}), "
        f"{_LINEAR_CELLS} + floor({CELLS_PER_OCTAVE} * log2({a} / {LINEAR_LIMIT_MS}))))"
    )


def encode(ms: float) -> int:
    a = abs(ms)
    if a < LINEAR_LIMIT_MS:
        c = math.floor(a / LINEAR_STEP_MS)
    else:
        c = _LINEAR_CELLS + math.floor(CELLS_PER_OCTAVE * math.log2(a / LINEAR_LIMIT_MS))
    return -c if ms < 0 else c


def decode(code: int) -> float:
    """The midpoint of a cell, in ms (cell 0 spans −0.1…+0.1 ms: its midpoint is 0)."""
    c = abs(code)
    if c == 0:
        return 0.0
    if c < _LINEAR_CELLS:
        v = (c + 0.5) * LINEAR_STEP_MS
    else:
        v = LINEAR_LIMIT_MS * 2 ** ((c - _LINEAR_CELLS + 0.5) / CELLS_PER_OCTAVE)
    return -v if code < 0 else v


def half_width_ms(value_ms: float) -> float:
    """Largest distance between a value and its cell's midpoint, for a cell holding value_ms."""
    a = abs(value_ms)
    return max(LINEAR_STEP_MS, a * _REL_HALF * 1.0001)
