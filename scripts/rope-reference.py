#!/usr/bin/python3
"""Reference RoPE frequencies for tests/runtime/test_model_rope.c (rope_frequencies_match_the_reference).

Written from the published definitions, not from kvpage's C: YaRN as in the paper (Peng et al. 2023,
arXiv:2309.00071, section 3) and as Hugging Face transformers' _compute_yarn_parameters states it (the
correction range of dimensions from beta_fast and beta_slow, a linear ramp between, floor/ceil when
truncating, attention factor 0.1 ln(s) + 1); linear scaling (position interpolation) divides every
frequency by the factor; dynamic NTK raises the base, at the stretched context's full length; LongRoPE (Phi-3) divides each
frequency by its long or short rescale factor. Prints, per case, the inverse frequencies and the attention factor at full
precision; the test holds a subset.

    scripts/rope-reference.py
"""
import json
import math
import os


def yarn(dim, base, factor, orig, beta_fast=32.0, beta_slow=1.0, truncate=True):
    # the dimension d whose wavelength 2*pi*base^(d/dim) fits `rotations` times into the original context
    def dim_of(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i in range(dim // 2):
        extrapolated = base ** (-2 * i / dim)
        interpolated = extrapolated / factor
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        keep = 1.0 - ramp  # the share of the original frequency
        out.append(interpolated * (1 - keep) + extrapolated * keep)
    scale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return out, scale


def linear(dim, base, factor):
    return [base ** (-2 * i / dim) / factor for i in range(dim // 2)], 1.0


def dynamic_ntk(dim, base, factor):
    # NTK-aware scaling (bloc97/emozilla) at the stretched context's full length, factor x the original: the
    # base grows by (factor * length / original - (factor - 1)) ** (dim / (dim - 2))
    length_ratio = factor
    base = base * (factor * length_ratio - (factor - 1)) ** (dim / (dim - 2))
    return [base ** (-2 * i / dim) for i in range(dim // 2)], 1.0


def longrope(dim, base, long_factor, short_factor, max_pos, orig, max_len):
    # LongRoPE (Ding et al. 2024, arXiv:2402.13753) as Phi-3 ships it: each pair's frequency divided by its
    # rescale factor, the long set when the served context passes the original one; cos and sin scaled by
    # sqrt(1 + ln(s) / ln(original)), s = max_position_embeddings / original (Hugging Face's default)
    factors = long_factor if max_len > orig else short_factor
    s = max_pos / orig
    scale = math.sqrt(1 + math.log(s) / math.log(orig)) if s > 1 else 1.0
    return [1.0 / (factors[i] * base ** (2 * i / dim)) for i in range(dim // 2)], scale


def phi35(max_len):
    # Phi-3.5-mini-instruct's config.json (../shared/data/configs/derived/phi-3_5.json): head_dim 3072 / 32
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "shared", "data", "configs", "derived", "phi-3_5.json")) as f:
        c = json.load(f)
    rs = c["rope_scaling"]
    dim = c["hidden_size"] // c["num_attention_heads"]
    return longrope(dim, c["rope_theta"], rs["long_factor"], rs["short_factor"], c["max_position_embeddings"],
                    c["original_max_position_embeddings"], max_len)


CASES = {
    # Qwen3-8B (head_dim 128, rope_theta 1e6) with the YaRN its model card gives for 131,072 tokens
    "qwen3_yarn": yarn(128, 1e6, 4.0, 32768),
    # stories260K (head_dim 8) stretched 4x past 128 original positions, and without truncation
    "s260_yarn": yarn(8, 10000.0, 4.0, 128),
    "s260_yarn_untruncated": yarn(8, 10000.0, 4.0, 128, truncate=False),
    "s260_linear": linear(8, 10000.0, 2.0),
    "s260_dynamic": dynamic_ntk(8, 10000.0, 2.0),
    # Phi-3.5-mini served past its original 4,096 tokens (long factors), and within them (short factors)
    "phi35_long": phi35(131072),
    "phi35_short": phi35(4096),
}

if __name__ == "__main__":
    for name, (inv, scale) in CASES.items():
        print(f"{name}: scale {scale!r}")
        for i, f in enumerate(inv):
            print(f"  {i:3d} {f!r}")
