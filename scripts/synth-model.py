#!/usr/bin/python3
"""Writes a Llama-architecture model with random weights as a Hugging Face folder (config.json +
model.safetensors, F32) plus the stories260K tokenizer, for timing models larger than stories260K:

    scripts/synth-model.py OUT_DIR [--hidden 512] [--layers 8] [--heads 8] [--kv-heads 4] [--ffn 1376]

Its output is noise (random weights); only its size and shape matter, e.g. to compare single-stream and
batched decode when the weights no longer fit in cache (`kvpage bench generate --model OUT_DIR`).
Pure Python (no numpy): a block of normal values is drawn once and repeated.
"""
import argparse
import array
import json
import os
import random
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "..", "..", "shared", "models", "stories260K", "llama2c", "tok512.bin")
VOCAB = 512  # the stories260K tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1376)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if min(a.hidden, a.layers, a.heads, a.kv_heads, a.ffn) < 1 or a.hidden % a.heads or a.heads % a.kv_heads:
        sys.exit("synth-model: sizes must be >= 1, hidden a multiple of heads, heads a multiple of kv-heads")
    if not os.path.isfile(TOKENIZER):
        sys.exit(f"synth-model: tokenizer not found: {TOKENIZER}")
    hd = a.hidden // a.heads
    shapes = {"model.embed_tokens.weight": (VOCAB, a.hidden), "model.norm.weight": (a.hidden,)}
    for l in range(a.layers):
        p = f"model.layers.{l}."
        shapes.update({
            p + "input_layernorm.weight": (a.hidden,),
            p + "post_attention_layernorm.weight": (a.hidden,),
            p + "self_attn.q_proj.weight": (a.heads * hd, a.hidden),
            p + "self_attn.k_proj.weight": (a.kv_heads * hd, a.hidden),
            p + "self_attn.v_proj.weight": (a.kv_heads * hd, a.hidden),
            p + "self_attn.o_proj.weight": (a.hidden, a.heads * hd),
            p + "mlp.gate_proj.weight": (a.ffn, a.hidden),
            p + "mlp.up_proj.weight": (a.ffn, a.hidden),
            p + "mlp.down_proj.weight": (a.hidden, a.ffn),
        })
    rng = random.Random(a.seed)
    block = array.array("f", (rng.gauss(0.0, 0.02) for _ in range(1 << 16))).tobytes()
    ones = array.array("f", [1.0] * 4096).tobytes()
    header, off = {}, 0
    for name, shape in shapes.items():
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + 4 * n]}
        off += 4 * n
    hjson = json.dumps(header).encode()
    hjson += b" " * (-len(hjson) % 8)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name, shape in shapes.items():
            nbytes = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            src = ones if name.endswith("norm.weight") else block
            while nbytes > 0:
                chunk = src[: min(nbytes, len(src))]
                f.write(chunk)
                nbytes -= len(chunk)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden,
        "intermediate_size": a.ffn, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads, "head_dim": hd, "vocab_size": VOCAB, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True, "bos_token_id": 1,
        "eos_token_id": 2, "torch_dtype": "float32",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    shutil.copy(TOKENIZER, os.path.join(a.out, "tok512.bin"))
    params = sum(h["data_offsets"][1] - h["data_offsets"][0] for h in header.values()) // 4
    print(f"{a.out}: {params / 1e6:.1f}M parameters, {4 * params / 2**20:.0f} MiB of F32 weights", file=sys.stderr)


if __name__ == "__main__":
    main()
