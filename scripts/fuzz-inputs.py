#!/usr/bin/python3
"""Feeds kvpage mutated inputs and reports every crash, hang and sanitizer report.

Eight targets, each a mutation of a known-good input, run through the sanitizer build (build-asan, made by
`make test`, which has AddressSanitizer, LeakSanitizer and UBSan):

    models      stories260K's GGUF, HF safetensors and config.json: truncations, flipped bytes, extreme
                header and metadata numbers, lying tensor shapes, dtypes and offsets, odd config values;
                each through `kvpage generate` (3 tokens).
    tokenizers  the tokenizer fixtures (tokenizer.json and GGUF vocabularies): truncations, flipped bytes,
                inserted junk, and edits to the JSON structure; each through `kvpage tokenize`.
    configs     the shared Hugging Face config.json files with odd values at any depth, dropped keys, or
                truncated; each through `kvpage plan`.
    traces      the Azure and Mooncake traces with odd fields, flipped bytes, shuffled or truncated lines;
                each through `kvpage simulate` (Qwen3-0.6B, 100 requests).
    cli         plan, simulate, generate and tokenize with 1..4 of their own options given odd values
                (negative, huge, NaN, empty, wrong words, missing paths) or an unknown option.
    serve       one `kvpage serve` (speculating: n-gram, 4 drafts), sent odd OpenAI requests: wrong types and out-of-range values in every
                field, broken JSON, lying Content-Length, chunked bodies, long headers, truncated requests.
    chat        `kvpage generate --chat` with every built-in template and the byte-level tokenizer fixtures,
                messages made of the templates' own markers (<think>, [INST], <|im_end|>, ...), newlines,
                multi-byte characters, empty ones.
    client      `kvpage bench serve --url` against a fake server whose /v1/models, /v1/completions streams
                and /metrics are mutated: broken JSON and events, odd values and status codes, streams cut
                short, without [DONE] or blank lines, huge lines, garbage bytes (exit 1, failed requests, is
                fine there).

    scripts/fuzz-inputs.py models|tokenizers|configs|traces|cli|serve|chat|client [-n N] [--seed S] [--kvpage build-asan/kvpage]

A run is bad when the exit code is neither 0 nor 2 (the CLI's code for bad input), when it runs past 60 s,
or when the sanitizers print anything; the server is bad when it dies or reports. Bad inputs are kept under
--keep (default /tmp/kvpage-fuzz) and the script exits 1. Not part of CI: a few thousand runs take minutes.
"""
import argparse
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S260 = os.path.join(ROOT, '..', 'shared', 'models', 'stories260K')
ENV = dict(os.environ, ASAN_OPTIONS='allocator_may_return_null=1:detect_leaks=1',
           UBSAN_OPTIONS='print_stacktrace=1:halt_on_error=1')
I32 = [0, 1, 3, 17, 1 << 20, 0x7fffffff, 0x80000000, 0xffffffff]
I64 = [0, 1, 12345678, 1 << 32, 1 << 40, 1 << 62, (1 << 64) - 1]


def odd_value(rng):
    return rng.choice([0, -1, 1, 2, 5, 1 << 31, -(1 << 31), 1 << 62, 1e308, -1e308, 0.5, 1e-30, 'x', '', None,
                       True, [], {}, [1, 2, 3], [[1]], {'a': 1}, [-1, 99999], '<|im_start|>', 'x' * 5000])


def sanitized(err):
    return 'Sanitizer' in err or 'runtime error' in err


def run_cli(args):
    try:
        p = subprocess.run(args, env=ENV, capture_output=True, stdin=subprocess.DEVNULL, timeout=60)
        return p.returncode, p.stderr.decode(errors='replace')
    except subprocess.TimeoutExpired:
        return 'timeout', ''


def fresh_work(keep):
    """An empty folder for the next input."""
    work = os.path.join(keep, 'work')
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return work


def judge(rc, err, work, keep, tag, bad, *what):
    """1 (and the input kept as keep/TAG<n>, the run printed) when the run went wrong, else 0."""
    if rc in (0, 2) and not sanitized(err):
        return 0
    shutil.copytree(work, os.path.join(keep, '%s%d' % (tag, bad + 1)))
    print('BAD', *what, rc, err[-1500:], flush=True)
    return 1


