#!/usr/bin/python3
"""Reproduces the prefix-cache results of the Mooncake paper (Qin et al., "Mooncake: Trading More Storage for Less
Computation — A KVCache-centric Architecture for Serving LLM Chatbot", FAST 2025) on its released traces: the hit
rates under the cache capacities its Table 1 reports (1,000, 10,000, 50,000 blocks of 512 tokens, and unbounded),
for LRU and LFU, with Belady's bound and kvpage's other policies beside them, the one-pass LRU curve at every
capacity, where the misses come from, and what a host-memory tier behind a small device cache brings back.

Every number comes from `kvpage bench prefix` (the replay of bench/bench_prefix.h: radix cache, blocks of 512
tokens as the traces' hash ids) on ../shared/data/traces/mooncake/synthetic_trace.jsonl, and on any other trace in
the same format given with --trace (measured and written, not claimed). Each experiment writes OUT/<name>.csv;
OUT/claims.csv and the table on stdout compare the paper's statements with what was measured. With --check the
exit status is 1 when a measurement leaves its claim's band (README.md says why each band is what it is).

Usage: papers/mooncake-fast25/reproduce.py [--kvpage build/kvpage] [--out DIR] [--trace PATH ...] [--check]
                                           [--compare CSV] [--plot]
"""
import argparse
import csv
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from claims import Claims, Kvpage, add_arguments, write_csv  # noqa: E402 (papers/claims.py)
TRACES = os.path.join(HERE, "..", "..", "..", "shared", "data", "traces", "mooncake")
SYNTH = os.path.join(TRACES, "synthetic_trace.jsonl")
BLOCK = 512
TABLE1_CAPS = [1000, 10000, 50000, 0]  # 0: unbounded
# Table 1 of the paper (its trace, not released here): hit rates at 1,000 / 10,000 / 50,000 / unbounded blocks.
TABLE1 = {"lru": [0.30, 0.40, 0.48, 0.51], "lfu": [0.30, 0.35, 0.44, 0.51]}
POLICIES = ["lru", "lfu", "belady"]
DEVICE, HOSTS = 2000, [8000, 32000]  # a small device cache and host tiers behind it (blocks)


class Runner(Kvpage):
    def prefix(self, trace, args):
        """bench prefix over the trace as a sweep: (rows, curve rows)."""
        with tempfile.TemporaryDirectory() as d:
            out = self.json(["bench", "prefix", "--trace", "mooncake:" + trace, "--block-size", str(BLOCK), *args,
                             "--sweep", "--out", d, "--name", "s", "--no-plot", "--format", "json"])
            rows = list(csv.DictReader(open(os.path.join(d, "s.csv"))))
        return rows, out if "--curve" in args else []


def trace_stats(path):
    """Requests, mean lengths, and the share of block occurrences (and of tokens in them) whose hash id was seen
    before, read from the trace directly."""
    seen, n, inp, outp, blocks, rep, rep_tok, tok = set(), 0, 0, 0, 0, 0, 0, 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            o = json.loads(line)
            n += 1
            inp += o["input_length"]
            outp += o["output_length"]
            ids = o["hash_ids"]
            for i, h in enumerate(ids):
                t = min(BLOCK, o["input_length"] - i * BLOCK)
                blocks += 1
                tok += t
                if h in seen:
                    rep += 1
                    rep_tok += t
            seen.update(ids)
    return {"requests": n, "mean_input": inp / n, "mean_output": outp / n, "blocks": blocks,
            "repeated_blocks": rep / blocks, "repeated_tokens": rep_tok / tok}


