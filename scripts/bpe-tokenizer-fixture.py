#!/usr/bin/env python3
"""Writes the BPE tokenizer fixtures of tests/runtime/test_tokenizer_bpe.c:

    pip install tokenizers gguf      # Hugging Face's tokenizers (Rust) and llama.cpp's gguf-py
    scripts/bpe-tokenizer-fixture.py tests/data/tokenizers [--only=NAME ...]   # NAME's files and cases only

For seven pre-tokenizer families (llama3: Llama-3's regex, ignore_merges and BOS; qwen2: Qwen2's regex,
single digits, no BOS; gpt2: GPT-2's ByteLevel regex; deepseek: DeepSeek-Coder's five Split steps; commandr:
Command-R's Digits and ByteLevel steps; qwen35: Qwen3.5's regex, combining marks kept with their letters;
tekken: Mistral-Nemo's regex, ignore_merges and BOS) it trains a small byte-level BPE (512 tokens: the size
of stories260K's vocabulary, so that tests can run that model with these tokenizers) with
Hugging Face's trainer on a mixed text (stories, numbers, contractions, code, accents, CJK, emoji), and writes

    NAME/tokenizer.json, NAME/tokenizer_config.json   the Hugging Face form
    NAME.gguf                                          the same vocabulary as llama.cpp's convert script
                                                       writes it (tokenizer.ggml.model "gpt2", tokens in
                                                       byte-to-unicode form, merges, pre, token types)
    cases.json                                         Hugging Face's own encodings of test strings (the
                                                       reference): {"NAME": [{"text", "ids"}...]}

and a fourth, spm: stories260K's sentencepiece vocabulary as the tokenizer.json that transformers'
LlamaConverter makes of a Llama-2 tokenizer (merges from the piece scores, byte fallback, "▁" normalizer,
BOS post-processor), so that a Hugging Face folder of a Llama-2-style model carries the tokenizer it has in
practice (spm/tokenizer.json; cases under "spm", no GGUF: stories260K.gguf is that vocabulary's GGUF).

The encodings are Hugging Face's, not ours: the C tests compare kvpage's tokenizer against them.
"""
import json
import os
import sys

import gguf
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5's: letters and their combining marks (\p{M}) in one piece
QWEN35_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Mistral-Nemo's tokenizer.json (Tekken): upper-case runs split from lower-case ones, single digits, "/" kept
# after punctuation
TEKKEN_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
             r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine.",
    "One day, she saw a big, red ball in the park. She wanted to play with it, but it was too high.",
    "Lily's mom said, \"Don't worry, we'll find a way!\" They're happy and they've got 123 apples.",
    "I'm sure you'd like it. It's 2024-11-30 and the price is $1,234.56 (about 1234567 cents).",
    "def main(argv):\n    for i in range(10):\n        print(f\"{i:03d}\")\n    return 0\n",
    "int main(void) { return x->y[42] >= 7 && z != NULL; }\t// comment\r\n",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u00c5ngstr\u00f6m.",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3067\u3059\u3002 \u4e2d\u6587\u6d4b\u8bd5\u3002 \ud55c\uad6d\uc5b4",
    "Emoji: \U0001f600\U0001f680 \u2764\ufe0f  done.\n\n\nNew paragraph   with   spaces.",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u03ba\u03cc\u03c3\u03bc\u03b5.",
] * 20

CASES = [
    "",
    "Hello world",
    " Hello world",
    "Once upon a time, there was a little girl named Lily.",
    "Lily's mom said, \"Don't worry, we'll find a way!\" THEY'RE HERE, I'M SURE, YOU'D SEE.",
    "12345678901 and 3.14159 and 1,000,000",
    "a  b   c    d\t\te\n\nf\r\ng \n h",
    "   leading and trailing spaces   ",
    "\n\n\n",
    "def f(x):\n    return x ** 2  # square\n",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3067\u3059\u3002\u4e2d\u6587\u6d4b\u8bd5",
    "Emoji \U0001f600\U0001f680\u2764\ufe0f and \U0001f9d1\u200d\U0001f4bb",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "unseen words: xylophone quixotic zephyr jump'd",
    "tabs\tand\u00a0non-breaking\u2003spaces",
    "!!!??? ... --- ___ *** ###",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
]