# ---------------------------------------------------------------- models

def mutate_gguf(rng, gguf):
    b = bytearray(gguf)
    end = gguf.find(b'token_embd.weight') + 2000  # metadata and tensor infos
    k = rng.randrange(6)
    if k == 0:
        return bytes(b[:rng.randrange(len(b))])
    if k == 1:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(end)] ^= 1 << rng.randrange(8)
    elif k in (2, 3):
        w = 4 if k == 2 else 8
        o = rng.randrange(0, end - w)
        b[o:o + w] = struct.pack('<I' if w == 4 else '<Q', rng.choice(I32 if w == 4 else I64))
    elif k == 4:  # the type or value of a metadata key
        keys = [x.encode() for x in ('llama.embedding_length', 'llama.block_count', 'llama.attention.head_count',
                                     'llama.attention.head_count_kv', 'llama.context_length', 'llama.rope.dimension_count',
                                     'llama.feed_forward_length', 'tokenizer.ggml.tokens', 'tokenizer.ggml.scores',
                                     'tokenizer.ggml.token_type', 'llama.rope.freq_base', 'tokenizer.ggml.bos_token_id',
                                     'general.architecture', 'tokenizer.ggml.model')]
        key = rng.choice(keys)
        o = b.find(key)
        if o >= 0:
            key_end = o + len(key)  # then the value's u32 type and the value
            if rng.random() < 0.3:
                b[key_end:key_end + 4] = struct.pack('<I', rng.randrange(14))
            else:
                w = rng.choice([4, 8])
                b[key_end + 4:key_end + 4 + w] = struct.pack('<I' if w == 4 else '<Q', rng.choice(I32 if w == 4 else I64))
    else:  # tensor infos: dims, types, offsets
        o = gguf.find(b'token_embd.weight') + rng.randrange(0, 1500)
        w = rng.choice([4, 8])
        b[o:o + w] = struct.pack('<I' if w == 4 else '<Q', rng.choice(I32 if w == 4 else I64))
    return bytes(b)


def mutate_safetensors(rng, st):
    hlen = struct.unpack('<Q', st[:8])[0]
    k = rng.randrange(5)
    if k == 0:
        return st[:rng.randrange(len(st))]
    if k == 1:
        b = bytearray(st)
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(8 + hlen)] ^= 1 << rng.randrange(8)
        return bytes(b)
    if k == 2:
        return struct.pack('<Q', rng.choice(I64 + [hlen - 1, hlen + 1])) + st[8:]
    h = json.loads(st[8:8 + hlen])
    t = h[rng.choice([n for n in h if n != '__metadata__'])]
    field = rng.choice(['dtype', 'shape', 'data_offsets'])
    if field == 'dtype':
        t['dtype'] = rng.choice(['F64', 'I8', 'F16', 'BF16', 'Q8', '', 5])
    elif field == 'shape' and t['shape'] and rng.random() < 0.7:
        t['shape'][rng.randrange(len(t['shape']))] = odd_value(rng)
    elif field == 'shape':
        t['shape'] = rng.choice([[], [1, 2, 3, 4, 5], 'x', [0]])
    else:
        t['data_offsets'][rng.randrange(2)] = odd_value(rng)
    hb = json.dumps(h).encode()
    return struct.pack('<Q', len(hb)) + hb + st[8 + hlen:]


def mutate_config(rng, cfg):
    c = dict(cfg)
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(list(c) + ['rope_scaling', 'sliding_window', 'head_dim', 'eos_token_id', 'layer_types'])
        r = rng.random()
        if r < 0.15:
            c.pop(key, None)
        elif key == 'rope_scaling' and r < 0.6:
            c[key] = {'rope_type': rng.choice(['llama3', 'linear', 'yarn', 'x']), 'factor': odd_value(rng),
                      'low_freq_factor': odd_value(rng), 'high_freq_factor': odd_value(rng),
                      'original_max_position_embeddings': odd_value(rng)}
        else:
            c[key] = odd_value(rng)
    return json.dumps(c)


