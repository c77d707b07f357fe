/* Chat template tests: the built-in templates against the prompts the models' own Jinja templates render
 * (written out from their Hugging Face tokenizer_config.json templates and model cards), detection from
 * those templates, token ids with BOS/EOS as ids (never from text), refusals, allocation failures. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/json.h"
#include "model_testutil.h"
#include "runtime/text/chat.h"
#include "runtime/text/tokenizer.h"

static void expect_text(kvp_chat_template t, const kvp_chat_msg *m, int32_t n, int agp, const char *want)
{
    char *got = NULL;
    cr_assert_eq(kvp_chat_render_text(t, m, n, agp, &got), KVP_OK, "%s", kvp_error_detail());
    cr_assert_str_eq(got, want, "%s:\ngot  [%s]\nwant [%s]", kvp_chat_template_name(t), got, want);
    kvp_free(got);
}

Test(chat, templates_render_as_the_models_own)
{
    const kvp_chat_msg sys_user[2] = {{"system", "You are a friendly chatbot who always responds in the style of a pirate"},
                                      {"user", "How many helicopters can a human eat in one sitting?"}};
    /* TinyLlama-1.1B-Chat-v1.0's model card */
    expect_text(KVP_CHAT_ZEPHYR, sys_user, 2, 1,
                "<|system|>\nYou are a friendly chatbot who always responds in the style of a pirate</s>\n<|user|>\n"
                "How many helicopters can a human eat in one sitting?</s>\n<|assistant|>\n");
    expect_text(KVP_CHAT_ZEPHYR, sys_user + 1, 1, 0, "<|user|>\nHow many helicopters can a human eat in one sitting?</s>\n");
    /* Llama-2-chat: the system message inside the first [INST], contents stripped */
    const kvp_chat_msg conv[4] = {{"system", "Be brief."}, {"user", "  Hi there!\n"}, {"assistant", " Hello! "},
                                  {"user", "How are you?"}};
    expect_text(KVP_CHAT_LLAMA2, conv, 4, 1,
                "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n  Hi there! [/INST] Hello! </s><s>[INST] How are you? [/INST]");
    expect_text(KVP_CHAT_LLAMA2, conv + 1, 3, 1, "<s>[INST] Hi there! [/INST] Hello! </s><s>[INST] How are you? [/INST]");
    /* Mistral-7B-Instruct-v0.1: BOS once, the reply right after [/INST] */
    expect_text(KVP_CHAT_MISTRAL, conv + 1, 3, 1, "<s>[INST]   Hi there!\n [/INST] Hello! </s>[INST] How are you? [/INST]");
}

/* Llama-3 and ChatML: the strings jinja2 renders from Meta-Llama-3-8B-Instruct's, Qwen2-Instruct's,
 * Qwen2.5-Instruct's (no tools) and plain ChatML's chat_template for the same two conversations. In text
 * form BOS is written "<s>" (the llama3 template writes bos_token, "<|begin_of_text|>"). */
