"""Plot user vs server P95 over the last `make demo` run, from the store it left behind.

Reads the demo's embedded store (``.parallax/demo/chdb``) and its ``sla.yaml``, and draws per
route the P95 of user and server TTFB (and TTFT) in 5-second buckets, with the SLA band
(± band_ms, 15 ms by default) shaded around the server line: where the user line leaves
the band, users wait for something the server's own figures do not show.

    python -m bench.demo_plot [--data-dir .parallax/demo] [--out docs/img/demo-p95.png]

The store must not be open in a running collector (chDB allows one process per path): run
it after `DEMO_EXIT=1 make demo`, or after stopping the demo with Ctrl-C.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / ".parallax" / "demo"
OUT = ROOT / "docs" / "img" / "demo-p95.png"
BUCKET_S = 5
MIN_PAIRS = 20  # a route with fewer pairs over the run (page loads, favicon) is left out
METRICS = (("ttfb", "TTFB"), ("ttft", "TTFT"))


class PlotError(RuntimeError):
    """An expected failure: printed as one line."""


@dataclass
class Series:
    t: list[float] = field(default_factory=list)  # seconds since the run's first pair
    n: list[int] = field(default_factory=list)
    user: dict[str, list[float | None]] = field(default_factory=lambda: defaultdict(list))
    server: dict[str, list[float | None]] = field(default_factory=lambda: defaultdict(list))


def load(data_dir: Path) -> tuple[dict[tuple[str, str], Series], dict[tuple[str, str, str], float]]:
    """P95 series per (service, route), and the SLA band per (service, route, metric)."""
    if not (data_dir / "chdb").is_dir():
        raise PlotError(f"no demo store at {data_dir / 'chdb'}: run `DEMO_EXIT=1 make demo` first")
    from collector.sla.config import ConfigError, SlaConfig
    from collector.sla.config import load as load_sla
    from collector.store.client import Store, StoreInUseError, chdb_dsn, check_embedded_free

    try:
        check_embedded_free(chdb_dsn(data_dir))
    except StoreInUseError as e:
        msg = f"{e}: stop the demo (Ctrl-C) or run it with DEMO_EXIT=1, then plot"
        raise PlotError(msg) from None

    try:
        cfg = load_sla(data_dir / "sla.yaml") if (data_dir / "sla.yaml").exists() else SlaConfig()
    except ConfigError as e:
        raise PlotError(f"{data_dir / 'sla.yaml'}: {e}") from e
    store = Store(chdb_dsn(data_dir))
    cols = ", ".join(
        f"quantileExactInclusive(0.95)({side}_{m}_ms) AS {side}_{m}"
        for m, _ in METRICS
        for side in ("user", "server")
    )
    sql = f"""
        SELECT service, route, toStartOfInterval(time, INTERVAL {BUCKET_S} SECOND) AS bucket,
               count() AS n, {cols}
        FROM {store.database}.pairs FINAL
        WHERE (service, route) IN (
            SELECT service, route FROM {store.database}.pairs FINAL
            GROUP BY service, route HAVING count() >= {MIN_PAIRS})
        GROUP BY service, route, bucket
        ORDER BY service, route, bucket"""  # noqa: S608 (our own constants)
    try:
        rows = store.rows(sql)
    except Exception as e:  # chDB raises its own types; one line is enough
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PlotError(f"cannot read the store in {data_dir}: {msg}") from e
    finally:
        store.close()
    if not rows:
        raise PlotError(f"no pairs in {data_dir}: did the demo run to the end?")
    start: datetime = min(r["bucket"] for r in rows)
    series: dict[tuple[str, str], Series] = {}
    bands: dict[tuple[str, str, str], float] = {}
    for r in rows:
        key = (r["service"], r["route"])
        s = series.setdefault(key, Series())
        s.t.append((r["bucket"] - start).total_seconds() + BUCKET_S / 2)
        s.n.append(int(r["n"]))
        for m, _ in METRICS:
            s.user[m].append(_num(r[f"user_{m}"]))
            s.server[m].append(_num(r[f"server_{m}"]))
            bands[(*key, m)] = cfg.thresholds(key[0], key[1], m).band_ms
    return series, bands


def _num(v: object) -> float | None:
    """quantile over only NULLs is NaN (or NULL): a gap in the line."""
    if isinstance(v, int | float) and not math.isnan(v):
        return float(v)
    return None


def plot(
    series: dict[tuple[str, str], Series], bands: dict[tuple[str, str, str], float], out: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    keys = sorted(series)
    fig, axes = plt.subplots(
        len(keys), len(METRICS), figsize=(11, 2.9 * len(keys)), squeeze=False, sharex=True
    )
    for row, key in enumerate(keys):
        s = series[key]
        for col, (m, label) in enumerate(METRICS):
            ax = axes[row][col]
            server = [float("nan") if v is None else v for v in s.server[m]]
            user = [float("nan") if v is None else v for v in s.user[m]]
            band = bands[(*key, m)]
            if all(v is None for v in s.server[m]):
                ax.text(0.5, 0.5, f"no {label} on this route", ha="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            ax.fill_between(
                s.t,
                [v - band for v in server],
                [v + band for v in server],
                color="tab:blue",
                alpha=0.15,
                label=f"SLA band (server ± {band:g} ms)",
            )
            ax.plot(s.t, server, color="tab:blue", marker=".", label=f"server P95 {label}")
            ax.plot(s.t, user, color="tab:red", marker=".", label=f"user P95 {label}")
            ax.set_title(f"{key[1]} ({key[0]}): {label}, n = {sum(s.n)}", fontsize=10)
            ax.set_ylabel("ms")
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
            if row == len(keys) - 1:
                ax.set_xlabel(f"seconds into the demo run ({BUCKET_S} s buckets)")
            if row == 0:
                ax.legend(fontsize=8, loc="best")
    fig.suptitle(f"make demo: user vs server P95 per {BUCKET_S} s bucket, by route")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=DATA_DIR)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    try:
        series, bands = load(args.data_dir)
        plot(series, bands, args.out)
    except PlotError as e:
        print(f"bench.demo_plot: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({len(series)} routes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