def fuzz_models(a, rng, keep):
    gguf = open(os.path.join(S260, 'stories260K.gguf'), 'rb').read()
    st = open(os.path.join(S260, 'hf', 'model.safetensors'), 'rb').read()
    cfg = json.load(open(os.path.join(S260, 'hf', 'config.json')))
    bad = 0
    for i in range(a.n):
        work = fresh_work(keep)
        kind = rng.choice(['gguf', 'gguf', 'safetensors', 'config'])
        if kind == 'gguf':
            path = os.path.join(work, 'm.gguf')
            open(path, 'wb').write(mutate_gguf(rng, gguf))
        else:
            path = work
            shutil.copy(os.path.join(S260, 'llama2c', 'tok512.bin'), work)
            if kind == 'safetensors':
                open(os.path.join(work, 'model.safetensors'), 'wb').write(mutate_safetensors(rng, st))
                shutil.copy(os.path.join(S260, 'hf', 'config.json'), work)
            else:
                shutil.copy(os.path.join(S260, 'hf', 'model.safetensors'), work)
                open(os.path.join(work, 'config.json'), 'w').write(mutate_config(rng, cfg))
        rc, err = run_cli([a.kvpage, 'generate', '--model', path, '--prompt', 'Once upon', '--max-tokens', '3'])
        bad += judge(rc, err, work, keep, 'model', bad, i, kind)
    return bad


# ---------------------------------------------------------------- tokenizers

def fuzz_tokenizers(a, rng, keep):
    srcs = ['tests/data/tokenizers/qwen2/tokenizer.json', 'tests/data/tokenizers/llama3.gguf',
            'tests/data/tokenizers/deepseek/tokenizer.json', 'tests/data/tokenizers/spm/tokenizer.json',
            'tests/data/tokenizers/commandr.gguf', 'tests/data/tokenizers/tekken.gguf', 'tests/data/quant_types.gguf']
    bad = 0
    for i in range(a.n):
        src = rng.choice(srcs)
        data = bytearray(open(os.path.join(ROOT, src), 'rb').read())
        kind = rng.randrange(4)
        if kind == 0:
            data = data[:rng.randrange(len(data))]
        elif kind == 1:
            for _ in range(rng.randrange(1, 20)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2 and src.endswith('.json'):
            j = json.loads(data)
            m = j['model']
            ch = rng.randrange(6)
            if ch == 0:
                m['merges'] = m['merges'][:rng.randrange(len(m['merges']) + 1)] + [rng.choice(['a', '', ' ', 'Ġ Ġ Ġ', ['x'], [1, 2], None])]
            elif ch == 1:
                j['added_tokens'].append({'id': rng.choice([-1, 0, 5, 1 << 30, 3.5]), 'content': rng.choice(['', '<|x|>', None]), 'special': True})
            elif ch == 2:
                j['pre_tokenizer'] = rng.choice([None, {'type': 'Split', 'pattern': {'Regex': '('}}, {'type': 'Digits'}, 5,
                                                 {'type': 'Sequence', 'pretokenizers': [{'type': 'Split', 'pattern': {'Regex': 'a'}, 'behavior': 'Isolated'}] * 9}])
            elif ch == 3:
                m['vocab'][rng.choice(['Ġ', 'zz', ''])] = rng.choice([0, 511, 600, -5, 'x'])
            elif ch == 4:
                j['post_processor'] = {'type': 'TemplateProcessing', 'single': [{'SpecialToken': {'id': rng.choice(['<nope>', 5, None])}}]}
            else:
                m['ignore_merges'] = rng.choice([True, 'yes', None])
            data = bytearray(json.dumps(j).encode())
        else:
            at = rng.randrange(len(data))
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 50)))
        work = fresh_work(keep)
        path = os.path.join(work, 'tokenizer.json' if src.endswith('.json') else 'm.gguf')
        open(path, 'wb').write(data)
        text = rng.choice(['Hello world 123', '日本語 😀 \'ll', '', '<|im_start|>x<|eot_id|>', '\xff'])
        rc, err = run_cli([a.kvpage, 'tokenize', '--tokenizer', path, '--special', '--json', '--text', text])
        bad += judge(rc, err, work, keep, 'tokenizer', bad, i, src, kind)
    return bad


# ---------------------------------------------------------------- configs and traces