Test(chat, llama3_and_chatml_render_as_the_models_own)
{
    const kvp_chat_msg su[2] = {{"system", "Be brief."}, {"user", "  Hi there!\n"}};
    const kvp_chat_msg multi[3] = {{"user", "Hi"}, {"assistant", " Hello! "}, {"user", "How are you?"}};
    expect_text(KVP_CHAT_LLAMA3, su, 2, 1,
                "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
                "<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_text(KVP_CHAT_LLAMA3, multi, 3, 0,
                "<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
                "<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>");
    /* Llama-3.1-Instruct's template (jinja2, no tools): the dated system message holds the stripped system
     * content, or nothing; 3.2's writes today's date */
    const kvp_chat_msg su2[2] = {{"system", "  Be brief.\n"}, {"user", "  Hi there!\n"}};
    expect_text(KVP_CHAT_LLAMA31, su2, 2, 1,
                "<s><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 "
                "Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
    const char *l31 = "<s><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: "
                      "%s\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>"
                      "assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHow are "
                      "you?<|eot_id|>";
    char w31[1024], today[32];
    snprintf(w31, sizeof w31, l31, "26 Jul 2024");
    expect_text(KVP_CHAT_LLAMA31, multi, 3, 0, w31);
    const time_t now = time(NULL);
    struct tm tmv;
    cr_assert_not_null(localtime_r(&now, &tmv));
    strftime(today, sizeof today, "%d %b %Y", &tmv);
    snprintf(w31, sizeof w31, l31, today);
    expect_text(KVP_CHAT_LLAMA32, multi, 3, 0, w31);
    const char *with_sys = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n  Hi there!\n<|im_end|>\n"
                           "<|im_start|>assistant\n";
    expect_text(KVP_CHAT_CHATML, su, 2, 1, with_sys);
    expect_text(KVP_CHAT_QWEN2, su, 2, 1, with_sys);
    expect_text(KVP_CHAT_QWEN25, su, 2, 1, with_sys);
    const char *turns = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n Hello! <|im_end|>\n"
                        "<|im_start|>user\nHow are you?<|im_end|>\n";
    char want[1024];
    expect_text(KVP_CHAT_CHATML, multi, 3, 0, turns);
    snprintf(want, sizeof want, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n%s<|im_start|>assistant\n", turns);
    expect_text(KVP_CHAT_QWEN2, multi, 3, 1, want);
    snprintf(want, sizeof want, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                                "assistant.<|im_end|>\n%s",
             turns);
    expect_text(KVP_CHAT_QWEN25, multi, 3, 0, want);
    /* SmolLM2-Instruct's template (Qwen2's with its own default system message), rendered by jinja2 */
    expect_text(KVP_CHAT_SMOLLM2, su, 2, 1, with_sys);
    snprintf(want, sizeof want, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                                "Face<|im_end|>\n%s<|im_start|>assistant\n",
             turns);
    expect_text(KVP_CHAT_SMOLLM2, multi, 3, 1, want);
}

/* Templates against jinja2's renderings of the models' own (tests/data/chat/cases.json, written by
 * scripts/chat-template-fixture.py): mistralai's v3, v3-tekken and v7 (Mistral-Large-Instruct-2407's,
 * Mistral-Nemo-Instruct-2407's and Mistral-Large-Instruct-2411's templates, and v7-tekken, Mistral-Small-3.1's, in
 * tests/data/chat), Gemma 2's and Gemma 3's (gemma-2-9b-it.jinja, gemma-3-4b-it.jinja), and the real
 * tokenizer_config.json templates of Qwen3-4B-Thinking-2507 and DeepSeek-R1-Distill-Qwen-32B (in
 * ../shared/data/configs/tokenizer_configs), every conversation with and without a generation prompt: the
 * same text, or a refusal where the template raises. Each template is detected as its built-in. */
Test(chat, templates_render_as_jinja2_renders_the_models_own)
{
    tu_require_shared();
    static const struct {
        const char *name, *jinja, *config; /* the template: a .jinja file, or a tokenizer_config.json's */
        kvp_chat_template t;
        int refusals;
    } k[] = {{"mistral-v3", "tests/data/chat/mistral-large-instruct-2407.jinja", NULL, KVP_CHAT_MISTRAL_V3, 6},
             {"mistral-v3-tekken", "tests/data/chat/mistral-nemo-instruct-2407.jinja", NULL, KVP_CHAT_MISTRAL_V3_TEKKEN, 6},
             {"mistral-v7", "tests/data/chat/mistral-large-instruct-2411.jinja", NULL, KVP_CHAT_MISTRAL_V7, 0},
             {"qwen3-thinking", NULL, "Qwen3-4B-Thinking-2507", KVP_CHAT_QWEN3_THINKING, 0},
             {"deepseek-r1", NULL, "DeepSeek-R1-Distill-Qwen-32B", KVP_CHAT_DEEPSEEK_R1, 0},
             {"mistral-small-3", "tests/data/chat/mistral-small-3.1-24b-instruct-2503.jinja", NULL, KVP_CHAT_MISTRAL_SMALL3, 2},
             {"gemma", "tests/data/chat/gemma-2-9b-it.jinja", NULL, KVP_CHAT_GEMMA, 16},
             {"gemma3", "tests/data/chat/gemma-3-4b-it.jinja", NULL, KVP_CHAT_GEMMA3, 4}};
    cJSON *cases;
    cr_assert_eq(kvp_json_parse_file("tests/data/chat/cases.json", &cases), KVP_OK, "%s", kvp_error_detail());
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        if (k[i].jinja) {
            size_t len;
            char *jinja = (char *)tu_read_all(k[i].jinja, &len);
            jinja[len] = '\0';
            cr_assert_eq(kvp_chat_template_detect(jinja), k[i].t, "%s is detected as %s", k[i].jinja, k[i].name);
            free(jinja);
        } else {
            char path[256];
            snprintf(path, sizeof path, "../shared/data/configs/tokenizer_configs/%s.tokenizer_config.json", k[i].config);
            cJSON *cfg;
            cr_assert_eq(kvp_json_parse_file(path, &cfg), KVP_OK, "%s", kvp_error_detail());
            const cJSON *tmpl = cJSON_GetObjectItem(cfg, "chat_template");
            cr_assert(cJSON_IsString(tmpl), "%s: no chat_template", path);
            cr_assert_eq(kvp_chat_template_detect(tmpl->valuestring), k[i].t, "%s is detected as %s", path, k[i].name);
            cJSON_Delete(cfg);
        }
        kvp_chat_template t;
        cr_assert_eq(kvp_chat_template_parse(k[i].name, &t), KVP_OK);
        cr_assert_eq(t, k[i].t);
        const cJSON *row;
        int nrows = 0, nerr = 0;
        cJSON_ArrayForEach(row, cJSON_GetObjectItem(cases, k[i].name)) {
            kvp_chat_msg m[8];
            int32_t n = 0;
            const cJSON *msg;
            cJSON_ArrayForEach(msg, cJSON_GetObjectItem(row, "messages")) {
                cr_assert_lt(n, 8);
                m[n++] = (kvp_chat_msg){cJSON_GetObjectItem(msg, "role")->valuestring,
                                        cJSON_GetObjectItem(msg, "content")->valuestring};
            }
            const int agp = cJSON_IsTrue(cJSON_GetObjectItem(row, "add_generation_prompt"));
            const cJSON *text = cJSON_GetObjectItem(row, "text");
            if (cJSON_IsString(text)) { /* %TODAY%: the date a template writes, today's */
                char want[4096], today[16];
                const time_t now = time(NULL);
                struct tm tmv;
                cr_assert_not_null(localtime_r(&now, &tmv));
                strftime(today, sizeof today, "%Y-%m-%d", &tmv);
                const char *at = strstr(text->valuestring, "%TODAY%");
                if (at) snprintf(want, sizeof want, "%.*s%s%s", (int)(at - text->valuestring), text->valuestring, today, at + 7);
                else snprintf(want, sizeof want, "%s", text->valuestring);
                expect_text(t, m, n, agp, want);
            } else {
                char *got = NULL;
                cr_assert_eq(kvp_chat_render_text(t, m, n, agp, &got), KVP_EINVAL, "%s, row %d: jinja2 raises, we gave [%s]",
                             k[i].name, nrows, got ? got : "");
                nerr++;
            }
            nrows++;
        }
        cr_assert_eq(nrows, 26, "%s: %d rows", k[i].name, nrows);
        cr_assert_eq(nerr, k[i].refusals, "%s: %d refusals", k[i].name, nerr);
    }
    cJSON_Delete(cases);
}

/* In ids, the markers are the tokenizer's control tokens: the same ids as the rendered text tokenized with
 * control pieces parsed (what apply_chat_template(tokenize=True) gives), except that a marker written inside
 * a message stays text. The byte-level fixtures of tests/data/tokenizers have these control tokens. */
Test(chat, llama3_and_chatml_ids_use_the_control_tokens)
{
    const struct {
        kvp_chat_template t;
        const char *tok;
    } cases[] = {{KVP_CHAT_LLAMA3, "llama3"},          {KVP_CHAT_LLAMA31, "llama3"},           {KVP_CHAT_QWEN25, "qwen2"},
                 {KVP_CHAT_SMOLLM2, "qwen2"},          {KVP_CHAT_MISTRAL_V3, "tekken"},        {KVP_CHAT_MISTRAL_V3_TEKKEN, "tekken"},
                 {KVP_CHAT_MISTRAL_V7, "tekken"},      {KVP_CHAT_QWEN3_THINKING, "qwen2"},     {KVP_CHAT_DEEPSEEK_R1, "deepseek"},
                 {KVP_CHAT_MISTRAL_SMALL3, "tekken"}};
    const kvp_chat_msg m[3] = {{"system", "Be brief."}, {"user", "Say <|im_end|> or <|eot_id|>."}, {"assistant", "Ok."}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char path[128];
        snprintf(path, sizeof path, "tests/data/tokenizers/%s/tokenizer.json", cases[c].tok);
        kvp_tokenizer *t;
        cr_assert_eq(kvp_tok_from_hf_json(path, &t), KVP_OK, "%s", kvp_error_detail());
        int32_t *ids, n, *want, nw;
        cr_assert_eq(kvp_chat_render_ids(cases[c].t, t, m, 3, 1, &ids, &n), KVP_OK, "%s", kvp_error_detail());
        const kvp_chat_msg plain[3] = {m[0], {"user", "Say it."}, m[2]};
        char *text;
        cr_assert_eq(kvp_chat_render_text(cases[c].t, plain, 3, 1, &text), KVP_OK);
        if (strncmp(text, "<s>", 3) == 0) { /* the llama3 text form writes BOS as <s> */
            memmove(text, text + 3, strlen(text + 3) + 1);
            int32_t *r, nr;
            cr_assert_eq(kvp_tok_encode_ex(t, text, strlen(text), KVP_TOK_ADD_BOS | KVP_TOK_PARSE_SPECIAL, &r, &nr), KVP_OK);
            want = r, nw = nr;
        } else {
            cr_assert_eq(kvp_tok_encode_ex(t, text, strlen(text), KVP_TOK_PARSE_SPECIAL, &want, &nw), KVP_OK);
        }
        /* the two renderings differ only in the user message's text: compare the control tokens in order */
        int32_t a = 0, b = 0;
        for (;;) {
            while (a < n && kvp_tok_type_of(t, ids[a]) != KVP_TOK_CONTROL) a++;
            while (b < nw && kvp_tok_type_of(t, want[b]) != KVP_TOK_CONTROL) b++;
            if (a == n || b == nw) break;
            cr_assert_eq(ids[a], want[b], "%s: control token %d vs %d", cases[c].tok, a, b);
            a++, b++;
        }
        cr_assert(a == n && b == nw, "%s: as many control tokens", cases[c].tok);
        cr_assert_eq(ids[n - 1], want[nw - 1]);
        cr_assert_gt(kvp_chat_end_of_turn(cases[c].t, t), 0);
        cr_assert_eq(kvp_tok_type_of(t, kvp_chat_end_of_turn(cases[c].t, t)), KVP_TOK_CONTROL);
        kvp_free(ids);
        kvp_free(want);
        kvp_free(text);
        kvp_tok_destroy(t);
    }
    /* the stories260K vocabulary has no <|im_start|>: a clear refusal */
    kvp_tokenizer *s;
    cr_assert_eq(kvp_tok_load(S260_GGUF, 0, &s), KVP_OK, "%s", kvp_error_detail());
    int32_t *ids, n;
    cr_assert_eq(kvp_chat_render_ids(KVP_CHAT_CHATML, s, m, 3, 1, &ids, &n), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "'<|im_start|>'"), "%s", kvp_error_message());
    kvp_tok_destroy(s);
}

