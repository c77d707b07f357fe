#!/usr/bin/python3
"""Reproduces the memory-management results of the PagedAttention paper (Kwon et al., "Efficient Memory
Management for Large Language Model Serving with PagedAttention", SOSP 2023) with `kvpage simulate`: the real
scheduler, block manager and prefix cache, with the model's execution replaced by the roofline cost model
(Fig. 14's parallel sampling through `simulate --n`).
Fig. 15 (sharing under parallel sampling and beam search) runs a real model instead, stories260K on the CPU
(`kvpage generate`): a cost model makes no tokens to choose beams by.

Each experiment runs kvpage, writes its raw rows to OUT/<name>.csv, and compares what it measured with what
the paper published (OUT/claims.csv, and a table on stdout). With --check, the exit status is 1 when a
measurement falls outside the band stated for its claim (README.md says why each band is what it is).

Usage: papers/vllm-sosp23/reproduce.py [--kvpage build/kvpage] [--out DIR] [--check] [--compare CSV] [--plot]
"""
import argparse
import csv
import json
import math
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from claims import STYLES, Claims, Kvpage, add_arguments, model_name, write_csv  # noqa: E402 (papers/claims.py)
SHARED = os.path.join(HERE, "..", "..", "..", "shared")
OPT13B = os.path.join(SHARED, "data", "configs", "derived", "opt-13b.json")
LLAMA13B = os.path.join(HERE, "configs", "llama-13b.json")
# Table 1 of the paper: a 13B model on one A100-40GB keeps 12 GB for the KV cache, 15.7K token slots of 800 KB
# (12 GiB / 819,200 bytes = 15,728).
SETUP = ["--gpu", "A100-40G", "--kv-mem", "12GiB"]
# Fig. 15 needs beams, which a cost model does not make: a real model runs them (kvpage generate, CPU).
STORIES = os.path.join(SHARED, "models", "stories260K")
ALLOCS = ["orca-max", "orca-pow2", "orca-oracle", "paged"]
NAMES = {"orca-max": "Orca (Max)", "orca-pow2": "Orca (Pow2)", "orca-oracle": "Orca (Oracle)", "paged": "vLLM"}


class Runner(Kvpage):
    def simulate(self, model, workload, rate, alloc="paged", extra=()):
        """workload: a generator spec, or "trace:PATH" (a Mooncake JSONL file)."""
        src = ["--trace", workload[6:]] if workload.startswith("trace:") else ["--workload", workload]
        return json.loads(self.run(["simulate", "--model", model, *SETUP, *src, "--rate", str(rate), "--alloc", alloc,
                                    *extra, "--json"]))


def capacity(run, lo, factor=2.0, rel=0.01):
    """The request rate (req/s) an allocator sustains: the highest rate at which the mean normalized latency
    stays within `factor` times its value at the light load lo (req/s), found by bisection (hi doubles from
    4 lo until it fails). Above it the queue, and the latency, grow; the paper's Fig. 12 compares systems by
    the rates they sustain "while maintaining similar latencies". Returns (rate, [(rate, result), ...])."""
    tried = [(lo, run(lo))]
    limit = factor * tried[0][1]["norm_latency_s"]

    def ok(rate):
        tried.append((rate, run(rate)))
        return tried[-1][1]["norm_latency_s"] <= limit

    hi = 4 * lo
    while ok(hi):
        if hi > 1e4:
            sys.exit("reproduce: normalized latency still within %gx of its light-load value at %g req/s" % (factor, hi))
        lo, hi = hi, hi * 2
    while hi - lo > rel * lo:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried


def chatbot_trace(path, n, seed=1):
    """Fig. 17's requests as a Mooncake JSONL trace: the chat history cut to its last 1,024 tokens (the paper:
    most prompts reach that cut, so here all do), an answer of at most 1,024 tokens with ShareGPT's
    log-normal output length (mean 337.99, sigma 0.8, as kvpage's sharegpt generator), Poisson arrivals at
    1 req/s (kvpage rescales them), nothing shared (the paper keeps no KV between rounds)."""
    rng = random.Random(seed)
    mean, sigma = 337.99, 0.8
    mu = math.log(mean) - sigma * sigma / 2  # the log-normal's mean is exp(mu + sigma^2 / 2)
    t = 0.0
    with open(path, "w") as f:
        for i in range(n):
            t += rng.expovariate(1.0)
            out = min(1024, max(1, round(rng.lognormvariate(mu, sigma))))
            f.write(json.dumps({"timestamp": round(t * 1000), "input_length": 1024, "output_length": out,
                                "hash_ids": [2 * i, 2 * i + 1]}) + "\n")