def mutate_json_values(rng, obj, edits):
    """obj with `edits` random values replaced by odd ones, keys dropped, or objects emptied, at any depth."""
    def walk(o, depth):
        if isinstance(o, dict) and o:
            k = rng.choice(list(o))
            r = rng.random()
            if r < 0.15:
                del o[k]
            elif r < 0.6 or depth > 3:
                o[k] = odd_value(rng)
            else:
                walk(o[k], depth + 1)
        elif isinstance(o, list) and o:
            i = rng.randrange(len(o))
            if rng.random() < 0.5:
                o[i] = odd_value(rng)
            else:
                walk(o[i], depth + 1)
    for _ in range(edits):
        walk(obj, 0)
    return obj


def fuzz_configs(a, rng, keep):
    """`kvpage plan` on the shared Hugging Face config.json files, mutated."""
    cdir = os.path.join(ROOT, '..', 'shared', 'data', 'configs')
    srcs = [os.path.join(cdir, f) for f in sorted(os.listdir(cdir)) if f.endswith('.json')]
    srcs += [os.path.join(cdir, 'derived', f) for f in sorted(os.listdir(os.path.join(cdir, 'derived'))) if f.endswith('.json')]
    bad = 0
    for i in range(a.n):
        src = rng.choice(srcs)
        text = open(src, 'rb').read()
        if rng.random() < 0.15:
            data = text[:rng.randrange(len(text))]
        else:
            data = json.dumps(mutate_json_values(rng, json.loads(text), rng.randint(1, 4))).encode()
        work = fresh_work(keep)
        path = os.path.join(work, 'config.json')
        open(path, 'wb').write(data)
        extra = rng.choice([[], ['--tp', '2'], ['--kv-dtype', 'fp8', '--train'], ['--seq-len', '100000', '--num-seqs', '64']])
        rc, err = run_cli([a.kvpage, 'plan', '--config', path, '--gpu', 'H200', '--json'] + extra)
        bad += judge(rc, err, work, keep, 'config', bad, i, src, extra)
    return bad