FAMILIES = {
    # name: (split regex or None for GPT-2's ByteLevel regex, ignore_merges, specials, bos, eos, gguf pre)
    "llama3": (LLAMA3_RE, True, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                  "<|end_header_id|>", "<|eot_id|>"], "<|begin_of_text|>", "<|eot_id|>",
               "llama-bpe"),
    "qwen2": (QWEN2_RE, False, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "qwen2"),
    "gpt2": (None, False, ["<|endoftext|>"], None, "<|endoftext|>", "gpt-2"),
    # several pre-tokenizer steps: DeepSeek-Coder's Split regexes, and Command-R's Digits + ByteLevel regex
    "deepseek": ([r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"], False,
                 ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
                 "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "deepseek-coder"),
    "commandr": ("digits", False, ["<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"], "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>",
                 "command-r"),
    "qwen35": (QWEN35_RE, False, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "qwen35"),
    "tekken": (TEKKEN_RE, True, ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"],
               "<s>", "</s>", "tekken"),
}

# training text for one family only: qwen35's and tekken's merges must join letters and their combining marks
# for their regexes (which keep them in one piece) to give other ids than regexes that split them
MARKS = ["e\u0301cole a\u0301b\u0301 na\u0308i\u0308ve \u0915\u093f\u0924\u093e\u092c "
         "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627 caf\u0065\u0301 E\u0301COLE"] * 40
EXTRA_CORPUS = {"qwen35": MARKS, "tekken": MARKS}

# strings for one family only (its regex's own corners)
EXTRA_CASES = {
    "qwen35": ["a\u0301b\u0301 e\u0301cole \u0915\u093f\u0924\u093e\u092c \u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627 x\u20dd'\u0301s",
               "na\u0308i\u0308ve \u00e9\u0301\u0302 \u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd 1\u0301 .\u0301 \u0301\u0301"],
    "tekken": ["CamelCaseWords HTTPServer iPhone McDonald's XMLHttpRequest ABCdef abcDEF",
               "\u00c9COLE \u00e9cole \u0416\u0443\u043a \u0416\u0423\u041a \u0394\u03b5\u03bb\u03c4\u03b1 a\u0301b\u0301C\u0301",
               "path/to/file.txt, https://example.com/a/b?c=1 ../up//double/// end/\nnext",
               "x1y22z333 3.14 v2.0.1 \u0663\u0664 \u2167 \u00bd"],
}


def random_cases(n=60, seed=7):
    """Seeded random strings over letters, digits, apostrophes, punctuation, whitespace runs and non-ASCII."""
    import random
    rng = random.Random(seed)
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3 +
            list(" " * 12 + "\n" * 3 + "\t\r'.,!?;:-_()[]{}<>|/\\\"$%&*#@~`^+=") +
            ["'s", "'ll", "'RE", "\u00e9", "\u00df", "\u00a0", "\u2003", "\u65e5", "\u672c", "\u3002",
             "\U0001f600", "\u200d", "\u0416", "\u03a9", "\u0663", "\u00bd", "\u2167"])
    return ["".join(rng.choice(pool) for _ in range(rng.randrange(0, 50))) for _ in range(n)]


def train(name):
    regex, ignore_merges, specials, bos, eos, _ = FAMILIES[name]
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if regex == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif regex:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in
             (regex if isinstance(regex, list) else [regex])] +
            [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS + EXTRA_CORPUS.get(name, []), trainer=trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def spm_from_stories(gguf_path):
    """transformers' LlamaConverter on stories260K's vocabulary (SentencePieceExtractor's merge order)."""
    r = gguf.GGUFReader(gguf_path)
    f = r.fields
    pieces = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode() for i in f["tokenizer.ggml.tokens"].data]
    scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for piece, score in zip(pieces, scores):
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
    merges = [(a, b) for a, b, _ in sorted(merges, key=lambda m: m[2], reverse=True)]
    from tokenizers import AddedToken, normalizers
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def write_gguf(name, tok, path):
    regex, _, specials, bos, eos, pre = FAMILIES[name]
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [None] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    types = [gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens]
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if bos:
        w.add_bos_token_id(vocab[bos])
    w.add_add_bos_token(bos is not None)
    w.add_eos_token_id(vocab[eos])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--only=")]
    only = [a[len("--only="):] for a in sys.argv[1:] if a.startswith("--only=")]
    out = args[0] if args else "tests/data/tokenizers"
    cases = {}
    if only:  # the named families rewritten, the others' files and cases kept as they are
        with open(os.path.join(out, "cases.json")) as f:
            cases = json.load(f)
    for name in FAMILIES:
        if only and name not in only:
            continue
        tok = train(name)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        _, _, specials, bos, eos, _ = FAMILIES[name]
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": bos, "eos_token": eos, "add_bos_token": bos is not None}, f, indent=1)
        write_gguf(name, tok, os.path.join(out, name + ".gguf"))
        rows = []
        for text in CASES + EXTRA_CASES.get(name, []) + random_cases():
            ids = tok.encode(text).ids
            assert tok.decode(ids, skip_special_tokens=True) == text, (name, text)
            rows.append({"text": text, "ids": ids})
        # special tokens written in the text are parsed as tokens (what vLLM's tokenizer call does)
        s = specials[1] if len(specials) > 1 else specials[0]
        text = f"{s}user{specials[-1]} hi{s}"
        rows.append({"text": text, "ids": tok.encode(text).ids, "special": True})
        cases[name] = rows
    here = os.path.dirname(os.path.abspath(__file__))
    if only and "spm" not in only:
        return write_cases(out, cases)
    tok = spm_from_stories(os.path.join(here, "..", "..", "shared", "models", "stories260K", "stories260K.gguf"))
    os.makedirs(os.path.join(out, "spm"), exist_ok=True)
    tok.save(os.path.join(out, "spm", "tokenizer.json"))
    with open(os.path.join(out, "spm", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}, f, indent=1)
    cases["spm"] = [{"text": t, "ids": tok.encode(t).ids} for t in CASES + random_cases()]
    write_cases(out, cases)


def write_cases(out, cases):
    with open(os.path.join(out, "cases.json"), "w") as f:
        f.write("{\n" + ",\n".join(
            json.dumps(name) + ": [\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n]"
            for name, rows in cases.items()) + "\n}\n")


if __name__ == "__main__":
    main()
