/* runtime/text/tokenizer.h — the two tokenizer families of Llama-family checkpoints:
 *
 * - sentencepiece-style BPE with scores and byte fallback (Llama-2, Mistral, TinyLlama; GGUF model "llama",
 *   llama2.c tokenizer files, and Hugging Face tokenizer.json files of that kind, whose merge list stands in
 *   for the scores);
 * - GPT-2 byte-level BPE with a merge list (Llama-3, Qwen2/2.5/3, GPT-2; GGUF model "gpt2" and Hugging Face
 *   tokenizer.json with a ByteLevel pre-tokenizer).
 *
 * Sentencepiece encoding follows llama2.c run.c (and llama.cpp's SPM tokenizer): a dummy-prefix space when
 * the text is not empty, one piece per UTF-8 code point (or its bytes as <0xNN> pieces when the code point
 * is not in the vocabulary), then repeatedly merge the adjacent pair whose concatenation is a vocabulary
 * piece with the highest score (the leftmost on ties; scores of -1e30 and below, or NaN, never merge) until
 * no pair merges. Control, unknown and byte pieces never match text. GGUF pieces spell spaces as U+2581
 * ("▁"); they are stored with plain spaces.
 *
 * Byte-level encoding follows Hugging Face's tokenizers: the text is split into pre-tokens by the model's
 * regexes in turn (Llama-3's, Qwen2's, GPT-2's, DeepSeek's, ...; run by PCRE2 with Unicode properties, each
 * splitting what the ones before it left into matches and gaps), each pre-token's bytes are
 * one symbol each, and the adjacent pair with the lowest rank in the merge list merges first (the leftmost
 * on ties) until none does; with ignore_merges (Llama-3) a pre-token that is itself a piece is that piece.
 * Both merge loops are O(n log n) in the text length (a heap of candidate pairs).
 *
 * Special pieces: user-defined pieces (Hugging Face's non-special added tokens) are always cut out of the
 * text first, as llama.cpp and Hugging Face do; control pieces (BOS, <|im_start|>, ...) only with
 * KVP_TOK_PARSE_SPECIAL (what vLLM's tokenizer call and llama.cpp's server do for a prompt). Each run of
 * text between them is encoded on its own.
 *
 * Decoding: a piece is the bytes it stands for; in sentencepiece vocabularies a piece that follows BOS drops
 * its leading space and <0xNN> pieces are the raw byte; control pieces (BOS, EOS, ...) decode to nothing.
 *
 * Ownership: kvp_tok_* loaders return an owned handle (kvp_tok_destroy; NULL is a no-op). The tokenizer is
 * immutable after loading: concurrent encode/decode calls are safe.
 */
#ifndef KVP_RUNTIME_TOKENIZER_H
#define KVP_RUNTIME_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/loader/gguf.h"

typedef struct kvp_tokenizer kvp_tokenizer;

typedef enum { KVP_TOK_NORMAL = 1, KVP_TOK_UNKNOWN = 2, KVP_TOK_CONTROL = 3, KVP_TOK_USER = 4,
               KVP_TOK_UNUSED = 5, KVP_TOK_BYTE = 6 } kvp_tok_type;

/* From GGUF metadata tokenizer.ggml.{model, tokens, scores, token_type, merges, pre, bos/eos_token_id,
 * add_bos_token, add_space_prefix}: model "llama" (sentencepiece) or "gpt2" (byte-level BPE, with `pre`
 * one of default/gpt-2/mpt, llama-bpe/llama3/llama-v3, qwen2, starcoder/refact/command-r, falcon,
 * deepseek-coder, deepseek-llm; absent means gpt-2). KVP_EUNSUPPORTED for another model or pre-tokenizer; KVP_EPARSE naming the file and the key otherwise, e.g. a bos/eos_token_id outside the
 * token list (-1 and 0xFFFFFFFF mean "none") or a merge of pieces not in the list. */
kvp_status kvp_tok_from_gguf(const kvp_gguf *g, kvp_tokenizer **out);
/* A Hugging Face tokenizer.json (model "BPE": byte-level with Split (regex), Digits and ByteLevel steps, or
 * sentencepiece-like with byte_fallback and a "▁" normalizer or Metaspace pre-tokenizer), with BOS from its
 * post-processor and bos/eos_token from tokenizer_config.json beside it when there is one. KVP_EUNSUPPORTED
 * naming what is not supported (a Unigram or WordPiece model, another pre-tokenizer); KVP_EPARSE naming the
 * file and the field. */
