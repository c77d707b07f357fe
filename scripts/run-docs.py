#!/usr/bin/python3
"""Runs the commands the documentation marks as runnable, so that README.md and docs/ cannot rot.

A runnable block is a fenced ```sh block right after the line `<!-- runnable -->` (blank lines between them are
allowed). Each block runs from the project root in `bash -eo pipefail`, as one script, and must exit 0 within
--timeout seconds. With --bin PATH, the block's `build/kvpage` becomes PATH (the kvpage under test). Blocks must
not change the source tree: `git status --porcelain` is compared before and after (when git is there), and a
block that leaves a new or modified file fails, as a benchmark writing into bench/results/ would.

Usage: scripts/run-docs.py [--bin build/kvpage] [--timeout S] [--list] [--only FILE:N] [FILE.md ...]
  (default files: README.md and docs/*.md). Exit 0 when every block passed, 1 when one failed, 2 for bad usage
  or a `<!-- runnable -->` marker with no ```sh block after it.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "<!-- runnable -->"


def blocks(path):
    """[(line number, text)] of the runnable blocks of one Markdown file; raises ValueError for a bad marker."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() != MARK:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j >= len(lines) or lines[j].strip() != "```sh":
            raise ValueError("%s:%d: %s is not followed by a ```sh block" % (path, i + 1, MARK))
        k = j + 1
        while k < len(lines) and lines[k].strip() != "```":
            k += 1
        if k >= len(lines):
            raise ValueError("%s:%d: the ```sh block is not closed" % (path, j + 1))
        out.append((j + 1, "\n".join(lines[j + 1:k])))
        i = k + 1
    return out


def git_status():
    try:
        p = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None
    return set(p.stdout.splitlines()) if p.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", help="Markdown files (default README.md docs/*.md)")
    ap.add_argument("--bin", help="the kvpage to run in place of build/kvpage")
    ap.add_argument("--timeout", type=float, default=180, help="seconds a block may take (default 180)")
    ap.add_argument("--list", action="store_true", help="print the blocks, run nothing")
    ap.add_argument("--only", metavar="FILE:LINE", help="run only the block that starts at that line")
    a = ap.parse_args()
    files = a.files or [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    todo = []
    for path in files:
        try:
            todo += [(os.path.relpath(path, ROOT), n, text) for n, text in blocks(path)]
        except (OSError, ValueError) as e:
            print("run-docs: %s" % e, file=sys.stderr)
            return 2
    if a.only:
        todo = [t for t in todo if "%s:%d" % (t[0], t[1]) == a.only]
        if not todo:
            print("run-docs: no runnable block starts at %s" % a.only, file=sys.stderr)
            return 2
    if not todo:
        print("run-docs: no runnable blocks in %s" % ", ".join(files), file=sys.stderr)
        return 2
    if a.list:
        for f, n, text in todo:
            print("== %s:%d\n%s" % (f, n, text))
        return 0
    binary = os.path.abspath(a.bin) if a.bin else None
    failed = 0
    for f, n, text in todo:
        script = text
        if binary:
            script = re.sub(r"(?<![\w/.-])build/kvpage\b", binary, script)
        before = git_status()
        t0 = time.monotonic()
        try:
            p = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=a.timeout)
            rc, output = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            rc, output = "timeout", (e.stdout or b"").decode("utf-8", "replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        wall = time.monotonic() - t0
        after = git_status()
        dirty = sorted(after - before) if before is not None and after is not None else []
        if rc == 0 and not dirty:
            print("run-docs: ok   %s:%d (%.1f s)" % (f, n, wall), flush=True)
            continue
        failed += 1
        why = "exit %s" % rc if rc != 0 else "changed the tree: %s" % ", ".join(dirty)
        print("run-docs: FAIL %s:%d (%s, %.1f s)\n---- block\n%s\n---- output (last 40 lines)\n%s\n----"
              % (f, n, why, wall, text, "\n".join(output.splitlines()[-40:])), flush=True)
    print("run-docs: %d of %d blocks passed" % (len(todo) - failed, len(todo)), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
