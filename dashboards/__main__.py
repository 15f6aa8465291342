"""``python -m dashboards`` writes the generated dashboards; ``--check`` only compares."""

from __future__ import annotations

import argparse
import sys

from dashboards.build import DIR, render_all


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 when a file differs")
    args = ap.parse_args()
    stale = []
    for name, text in render_all().items():
        path = DIR / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    verb = "differ from the code" if args.check else "written"
    print(f"{', '.join(stale) or 'nothing'} {verb if stale else 'to do: up to date'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
