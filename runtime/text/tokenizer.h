/* runtime/text/tokenizer.h — the two tokenizer families of Llama-family checkpoints, encoding as their
 * references do (the algorithms: tokenizer.c), in O(n log n) of the text length:
 *   sentencepiece BPE with scores and byte fallback, as llama2.c and llama.cpp (Llama-2, Mistral, TinyLlama;
 *     GGUF "llama", llama2.c files, tokenizer.json of that kind, its merge list standing in for scores);
 *   GPT-2 byte-level BPE by merge rank, as Hugging Face's tokenizers (Llama-3, Qwen2/2.5/3, GPT-2; GGUF
 *     "gpt2", tokenizer.json with a ByteLevel pre-tokenizer).
 * User-defined pieces (HF's non-special added tokens) are cut out of the text first, control pieces (BOS,
 * <|im_start|>, ...) only with KVP_TOK_PARSE_SPECIAL (as vLLM and llama.cpp's server treat a prompt); each
 * run of text between them is encoded on its own. GGUF's U+2581 ("▁") is stored as a plain space.
 *
 * Decoding: a piece is the bytes it stands for; <0xNN> is that byte; control pieces are nothing; in
 * sentencepiece vocabularies a piece after BOS drops its leading space. Loaders return an owned handle
 * (kvp_tok_destroy), immutable after loading: concurrent encode and decode calls are safe.
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

/* From GGUF tokenizer.ggml.{model, tokens, scores, token_type, merges, pre, bos/eos_token_id, add_bos_token,
 * add_space_prefix}: model "llama", or "gpt2" with pre default/gpt-2/mpt (or absent), llama-bpe/llama3/
 * llama-v3, qwen2, starcoder/refact/command-r, falcon, deepseek-coder or deepseek-llm; else KVP_EUNSUPPORTED.
 * KVP_EPARSE names the file and key (a bos/eos_token_id outside the list, -1 and 0xFFFFFFFF meaning none;
 * a merge of unknown pieces). */
kvp_status kvp_tok_from_gguf(const kvp_gguf *g, kvp_tokenizer **out);
/* A tokenizer.json of model "BPE", byte-level (Split, Digits, ByteLevel) or sentencepiece-like
 * (byte_fallback, a "▁" normalizer or Metaspace), BOS from its post-processor and bos/eos_token from a
 * tokenizer_config.json beside it. KVP_EUNSUPPORTED naming the rest (Unigram, WordPiece, other
 * pre-tokenizers); KVP_EPARSE naming file and field. */
kvp_status kvp_tok_from_hf_json(const char *path, kvp_tokenizer **out);
/* A llama2.c file (int32 max_token_length, then per token f32 score, int32 len, bytes): vocab_size tokens
 * (0: to the end), BOS 1, EOS 2. Errors name the file and the token index. */
kvp_status kvp_tok_load_llama2c(const char *path, int32_t vocab_size, kvp_tokenizer **out);
void kvp_tok_destroy(kvp_tokenizer *t); /* NULL: no-op */

int32_t kvp_tok_vocab_size(const kvp_tokenizer *t);
int kvp_tok_adds_bos(const kvp_tokenizer *t); /* 1 when the model's prompts start with BOS */
int32_t kvp_tok_bos(const kvp_tokenizer *t); /* -1 when none */
int32_t kvp_tok_eos(const kvp_tokenizer *t); /* -1 when none */
/* A token's piece, NUL-terminated, and its length; NULL for an id out of range. Valid while t is. */
const char *kvp_tok_piece(const kvp_tokenizer *t, int32_t id, size_t *len);
float kvp_tok_score(const kvp_tokenizer *t, int32_t id);
int32_t kvp_tok_special_id(const kvp_tokenizer *t, const char *text); /* "<|im_end|>" -> its id, or -1 */
kvp_tok_type kvp_tok_type_of(const kvp_tokenizer *t, int32_t id);

enum {
    KVP_TOK_ADD_BOS = 1,       /* BOS first, when the tokenizer has one and its model adds it */
    KVP_TOK_PARSE_SPECIAL = 2, /* control pieces written in the text are those tokens */
};
/* text[0..len), any bytes (invalid UTF-8 as bytes), into *n ids (*ids the caller's, kvp_free). KVP_EINVAL
 * if a byte has no piece covering it; KVP_ENOMEM. */
kvp_status kvp_tok_encode_ex(const kvp_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                             int32_t *n);
kvp_status kvp_tok_encode(const kvp_tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids,
                          int32_t *n); /* flags: KVP_TOK_ADD_BOS if add_bos */

/* The bytes of `id` after `prev` (-1 at the start) into buf[0..cap), at most 4 + the longest piece, no NUL;
 * returns how many, or -1 (id out of range, buf too small). */
int kvp_tok_decode_piece(const kvp_tokenizer *t, int32_t prev, int32_t id, char *buf, size_t cap);
/* ids[0..n) after `prev` into a NUL-terminated string, the caller's (kvp_free); <0x00> adds nothing.
 * KVP_EINVAL naming the first id out of range; KVP_ENOMEM. */
kvp_status kvp_tok_decode(const kvp_tokenizer *t, int32_t prev, const int32_t *ids, int32_t n, char **text);

/* A GGUF (by its magic), a tokenizer.json, a llama2.c file (vocab_size as above), or a folder (or a
 * .safetensors file's): its tokenizer.json, else tokenizer.bin or tok*.bin in it or in ../llama2c beside
 * it. KVP_EINVAL when a folder has none. */
kvp_status kvp_tok_load(const char *path, int32_t vocab_size, kvp_tokenizer **out);

struct kvp_model;
/* Model m's (loaded from model_path): tok_path if given, else the GGUF's own, else as kvp_tok_load on the
 * folder. A vocabulary shorter than the model's (padded embeddings, as Qwen's) gets unused ids that decode
 * to nothing. KVP_EINVAL when none is found or it is longer than the model's. */
kvp_status kvp_tok_for_model(const struct kvp_model *m, const char *model_path, const char *tok_path,
                             kvp_tokenizer **out);

#endif