def fuzz_traces(a, rng, keep):
    """`kvpage simulate` on the Azure and Mooncake traces (their first 200 lines), mutated."""
    tdir = os.path.join(ROOT, '..', 'shared', 'data', 'traces')
    srcs = [os.path.join(tdir, 'azure_llm_2023', 'AzureLLMInferenceTrace_code.csv'),
            os.path.join(tdir, 'mooncake', 'arxiv_trace_first20.jsonl'),
            os.path.join(tdir, 'mooncake', 'synthetic_trace.jsonl')]
    model = os.path.join(ROOT, '..', 'shared', 'data', 'configs', 'Qwen3-0.6B.json')
    bad = 0
    for i in range(a.n):
        src = rng.choice(srcs)
        lines = open(src, 'rb').read().split(b'\n')[:200]
        k = rng.randrange(4)
        if k == 0:  # a field of a line replaced
            j = rng.randrange(1, len(lines))
            if src.endswith('.csv'):
                f = lines[j].split(b',')
                f[rng.randrange(len(f))] = rng.choice([b'', b'-1', b'0', b'1e300', b'nan', b'x', b'99999999999999999999',
                                                       b'2023-13-45 99:99:99', b'"', b'4,5'])
                lines[j] = b','.join(f)
            else:
                try:
                    lines[j] = json.dumps(mutate_json_values(rng, json.loads(lines[j]), 1)).encode()
                except ValueError:
                    pass
        elif k == 1:  # flipped bytes
            b = bytearray(b'\n'.join(lines))
            for _ in range(rng.randint(1, 10)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            lines = bytes(b).split(b'\n')
        elif k == 2:  # lines dropped, repeated or shuffled (time going backwards)
            rng.shuffle(lines) if rng.random() < 0.5 else lines.insert(rng.randrange(len(lines)), lines[-2])
        else:  # truncated
            b = b'\n'.join(lines)
            lines = [b[:rng.randrange(len(b))]]
        work = fresh_work(keep)
        path = os.path.join(work, os.path.basename(src))
        open(path, 'wb').write(b'\n'.join(lines))
        extra = rng.choice([[], ['--rate', '5'], ['--rate', 'inf'], ['--duration', '30']])
        rc, err = run_cli([a.kvpage, 'simulate', '--model', model, '--trace', path, '--num-requests', '100'] + extra)
        bad += judge(rc, err, work, keep, 'trace', bad, i, src, k, extra)
    return bad


# ---------------------------------------------------------------- command lines

def options_of(kvpage, cmd):
    """The --options of `kvpage CMD --help`: (name, takes a value)."""
    out = subprocess.run([kvpage] + cmd + ['--help'], capture_output=True, env=ENV, timeout=60)
    opts = []
    for line in (out.stdout + out.stderr).decode(errors='replace').splitlines():
        w = line.strip().split()
        if w and w[0].startswith('--') and w[0] not in ('--help', '--tp'):
            opts.append((w[0].rstrip(','), len(w) > 1 and (w[1].isupper() or '|' in w[1])))
    return opts


def fuzz_cli(a, rng, keep):
    """Each command with a working base command line plus 1..4 of its own options given odd values."""
    s260 = os.path.join(S260, 'stories260K.gguf')
    cfg = os.path.join(ROOT, '..', 'shared', 'data', 'configs', 'Qwen3-0.6B.json')
    bases = {'plan': ['plan', '--config', cfg],
             'simulate': ['simulate', '--model', cfg, '--workload', 'sharegpt:n=20'],
             'generate': ['generate', '--model', s260, '--prompt', 'Once', '--max-tokens', '4'],
             'tokenize': ['tokenize', '--tokenizer', s260, '--text', 'Once upon a time']}
    opts = {c: options_of(a.kvpage, [c]) for c in bases}
    values = ['-1', '0', '1', '2', '3', '7', '64', '1e309', 'nan', 'inf', '-inf', '0.5', 'abc', '', '99999999999999999999',
              '2GiB', '1e-40', 'H200', 'A100-40G', 'f16', 'fp8', 'bf16', 'q8_0', 'auto', 'radix', 'none', 'blas',
              'sharegpt:n=-5', 'system:n=3', s260, cfg, '/nonexistent', '/', 'x' * 3000,
              # --speculative-config: good ones and bad ones
              '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":2}',
              '{"method":"ngram","num_speculative_tokens":16,"prompt_lookup_min":1,"prompt_lookup_max":64}',
              '{"method":"ngram"', '{"method":1}', '[]', '{"method":"ngram","num_speculative_tokens":1e99}']
    bad = slow = 0
    for i in range(a.n):
        c = rng.choice(list(bases))
        args = list(bases[c])
        for _ in range(rng.randint(1, 4)):
            name, takes = rng.choice(opts[c]) if rng.random() < 0.95 else ('--no-such-option', False)
            args += [name, rng.choice(values)] if takes else [name]
        try:
            p = subprocess.run([a.kvpage] + args, env=ENV, capture_output=True, stdin=subprocess.DEVNULL, timeout=30)
            rc, err = p.returncode, p.stderr.decode(errors='replace')
        except subprocess.TimeoutExpired:
            slow += 1  # a valid but long run (a long generation, a big simulation): not an error by itself
            print('SLOW', i, args[:12], flush=True)
            continue
        if rc not in (0, 2) or sanitized(err):
            bad += 1
            print('BAD', i, rc, args, err[-1500:], flush=True)
    print('runs past 30 s (look at them):', slow)
    return bad


# ---------------------------------------------------------------- chat

TEMPLATES = ['llama2', 'mistral', 'zephyr', 'llama3', 'llama3.1', 'llama3.2', 'chatml', 'qwen2', 'qwen2.5', 'smollm2',
             'mistral-v3', 'mistral-v3-tekken', 'mistral-v7', 'mistral-small-3', 'qwen3-thinking', 'deepseek-r1']


def fuzz_chat(a, rng, keep):
    """A prompt and maybe a system message of the templates' markers and odd text, through each template."""
    toks = [os.path.join(ROOT, 'tests', 'data', 'tokenizers', t) for t in
            ('qwen2/tokenizer.json', 'llama3.gguf', 'tekken.gguf', 'deepseek/tokenizer.json', 'gpt2.gguf')]
    pieces = ['<think>', '</think>', '\n', '\n\n', ' ', '  ', '[INST]', '[/INST]', '[SYSTEM_PROMPT]', '<|im_start|>',
              '<|im_end|>', '<|eot_id|>', '<<SYS>>', '<\uff5cUser\uff5c>', '<tool_response>', '</tool_response>', '<s>',
              '</s>', 'Lily', '\u00e9', '\U0001f600', '\t']
    bad = 0
    for i in range(a.n):
        def text(k):
            return ''.join(rng.choice(pieces) for _ in range(rng.randrange(k)))
        args = ['generate', '--model', os.path.join(S260, 'stories260K.gguf'), '--tokenizer', rng.choice(toks), '--chat',
                '--chat-template', rng.choice(TEMPLATES), '--prompt', text(9), '--max-tokens', '2', '--json']
        if rng.random() < 0.5:
            args += ['--system', text(6)]
        p = subprocess.run([a.kvpage] + args, env=ENV, capture_output=True, stdin=subprocess.DEVNULL, timeout=60)
        err = p.stderr.decode(errors='replace')
        if p.returncode not in (0, 2) or sanitized(err):
            bad += 1
            print('BAD', i, p.returncode, args, err[-1500:], flush=True)
    return bad


# ---------------------------------------------------------------- serve

KEYS = ['prompt', 'max_tokens', 'temperature', 'top_k', 'top_p', 'n', 'stream', 'seed', 'stop', 'logprobs', 'echo',
        'best_of', 'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'logit_bias', 'min_tokens',
        'ignore_eos', 'messages', 'model', 'stream_options', 'top_logprobs', 'max_completion_tokens', 'text',
        'tokens', 'add_special_tokens', 'suffix', 'response_format', 'stop_token_ids', 'skip_special_tokens', 'min_p',
        'return_token_ids', 'priority']


def odd_body(rng):
    b = {'prompt': 'Once', 'max_tokens': 4}
    if rng.random() < 0.4:
        b = {'messages': [{'role': 'user', 'content': 'Hi'}], 'max_tokens': 4}
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        k = rng.choice(KEYS)
        if k == 'messages' and rng.random() < 0.6:
            b[k] = [{'role': rng.choice(['user', 'system', 'assistant', 'tool', 'x', 5]), 'content': odd_value(rng)}
                    for _ in range(rng.randint(0, 3))]
        elif k == 'logit_bias' and rng.random() < 0.6:
            b[k] = {str(rng.choice([0, 1, 511, 512, -1, 'x'])): odd_value(rng)}
        else:
            b[k] = odd_value(rng)
    s = json.dumps(b)
    r = rng.random()
    if r < 0.1:
        s = s[:rng.randrange(len(s) + 1)]
    elif r < 0.2:
        at = rng.randrange(len(s))
        s = s[:at] + rng.choice('{}[]",:\\0x\x00\xff') + s[at + 1:]
    return s.encode('utf-8', 'surrogatepass')


def send(port, rng, path, data):
    """The answer's status code (b'closed': none). Well-framed requests (an honest Content-Length, whole)
    wait for their answer; the others are half-closed after sending, so the server sees their end."""
    head = b'POST ' + path.encode() + b' HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n'
    framed = True
    r = rng.random()
    if r < 0.05:
        head += b'Content-Length: %d\r\n' % rng.choice([0, len(data) + 10, 1 << 40, -5])
        framed = False
    elif r < 0.1:
        head += b'Transfer-Encoding: chunked\r\n'  # with an unchunked body: malformed
        framed = False
    else:
        head += b'Content-Length: %d\r\n' % len(data)
    if rng.random() < 0.05:
        head += b'X: ' + b'a' * rng.choice([100, 10000, 100000]) + b'\r\n'
    msg = head + b'\r\n' + data
    if rng.random() < 0.05:
        msg = msg[:rng.randrange(len(msg))]
        framed = False
    try:
        with socket.create_connection(('127.0.0.1', port), timeout=60) as s:
            s.sendall(msg)
            if not framed:
                s.shutdown(socket.SHUT_WR)  # the server may take this for a client gone: no answer is fine
            out = b''
            while True:
                c = s.recv(65536)
                if not c:
                    return out[9:12] or (b'closed' if framed else b'closed (not framed)')
                out += c
    except OSError:  # a reset is fine for a request that lies about its length (refused before it is read)
        return b'err' if framed else b'reset (not framed)'


def fuzz_serve(a, rng, keep):
    log = os.path.join(keep, 'serve.err')
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    errf = open(log, 'w')
    srv = subprocess.Popen([a.kvpage, 'serve', '--model', os.path.join(S260, 'stories260K.gguf'), '--port', str(port),
                            '--kv-mem', '8MiB', '--kv-offloading-size', '8MiB', '--speculative-config',
                            '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3,"prompt_lookup_min":1}'],
                           env=ENV, stdout=subprocess.DEVNULL, stderr=errf)
    for _ in range(150):
        try:
            socket.create_connection(('127.0.0.1', port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.2)
    paths = ['/v1/completions'] * 4 + ['/v1/chat/completions'] * 4 + ['/tokenize', '/detokenize', '/nope']
    codes, bad = {}, 0
    for i in range(a.n):
        code = send(port, rng, rng.choice(paths), odd_body(rng)).decode(errors='replace')
        codes[code] = codes.get(code, 0) + 1
        if code in ('closed', 'err'):  # a whole request the server dropped without an answer
            print('BAD: no answer to request', i, flush=True)
            bad += 1
        if srv.poll() is not None:
            print('BAD: the server died at request', i, 'exit code', srv.returncode, flush=True)
            bad += 1
            break
    srv.terminate()
    try:
        srv.wait(timeout=30)
    except subprocess.TimeoutExpired:
        srv.kill()
        bad += 1
        print('BAD: the server did not stop on SIGTERM')
    errf.close()
    err = open(log).read()
    if sanitized(err) or srv.returncode not in (0, -15):
        bad += 1
        print('BAD: server exit code', srv.returncode, err[-3000:])
    print('answers:', dict(sorted(codes.items())))
    return bad


# ---------------------------------------------------------------- client (bench serve)

def odd_stream(rng):
    """A mutated answer to a streamed completion: (status, body bytes)."""
    ev = []
    for k in range(rng.randint(0, 6)):
        text = rng.choice(['a', ' b', '', 'é', '\u0000', 'x' * 3000])
        chunk = {'id': 'cmpl-0', 'object': 'text_completion', 'choices': [{'index': 0, 'text': text, 'finish_reason': None}]}
        if rng.random() < 0.3:  # a chat chunk
            chunk['choices'][0] = {'index': 0, 'delta': rng.choice([{'content': text}, {'role': 'assistant'}, {'content': 5},
                                                                    {'content': None}, 'x']), 'finish_reason': None}
        if rng.random() < 0.5:  # --answers server reads them
            chunk['choices'][0]['token_ids'] = rng.choice([[5, 6], [7], [], [-1], [1e20], [2.5], 'x', None, {}, [3] * 5000])
        if rng.random() < 0.3:
            chunk = mutate_json_values(rng, chunk, rng.randint(1, 3))
        ev.append(json.dumps(chunk))
    usage = {'prompt_tokens': rng.choice([3, 3, 3, 0, -1, 1e308, 'x', None]), 'completion_tokens': rng.choice([4, 4, 0, -5, 1e20]),
             'prompt_tokens_details': rng.choice([{'cached_tokens': 2}, {'cached_tokens': -3}, None, [], 'x'])}
    if rng.random() < 0.8:
        ev.append(json.dumps({'choices': [], 'usage': usage}))
    if rng.random() < 0.2:
        ev.append(json.dumps({'error': rng.choice([{'message': 'boom'}, 'boom', 5, None, {'message': 7}])}))
    if rng.random() < 0.85:
        ev.append('[DONE]')
    sep = rng.choice(['\n\n'] * 6 + ['\r\n\r\n', '\n', ''])
    body = ''.join(rng.choice(['data: ', 'data:', 'data: ', 'event: x\ndata: ', '']) + e + sep for e in ev)
    b = body.encode()
    r = rng.random()
    if r < 0.1:
        b = b[:rng.randint(0, len(b))]
    elif r < 0.2:
        b = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300)))
    elif r < 0.25:
        b = b'data: ' + b'{' * 100000 + b'\n\n'
    status = rng.choice([200] * 8 + [400, 500, 503, 204, 302])
    return status, b


