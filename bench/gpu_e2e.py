#!/usr/bin/env python3
"""bench/gpu_e2e.py — the arithmetic of bench/gpu_check.sh's end-to-end part (standard library only).

  gpu_e2e.py trace OUT.jsonl --requests R --prompt-len P --new-tokens N
      a Mooncake JSONL trace (runtime/workload/workload.h): R requests at time 0, P prompt tokens each with hash
      ids no two requests share (no prefix to reuse), N output tokens each.
  gpu_e2e.py golden GENERATE.json GOLDEN.json
      `kvpage generate --json`'s first sample against golden.json's "Once upon a time" case, token for token;
      prints "N/N tokens" and exits 0, or the first difference and exits 1.
  gpu_e2e.py report --dir DIR --out CSV [--copy-gbps X] [--peak-tflops F] [--machine M] [--commit C]
      reads DIR/sim_b<B>_<graphs|eager>.{json,steps.csv} (the 8B shape; sim_b<B>_det: with --deterministic, at
      --det-batches; sim_moe_b<B>_graphs: the --moe-config shape, at --moe-batches), DIR/prefill4096.{json,steps.csv}
      and DIR/hf_peer.json (JSON lines),
      writes one CSV row per run (kvpage: prefill tok/s = prompt tokens over the time of the steps that computed
      prompt tokens; decode tok/s = tokens over the time of the steps where all B sequences decode one token
      each; transformers: hf_peer.py's), then prints the memory split of the 8B shape and the ratios:
        batch-64 decode, kvpage over transformers;
        single-stream decode over its bandwidth bound: copy bandwidth / (weight bytes + KV bytes read per token);
        4,096-token prefill over the bf16 tensor-core peak: (2 x matmul weights + attention) FLOPs per second;
      and what --deterministic costs (its decode tok/s over the graphs run's) and the MoE shape's decode tok/s
      (no peer runs it: a figure, not a ratio).
      A run that is missing or failed is a row with status FAIL and its reason (DIR/<run>.err's last line).
"""
import argparse
import csv
import json
import os
import sys


def cmd_trace(a):
    blocks = (a.prompt_len + 511) // 512
    with open(a.out, "w") as f:
        for r in range(a.requests):
            ids = [r * blocks + j for j in range(blocks)]
            f.write(json.dumps({"timestamp": 0, "input_length": a.prompt_len, "output_length": a.new_tokens,
                                "hash_ids": ids}) + "\n")
    return 0


def cmd_golden(a):
    try:
        gen = json.load(open(a.generate))
        gold = json.load(open(a.golden))
        got = gen["requests"][0]["samples"][0]["tokens"]
        case = next(c for c in gold["cases"] if c["prompt"] == "Once upon a time")
    except (OSError, ValueError, KeyError, IndexError, StopIteration) as e:
        print(f"cannot read the tokens: {type(e).__name__}: {e}")
        return 1
    want = case["tokens_after_bos"][len(case["prompt_tokens"]) - 1:]
    for i, w in enumerate(want):
        if i >= len(got) or got[i] != w:
            print(f"token {i}: {got[i] if i < len(got) else 'none'}, golden {w} ({min(i, len(got))}/{len(want)} equal)")
            return 1
    print(f"{len(want)}/{len(want)} tokens")
    return 0


def err_of(d, name):
    p = os.path.join(d, name + ".err")
    try:
        lines = [ln.strip() for ln in open(p, errors="replace") if ln.strip()]
    except OSError:
        return "not run"
    return lines[-1][:200] if lines else "no output"


def read_steps(path):
    with open(path) as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def kvpage_run(d, name):
    """(the simulate JSON, prefill tok/s, decode tok/s, decode steps, fastest prefill step) of one run, or raises."""
    js = json.load(open(os.path.join(d, name + ".json")))
    steps = read_steps(os.path.join(d, name + ".steps.csv"))
    if not steps:
        raise ValueError("no steps")
    B = max(s["batch_seqs"] for s in steps)
    pre = [s for s in steps if s["batch_tokens"] > s["batch_seqs"]]
    dec = [s for s in steps if s["batch_tokens"] == s["batch_seqs"] == B]
    pre_tok = sum(s["batch_tokens"] for s in pre)
    pre_s = sum(s["step_s"] for s in pre)
    dec_tok = sum(s["batch_tokens"] for s in dec)
    dec_s = sum(s["step_s"] for s in dec)
    fastest = min(pre, key=lambda s: s["step_s"]) if pre else None
    return (js, pre_tok / pre_s if pre_s > 0 else None, dec_tok / dec_s if dec_s > 0 else None, len(dec), fastest)


def fmt(x, nd=1):
    return "" if x is None else f"{x:.{nd}f}"


def model_of(path):
    return os.path.basename(path).removesuffix(".json") if path else ""