Test(chat, detection_parsing_and_refusals)
{
    /* markers of the models' own templates (abridged) */
    cr_assert_eq(kvp_chat_template_detect("{% if messages[0]['role'] == 'system' %}...{{ bos_token + '[INST] ' + "
                                          "content.strip() + ' [/INST]' }}...'<<SYS>>\\n' + system_message"),
                 KVP_CHAT_LLAMA2);
    cr_assert_eq(kvp_chat_template_detect("{{ bos_token }}{% for message in messages %}{{ '[INST] ' + "
                                          "message['content'] + ' [/INST]' }}"),
                 KVP_CHAT_MISTRAL);
    cr_assert_eq(kvp_chat_template_detect("{{ '<|user|>\\n' + message['content'] + eos_token }}{{ '<|assistant|>' }}"),
                 KVP_CHAT_ZEPHYR);
    cr_assert_eq(kvp_chat_template_detect("{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                                          "'<|im_end|>' }}"),
                 KVP_CHAT_CHATML);
    cr_assert_eq(kvp_chat_template_detect("{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>' }}"),
                 KVP_CHAT_QWEN2);
    cr_assert_eq(kvp_chat_template_detect("'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
                                          "helpful assistant.<|im_end|>\\n'"),
                 KVP_CHAT_QWEN25);
    /* SmolLM2-Instruct's whole template */
    cr_assert_eq(kvp_chat_template_detect(
                     "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
                     "'<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                     "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                     "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
                     "}}{% endif %}"),
                 KVP_CHAT_SMOLLM2);
    cr_assert_eq(kvp_chat_template_detect("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}"
                                          "{{ content | trim + '<|eot_id|>' }}"),
                 KVP_CHAT_LLAMA3);
    cr_assert_eq(kvp_chat_template_detect("{%- set date_string = \"26 Jul 2024\" %}{{- \"Cutting Knowledge Date: December "
                                          "2023\\n\" }}<|start_header_id|><|eot_id|>"),
                 KVP_CHAT_LLAMA31);
    cr_assert_eq(kvp_chat_template_detect("{%- set date_string = strftime_now(\"%d %b %Y\") %}{{- \"Cutting Knowledge "
                                          "Date: December 2023\\n\" }}<|start_header_id|><|eot_id|>"),
                 KVP_CHAT_LLAMA32);
    cr_assert_eq(kvp_chat_template_detect("{{ '<start_of_turn>' + role }}"), KVP_CHAT_GEMMA);
    cr_assert_eq(kvp_chat_template_detect("{{ '<start_of_turn>' + role + first_user_prefix }}"), KVP_CHAT_GEMMA3);
    cr_assert_eq(kvp_chat_template_detect("{{ '<turn>' + role }}"), KVP_CHAT_NONE);
    cr_assert_eq(kvp_chat_template_detect(NULL), KVP_CHAT_NONE);
    kvp_chat_template t;
    cr_assert_eq(kvp_chat_template_parse("mistral", &t), KVP_OK);
    cr_assert_eq(t, KVP_CHAT_MISTRAL);
    cr_assert_eq(kvp_chat_template_parse("qwen2.5", &t), KVP_OK);
    cr_assert_eq(t, KVP_CHAT_QWEN25);
    cr_assert_eq(kvp_chat_template_parse("smollm2", &t), KVP_OK);
    cr_assert_eq(t, KVP_CHAT_SMOLLM2);
    cr_assert_eq(kvp_chat_template_parse("vicuna", &t), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "'vicuna'") && strstr(kvp_error_message(), "smollm2"), "%s",
              kvp_error_message());
    static const struct {
        kvp_chat_template t;
        kvp_chat_msg m[3];
        int32_t n;
        const char *needle;
    } bad[] = {
        {KVP_CHAT_LLAMA2, {{"user", "a"}, {"user", "b"}}, 2, "message 1 is user: roles must alternate"},
        {KVP_CHAT_LLAMA2, {{"assistant", "a"}}, 1, "message 0 is assistant"},
        {KVP_CHAT_LLAMA2, {{"user", "a"}, {"assistant", "b"}, {"system", "c"}}, 3, "a system message can only come first"},
        {KVP_CHAT_MISTRAL, {{"system", "a"}, {"user", "b"}}, 2, "the mistral template has no system role"},
        {KVP_CHAT_ZEPHYR, {{"tool", "a"}}, 1, "message 0 has role \"tool\""},
        {KVP_CHAT_ZEPHYR, {{"user", NULL}}, 1, "message 0 has no content"},
        {KVP_CHAT_ZEPHYR, {{"user", "a"}}, 0, "no message"},
        {KVP_CHAT_NONE, {{"user", "a"}}, 1, "no chat template"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = (char *)1;
        cr_assert_eq(kvp_chat_render_text(bad[i].t, bad[i].m, bad[i].n, 1, &out), KVP_EINVAL, "case %zu", i);
        cr_assert_null(out);
        cr_assert(strstr(kvp_error_message(), bad[i].needle), "case %zu: %s", i, kvp_error_message());
    }
}

