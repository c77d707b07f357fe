#!/usr/bin/env python3
"""bench/sdpa_peer.py — the PyTorch peer of `kvpage bench attention-cuda`: the same decode (and prefill) through
torch.nn.functional.scaled_dot_product_attention on contiguous K/V, timed with CUDA events in the same run as
bench/gpu_check.sh's kernel benchmark. CSV to stdout (machine, commit, op, dtype, batch, ctx, q_heads, kv_heads,
head_dim, time_ms, kv_gbps, tflops, gqa). Exit 3, with a message on stderr, when torch (with CUDA) is missing.
"""
import argparse
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--machine", default="unknown")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("sdpa_peer: PyTorch is not installed here: no peer figure", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("sdpa_peer: PyTorch sees no CUDA device: no peer figure", file=sys.stderr)
        return 3
    dev = torch.device("cuda")
    hq, hkv, d = 32, 8, 128
    print("machine,commit,op,dtype,batch,ctx,q_heads,kv_heads,head_dim,time_ms,kv_gbps,tflops,gqa")

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(a.reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / a.reps

    def sdpa(q, k, v, causal):
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True), "enable_gqa"
        except TypeError:  # torch < 2.5: expand the KV heads (a copy per call, counted in the time)
            g = q.shape[1] // k.shape[1]
            return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                                  is_causal=causal), "repeat_interleave"

    for op, dtype, batch, ctx in (("decode", torch.bfloat16, 64, 4096), ("decode", torch.bfloat16, 1, 65536),
                                  ("prefill", torch.bfloat16, 1, 4096)):
        nq = 1 if op == "decode" else ctx
        q = torch.randn(batch, hq, nq, d, device=dev, dtype=dtype)
        k = torch.randn(batch, hkv, ctx, d, device=dev, dtype=dtype)
        v = torch.randn(batch, hkv, ctx, d, device=dev, dtype=dtype)
        mode = sdpa(q, k, v, op == "prefill")[1]
        ms = timed(lambda: sdpa(q, k, v, op == "prefill"))
        kv_bytes = 2 * batch * ctx * hkv * d * k.element_size()
        flops = 4 * batch * hq * d * (nq * (nq + 1) / 2 if op == "prefill" else ctx)
        print(f"\"{a.machine}\",{a.commit},{op},bf16,{batch},{ctx},{hq},{hkv},{d},{ms:.5f},"
              f"{kv_bytes / (ms * 1e-3) / 1e9:.1f},{flops / (ms * 1e-3) / 1e12:.2f},{mode}")
        del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(main())
