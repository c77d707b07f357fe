#!/usr/bin/python3
"""bench/plot.py — one line plot from a benchmark CSV (kvpage bench ... writes the CSV, this draws the PNG).

Generic: choose the x column, the y column, an optional group-by column (one line per distinct value, in
order of first appearance) and a log x axis. Rows whose x or y is not a number are skipped; with --logx,
rows with x <= 0 are skipped too.

  /usr/bin/python3 bench/plot.py --csv bench/results/prefix_x.csv --x capacity_eff --y hit_rate \
      --group series --logx --out bench/results/prefix_x.png
"""
import argparse
import csv
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", required=True, help="input CSV with a header row")
    ap.add_argument("--x", required=True, help="x column")
    ap.add_argument("--y", required=True, help="y column")
    ap.add_argument("--group", help="one line per distinct value of this column")
    ap.add_argument("--logx", action="store_true", help="logarithmic x axis")
    ap.add_argument("--logy", action="store_true", help="logarithmic y axis")
    ap.add_argument("--title", default="")
    ap.add_argument("--xlabel")
    ap.add_argument("--ylabel")
    ap.add_argument("--out", required=True, help="output PNG")
    a = ap.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not installed", file=sys.stderr)
        return 3

    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    for col in [a.x, a.y] + ([a.group] if a.group else []):
        if rows and col not in rows[0]:
            print(f"plot.py: {a.csv} has no column '{col}'", file=sys.stderr)
            return 2
    series = {}
    for r in rows:
        try:
            x, y = float(r[a.x]), float(r[a.y])
        except (TypeError, ValueError):
            continue
        if a.logx and x <= 0:
            continue
        series.setdefault(r[a.group] if a.group else a.y, []).append((x, y))
    if not series:
        print(f"plot.py: no numeric ({a.x}, {a.y}) points in {a.csv}", file=sys.stderr)
        return 2

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    markers = "os^vDP*Xh<>"
    for i, (name, pts) in enumerate(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)], markersize=4,
                label=name)
    if a.logx:
        ax.set_xscale("log")
    if a.logy:
        ax.set_yscale("log")
    ax.set_xlabel(a.xlabel or a.x)
    ax.set_ylabel(a.ylabel or a.y)
    if a.title:
        ax.set_title(a.title)
    ax.grid(True, which="both", alpha=0.3)
    if a.group:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