static kvp_tokenizer *g_tok;

static void setup(void)
{
    tu_require_shared();
    cr_assert_eq(kvp_tok_load(S260_GGUF, 0, &g_tok), KVP_OK, "%s", kvp_error_detail());
}

static void teardown(void) { kvp_tok_destroy(g_tok); }

/* ids = [BOS] + encode(text run) + [EOS] + ... : each run between specials encoded alone; "</s>" written
 * in a message stays text. */
Test(chat, token_ids_put_bos_and_eos_as_ids, .init = setup, .fini = teardown)
{
    const kvp_chat_msg m[3] = {{"user", "Lily saw </s> a cat"}, {"assistant", "It ran."}, {"user", "Why?"}};
    int32_t *ids, n;
    cr_assert_eq(kvp_chat_render_ids(KVP_CHAT_LLAMA2, g_tok, m, 3, 1, &ids, &n), KVP_OK, "%s", kvp_error_detail());
    const char *runs[2] = {"[INST] Lily saw </s> a cat [/INST] It ran. ", "[INST] Why? [/INST]"};
    int32_t at = 0;
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(ids[at++], kvp_tok_bos(g_tok), "run %d starts with BOS", r);
        int32_t *e, ne;
        cr_assert_eq(kvp_tok_encode(g_tok, runs[r], strlen(runs[r]), 0, &e, &ne), KVP_OK);
        cr_assert_leq(at + ne, n);
        for (int32_t i = 0; i < ne; i++) cr_assert_eq(ids[at + i], e[i], "run %d token %d", r, i);
        at += ne;
        kvp_free(e);
        if (r == 0) cr_assert_eq(ids[at++], kvp_tok_eos(g_tok), "the reply ends with EOS");
    }
    cr_assert_eq(at, n);
    int eos = 0;
    for (int32_t i = 0; i < n; i++) eos += ids[i] == kvp_tok_eos(g_tok);
    cr_assert_eq(eos, 1, "text never becomes an EOS");
    kvp_free(ids);
}

