#!/usr/bin/python3
"""What every reproduction in papers/ shares: running kvpage, writing its CSV files (build/results/<paper>/, or
--out), and the claims table.

A claim is one statement of a paper beside what kvpage measured: (claim, figure, published, measured, band_lo,
band_hi). A reproduction collects them (Claims), then Claims.finish writes OUT/claims.csv, prints the table on
stdout (a row ends in "| ok |" or "| OUTSIDE |") and a summary on stderr, and returns the exit status: 1 under
--check when a measurement is outside its band, or under --compare when the claims measured now are not those of
a committed claims.csv (each within 1 %, the same claims); 2 when that file cannot be read, or --plot finds no
matplotlib.

As a command, `papers/claims.py MEASURED_CSV COMMITTED_CSV` makes the --compare test between two claims files
(a fresh OUT/claims.csv and the committed results/claims.csv): one line per difference on stderr, exit 1 when
there is any, 2 for a file that cannot be read.
"""
import argparse
import csv
import json
import os
import subprocess
import sys

HEADER = ["claim", "figure", "published", "measured", "band_lo", "band_hi", "within"]


class Kvpage:
    """The kvpage program: run() returns a command's stdout and exits the script with kvpage's error when it
    fails; runs counts the commands."""

    def __init__(self, path):
        self.path = path
        self.runs = 0

    def run(self, args, stdin=None):
        cmd = [self.path, *args]
        try:
            p = subprocess.run(cmd, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except OSError as e:
            sys.exit("reproduce: cannot run %s: %s" % (self.path, e.strerror))
        if p.returncode != 0:
            sys.exit("reproduce: %s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()[-500:]))
        self.runs += 1
        return p.stdout

    def json(self, args, stdin=None):
        return json.loads(self.run(args, stdin))


def model_name(config):
    """A model as its config.json names it ("_name_or_path", e.g. facebook/opt-13b), else the file's stem: for
    plot titles."""
    try:
        with open(config) as f:
            name = json.load(f).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        name = None
    return name or os.path.splitext(os.path.basename(config))[0]


# Distinct (marker, line style) pairs, so that lines which coincide stay visible.
STYLES = [("o", "-"), ("s", "--"), ("D", "-."), ("^", ":"), ("v", (0, (5, 1, 1, 1)))]


def write_csv(out, name, header, rows):
    """OUT/<name>.csv with a header line."""
    with open(os.path.join(out, name + ".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_out(here):
    """Where a reproduction writes without --out: build/results/<paper>/ under the project root, so a run never
    changes the committed papers/<paper>/results/ unless asked (--out papers/<paper>/results)."""
    return os.path.join(ROOT, "build", "results", os.path.basename(os.path.normpath(here)))


def add_arguments(ap, here, png):
    """The options every reproduce.py has: --kvpage, --out (default build/results/<paper>), --check, --compare,
    --plot."""
    ap.add_argument("--kvpage", default="build/kvpage", help="the kvpage program (default build/kvpage)")
    ap.add_argument("--out", default=default_out(here),
                    help="where the CSV files go (default build/results/%s; --out %s updates the committed "
                         "results)" % (os.path.basename(os.path.normpath(here)),
                                       os.path.relpath(os.path.join(here, "results"), ROOT)))
    ap.add_argument("--check", action="store_true", help="exit 1 when a claim's measurement is outside its band")
    ap.add_argument("--compare", metavar="CLAIMS_CSV",
                    help="exit 1 unless the claims measured now are those of this file (a committed claims.csv), "
                         "each within 1 %%")
    ap.add_argument("--plot", action="store_true", help="also draw OUT/%s (matplotlib)" % png)


def read_claims(path):
    """{claim: measured} of a claims.csv."""
    with open(path, newline="") as f:
        return {row["claim"]: float(row["measured"]) for row in csv.DictReader(f)}


def differences(now, old, path):
    """The differences between claims measured now and those of the file path ({claim: measured} each): a value
    that moved by more than 1 %, a claim missing on either side. One line each."""
    diffs = ["%s: measured %.4g here, %.4g in %s" % (t, now[t], old[t], path)
             for t in now if t in old and abs(now[t] - old[t]) > 0.01 * abs(old[t]) + 1e-9]
    diffs += ["%s: not in %s" % (t, path) for t in now if t not in old]
    diffs += ["%s: in %s, not measured" % (t, path) for t in old if t not in now]
    return diffs


class Claims:
    """The claims of one reproduction, in the order they are made."""

    def __init__(self):
        self.rows = []

    def __call__(self, text, figure, published, measured, lo, hi):
        self.rows.append((text, figure, published, measured, lo, hi))

    def finish(self, a, runs, fmt="%.3g", note="", plot=None):
        """Writes a.out/claims.csv, prints the table (measurements as fmt) and the summary (runs kvpage commands,
        then note), draws the plot under --plot (plot(), when given), and returns the exit status."""
        try:  # before OUT/claims.csv is written: it may be that file
            old = read_claims(a.compare) if a.compare else None
        except (OSError, KeyError, ValueError) as e:
            print("reproduce: --compare: cannot read %s: %s" % (a.compare, e), file=sys.stderr)
            return 2
        rows = [[t, f, p, m, lo, hi, lo <= m <= hi] for t, f, p, m, lo, hi in self.rows]
        write_csv(a.out, "claims", HEADER, [row[:3] + ["%.4g" % x for x in row[3:6]] + row[6:] for row in rows])
        print("| claim | paper | published | kvpage | band | |")
        print("|---|---|---|---|---|---|")
        for t, f, p, m, lo, hi, within in rows:
            print(("| %s | %s | %s | " + fmt + " | %.3g-%s | %s |")
                  % (t, f, p, m, lo, "inf" if hi == float("inf") else "%.3g" % hi, "ok" if within else "OUTSIDE"))
        bad = sum(not row[6] for row in rows)
        print("reproduce: %d kvpage runs, %d of %d claims within their bands%s" % (runs, len(rows) - bad, len(rows), note),
              file=sys.stderr)
        plot_failed = 0
        if a.plot and plot:
            try:
                plot()
            except ImportError as e:
                print("reproduce: --plot: %s (pip install matplotlib)" % e, file=sys.stderr)
                plot_failed = 1
        stale = 0
        if old is not None:
            diffs = differences({t: m for t, f, p, m, lo, hi in self.rows}, old, a.compare)
            for d in diffs:
                print("reproduce: " + d, file=sys.stderr)
            stale = len(diffs)
        return 1 if (a.check and bad) or stale else 2 if plot_failed else 0


def main():
    ap = argparse.ArgumentParser(description="Compares two claims files: exit 1 when they differ (a value by more "
                                             "than 1 %, or a claim missing from either)")
    ap.add_argument("measured", help="a fresh claims.csv (reproduce.py --out DIR writes DIR/claims.csv)")
    ap.add_argument("committed", help="the claims.csv to compare with (results/claims.csv)")
    a = ap.parse_args()
    try:
        now, old = read_claims(a.measured), read_claims(a.committed)
    except (OSError, KeyError, ValueError) as e:
        print("claims: cannot read the claims files: %s" % e, file=sys.stderr)
        return 2
    diffs = differences(now, old, a.committed)
    for d in diffs:
        print("claims: " + d, file=sys.stderr)
    print("claims: %d claims, %d differences" % (len(now), len(diffs)), file=sys.stderr)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
