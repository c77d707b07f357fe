#!/usr/bin/python3
"""Checks kvpage's tokenizer on real model vocabularies against Hugging Face's encodings.

llama.cpp keeps vocabulary-only GGUF files of real models (models/ggml-vocab-*.gguf: Llama-3's, Qwen2's, Qwen3.5's,
GPT-2's, DeepSeek's, Falcon's, StarCoder's, Command-R's, Llama-2's and Phi-3's sentencepiece, ...) with test strings (*.inp) and the ids Hugging Face's tokenizer gives
them (*.out). They ship inside llama-cpp-python's source package on PyPI. This script fetches it (or uses
a folder that has them), runs `kvpage tokenize --no-bos` on every test string and compares the ids:

    scripts/check-llama-cpp-vocabs.py [--kvpage build/kvpage] [--models DIR]

It prints one line per vocabulary and exits 1 on any mismatch. Not part of CI (it downloads ~75 MB).
"""
import argparse
import glob
import os
import subprocess
import sys
import tarfile
import tempfile

VOCABS = ["llama-bpe", "qwen2", "qwen35", "gpt-2", "llama-spm", "phi-3", "deepseek-llm", "deepseek-coder", "falcon", "starcoder", "refact",
          "command-r", "mpt"]
SEP = "\n__ggml_vocab_test__\n"


def fetch(dest):
    subprocess.run([sys.executable, "-m", "pip", "download", "llama-cpp-python", "--no-binary", ":all:", "--no-deps",
                    "-q", "-d", dest], check=True)
    sdist = glob.glob(os.path.join(dest, "llama_cpp_python-*.tar.gz"))[0]
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if any(m.name.endswith(f"models/ggml-vocab-{v}.gguf" + ext) for v in VOCABS for ext in ("", ".inp", ".out"))]
        tar.extractall(dest, members=members)
    return os.path.dirname(os.path.join(dest, members[0].name))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvpage", default="build/kvpage")
    ap.add_argument("--models", help="a folder holding ggml-vocab-*.gguf(.inp/.out); default: fetch them")
    a = ap.parse_args()
    models = a.models or fetch(tempfile.mkdtemp(prefix="kvp-vocabs-"))
    bad = 0
    for v in VOCABS:
        path = os.path.join(models, f"ggml-vocab-{v}.gguf")
        texts = open(path + ".inp", encoding="utf-8").read().split(SEP)[:-1]
        want = open(path + ".out", encoding="utf-8").read().split("\n")[:len(texts)]
        args = [a.kvpage, "tokenize", "--tokenizer", path, "--no-bos"]
        for t in texts:
            args += ["--text", t]
        got = subprocess.run(args, check=True, capture_output=True, text=True).stdout.split("\n")[:len(texts)]
        miss = [i for i in range(len(texts)) if got[i].split() != want[i].split()]
        bad += len(miss)
        print(f"{v}: {len(texts)} strings, {len(miss)} differ from Hugging Face")
        for i in miss[:5]:
            print(f"  {texts[i]!r}\n    kvpage:       {got[i]}\n    Hugging Face: {want[i].strip()}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
