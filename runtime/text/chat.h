/* runtime/text/chat.h — chat templates: a conversation (role, content messages) rendered into a prompt the way
 * a model's chat template renders it (Hugging Face's apply_chat_template), for the sentencepiece chat models
 * the tokenizer reads. Built-in templates, not a Jinja engine: a model's own template (GGUF metadata
 * tokenizer.chat_template) is recognised by its markers, as llama.cpp did before it ran Jinja.
 *
 *   llama2   Llama-2-chat:  <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ...
 *            (contents stripped of surrounding whitespace; roles alternate user/assistant after one system)
 *   mistral  Mistral-7B-Instruct v0.1:  <s>[INST] {user} [/INST]{assistant}</s>[INST] ...  (no system role)
 *   mistral-v3  mistralai's "v3" (Mistral-Large-Instruct-2407):  <s>[INST] {user}[/INST] {assistant, stripped}</s>
 *            [INST] ...; a system message goes before the last message when that is the user's: "{system}\n\n{user}"
 *   mistral-v3-tekken  mistralai's "v3-tekken" (Mistral-Nemo-Instruct-2407):  as v3 without the spaces and with the
 *            answer as it is:  <s>[INST]{user}[/INST]{assistant}</s>[INST]...
 *   mistral-v7  mistralai's "v7" (Mistral-Large-Instruct-2411):  <s>[SYSTEM_PROMPT] {system}[/SYSTEM_PROMPT][INST]
 *            {user}[/INST] {assistant}</s>... (every message in order; [INST], [SYSTEM_PROMPT] are control tokens)
 *            (none of the mistral templates writes a generation prompt: the prompt ends at [/INST])
 *   mistral-small-3  mistralai's "v7-tekken" (Mistral-Small-3.1-24B-Instruct-2503):  <s>[SYSTEM_PROMPT]{system, or
 *            the model's default one with today's date}[/SYSTEM_PROMPT][INST]{user}[/INST]{assistant}</s>...
 *   qwen3-thinking  Qwen3-4B-Thinking-2507: ChatML; an answer's "<think>..</think>" reasoning is dropped before the
 *            last user message and rewritten "<think>\n{reasoning}\n</think>\n\n{answer}" after it; the generation
 *            prompt is "<|im_start|>assistant\n<think>\n"
 *   deepseek-r1  DeepSeek-R1-Distill-*: <s>{system}<｜User｜>{user}<｜Assistant｜>{answer after its </think>}
 *            <｜end▁of▁sentence｜>...; the generation prompt is <｜Assistant｜>
 *   zephyr   Zephyr / TinyLlama-chat:  <|system|>\n{system}</s>\n<|user|>\n{user}</s>\n<|assistant|>\n
 *   llama3   Llama-3-Instruct:  <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>...
 *            (contents stripped)
 *   llama3.1 Llama-3.1-Instruct: the same after a system message that opens "Cutting Knowledge Date:
 *            December 2023\nToday Date: 26 Jul 2024\n\n" and holds the conversation's system message
 *   llama3.2 Llama-3.2/3.3-Instruct: as llama3.1 with today's date ("%d %b %Y", as their templates'
 *            strftime_now writes it)
 *   chatml   ChatML (Qwen3, and others):  <|im_start|>{role}\n{content}<|im_end|>\n...
 *   qwen2    ChatML with Qwen2-Instruct's default system message ("You are a helpful assistant.")
 *   qwen2.5  ChatML with Qwen2.5-Instruct's ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
 *   gemma    Gemma and Gemma 2 (-it):  <bos><start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n{assistant}
 *            <end_of_turn>\n...  (contents stripped; no system message; the prompt ends "<start_of_turn>model\n")
 *   gemma3   Gemma 3 (-it): the same, a first system message going, as it is, before the first turn's content:
 *            "{system}\n\n{user}"
 *
 * <s> and </s> are the BOS and EOS tokens, and <|im_start|>, <|eot_id|>, ... the tokenizer's control tokens of
 * that text, never text: a message that contains "</s>" or "<|im_end|>" gets those characters tokenized, not
 * the token. Each run of text between them is tokenized on its own with sentencepiece's leading
 * space, as llama.cpp and Hugging Face's legacy Llama tokenizer do. With add_generation_prompt the prompt
 * ends where the assistant's reply starts (llama2 and the mistral ones: after [/INST]; zephyr: "<|assistant|>\n";
 * llama3: "<|start_header_id|>assistant<|end_header_id|>\n\n"; ChatML: "<|im_start|>assistant\n").
 */
