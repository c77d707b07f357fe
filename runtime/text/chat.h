/* runtime/text/chat.h — chat templates: a conversation of (role, content) messages rendered into a prompt
 * as the model's chat template renders it (Hugging Face's apply_chat_template); the renderings are listed in
 * chat.c. Built-in templates, not a Jinja engine: a model's own template is recognised by its markers, as
 * llama.cpp did before it ran Jinja.
 *
 * <s> and </s> are BOS and EOS, and <|im_start|>, <|eot_id|>, ... the tokenizer's control tokens, never
 * text: a message containing "</s>" gets those characters tokenized. Each run of text between them is
 * tokenized on its own with sentencepiece's leading space, as llama.cpp and Hugging Face's legacy Llama
 * tokenizer do. With add_generation_prompt the prompt ends where the assistant's reply starts (mistral
 * templates have none: their prompt ends at [/INST]).
 */
#ifndef KVP_RUNTIME_CHAT_H
#define KVP_RUNTIME_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/text/tokenizer.h"

typedef enum {
    KVP_CHAT_NONE = 0,
    KVP_CHAT_LLAMA2,            /* llama2: Llama-2-chat */
    KVP_CHAT_MISTRAL,           /* mistral: Mistral-7B-Instruct v0.1 (no system role) */
    KVP_CHAT_ZEPHYR,            /* zephyr: Zephyr, TinyLlama-chat */
    KVP_CHAT_LLAMA3,            /* llama3: Llama-3-Instruct */
    KVP_CHAT_CHATML,            /* chatml: ChatML (Qwen3 and others) */
    KVP_CHAT_QWEN2,             /* qwen2: ChatML with Qwen2-Instruct's default system message */
    KVP_CHAT_QWEN25,            /* qwen2.5: ChatML with Qwen2.5-Instruct's */
    KVP_CHAT_LLAMA31,           /* llama3.1: llama3, a system message with a knowledge date and 26 Jul 2024 */
    KVP_CHAT_LLAMA32,           /* llama3.2: Llama-3.2/3.3-Instruct, as llama3.1 with today's date */
    KVP_CHAT_SMOLLM2,           /* smollm2: ChatML with SmolLM2's default system message */
    KVP_CHAT_MISTRAL_V3,        /* mistral-v3: Mistral-Large-Instruct-2407 */
    KVP_CHAT_MISTRAL_V3_TEKKEN, /* mistral-v3-tekken: Mistral-Nemo-Instruct-2407 */
    KVP_CHAT_MISTRAL_V7,        /* mistral-v7: Mistral-Large-Instruct-2411 */
    KVP_CHAT_QWEN3_THINKING,    /* qwen3-thinking: Qwen3-4B-Thinking-2507 (<think> reasoning) */
    KVP_CHAT_DEEPSEEK_R1,       /* deepseek-r1: DeepSeek-R1-Distill-* (answers without their reasoning) */
    KVP_CHAT_MISTRAL_SMALL3,    /* mistral-small-3: Mistral-Small-3.1-24B-Instruct-2503 (today's date) */
    KVP_CHAT_GEMMA,             /* gemma: Gemma, Gemma 2 -it (no system message) */
    KVP_CHAT_GEMMA3             /* gemma3: Gemma 3 -it (a system message before the first user turn) */
} kvp_chat_template;

/* The names above; KVP_EINVAL naming the value and the choices. */
kvp_status kvp_chat_template_parse(const char *name, kvp_chat_template *out);
const char *kvp_chat_template_name(kvp_chat_template t); /* "none" for KVP_CHAT_NONE */
/* "llama2, mistral, ... or gemma3", for messages (cut to cap bytes). */
void kvp_chat_template_list(char *buf, size_t cap);
kvp_chat_template kvp_chat_template_detect(const char *jinja); /* by its markers; KVP_CHAT_NONE: none */

/* Detects the model's own template: a GGUF's tokenizer.chat_template, or an HF folder's tokenizer_config.json
 * chat_template (of several, "default"). KVP_CHAT_NONE when it has none (*jinja_found 0) or none built in.
 * KVP_EPARSE naming the file for an unreadable tokenizer_config.json or a chat_template not a string. */
kvp_status kvp_chat_template_of_model(const char *model_path, int is_gguf, kvp_chat_template *out, int *jinja_found);

typedef struct {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content;
} kvp_chat_msg;

/* The prompt as text, "<s>" / "</s>" where BOS and EOS go (apply_chat_template untokenized); *out is the
 * caller's (kvp_free). KVP_EINVAL naming the message (none, an unknown role, roles out of order, a role the
 * template has no place for); KVP_ENOMEM. */
kvp_status kvp_chat_render_text(kvp_chat_template t, const kvp_chat_msg *msgs, int32_t n, int add_generation_prompt,
                                char **out);
/* The same as tok's ids (*ids the caller's, kvp_free); KVP_EINVAL also for a control token tok lacks. */
kvp_status kvp_chat_render_ids(kvp_chat_template t, const kvp_tokenizer *tok, const kvp_chat_msg *msgs, int32_t n,
                               int add_generation_prompt, int32_t **ids, int32_t *n_ids);

/* Where a reply ends, whatever the model's EOS: <|eot_id|> (llama3), <|im_end|> (ChatML), <end_of_turn>
 * (gemma), else EOS; -1 when tok has none. */
int32_t kvp_chat_end_of_turn(kvp_chat_template t, const kvp_tokenizer *tok);

#endif
