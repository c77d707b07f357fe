#!/usr/bin/python3
"""bench/plot.py - turn a benchmark CSV (common/report.h layout) into a PNG. Called by `kvpage bench ...`
(through bench/plot.c) with /usr/bin/python3 and Debian's python3-matplotlib.

  plot.py stacked CSV PNG --label COL --stack A,B,C [--line COL] [--title T] [--ylabel Y]
      one stacked bar per row (labelled by COL) of the share columns A, B, C (values in [0, 1], shown in %),
      in the style of the PagedAttention paper's Figure 2; --line adds a second axis with one more column
      (e.g. the mean number of running requests) as markers.
  plot.py lines CSV PNG --x COL --y COL[,COL...] [--series COL] [--logx] [--logy] [--in-order]
                   [--annotate COL] [--title T] [--xlabel X] [--ylabel Y]
      one line per distinct value of --series (in order of first appearance) and --y column; rows whose x or
      y is not a number are skipped, and on a log axis points <= 0 too. Points are joined in x order, or in
      row order with --in-order (a latency-throughput curve: throughput falls back past saturation);
      --annotate writes that column's value beside each point of the last line.
  plot.py prefix CSV PNG [--curve CURVE_CSV] [--tokens] [--title T]
      `kvpage bench prefix` sweeps: total_hit_rate against capacity, one line per series, each with its own
      marker and line style (radix and hash often coincide: both stay visible); capacity in blocks, as
      --capacity takes it (--tokens: capacity_tokens, for --capacity-tokens sweeps). Unbounded rows
      (capacity 0) are labelled horizontal lines, not points. The gap to Belady at the same capacity
      (belady_hit_rate) is shaded under it. --curve adds the one-pass LRU curve (every capacity) as a thin line.
"""
import argparse
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def stacked(a, rows):
    cols = a.stack.split(",")
    for c in cols + [a.label] + ([a.line] if a.line else []):
        if rows and c not in rows[0]:
            sys.exit(f"plot.py: no column '{c}' in {a.csv}")
    labels = [r[a.label] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows) + 2), 4.5))
    bottom = [0.0] * len(rows)
    colors = ["#2b6cb0", "#f6ad55", "#e53e3e", "#805ad5", "#a0aec0", "#68d391", "#d69e2e"]
    for i, c in enumerate(cols):
        vals = [100.0 * num(r[c]) for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=c.replace("_", " "), color=colors[i % len(colors)],
               edgecolor="white", linewidth=0.5)
        if i == 0:
            for x, v in enumerate(vals):
                ax.text(x, v / 2, f"{v:.1f}", ha="center", va="center", fontsize=7, color="white")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylim(0, 100)
    ax.set_ylabel(a.ylabel or "KV cache memory (%)")
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    handles, names = ax.get_legend_handles_labels()
    if a.line:
        ax2 = ax.twinx()
        ax2.plot(labels, [num(r[a.line]) for r in rows], "ko--", markersize=4, linewidth=1)
        ax2.set_ylabel(a.line.replace("_", " "))
        ax2.set_ylim(bottom=0)
        handles.append(plt.Line2D([], [], color="k", marker="o", linestyle="--"))
        names.append(a.line.replace("_", " "))
    ax.legend(handles, names, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=4)
    if a.title:
        ax.set_title(a.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.png, dpi=130)


def lines(a, rows):
    ys = a.y.split(",")
    for c in [a.x] + ys + [c for c in (a.series, a.annotate) if c]:
        if c not in rows[0]:
            sys.exit(f"plot.py: no column '{c}' in {a.csv}")
    series = {}
    for r in rows:
        for yc in ys:
            x, y = num(r[a.x]), num(r[yc])
            if x != x or y != y or (a.logx and x <= 0) or (a.logy and y <= 0):
                continue
            name = " ".join(n for n in [r[a.series] if a.series else "", yc.replace("_", " ") if len(ys) > 1 else ""] if n)
            series.setdefault(name, []).append((x, y, r[a.annotate] if a.annotate else ""))
    if not series:
        sys.exit(f"plot.py: no numeric ({a.x}, {a.y}) points in {a.csv}")
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    markers = "os^vDP*Xh<>"
    for i, (name, pts) in enumerate(series.items()):
        if not a.in_order:
            pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", marker=markers[i % len(markers)],
                label=name or a.y, markersize=3)
    for x, y, text in pts if a.annotate else []:
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if a.logx:
        ax.set_xscale("log", base=2)
    if a.logy:
        ax.set_yscale("log")
    ax.set_xlabel(a.xlabel or a.x.replace("_", " "))
    ax.set_ylabel(a.ylabel or a.y.replace("_", " "))
    ax.grid(alpha=0.3)
    if len(series) > 1 or a.series:
        ax.legend(fontsize=8)
    if a.title:
        ax.set_title(a.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.png, dpi=130)


