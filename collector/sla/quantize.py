"""The value grids of the SLA histograms.

Per-minute summaries store counts per grid cell instead of raw values, so an evaluation
costs the number of occupied cells, not the number of pairs. The grids are log-linear:
fixed 0.1 ms cells up to a limit, then a fixed number of cells per doubling.

- ``FINE`` (the user and server sides of each metric, whose P95s make the divergence):
  0.1 ms cells below 25.6 ms, 256 cells per doubling above (a cell is 0.27 % of its value).
  A quantile read from the grid is the cell's midpoint, off by at most half a cell: 0.05 ms
  below 25.6 ms, 0.135 % above (0.54 ms at 400 ms, 1.35 ms at 1 s, 6.8 ms at 5 s). The
  confidence bounds are widened by that half cell so they stay valid (``half_width_ms``).
  512 cells per doubling doubled the cells an evaluation reads for precision far below the
  sampling error of a P95.
- ``COARSE`` (the parts, which rank and explain but never decide a verdict): 0.1 ms cells
  below 6.4 ms, 64 per doubling above (±0.54 %): a quarter of the cells.

Why not ClickHouse's own sketches: ``quantileTiming`` rounds to 16 ms above 1 s and takes
integer ms; ``quantileTDigest``/``quantileDD`` states merge fast but their error is in rank
or relative value with no exact rank convention, and the confidence bounds need exact
order statistics (rank k of n). ``quantilesExactWeighted`` over grid cells gives exactly
that: the value at rank ceil(n·q) of the gridded sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Grid:
    linear_limit_ms: float
    step_ms: float
    cells_per_octave: int

    @property
    def linear_cells(self) -> int:
        return round(self.linear_limit_ms / self.step_ms)

    @property
    def rel_half(self) -> float:
        return float(2 ** (1 / (2 * self.cells_per_octave)) - 1)


FINE = Grid(25.6, 0.1, 256)
COARSE = Grid(6.4, 0.1, 64)


def code_sql(expr: str, grid: Grid = FINE) -> str:
    """SQL for the signed Int32 cell of ``expr`` (ms); must agree with ``encode``."""
    a = f"abs({expr})"
    return (
        f"toInt32(sign({expr}) * if({a} < {grid.linear_limit_ms}, "
        f"floor({a} * {1 / grid.step_ms:g}), "
        f"{grid.linear_cells} + "
        f"floor({grid.cells_per_octave} * log2({a} / {grid.linear_limit_ms}))))"
    )


def encode(ms: float, grid: Grid = FINE) -> int:
    a = abs(ms)
    if a < grid.linear_limit_ms:
        c = math.floor(a / grid.step_ms)
    else:
        c = grid.linear_cells + math.floor(
            grid.cells_per_octave * math.log2(a / grid.linear_limit_ms)
        )
    return -c if ms < 0 else c


def decode(code: int, grid: Grid = FINE) -> float:
    """The midpoint of a cell, in ms (cell 0 spans −0.1…+0.1 ms: its midpoint is 0)."""
    c = abs(code)
    if c == 0:
        return 0.0
    if c < grid.linear_cells:
        v = (c + 0.5) * grid.step_ms
    else:
        v = grid.linear_limit_ms * 2 ** ((c - grid.linear_cells + 0.5) / grid.cells_per_octave)
    return -v if code < 0 else v


def half_width_ms(value_ms: float, grid: Grid = FINE) -> float:
    """Largest distance between a value and its cell's midpoint, for a cell holding value_ms."""
    return max(grid.step_ms, abs(value_ms) * grid.rel_half * 1.0001)