def num(row, k):
    return float(row[k])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap, HERE, "mooncake_fast25.png")
    ap.add_argument("--trace", action="append", default=[], help="another Mooncake-format trace (repeatable)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    r = Runner(a.kvpage)
    claim = Claims()

    # --- the trace itself, against its release README
    st = trace_stats(SYNTH)
    claim("synthetic trace: requests", "release README", 3993, st["requests"], 3993, 3993)
    claim("synthetic trace: mean input length (tokens)", "release README", 15325, st["mean_input"], 15324.5, 15326.5)
    claim("synthetic trace: mean output length (tokens)", "release README", 149, st["mean_output"], 148.5, 149.5)

    # --- Table 1's capacities, every policy, the one-pass curve
    table, curves = [], []
    for path in [SYNTH] + a.trace:
        name = os.path.basename(path)
        rows, curve = r.prefix(path, ["--evict", ",".join(POLICIES), "--capacity", ",".join(map(str, TABLE1_CAPS)),
                                      "--curve", "--curve-points", "100"])
        for x in rows:
            table.append([name, x["evict"], int(num(x, "capacity")), num(x, "hit_rate"), num(x, "block_hit_rate"),
                          num(x, "belady_hit_rate"), num(x, "regret_belady"), int(num(x, "evicted_blocks")),
                          int(num(x, "miss_cold_tokens")), int(num(x, "miss_evicted_tokens")),
                          int(num(x, "miss_partial_tokens")), int(num(x, "miss_last_token_tokens")),
                          int(num(x, "prompt_tokens"))])
        curves += [[name, int(c["capacity"]), c["hit_tokens"], c["hit_rate"], c["stack_hit_rate"], c["exact"]] for c in curve]
        if path != SYNTH:
            continue
        hr = {(x["evict"], int(num(x, "capacity"))): num(x, "hit_rate") for x in rows}
        ht = {int(num(x, "capacity")): int(num(x, "hit_tokens")) for x in rows if x["evict"] == "lru"}
        bhr = {int(num(x, "capacity")): num(x, "block_hit_rate") for x in rows if x["evict"] == "lru"}
        # the curve's hit tokens at a capacity: its row there, or beyond its distinct blocks the unbounded row
        distinct = int(curve[0]["distinct_blocks"])
        cv = {int(c["capacity"]): int(c["hit_tokens"]) for c in curve}
        unb = hr["lru", 0]
        for k, cap in enumerate(TABLE1_CAPS):
            label = "unbounded" if cap == 0 else "%d blocks" % cap
            for pol in ("lru", "lfu"):
                claim("hit rate, %s, %s (%%)" % (pol.upper(), label), "Table 1 (its trace)", 100 * TABLE1[pol][k],
                      100 * hr[pol, cap], 0.0, 100.0)
            at = cap if 0 < cap <= distinct else 0
            claim("one-pass LRU curve - LRU replay, %s (hit tokens)" % label, "(ours)", 0, cv.get(at, -1) - ht[cap], 0.0, 0.0)
        claim("an unbounded cache hits the trace's repeated blocks: block hit rate - repeated share (points)",
              "(the trace)", 0, 100 * (bhr[0] - st["repeated_blocks"]), -0.5, 0.0)
        claim("hit rate rises with capacity: LRU unbounded / LRU at 1,000 blocks (x)", "Table 1", round(0.51 / 0.30, 2),
              unb / hr["lru", 1000], 1.0, float("inf"))
        claim("LRU at 50,000 blocks / unbounded (%)", "Table 1", round(100 * 0.48 / 0.51, 1), 100 * hr["lru", 50000] / unb,
              90.0, 100.0)
        for cap in (10000, 50000):
            claim("LRU - LFU at %d blocks (points)" % cap, "Table 1", round(100 * (TABLE1["lru"][TABLE1_CAPS.index(cap)] -
                                                                          TABLE1["lfu"][TABLE1_CAPS.index(cap)]), 1),
                  100 * (hr["lru", cap] - hr["lfu", cap]), 0.0, 100.0)
        claim("Belady - LRU at 10,000 blocks (points)", "(ours)", ">= 0", 100 * (hr["belady", 10000] - hr["lru", 10000]),
              0.0, 100 * (unb - hr["lru", 10000]))
    write_csv(a.out, "table1", ["trace", "evict", "capacity_blocks", "hit_rate", "block_hit_rate", "belady_hit_rate",
                                "regret_belady", "evicted_blocks", "miss_cold_tokens", "miss_evicted_tokens",
                                "miss_partial_tokens", "miss_last_token_tokens", "prompt_tokens"], table)
    write_csv(a.out, "curve", ["trace", "capacity_blocks", "hit_tokens", "hit_rate", "stack_hit_rate", "exact"], curves)

    # --- a host tier behind a small device cache: more storage, less computation
    rows, _ = r.prefix(SYNTH, ["--capacity", str(DEVICE), "--host-capacity", "0," + ",".join(map(str, HOSTS)),
                               "--host-write-policy", "write_through,write_back", "--no-regret"])
    rows += r.prefix(SYNTH, ["--capacity", ",".join(map(str, HOSTS)), "--no-regret"])[0]
    tier = []
    dev = {int(num(x, "capacity")): num(x, "total_hit_rate") for x in rows if num(x, "host_capacity") == 0}
    tot = {}
    for x in rows:
        cap, host = int(num(x, "capacity")), int(num(x, "host_capacity"))
        if cap != DEVICE:
            continue
        pol = x["host_write_policy"] or "none"
        tot[host, pol] = num(x, "total_hit_rate")
        tier.append([cap, host, pol, num(x, "hit_rate"), num(x, "host_hit_rate"), num(x, "total_hit_rate"),
                     int(num(x, "host_stored_blocks")), int(num(x, "miss_host_tokens")), int(num(x, "miss_evicted_tokens"))])
    write_csv(a.out, "host_tier", ["device_blocks", "host_blocks", "write_policy", "device_hit_rate", "host_hit_rate",
                                   "total_hit_rate", "host_stored_blocks", "miss_host_tokens", "miss_evicted_tokens"], tier)
    for host in HOSTS:
        claim("device %d + host %d blocks, write-through, total - device %d alone (points)" % (DEVICE, host, host),
              "Sec. 1 (storage for computation)", 0, 100 * (tot[host, "write_through"] - dev[host]), -1.0, 1.0)
        claim("device %d + host %d blocks: hits the tier adds (points)" % (DEVICE, host), "Sec. 1", "> 0",
              100 * (tot[host, "write_through"] - dev[DEVICE]), 0.0, 100.0)
        claim("write-back - write-through total hit rate, host %d blocks (points)" % host, "(ours)", ">= 0",
              100 * (tot[host, "write_back"] - tot[host, "write_through"]), 0.0, 100.0)

    return claim.finish(a, r.runs, fmt="%.4g", plot=lambda: plot(a.out))


def plot(out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tab = [x for x in csv.DictReader(open(os.path.join(out, "table1.csv"))) if x["trace"] == "synthetic_trace.jsonl"]
    cur = [x for x in csv.DictReader(open(os.path.join(out, "curve.csv"))) if x["trace"] == "synthetic_trace.jsonl"]
    tier = list(csv.DictReader(open(os.path.join(out, "host_tier.csv"))))
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.3))
    pts = sorted((int(c["capacity_blocks"]), 100 * float(c["hit_rate"])) for c in cur if int(c["capacity_blocks"]) > 0)
    ax[0].step([p[0] for p in pts], [p[1] for p in pts], where="post", color="black", lw=0.9, label="LRU, one pass")
    for k, pol in enumerate(POLICIES):
        p = sorted((int(x["capacity_blocks"]), 100 * float(x["hit_rate"])) for x in tab if x["evict"] == pol
                   and int(x["capacity_blocks"]) > 0)
        ax[0].plot([q[0] for q in p], [q[1] for q in p], "osD^v"[k] + ["-", "--", "-.", ":", "-"][k], ms=6,
                   mfc="none" if k % 2 == 0 else None, label=pol)
    for pol, vals in TABLE1.items():
        ax[0].plot(TABLE1_CAPS[:3], [100 * v for v in vals[:3]], "x:", color="gray", label="paper, %s (its trace)" % pol.upper())
    unb = next(100 * float(x["hit_rate"]) for x in tab if x["evict"] == "lru" and int(x["capacity_blocks"]) == 0)
    ax[0].axhline(unb, color="gray", ls="--", lw=0.8)
    ax[0].annotate("unbounded: %.1f %%" % unb, (2, unb), xytext=(0, 3), textcoords="offset points", fontsize=7)
    ax[0].set(xscale="log", xlabel="cache capacity (blocks of 512 tokens)", ylabel="prefix hit rate (%)",
              title="Table 1's capacities, synthetic trace", ylim=(0, 100))
    ax[0].legend(fontsize=7)
    for k, pol in enumerate(("write_through", "write_back")):
        p = [(int(x["host_blocks"]), 100 * float(x["total_hit_rate"]), 100 * float(x["device_hit_rate"])) for x in tier
             if x["write_policy"] == pol]
        ax[1].bar([i + (k - 0.5) * 0.35 for i in range(len(p))], [q[1] for q in p], 0.35, label="total, " + pol)
    base = next(100 * float(x["total_hit_rate"]) for x in tier if x["write_policy"] == "none")
    ax[1].axhline(base, color="black", lw=0.8, label="device %d blocks alone" % DEVICE)
    ax[1].axhline(unb, color="gray", ls="--", lw=0.8, label="unbounded")
    ax[1].set(xticks=range(len(HOSTS)), xticklabels=["host %d" % h for h in HOSTS], ylabel="hit rate, device + host (%)",
              title="a host tier behind %d device blocks" % DEVICE, ylim=(0, 100))
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "mooncake_fast25.png"), dpi=90)


if __name__ == "__main__":
    sys.exit(main())