kvp_status kvp_tok_from_hf_json(const char *path, kvp_tokenizer **out);
/* A llama2.c tokenizer file (int32 max_token_length, then per token: f32 score, int32 len, bytes).
 * vocab_size > 0: exactly that many tokens are read; 0: every token up to the end of the file.
 * BOS = 1, EOS = 2 (llama2.c convention). Errors name the file and the token index. */
kvp_status kvp_tok_load_llama2c(const char *path, int32_t vocab_size, kvp_tokenizer **out);
void kvp_tok_destroy(kvp_tokenizer *t);

int32_t kvp_tok_vocab_size(const kvp_tokenizer *t);
int kvp_tok_adds_bos(const kvp_tokenizer *t); /* 1 when the model's prompts start with BOS */
int32_t kvp_tok_bos(const kvp_tokenizer *t); /* -1 when none */
int32_t kvp_tok_eos(const kvp_tokenizer *t); /* -1 when none */
/* The piece of a token (spaces as ' ', NUL-terminated) and its length; NULL for an id out of range. */
const char *kvp_tok_piece(const kvp_tokenizer *t, int32_t id, size_t *len);
float kvp_tok_score(const kvp_tokenizer *t, int32_t id);
/* The control, user-defined or unknown piece spelled exactly `text` ("<|im_end|>"), or -1. */
int32_t kvp_tok_special_id(const kvp_tokenizer *t, const char *text);
kvp_tok_type kvp_tok_type_of(const kvp_tokenizer *t, int32_t id);

enum {
    KVP_TOK_ADD_BOS = 1,       /* BOS first, when the tokenizer has one and its model adds it */
    KVP_TOK_PARSE_SPECIAL = 2, /* control pieces written in the text are those tokens */
};
/* Encodes text[0..len) (any bytes; invalid UTF-8 falls back to bytes). *ids (owned by the caller, kvp_free)
 * receives *n ids. KVP_EINVAL if a byte has no piece that covers it; KVP_ENOMEM. */
kvp_status kvp_tok_encode_ex(const kvp_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                             int32_t *n);
/* kvp_tok_encode_ex with KVP_TOK_ADD_BOS when add_bos, never parsing control pieces. */
kvp_status kvp_tok_encode(const kvp_tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids,
                          int32_t *n);

/* The bytes of token `id` as it follows token `prev` (-1 at the start): writes at most 4 + max piece
 * length bytes into buf (size cap) and returns the count, or -1 for an id out of range or a buffer too small.
 * No NUL is added. */
int kvp_tok_decode_piece(const kvp_tokenizer *t, int32_t prev, int32_t id, char *buf, size_t cap);
/* Decodes ids[0..n) (prev of ids[0] is `prev`) into a NUL-terminated string owned by the caller
 * (kvp_free); a <0x00> byte token adds nothing (it would end the string). KVP_EINVAL naming the first id
 * out of range; KVP_ENOMEM. */
kvp_status kvp_tok_decode(const kvp_tokenizer *t, int32_t prev, const int32_t *ids, int32_t n, char **text);

/* The tokenizer at path: a GGUF file (by its magic), a Hugging Face tokenizer.json, a llama2.c tokenizer file
 * (vocab_size as for kvp_tok_load_llama2c), or a folder (or the folder of a .safetensors file): its
 * tokenizer.json, else tokenizer.bin or tok*.bin in it or in ../llama2c beside it. KVP_EINVAL when a folder
 * has none. */
kvp_status kvp_tok_load(const char *path, int32_t vocab_size, kvp_tokenizer **out);

struct kvp_model;
/* The tokenizer of model m loaded from model_path: tok_path when given (a tokenizer.json, a GGUF or a
 * llama2.c tokenizer.bin), else the GGUF's own, else for an HF folder its tokenizer.json, or tokenizer.bin
 * or tok*.bin in the folder or in ../llama2c beside it. A vocabulary shorter than the model's (embedding rows
 * padded past the last token, as Qwen's are) is padded with unused ids that decode to nothing. KVP_EINVAL
 * when none is found or its vocabulary is longer than the model's. */
kvp_status kvp_tok_for_model(const struct kvp_model *m, const char *model_path, const char *tok_path,
                             kvp_tokenizer **out);

#endif