#ifndef KVP_RUNTIME_CHAT_H
#define KVP_RUNTIME_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/text/tokenizer.h"

typedef enum {
    KVP_CHAT_NONE = 0,
    KVP_CHAT_LLAMA2,
    KVP_CHAT_MISTRAL,
    KVP_CHAT_ZEPHYR,
    KVP_CHAT_LLAMA3,
    KVP_CHAT_CHATML,
    KVP_CHAT_QWEN2,
    KVP_CHAT_QWEN25,
    KVP_CHAT_LLAMA31,
    KVP_CHAT_LLAMA32,
    KVP_CHAT_SMOLLM2,
    KVP_CHAT_MISTRAL_V3,
    KVP_CHAT_MISTRAL_V3_TEKKEN,
    KVP_CHAT_MISTRAL_V7,
    KVP_CHAT_QWEN3_THINKING,
    KVP_CHAT_DEEPSEEK_R1,
    KVP_CHAT_MISTRAL_SMALL3,
    KVP_CHAT_GEMMA,
    KVP_CHAT_GEMMA3
} kvp_chat_template;

/* "llama2" | "mistral" | "zephyr" | "llama3" | "llama3.1" | "llama3.2" | "chatml" | "qwen2" | "qwen2.5" |
 * "smollm2" | "mistral-v3" | "mistral-v3-tekken" | "mistral-v7" | "qwen3-thinking" | "deepseek-r1" |
 * "mistral-small-3" | "gemma" | "gemma3" (KVP_EINVAL naming the value and the choices). */
kvp_status kvp_chat_template_parse(const char *name, kvp_chat_template *out);
const char *kvp_chat_template_name(kvp_chat_template t); /* "none" for KVP_CHAT_NONE */
/* "llama2, mistral, ... or smollm2": the built-in names, for messages (cut to cap bytes). */
void kvp_chat_template_list(char *buf, size_t cap);
/* The built-in template a Jinja chat template is, by its markers; KVP_CHAT_NONE when it is none of them. */
kvp_chat_template kvp_chat_template_detect(const char *jinja);

/* The built-in template of a model's own chat template: a GGUF file's tokenizer.chat_template, or the
 * chat_template of tokenizer_config.json in a Hugging Face folder (the one named "default" when it lists
 * several). KVP_CHAT_NONE when the model has none or one of no built-in kind (*jinja_found says which).
 * KVP_EPARSE naming the file for an unreadable tokenizer_config.json or a chat_template that is no string. */
kvp_status kvp_chat_template_of_model(const char *model_path, int is_gguf, kvp_chat_template *out, int *jinja_found);

typedef struct {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content;
} kvp_chat_msg;

/* The prompt of msgs[0..n) as text, with "<s>" and "</s>" where BOS and EOS go (what apply_chat_template
 * returns untokenized); *out owned by the caller (kvp_free). KVP_EINVAL naming the message and the problem
 * (no message, an unknown role, roles out of order, a role the template has no place for); KVP_ENOMEM. */
kvp_status kvp_chat_render_text(kvp_chat_template t, const kvp_chat_msg *msgs, int32_t n, int add_generation_prompt,
                                char **out);
/* The same prompt as token ids of tok (BOS, EOS and the template's control tokens as their ids); *ids owned by
 * the caller (kvp_free). KVP_EINVAL also when the tokenizer lacks a control token the template needs. */
kvp_status kvp_chat_render_ids(kvp_chat_template t, const kvp_tokenizer *tok, const kvp_chat_msg *msgs, int32_t n,
                               int add_generation_prompt, int32_t **ids, int32_t *n_ids);

/* The token that ends an assistant's turn: <|eot_id|> (llama3), <|im_end|> (ChatML, qwen3-thinking), <end_of_turn>
 * (gemma, gemma3), else EOS; -1 when the tokenizer has none. A reply ends there, whatever the model's configured
 * EOS. */
int32_t kvp_chat_end_of_turn(kvp_chat_template t, const kvp_tokenizer *tok);

#endif
