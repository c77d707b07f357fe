#!/usr/bin/env python3
"""bench/hf_peer.py — the Hugging Face transformers + PyTorch peer of bench/gpu_check.sh's end-to-end rows: a
LlamaForCausalLM built from a config.json with random weights (no checkpoint is read), bf16, on the GPU, a
StaticCache, torch.compile off; greedy decode of N tokens at batch B from random P-token prompts. Prints one JSON
line per batch on stdout: prefill tokens/s (one forward of the B x P prompt tokens, the LM head on the last row
only), decode tokens/s (B x (N - 1) tokens over the N - 1 one-token steps after it), each the median of --reps
timed runs after one warm-up, and the device's copy bandwidth (torch device-to-device copy, bytes read + written).
Exit 3 with one line on stderr when torch, transformers or a CUDA device is missing; 2 on bad arguments.
"""
import argparse
import json
import sys
import time


def fail(msg, code=3):
    print(f"hf_peer: {msg}", file=sys.stderr)
    return code


def make_cache(StaticCache, config, batch, max_len, dev, dtype):
    """A StaticCache across transformers versions (4.x takes the batch size and device; 5.x infers them)."""
    tries = (dict(config=config, max_batch_size=batch, max_cache_len=max_len, device=dev, dtype=dtype),
             dict(config=config, batch_size=batch, max_cache_len=max_len, device=dev, dtype=dtype),
             dict(config=config, max_cache_len=max_len))
    err = None
    for kw in tries:
        try:
            return StaticCache(**kw)
        except TypeError as e:
            err = e
    raise err


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a Hugging Face config.json (e.g. Meta-Llama-3.1-8B.json)")
    ap.add_argument("--batch", default="1,16,64,256", help="comma-separated batch sizes (default 1,16,64,256)")
    ap.add_argument("--prompt-len", type=int, default=1024, help="prompt tokens P per sequence (default 1024)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens N generated per sequence (default 64)")
    ap.add_argument("--reps", type=int, default=2, help="timed runs per batch, median reported (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--machine", default="unknown")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    try:
        batches = [int(x) for x in a.batch.split(",")]
    except ValueError:
        return fail(f"--batch {a.batch!r} is not a comma-separated list of integers", 2)
    if min(batches) < 1 or a.prompt_len < 1 or a.new_tokens < 2 or a.reps < 1:
        return fail("--batch, --prompt-len and --reps must be >= 1, --new-tokens >= 2", 2)
    try:
        with open(a.config) as f:
            cfg_json = json.load(f)
    except (OSError, ValueError) as e:
        return fail(f"cannot read {a.config}: {e}", 2)
    try:
        import torch
    except ImportError:
        return fail("PyTorch is not installed here: no peer figure")
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
    except ImportError as e:
        return fail(f"Hugging Face transformers is not installed here ({e}): no peer figure")
    if not torch.cuda.is_available():
        return fail("PyTorch sees no CUDA device: no peer figure")
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    torch.manual_seed(a.seed)

    # copy bandwidth: 2 GiB device to device, bytes read + written
    buf = torch.empty(1 << 30, dtype=torch.int16, device=dev)
    out = torch.empty_like(buf)
    out.copy_(buf)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        out.copy_(buf)
    e1.record()
    torch.cuda.synchronize()
    copy_gbps = 2 * buf.numel() * buf.element_size() * 10 / (e0.elapsed_time(e1) * 1e-3) / 1e9
    del buf, out

    config = LlamaConfig.from_dict(cfg_json)
    config.use_cache = True
    t0 = time.time()
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    with torch.device(dev):  # parameters made (and randomly initialized) on the GPU, not on the host first
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(prev)
    model = model.to(dev, dtype).eval()
    init_s = time.time() - t0
    vocab = config.vocab_size
    P, N = a.prompt_len, a.new_tokens
    max_len = P + N

    # The call's keywords across transformers versions, the first that binds kept: 4.x wants cache_position for
    # the static cache and takes logits_to_keep from 4.50 (num_logits_to_keep before); 5.x computes the cache
    # position itself and renames past_key_values to cache.
    variants = [("past_key_values", True, "logits_to_keep"), ("past_key_values", False, "logits_to_keep"),
                ("cache", False, "logits_to_keep"), ("past_key_values", True, "num_logits_to_keep")]
    chosen = []

    def forward(ids, cache, pos):
        last = None
        for v in (chosen or variants):
            kw = {v[0]: cache, "input_ids": ids, "position_ids": pos[None].expand(ids.shape[0], -1),
                  "use_cache": True, v[2]: 1}
            if v[1]:
                kw["cache_position"] = pos
            try:
                out = model(**kw).logits
            except TypeError as e:  # a keyword this version lacks
                last = e
                continue
            if not chosen:
                chosen.append(v)
            return out
        raise last

    def run(B):
        g = torch.Generator(device=dev).manual_seed(a.seed + B)
        ids = torch.randint(0, vocab, (B, P), device=dev, generator=g)
        cache = make_cache(StaticCache, config, B, max_len, dev, dtype)
        torch.cuda.synchronize()
        with torch.inference_mode():
            t0 = time.perf_counter()
            logits = forward(ids, cache, torch.arange(P, device=dev))
            tok = logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            for i in range(N - 1):
                logits = forward(tok, cache, torch.tensor([P + i], device=dev))
                tok = logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
        del cache
        return t1 - t0, t2 - t1

    for B in batches:
        try:
            run(B)  # warm-up: cuBLAS plans, allocator
            times = [run(B) for _ in range(a.reps)]
        except Exception as e:  # out of memory, an API this transformers lacks: that batch fails, the others run
            print(json.dumps({"peer": "transformers", "batch": B, "error": f"{type(e).__name__}: {str(e)[:300]}"}),
                  flush=True)
            torch.cuda.empty_cache()
            continue
        pre = sorted(t[0] for t in times)[len(times) // 2]
        dec = sorted(t[1] for t in times)[len(times) // 2]
        print(json.dumps({"peer": "transformers", "transformers": transformers.__version__, "torch": torch.__version__,
                          "machine": a.machine, "commit": a.commit, "batch": B, "prompt_len": P, "new_tokens": N,
                          "dtype": "bf16", "cache": "StaticCache", "compile": False, "init_s": round(init_s, 2),
                          "prefill_s": pre, "decode_s": dec, "prefill_tok_s": B * P / pre,
                          "decode_tok_s": B * (N - 1) / dec, "copy_gbps": copy_gbps}), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