MARKERS = "osD^vP*Xh<>"
STYLES = ["-", "--", "-.", ":"]


def prefix(a, rows):
    for c in ("series", "capacity", "total_hit_rate", "belady_hit_rate"):
        if c not in rows[0]:
            sys.exit(f"plot.py prefix: no column '{c}' in {a.csv}")
    xcol = "capacity_tokens" if a.tokens else "capacity"
    series, unbounded = {}, {}
    for r in rows:
        x, y, b = num(r[xcol]), num(r["total_hit_rate"]), num(r["belady_hit_rate"])
        if num(r["capacity"]) == 0:
            unbounded.setdefault(round(y, 6), []).append(r["series"])
        elif x > 0 and y == y:
            series.setdefault(r["series"], []).append((x, y, b))
    curves = {}
    if a.curve:
        for r in read_rows(a.curve):
            x = num(r["capacity_tokens" if a.tokens else "capacity"])
            if num(r["capacity"]) > 0 and x > 0:
                curves.setdefault(r["series"], []).append((x, num(r["hit_rate"])))
    if not series and not curves:
        sys.exit(f"plot.py prefix: no bounded rows in {a.csv}")
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    xs = [p[0] for pts in series.values() for p in pts] + [p[0] for pts in curves.values() for p in pts]
    for i, (name, pts) in enumerate(series.items()):
        pts.sort()
        x, y, b = [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]
        col = colors[i % len(colors)]
        ax.plot(x, y, STYLES[i % len(STYLES)], marker=MARKERS[i % len(MARKERS)], color=col, label=name,
                markersize=7 - 4 * (i % 2), markerfacecolor="none" if i % 2 == 0 else col, linewidth=1.2)
    # regret: per cache (and block size / host tier), the band from the best online policy up to belady
    groups = {}
    for name, pts in series.items():
        parts = name.split("/")
        if len(parts) < 2 or parts[1] == "belady":
            continue
        g = groups.setdefault("/".join([parts[0]] + parts[2:]), {})
        for x, y, b in pts:
            best, bel = g.get(x, (-1.0, b))
            g[x] = (max(best, y), bel)
    for k, (gname, g) in enumerate(sorted(groups.items())):
        xs_g = sorted(g)
        lo, hi = [g[x][0] for x in xs_g], [g[x][1] for x in xs_g]
        if len(xs_g) > 1 and any(h > l for l, h in zip(lo, hi)):
            ax.fill_between(xs_g, lo, hi, color=colors[(k + 3) % len(colors)], alpha=0.13, linewidth=0,
                            label=f"{gname}: gap of the best policy to Belady")
    for name, pts in curves.items():
        pts.sort()
        ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", color="black", linewidth=0.8, alpha=0.8,
                label=name + " (one pass, every capacity)")
    for j, (y, names) in enumerate(sorted(unbounded.items())):
        ax.axhline(y, color="gray", linestyle=STYLES[(j + 1) % len(STYLES)], linewidth=0.9)
        label = "unbounded" + ("" if len(unbounded) == 1 else " (" + ", ".join(sorted(set(names))) + ")")
        ax.annotate(f"{label}: {100 * y:.1f} %", (min(xs) if xs else 1, y), textcoords="offset points",
                    xytext=(2, 3), fontsize=7, color="dimgray")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cache capacity (tokens)" if a.tokens else "cache capacity (blocks)")
    ax.set_ylabel("prefix hit rate (share of prompt tokens)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(series) + len(curves) > 6 else 1)
    title = a.title or ""
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(a.png, dpi=130)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=["stacked", "lines", "prefix"])
    p.add_argument("csv")
    p.add_argument("png")
    p.add_argument("--label")
    p.add_argument("--stack")
    p.add_argument("--line")
    p.add_argument("--x")
    p.add_argument("--y")
    p.add_argument("--series")
    p.add_argument("--logx", action="store_true")
    p.add_argument("--logy", action="store_true")
    p.add_argument("--in-order", action="store_true")
    p.add_argument("--annotate")
    p.add_argument("--title")
    p.add_argument("--xlabel")
    p.add_argument("--ylabel")
    p.add_argument("--curve")
    p.add_argument("--tokens", action="store_true")
    a = p.parse_args()
    rows = read_rows(a.csv)
    if not rows:
        sys.exit(f"plot.py: {a.csv} has no rows")
    if a.kind == "prefix":
        prefix(a, rows)
    elif a.kind == "stacked":
        if not a.label or not a.stack:
            sys.exit("plot.py stacked: --label and --stack are required")
        stacked(a, rows)
    else:
        if not a.x or not a.y:
            sys.exit("plot.py lines: --x and --y are required")
        lines(a, rows)


if __name__ == "__main__":
    main()
