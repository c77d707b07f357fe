#!/usr/bin/env python3
"""Checks a running `kvpage serve` with OpenAI's own Python client (pip install openai): the client parses
every answer into its typed objects, so a field of the wrong shape fails here. Usage:

    build/kvpage serve --model ../shared/models/stories260K/stories260K.gguf --chat-template llama2 --port 8000 &
    scripts/openai-client-check.py http://127.0.0.1:8000

Exits 0 and prints "ok" when every call gave what it should."""
import sys

import openai


def main(base):
    c = openai.OpenAI(base_url=base + "/v1", api_key="none")
    name = c.models.list().data[0].id
    r = c.completions.create(model=name, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.choices[0].text and r.usage.completion_tokens == 8, r
    # lm-evaluation-harness's scoring request: echo + logprobs, the prompt as token ids
    ids = [1, 403, 407, 261, 378]
    r = c.completions.create(model=name, prompt=ids, max_tokens=0, temperature=0, logprobs=1, echo=True)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp
    assert all(x < 0 for x in lp.token_logprobs[1:]) and lp.text_offset[1] == 0, lp
    # streamed, several prompts and samples, usage at the end, logprobs per event
    s = c.completions.create(model=name, prompt=["Tom", "Lily"], max_tokens=6, n=2, seed=3, stream=True,
                             stream_options={"include_usage": True}, logprobs=1)
    texts, usage, tokens = {}, None, 0
    for ev in s:
        for ch in ev.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            tokens += len(ch.logprobs.tokens) if ch.logprobs else 0
        usage = ev.usage or usage
    assert sorted(texts) == [0, 1, 2, 3] and usage.completion_tokens == tokens == 24, (texts, usage, tokens)
    r = c.chat.completions.create(model=name, messages=[{"role": "system", "content": "Be nice."},
                                                        {"role": "user", "content": "Hi"}],
                                  max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    m = r.choices[0]
    assert m.message.role == "assistant" and len(m.logprobs.content) == 8, r
    assert bytes(b for t in m.logprobs.content for b in t.bytes).decode() == m.message.content, r
    s = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True,
                                  stream_options={"include_usage": True}, frequency_penalty=0.5,
                                  logit_bias={"300": 2}, seed=1)
    out, usage = "", None
    for ev in s:
        for ch in ev.choices:
            out += ch.delta.content or ""
        usage = ev.usage or usage
    assert out and usage.completion_tokens == 6, (out, usage)
    try:
        c.completions.create(model=name, prompt="x", max_tokens=4, suffix="y")
        raise AssertionError("suffix was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "suffix" in e.message, e
    try:
        c.completions.create(model="gpt-4", prompt="x")
        raise AssertionError("an unknown model was served")
    except openai.NotFoundError:
        pass
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")