def cmd_report(a):
    d = a.dir
    rows, split, res = [], None, {}
    m8b, mmoe = model_of(a.config), model_of(a.moe_config)
    runs = [(B, mode, f"sim_b{B}_{mode}", m8b) for B in a.batches for mode in ("graphs", "eager")]
    runs += [(B, "det", f"sim_b{B}_det", m8b) for B in a.det_batches]
    runs += [(B, "moe", f"sim_moe_b{B}_graphs", mmoe) for B in (a.moe_batches if a.moe_config else [])]
    for B, mode, name, model in runs:
        row = {"machine": a.machine, "commit": a.commit, "engine": a.engine, "model": model,
               "mode": {"det": "deterministic", "moe": "graphs"}.get(mode, mode), "batch": B, "prompt_len": a.prompt_len,
               "new_tokens": a.new_tokens}
        try:
            js, pre, dec, nd, _ = kvpage_run(d, name)
            if nd == 0:
                raise ValueError("no step decoded the whole batch")
            row.update(prefill_tok_s=fmt(pre), decode_tok_s=fmt(dec), decode_steps=nd, status="ok")
            res[(B, mode)] = (js, pre, dec)
            if split is None and mode != "moe" and isinstance(js.get("cuda"), dict):
                split = js["cuda"]
        except (OSError, ValueError, KeyError) as e:
            row.update(status=f"FAIL: {err_of(d, name) if isinstance(e, OSError) else e}")
        rows.append(row)
    hf = {}
    try:
        for ln in open(os.path.join(d, "hf_peer.json")):
            ln = ln.strip()
            if ln.startswith("{"):
                j = json.loads(ln)
                hf[j["batch"]] = j
    except (OSError, ValueError, KeyError):
        pass
    for B in a.batches:
        j = hf.get(B)
        row = {"machine": a.machine, "commit": a.commit, "engine": "transformers", "model": m8b, "mode": "eager",
               "batch": B, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens}
        if j and "error" not in j:
            row.update(prefill_tok_s=fmt(j["prefill_tok_s"]), decode_tok_s=fmt(j["decode_tok_s"]),
                       decode_steps=a.new_tokens - 1, status=f"ok (transformers {j.get('transformers')})")
        else:
            row.update(status=f"FAIL: {j['error'] if j else err_of(d, 'hf_peer')}")
        rows.append(row)
    pre4k = None
    try:
        js, _, _, _, fastest = kvpage_run(d, "prefill4096")
        if fastest is None or fastest["batch_tokens"] != 4096:
            raise ValueError("no step computed 4,096 prompt tokens")
        pre4k = (js, fastest)
        rows.append({"machine": a.machine, "commit": a.commit, "engine": a.engine, "model": m8b, "mode": "graphs",
                     "batch": 1, "prompt_len": 4096, "new_tokens": 2, "prefill_tok_s": fmt(4096 / fastest["step_s"]),
                     "status": "ok (fastest of the 4,096-token prefill steps)"})
    except (OSError, ValueError, KeyError) as e:
        rows.append({"machine": a.machine, "commit": a.commit, "engine": a.engine, "model": m8b, "mode": "graphs",
                     "batch": 1, "prompt_len": 4096, "new_tokens": 2,
                     "status": f"FAIL: {err_of(d, 'prefill4096') if isinstance(e, OSError) else e}"})
    fields = ["machine", "commit", "engine", "model", "mode", "batch", "prompt_len", "new_tokens", "prefill_tok_s",
              "decode_tok_s", "decode_steps", "status"]
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow(r)

    print(f"{'engine':<18} {'model':<20} {'mode':<13} {'batch':>5} {'prompt':>6} {'prefill tok/s':>14} "
          f"{'decode tok/s':>13}  status")
    for r in rows:
        print(f"{r['engine']:<18} {r['model'][:20]:<20} {r['mode']:<13} {r['batch']:>5} {r['prompt_len']:>6} "
              f"{r.get('prefill_tok_s', ''):>14} {r.get('decode_tok_s', ''):>13}  {r['status']}")
    G = 1024 ** 3
    if split:
        print(f"memory split of the 8B shape ({split.get('device', '?')}): total {split['total_bytes'] / G:.2f} GiB, "
              f"budget {split['budget_bytes'] / G:.2f} GiB (utilization {split['gpu_memory_utilization']}) = weights "
              f"{split['weights_bytes'] / G:.2f} + activations {split['activations_bytes'] / G:.2f} + KV "
              f"{split['kv_bytes'] / G:.2f} GiB ({split['num_blocks']} blocks of {split['kv_block_bytes']} bytes)")
    else:
        print("memory split of the 8B shape: FAIL (no run gave one)")

    k64, h64 = res.get((64, "graphs")), hf.get(64)
    if k64 and k64[2] and h64 and "error" not in h64:
        print(f"batch-64 decode, kvpage / transformers: {k64[2]:.1f} / {h64['decode_tok_s']:.1f} tok/s = "
              f"{k64[2] / h64['decode_tok_s']:.2f}x")
    else:
        print("batch-64 decode, kvpage / transformers: FAIL (" + ("no kvpage batch-64 decode" if not (k64 and k64[2])
                                                                else "no transformers batch-64 row") + ")")
    k1 = res.get((1, "graphs"))
    copy = a.copy_gbps or next((j.get("copy_gbps") for j in hf.values() if j.get("copy_gbps")), None)
    if k1 and k1[2] and copy:
        js = k1[0]
        wbytes = js["cuda"]["weights_bytes"] if isinstance(js.get("cuda"), dict) else js["weight_bytes_per_gpu"]
        kv_read = js["kv_bytes_per_token"] * (a.prompt_len + a.new_tokens / 2)  # the mean context of the decode steps
        bound = copy * 1e9 / (wbytes + kv_read)
        print(f"single-stream decode / bandwidth bound: {k1[2]:.1f} / {bound:.1f} tok/s = {100 * k1[2] / bound:.1f} % "
              f"(copy {copy:.0f} GB/s over {wbytes / 1e9:.2f} GB weights + {kv_read / 1e9:.3f} GB KV per token)")
    else:
        print("single-stream decode / bandwidth bound: FAIL (" + ("no batch-1 decode" if not (k1 and k1[2]) else
                                                               "no copy bandwidth measured") + ")")
    for B in a.det_batches:
        kd, kg = res.get((B, "det")), res.get((B, "graphs"))
        if kd and kd[2] and kg and kg[2]:
            print(f"--deterministic decode cost, batch {B}: {kd[2]:.1f} / {kg[2]:.1f} tok/s = {kd[2] / kg[2]:.2f}x of "
                  f"cuBLAS's")
        else:
            print(f"--deterministic decode cost, batch {B}: FAIL (no " + ("--deterministic" if not (kd and kd[2])
                                                                         else "graphs") + " decode)")
    if a.moe_config:
        got = [f"batch {B} {res[(B, 'moe')][2]:.1f}" for B in a.moe_batches if res.get((B, "moe")) and res[(B, "moe")][2]]
        print(f"{mmoe}-shaped decode (random weights, graphs; no peer): " +
              (", ".join(got) + " tok/s" if got else "FAIL (no run decoded)"))
    if pre4k:
        js, st = pre4k
        try:
            c = json.load(open(a.config))
            H, L, I = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
            nh, nkv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
            hd = c.get("head_dim") or H // nh
            T = 4096
            matmul = L * (H * (nh + 2 * nkv) * hd + nh * hd * H + 3 * H * I)  # weights of one token's GEMMs
            attn = L * 4 * nh * hd * T * (T + 1) / 2  # QK^T and PV over the causal prefix
            flops = 2 * matmul * T + attn + 2 * H * c["vocab_size"]  # + the one logits row
            tf = flops / st["step_s"] / 1e12
            print(f"4,096-token prefill / bf16 peak: {tf:.1f} / {a.peak_tflops:.0f} TFLOP/s = "
                  f"{100 * tf / a.peak_tflops:.1f} % ({flops / 1e12:.1f} TFLOP in {st['step_s'] * 1e3:.1f} ms)")
        except (OSError, ValueError, KeyError) as e:
            print(f"4,096-token prefill / bf16 peak: FAIL (config {a.config}: {e})")
    else:
        print("4,096-token prefill / bf16 peak: FAIL (no 4,096-token prefill step)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace")
    t.add_argument("out")
    t.add_argument("--requests", type=int, required=True)
    t.add_argument("--prompt-len", type=int, required=True)
    t.add_argument("--new-tokens", type=int, required=True)
    g = sub.add_parser("golden")
    g.add_argument("generate")
    g.add_argument("golden")
    r = sub.add_parser("report")
    r.add_argument("--dir", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--config", required=True, help="the 8B config.json (for the prefill FLOPs)")
    r.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64, 256])
    r.add_argument("--det-batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    r.add_argument("--moe-config", default=None, help="the MoE config.json of the sim_moe runs")
    r.add_argument("--moe-batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64])
    r.add_argument("--prompt-len", type=int, default=1024)
    r.add_argument("--new-tokens", type=int, default=64)
    r.add_argument("--copy-gbps", type=float, default=None, help="device copy bandwidth, bytes read + written")
    r.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 tensor-core peak (H200: 989)")
    r.add_argument("--engine", default="kvpage", help="the kvpage rows' engine label")
    r.add_argument("--machine", default="unknown")
    r.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    return {"trace": cmd_trace, "golden": cmd_golden, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
