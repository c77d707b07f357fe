/* runtime/text/tokenizer_internal.h — the tokenizer's representation, shared by its three layers (not a
 * public header), each calling only the ones below it:
 *   tokenizer_load.c  which vocabulary a model path means; GGUF and llama2.c readers
 *   tokenizer_bpe.c   byte-level BPE: GGUF "gpt2" vocabularies' setup, Hugging Face tokenizer.json
 *   tokenizer.c       the vocabulary itself: lookup, specials, encoding (merges, byte fallback), decoding
 */
#ifndef KVP_RUNTIME_TOKENIZER_INTERNAL_H
#define KVP_RUNTIME_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "runtime/text/tokenizer.h"

enum { KVP_TOK_MAX_PRE = 8 };

/* One merge of a BPE merge list: pieces (l, r) make piece id, at priority rank (lower merges first).
 * key = l << 32 | r; UINT64_MAX marks an empty slot. */
typedef struct {
    uint64_t key;
    int32_t rank, id;
} kvp_tok_merge;

struct kvp_tokenizer {
    int32_t n;
    char **pieces;    /* [n] owned, NUL-terminated: the bytes a piece stands for (spaces as ' ') */
    uint32_t *lens;   /* [n] */
    float *scores;    /* [n] sentencepiece scores (0 for BPE vocabularies) */
    uint8_t *types;   /* [n] kvp_tok_type */
    uint8_t *raw;     /* [n] 1: a byte-level vocabulary's normal piece not spelled in GPT-2's form (it decodes to
                       * its text but never matches text: Hugging Face's byte-level encoder cannot reach it) */
    int32_t byte_id[256]; /* the piece of each single byte (<0xNN> pieces, or byte-level's 256 pieces) */
    int32_t bos, eos;
    int add_bos;          /* prompts start with BOS (GGUF add_bos_token; HF post-processor) */
    int add_space_prefix; /* sentencepiece's dummy prefix: each run of text starts with ' ' */
    int byte_level;       /* GPT-2 byte-level BPE: text split by `pre`, each pre-token's bytes merged by rank */
    int ignore_merges;    /* a pre-token that is a whole piece is that piece, unmerged (Llama-3) */
    uint32_t max_len;
    int32_t *table; /* [mask + 1] ids of text-matching pieces, -1 empty */
    uint64_t mask;
    kvp_tok_merge *merges; /* [merge_mask + 1]; NULL: merge by piece score (sentencepiece) */
    uint64_t merge_mask;
    /* The pre-tokenizer: regexes applied in turn, each splitting every piece of text the ones before it left
     * into its matches and the gaps between them (Hugging Face's Sequence of Split steps, "Isolated");
     * none: a run of text is one pre-token. */
    pcre2_code *pre[KVP_TOK_MAX_PRE];
    int npre;
    int32_t *special;      /* [nspecial] control / user-defined / unknown ids, longest piece first */
    int32_t nspecial;
    uint8_t special_first[256]; /* 1 when some special piece starts with this byte */
};

kvp_tokenizer *kvp_tok_alloc(int32_t n);
/* Byte ids, default types, the lookup table and the special list; called once the pieces are in. */
kvp_status kvp_tok_finish(kvp_tokenizer *t, const char *what);
/* The id of a text-matching piece (normal or user-defined) of exactly these bytes, or -1. */
int32_t kvp_tok_lookup(const kvp_tokenizer *t, const char *s, size_t len);
/* tokenizer_bpe.c: sets piece `id` of a byte-level vocabulary from its spelling s[0..len): a normal piece
 * (type 0 or KVP_TOK_NORMAL) spelled in GPT-2's unicode form as the bytes it stands for; other pieces copied
 * as they are, and a normal piece that spells no bytes too, marked raw. 0 when out of memory. */
int kvp_tok_bpe_set_piece(kvp_tokenizer *t, int32_t id, const char *s, size_t len);
/* The merge list (tokenizer.ggml.merges) and the pre-tokenizer (tokenizer.ggml.pre) of a GGUF "gpt2"
 * vocabulary, into t once kvp_tok_finish has run. */
kvp_status kvp_tok_bpe_gguf_setup(const kvp_gguf *g, kvp_tokenizer *t);
/* Copies a piece replacing U+2581 ("▁", sentencepiece's space) with ' '. */
char *kvp_tok_copy_spm_piece(const char *s, size_t len, uint32_t *out_len);

#endif
