#!/usr/bin/env python3
"""Writes tests/data/quant_types.gguf, the fixture of tests/runtime/test_quant.c:

    pip install gguf numpy           # llama.cpp's gguf-py (its numpy port of ggml's dequantizers)
    scripts/gguf-quant-fixture.py tests/data/quant_types.gguf

For each of ggml's quantized types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K it writes a
tensor NAME (lower-case type name, 2 rows x 256 elements) made of random block bytes, seeded, with every f16
scale field (d, m, dmin) set to a finite value of magnitude 1e-6..2 (f16 subnormals included) and random sign,
and beside it the F32 tensor NAME.ref: gguf-py's dequantization of those same bytes (gguf.quants.dequantize).
The values are gguf-py's, not ours: the C test converts NAME with kvp_tensor_to_f32 and wants NAME.ref bit
for bit. Rerunning the script writes the same file.
"""
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

SEED = 20240611
ROWS, COLS = 2, 256

# Byte offsets of the f16 scale fields inside one block (ggml-common.h's block_* structs).
F16_FIELDS = {
    Q.Q4_0: [0],
    Q.Q4_1: [0, 2],
    Q.Q5_0: [0],
    Q.Q5_1: [0, 2],
    Q.Q8_0: [0],
    Q.Q2_K: [80, 82],  # scales[16] | qs[64] | d | dmin
    Q.Q3_K: [108],  # hmask[32] | qs[64] | scales[12] | d
    Q.Q4_K: [0, 2],  # d | dmin | scales[12] | qs[128]
    Q.Q5_K: [0, 2],  # d | dmin | scales[12] | qh[32] | qs[128]
    Q.Q6_K: [208],  # ql[128] | qh[64] | scales[16] | d
}


def random_blocks(rng, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nblocks = ROWS * COLS // block
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        mag = np.exp(rng.uniform(np.log(1e-6), np.log(2.0), size=nblocks))
        val = (mag * rng.choice([-1.0, 1.0], size=nblocks)).astype(np.float16)
        assert np.all(np.isfinite(val)) and np.all(val != 0)
        raw[:, off:off + 2] = val.reshape(nblocks, 1).view(np.uint8)
    return raw.reshape(ROWS, COLS // block * size)


def main(path):
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(path, arch="quant-fixture")
    w.add_uint32("quant_fixture.seed", SEED)
    for qtype in F16_FIELDS:
        raw = random_blocks(rng, qtype)
        ref = gguf.quants.dequantize(raw, qtype)
        assert ref.dtype == np.float32 and ref.shape == (ROWS, COLS) and np.all(np.isfinite(ref)), qtype.name
        name = qtype.name.lower()
        w.add_tensor(name, raw, raw_dtype=qtype)
        w.add_tensor(name + ".ref", ref)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