def story_prompts(r, n, seed=1):
    """n requests of Alpaca's lengths, as kvpage's alpaca workload draws them: (text, max_tokens) pairs. The
    prompt (log-normal, mean 19.31 tokens, sigma 0.5, 4 to 60) is cut from the published 256-token story of
    stories260K at a random place, as text (newlines as spaces); the output is log-normal, mean 58.45, sigma
    0.8, at most 400 tokens."""
    with open(os.path.join(STORIES, "golden.json")) as f:
        story = next(c["tokens_after_bos"] for c in json.load(f)["cases"] if c["steps"] == 256)
    rng = random.Random(seed)
    cuts, outs = [], []
    for _ in range(n):
        k = max(4, min(60, round(rng.lognormvariate(math.log(19.31) - 0.5 ** 2 / 2, 0.5))))
        at = rng.randrange(len(story) - k)
        cuts.append(" ".join(map(str, story[at:at + k])))
        outs.append(max(1, min(400, round(rng.lognormvariate(math.log(58.45) - 0.8 ** 2 / 2, 0.8)))))
    out = r.run(["tokenize", "--tokenizer", os.path.join(STORIES, "stories260K.gguf"), "--decode", "--json"],
                "\n".join(cuts) + "\n")
    texts, dec, i = [], json.JSONDecoder(), 0  # one JSON object per prompt, one after another
    out = out.strip()
    while i < len(out):
        o, i = dec.raw_decode(out, i)
        texts.append(" ".join(o["text"].split()))
        while i < len(out) and out[i].isspace():
            i += 1
    return list(zip(texts, outs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap, HERE, "vllm_sosp23.png")
    ap.add_argument("--latency-factor", type=float, default=2.0,
                    help="a rate is sustained while the normalized latency stays within this factor of its "
                         "light-load value (default 2)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    r = Runner(a.kvpage)
    n_sg, n_al, n_px = 1000, 2000, 2000
    sharegpt, alpaca = "sharegpt:n=%d" % n_sg, "alpaca:n=%d" % n_al
    claim = Claims()

    # --- Fig. 2 and Fig. 13: every request queued at once, so each allocator runs the largest batch its
    # memory allows: the share of KV memory holding token states, and the mean batch.
    sat = {}
    rows = []
    for wl, spec in (("sharegpt", sharegpt), ("alpaca", alpaca)):
        for al in ALLOCS:
            d = r.simulate(OPT13B, spec, "inf", al)
            sat[wl, al] = d
            rows.append([wl, al, d["mean_running"], d["kv_token_states"], d["kv_reserved"], d["kv_internal_frag"],
                         d["kv_external_frag"], d["kv_free"], d["throughput_tok_s"]])
    write_csv(a.out, "saturation", ["workload", "alloc", "mean_running", "kv_token_states", "kv_reserved",
                                    "kv_internal_frag", "kv_external_frag", "kv_free", "throughput_tok_s"], rows)
    for al, pub in (("orca-max", 20.4), ("orca-pow2", 26.8), ("orca-oracle", 38.2), ("paged", 96.3)):
        m = sat["sharegpt", al]["kv_token_states"] * 100
        lo, hi = (90.0, 100.0) if al == "paged" else (pub - 5, pub + 5)
        claim("KV memory holding token states, %s (%%)" % NAMES[al], "Fig. 2", pub, m, lo, hi)
    # Fig. 13 bar labels (mean batched requests, OPT-13B): ShareGPT at 2 req/s, Alpaca at 30 req/s, where the
    # paper's systems ran at their memory limit; the text quotes the ShareGPT ratios (2.2x, 4.3x).
    for wl, pubs in (("sharegpt", (7.00, 9.81, 13.62, 30.42)), ("alpaca", (7.00, 43.24, 72.75, 132.44))):
        for al, pub in zip(ALLOCS, pubs):
            m = sat[wl, al]["mean_running"]
            claim("mean batched requests, %s, %s" % (wl, NAMES[al]), "Fig. 13", pub, m, pub * 0.8, pub * 1.25)
    for al, pub in (("orca-oracle", 2.2), ("orca-max", 4.3)):
        m = sat["sharegpt", "paged"]["mean_running"] / sat["sharegpt", al]["mean_running"]
        claim("batched requests, vLLM / %s, sharegpt (x)" % NAMES[al], "Fig. 13a, text", pub, m, pub * 0.8, pub * 1.25)

    # --- Fig. 12: the request rate each allocator sustains (capacity()), and the latency curves around it.
    cap = {}
    rows = []
    for wl, spec, lo in (("sharegpt", sharegpt, 0.25), ("alpaca", alpaca, 2.0)):
        for al in ALLOCS:
            cap[wl, al], tried = capacity(lambda rate: r.simulate(OPT13B, spec, rate, al), lo, a.latency_factor)
            rows += [[wl, al, rate, d["norm_latency_s"], d["mean_running"], d["preemptions"]] for rate, d in tried]
    write_csv(a.out, "rate_sweep", ["workload", "alloc", "rate", "norm_latency_s", "mean_running", "preemptions"],
              sorted(rows, key=lambda x: (x[0], x[1], x[2])))
    write_csv(a.out, "capacity", ["workload", "alloc", "req_per_s"], [[wl, al, c] for (wl, al), c in cap.items()])
    claim("sustained request rate, vLLM / Orca (Oracle), sharegpt (x)", "Fig. 12, text", "1.7-2.7",
          cap["sharegpt", "paged"] / cap["sharegpt", "orca-oracle"], 1.7, 2.7)
    claim("sustained request rate, vLLM / Orca (Max), sharegpt (x)", "Fig. 12, text", "2.7-8",
          cap["sharegpt", "paged"] / cap["sharegpt", "orca-max"], 2.7, 8.0)

    # --- Fig. 14, first row: parallel sampling on Alpaca. Each request fans out into n samples (simulate --n):
    # vLLM computes the prompt once and the samples share its full blocks (the prefix cache, as vLLM v1 forks
    # n > 1); each Orca sample reserves its own prompt + output. The rate counts requests, not samples. "paged"
    # without the cache is vLLM with every sample holding its own copy of the prompt: it isolates the sharing.
    rows = [[1, al, cap["alpaca", al]] for al in ALLOCS]
    for n in (2, 4, 6):
        runs = [(al, al, ()) for al in ALLOCS[:3]] + [("paged", "paged", ("--cache", "radix")),
                                                       ("paged-unshared", "paged", ())]  # (label, alloc, options)
        for label, al, extra in runs:
            key = "alpaca-n%d" % n, label
            cap[key], tried = capacity(lambda rate: r.simulate(OPT13B, alpaca, rate, al, ("--n", str(n)) + extra),
                                       2.0 / n, a.latency_factor)
            rows.append([n, label, cap[key]])
    write_csv(a.out, "parallel_sampling", ["n", "alloc", "req_per_s"], rows)
    for n in (2, 4, 6):
        for al in ALLOCS[:3]:
            claim("sustained request rate, vLLM / %s, alpaca, parallel n = %d (x)" % (NAMES[al], n), "Fig. 14a", ">1",
                  cap["alpaca-n%d" % n, "paged"] / cap["alpaca-n%d" % n, al], 1.0, float("inf"))
    for n in (2, 6):
        claim("sustained request rate, vLLM sharing the prompt / not, alpaca, n = %d (x)" % n, "Fig. 14a, Sec. 6.3",
              ">1", cap["alpaca-n%d" % n, "paged"] / cap["alpaca-n%d" % n, "paged-unshared"], 1.0, float("inf"))

    # --- Fig. 16: a translation workload whose prompts share a few-shot prefix (LLaMA-13B). vLLM keeps one copy
    # of the prefix (prefix cache); Orca (Oracle) stores it in every request's reservation.
    rows = []
    gain = {}
    for shots, prefix, pub in ((1, 80, 1.67), (5, 341, 3.58)):
        spec = "system:n=%d,prefix=%d,suffix=32,output=40,share=1" % (n_px, prefix)
        c = {}
        for al, extra in (("paged", ("--cache", "radix")), ("orca-oracle", ())):
            c[al], tried = capacity(lambda rate: r.simulate(LLAMA13B, spec, rate, al, extra), 1.0,
                                    a.latency_factor)
            rows.append([shots, prefix, al, c[al]])
        gain[shots] = c["paged"] / c["orca-oracle"]
        claim("throughput, vLLM / Orca (Oracle), %d-shot prefix of %d tokens (x)" % (shots, prefix), "Fig. 16, text",
              pub, gain[shots], 1.0, float("inf"))
    claim("throughput gain, 5-shot / 1-shot (x)", "Fig. 16, text", round(3.58 / 1.67, 2), gain[5] / gain[1], 1.0,
          float("inf"))
    write_csv(a.out, "shared_prefix", ["shots", "prefix_tokens", "alloc", "req_per_s"], rows)

    # --- Fig. 17: a chatbot whose prompts are the last 1,024 tokens of the conversation (OPT-13B).
    trace = os.path.join(a.out, "chatbot_trace.jsonl")
    chatbot_trace(trace, n_sg)
    rows = []
    for al in ALLOCS:
        cap["chatbot", al], tried = capacity(lambda rate: r.simulate(OPT13B, "trace:" + trace, rate, al), 0.1,
                                             a.latency_factor)
        rows.append(["chatbot", al, cap["chatbot", al]])
    os.remove(trace)
    write_csv(a.out, "chatbot", ["workload", "alloc", "req_per_s"], rows)
    for al in ALLOCS[:3]:
        claim("sustained request rate, vLLM / %s, chatbot (x)" % NAMES[al], "Fig. 17, text", 2.0,
              cap["chatbot", "paged"] / cap["chatbot", al], 1.2, 2.5)
    orca = [cap["chatbot", al] for al in ALLOCS[:3]]
    claim("sustained request rate, fastest / slowest Orca, chatbot (x)", "Fig. 17, text", "similar",
          max(orca) / min(orca), 1.0, 1.1)

    # --- Fig. 18b: block size at a fixed rate (90 % of what vLLM sustains with blocks of 16).
    rows = []
    lat = {}
    for wl, spec in (("sharegpt", sharegpt), ("alpaca", alpaca)):
        rate = round(0.9 * cap[wl, "paged"], 3)
        for bs in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            d = r.simulate(OPT13B, spec, rate, "paged", ("--block-size", str(bs)))
            lat[wl, bs] = d["norm_latency_s"]
            rows.append([wl, rate, bs, d["norm_latency_s"], d["mean_running"], d["preemptions"], d["kv_internal_frag"]])
    write_csv(a.out, "block_size", ["workload", "rate", "block_size", "norm_latency_s", "mean_running", "preemptions",
                                    "kv_internal_frag"], rows)
    best = min(lat["sharegpt", bs] for bs in (16, 32, 64, 128))
    claim("normalized latency, sharegpt, blocks of 256 / best of 16-128 (x)", "Fig. 18b, text", ">1",
          lat["sharegpt", 256] / best, 1.0, float("inf"))
    claim("normalized latency, alpaca, blocks of 128 / blocks of 16 (x)", "Fig. 18b, text", ">1",
          lat["alpaca", 128] / lat["alpaca", 16], 1.5, float("inf"))

    # --- Fig. 15: memory saved by sharing blocks (copy-on-write forks), parallel sampling and beam search.
    # Beams need a model: stories260K on the CPU (kvpage generate), 40 requests of Alpaca's lengths (prompts cut
    # from the model's story, each its own max_tokens through a .jsonl prompts file), blocks of 16. Saving = over
    # the decoding steps, the sequences' token slots that sharing kept from being stored twice / all their token
    # slots (kv_shared_savings_mean).
    prompts = os.path.join(a.out, "fig15_prompts.jsonl")
    with open(prompts, "w") as f:
        for text, n_out in story_prompts(r, 40):
            f.write(json.dumps({"prompt": text, "max_tokens": n_out}) + "\n")
    rows, save = [], {}
    pubs15 = {"parallel": (6.09, 8.53, 9.79), "beam": (37.56, 44.22, 55.16)}  # widths 2, 4, 6
    for mode, pubs in pubs15.items():
        for w, pub in zip((2, 4, 6), pubs):
            how = ["--n", str(w), "--temperature", "1", "--ignore-eos"] if mode == "parallel" else ["--beam-width", str(w)]
            d = json.loads(r.run(["generate", "--model", os.path.join(STORIES, "stories260K.gguf"), "--prompts-file",
                                  prompts, "--json", *how]))["totals"]
            save[mode, w] = d["kv_shared_savings_mean"] * 100
            rows.append([mode, w, pub, save[mode, w], d["kv_shared_savings"], d["kv_logical_tokens"]])
    os.remove(prompts)
    write_csv(a.out, "sharing", ["mode", "width", "published_pct", "saving_pct", "peak_shared_savings",
                                 "peak_logical_tokens"], rows)
    # The paper's claims are qualitative: sharing saves some memory with parallel sampling (the prompt's blocks)
    # and much more with beam search (the beams' common prefixes too), more as the width grows.
    for w, pub in zip((2, 4, 6), pubs15["parallel"]):
        claim("memory saving, parallel sampling, n = %d (%%)" % w, "Fig. 15", pub, save["parallel", w], 0.0,
              save["beam", w])
    for w, pub in zip((2, 4, 6), pubs15["beam"]):
        claim("memory saving, beam search, width %d (%%)" % w, "Fig. 15", pub, save["beam", w], save["parallel", w],
              100.0)
    for mode, pubs in pubs15.items():
        claim("memory saving, %s, width 6 / width 2 (x)" % mode, "Fig. 15", round(pubs[2] / pubs[0], 2),
              save[mode, 6] / save[mode, 2], 1.0, float("inf"))

    return claim.finish(a, r.runs, note=" (latency factor %g)" % a.latency_factor, plot=lambda: plot(a.out, sat))


def plot(out, sat):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sweep = list(csv.DictReader(open(os.path.join(out, "rate_sweep.csv"))))
    bsz = list(csv.DictReader(open(os.path.join(out, "block_size.csv"))))
    fig, ax = plt.subplots(2, 4, figsize=(20, 8))
    opt = model_name(OPT13B)
    for i, wl in enumerate(("sharegpt", "alpaca")):
        for k, al in enumerate(ALLOCS):
            pts = [(float(x["rate"]), float(x["norm_latency_s"])) for x in sweep if x["workload"] == wl and x["alloc"] == al]
            ax[i][0].plot([p[0] for p in pts], [p[1] for p in pts], marker=STYLES[k][0], ls=STYLES[k][1], ms=4,
                          mfc="none" if k % 2 else None, label=NAMES[al])
        ax[i][0].set(title="Fig. 12: %s, %s" % (opt, wl), xlabel="request rate (req/s)",
                     ylabel="normalized latency (s/token)", ylim=(0, 1))
        ax[i][0].legend()
        ax[i][1].bar([NAMES[al] for al in ALLOCS], [sat[wl, al]["mean_running"] for al in ALLOCS])
        ax[i][1].set(title="Fig. 13: mean batched requests, %s, %s" % (opt, wl))
        pts = [(int(x["block_size"]), float(x["norm_latency_s"])) for x in bsz if x["workload"] == wl]
        ax[i][2].plot([p[0] for p in pts], [p[1] for p in pts], "o-")
        ax[i][2].set(title="Fig. 18b: block size, %s, %s" % (opt, wl), xscale="log", xlabel="block size (tokens)",
                     ylabel="normalized latency (s/token)")
    par = list(csv.DictReader(open(os.path.join(out, "parallel_sampling.csv"))))
    for k, (al, name) in enumerate(list(NAMES.items()) + [("paged-unshared", "vLLM, prompt not shared")]):
        pts = [(int(x["n"]), float(x["req_per_s"])) for x in par if x["alloc"] == al]
        ax[0][3].plot([p[0] for p in pts], [p[1] for p in pts], marker=STYLES[k][0], ls=STYLES[k][1], ms=5,
                      mfc="none" if k % 2 else None, label=name)
    ax[0][3].set(title="Fig. 14a: parallel sampling, %s, alpaca" % opt, xlabel="samples per request (n)",
                 ylabel="sustained request rate (req/s)", yscale="log")
    ax[0][3].legend()
    shr = list(csv.DictReader(open(os.path.join(out, "sharing.csv"))))
    for k, mode in enumerate(("parallel", "beam")):
        pts = [(int(x["width"]), float(x["saving_pct"])) for x in shr if x["mode"] == mode]
        ax[1][3].bar([p[0] + (k - 0.5) * 0.8 for p in pts], [p[1] for p in pts], 0.8, label=mode)
    ax[1][3].set(title="Fig. 15: memory saved by sharing (stories260K)", xlabel="n or beam width",
                 ylabel="saving (%)", xticks=(2, 4, 6))
    ax[1][3].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "vllm_sosp23.png"), dpi=80)


if __name__ == "__main__":
    sys.exit(main())