typedef struct {
    kvp_chat_template t;
    const kvp_chat_msg *m;
    int32_t n;
} render_ctx;

static kvp_status make_ids(void *ctx, void **obj)
{
    render_ctx *c = ctx;
    int32_t *ids, n;
    kvp_status st = kvp_chat_render_ids(c->t, g_tok, c->m, c->n, 1, &ids, &n);
    if (st == KVP_OK) *obj = ids;
    return st;
}

static kvp_status make_text(void *ctx, void **obj)
{
    render_ctx *c = ctx;
    char *s;
    kvp_status st = kvp_chat_render_text(c->t, c->m, c->n, 1, &s);
    if (st == KVP_OK) *obj = s;
    return st;
}

static void destroy(void *obj) { kvp_free(obj); }

Test(chat, every_allocation_failure, .init = setup, .fini = teardown)
{
    const kvp_chat_msg m[3] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}};
    for (int t = KVP_CHAT_LLAMA2; t <= KVP_CHAT_ZEPHYR; t++) {
        render_ctx c = {(kvp_chat_template)t, t == KVP_CHAT_MISTRAL ? m + 1 : m, t == KVP_CHAT_MISTRAL ? 2 : 3};
        tu_every_alloc_failure("chat ids", make_ids, destroy, &c, 0);
        tu_every_alloc_failure("chat text", make_text, destroy, &c, 0);
    }
}
