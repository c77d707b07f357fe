#!/usr/bin/env python3
"""Writes the Mistral chat-template fixtures of tests/runtime/test_chat.c:

    pip install jinja2
    scripts/chat-template-fixture.py tests/data/chat

tests/data/chat/mistral-nemo-instruct-2407.jinja is Mistral-Nemo-Instruct-2407's chat_template as llama.cpp
keeps it (models/templates/, from the model's tokenizer_config.json): mistralai's "v3-tekken" template. This
script writes beside it
    mistral-large-instruct-2407.jinja   mistralai's "v3" template: the same with "[INST] " (a space), " " and
                                        trim before an answer, a space after [AVAILABLE_TOOLS], [TOOL_CALLS]
                                        and [TOOL_RESULTS] (as llama.cpp's test-chat-template.cpp quotes it)
    mistral-large-instruct-2411.jinja   mistralai's "v7" template (as test-chat-template.cpp quotes it)
and takes mistral-small-3.1-24b-instruct-2503.jinja (mistralai's "v7-tekken", Mistral-Small-3.1's as llama.cpp
keeps it) as it is; its default system message holds today's date, rendered as %TODAY% for the test to fill;
and Gemma's two templates, written here as google/gemma-2-9b-it's and google/gemma-3-4b-it's tokenizer_config.json
hold them (Gemma 1 and 2 share the first; Gemma 3's folds a system message into the first turn):
    gemma-2-9b-it.jinja, gemma-3-4b-it.jinja
and renders as well the two real tokenizer_config.json templates of ../shared/data/configs/tokenizer_configs/
(Qwen3-4B-Thinking-2507's, DeepSeek-R1-Distill-Qwen-32B's), read from there:
    cases.json                          each template rendered by jinja2 as transformers' apply_chat_template
                                        renders it (trim_blocks, lstrip_blocks, raise_exception), bos "<s>",
                                        eos "</s>", for a set of conversations: {"TEMPLATE": [{"messages",
                                        "add_generation_prompt", "text"} or {... "error": true}]}

The renderings are jinja2's, not kvpage's: the C tests compare kvpage's built-in templates against them.
"""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

V3_EDITS = [  # Nemo's "v3-tekken" text -> Large-2407's "v3" text
    ('"[AVAILABLE_TOOLS][" }}', '"[AVAILABLE_TOOLS] [" }}'),
    ('"[INST]" + system_message', '"[INST] " + system_message'),
    ('"[INST]" + message["content"]', '"[INST] " + message["content"]'),
    ('{%- elif (message.tool_calls is defined and message.tool_calls is not none) %}',
     '{%- elif message.tool_calls is defined and message.tool_calls is not none %}'),
    ('"[TOOL_CALLS][" }}', '"[TOOL_CALLS] [" }}'),
    ('{{- message["content"] + eos_token}}', '{{- " " + message["content"]|trim + eos_token}}'),
    ("'[TOOL_RESULTS]{\"content\": '", "'[TOOL_RESULTS] {\"content\": '"),
]

V7 = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + "
      "'[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}"
      "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}{% else %}{{ "
      "raise_exception('Only user, system and assistant roles are supported!') }}{% endif %}{% endfor %}")

GEMMA2 = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
          "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
          "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")

GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

CONVERSATIONS = [
    [("user", "Hello")],
    [("system", "Be brief."), ("user", "Hi there!")],
    [("user", "  Hi\n"), ("assistant", " Hello! "), ("user", "How are you?")],
    [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!\n"), ("user", "Bye")],
    [("system", "Sys"), ("user", "Hi"), ("assistant", "Ok")],
    [("user", "a"), ("user", "b")],
    [("system", "S1"), ("user", "u"), ("system", "S2"), ("user", "v")],
    [("assistant", "x")],
    [("system", "only")],
    # answers with reasoning, for the templates that drop or rewrite it
    [("user", "What is 2+2?"), ("assistant", "<think>\nadd them\n</think>\n\n4"), ("user", "And 3+3?")],
    [("system", "Be brief."), ("user", "Hi"), ("assistant", "<think>greet</think>Hello!")],
    [("user", "Hi"), ("assistant", "Hello!")],
    [("user", "x"), ("assistant", "\n<think>a<think>b\n</think>c</think>\n\nd\n")],
]

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "configs",
                      "tokenizer_configs")


def render(template, messages, agp):
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "%TODAY%"
    t = env.from_string(template)
    return t.render(messages=[{"role": r, "content": c} for r, c in messages], bos_token="<s>", eos_token="</s>",
                    add_generation_prompt=agp)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/chat"
    nemo = open(os.path.join(out, "mistral-nemo-instruct-2407.jinja")).read()
    v3 = nemo
    for a, b in V3_EDITS:
        assert v3.count(a) == 1, a
        v3 = v3.replace(a, b)
    templates = {"mistral-v3-tekken": ("mistral-nemo-instruct-2407.jinja", nemo),
                 "mistral-v3": ("mistral-large-instruct-2407.jinja", v3),
                 "mistral-v7": ("mistral-large-instruct-2411.jinja", V7),
                 "gemma": ("gemma-2-9b-it.jinja", GEMMA2), "gemma3": ("gemma-3-4b-it.jinja", GEMMA3)}
    with open(os.path.join(out, "mistral-small-3.1-24b-instruct-2503.jinja")) as f:
        templates["mistral-small-3"] = (None, f.read())
    for name, model in (("qwen3-thinking", "Qwen3-4B-Thinking-2507"), ("deepseek-r1", "DeepSeek-R1-Distill-Qwen-32B")):
        with open(os.path.join(SHARED, model + ".tokenizer_config.json")) as f:
            templates[name] = (None, json.load(f)["chat_template"])
    cases = {}
    for name, (fname, text) in templates.items():
        if fname:
            with open(os.path.join(out, fname), "w") as f:
                f.write(text)
        rows = []
        for conv in CONVERSATIONS:
            for agp in (True, False):
                row = {"messages": [{"role": r, "content": c} for r, c in conv], "add_generation_prompt": agp}
                try:
                    row["text"] = render(text, conv, agp)
                except jinja2.exceptions.TemplateError:
                    row["error"] = True
                rows.append(row)
        cases[name] = rows
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