def odd_models(rng):
    good = {'object': 'list', 'data': [{'id': 'm', 'object': 'model', 'max_model_len': 2048}]}
    r = rng.random()
    if r < 0.7:
        return 200, json.dumps(good).encode()
    if r < 0.9:
        return 200, json.dumps(mutate_json_values(rng, good, rng.randint(1, 3))).encode()
    return rng.choice([200, 404, 500]), rng.choice([b'', b'{', b'null', b'[]', b'\xff\xfe'])


def odd_metrics(rng):
    lines = ['# HELP x', 'kvpage_sequences_running 3', 'vllm:num_requests_running{model_name="m"} 2',
             'kvpage_kv_cache_usage_ratio 0.5', 'vllm:kv_cache_usage_perc{a="}"} nan', 'kvpage_preemptions_total inf',
             'kvpage_requests_waiting', 'kvpage_requests_waiting {', 'vllm:num_preemptions_total{x="1" 7',
             '\x00\x01', 'kvpage_sequences_running ' + '9' * 400]
    return 200, '\n'.join(rng.choice(lines) for _ in range(rng.randint(0, 12))).encode()


def fuzz_client(a, rng, keep):
    import http.server
    import threading
    state = {'rng': random.Random(0)}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'

        def log_message(self, *args):
            pass

        def answer(self, status, body, stream=False):
            try:
                self.send_response(status)
                self.send_header('Content-Type', 'text/event-stream' if stream else 'application/json')
                if state['rng'].random() < 0.9:
                    self.send_header('Content-Length', str(len(body)))
                self.send_header('Connection', 'close')
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass

        def do_GET(self):
            rng = state['rng']
            self.answer(*(odd_models(rng) if self.path.startswith('/v1/models') else odd_metrics(rng)))

        def do_POST(self):
            n = int(self.headers.get('Content-Length') or 0)
            self.rfile.read(n)
            self.answer(*odd_stream(state['rng']), stream=True)

    srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = 'http://127.0.0.1:%d' % srv.server_address[1]
    bad = 0
    codes = {}
    for i in range(a.n):
        state['rng'] = random.Random(rng.getrandbits(32))
        load = ['--workload', 'system:n=%d,prefix=16,suffix=8,output=4,vocab=512' % rng.randint(1, 4)]
        if rng.random() < 0.4:  # chat turns carrying the (fake) server's answers
            load = ['--workload', 'chat:conversations=2,turns=3,system=16,user=8,assistant=4,vocab=512', '--answers', 'server']
            load += ['--endpoint', 'chat'] if rng.random() < 0.5 else []
        args = [a.kvpage, 'bench', 'serve', '--model', os.path.join(S260, 'stories260K.gguf'), '--url', url] + load + [
                '--rate', 'inf', '--timeout', '5', '--metrics-interval', rng.choice(['0', '0.01', '0.1'])]
        rc, err = run_cli(args)
        codes[rc] = codes.get(rc, 0) + 1
        if rc not in (0, 1, 2) or sanitized(err):
            bad += 1
            print('BAD', i, rc, err[-1500:], flush=True)
    srv.shutdown()
    print('exit codes:', codes)
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('target', choices=['models', 'tokenizers', 'configs', 'traces', 'cli', 'serve', 'chat', 'client'])
    ap.add_argument('-n', type=int, default=500, help='inputs (requests for serve) to try (default 500)')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--kvpage', default=os.path.join(ROOT, 'build-asan', 'kvpage'))
    ap.add_argument('--keep', default='/tmp/kvpage-fuzz', help='folder for bad inputs (default /tmp/kvpage-fuzz)')
    a = ap.parse_args()
    if not os.access(a.kvpage, os.X_OK):
        sys.exit('%s: not found (run `make test` first, or pass --kvpage)' % a.kvpage)
    os.makedirs(a.keep, exist_ok=True)
    rng = random.Random(a.seed)
    bad = {'models': fuzz_models, 'tokenizers': fuzz_tokenizers, 'configs': fuzz_configs, 'traces': fuzz_traces,
           'cli': fuzz_cli, 'serve': fuzz_serve, 'chat': fuzz_chat,
           'client': fuzz_client}[a.target](a, rng, a.keep)
    print('%s: %d inputs, %d bad' % (a.target, a.n, bad))
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
