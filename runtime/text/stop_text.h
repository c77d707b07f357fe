/* runtime/text/stop_text.h — a sample's text as its tokens come, cut at the first of its stop strings (OpenAI's
 * "stop"): what `serve` streams and what `generate --stop` prints.
 *
 * Each call decodes the tokens added since the last one and looks for the stop strings where they could
 * newly occur (the new text and the longest stop string's length - 1 bytes before it). The first one found
 * cuts the text where it starts (or ends, with include) and the caller ends the sample (kvp_session_stop).
 * Until then `ready` marks the text that can no longer become part of a stop string: a stream sends that
 * and holds back the rest. With min_tokens (vLLM's), no stop string is looked for before that many tokens.
 */
#ifndef KVP_RUNTIME_STOP_TEXT_H
#define KVP_RUNTIME_STOP_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/text/tokenizer.h"

typedef struct {
    char *const *stop;      /* [nstop] stop strings, borrowed */
    const size_t *stop_len; /* [nstop], each >= 1 */
    int nstop;
    size_t stop_max;        /* the longest */
    int include;            /* the text keeps the stop string */
    int32_t min_tokens;
} kvp_stop_set;

typedef struct {
    char *text;    /* owned, NUL-terminated (NULL before the first token) */
    size_t len, cap;
    size_t ready;  /* text[0, ready) can no longer become part of a stop string */
    int32_t ntok;  /* tokens decoded into text */
    int stop;      /* 1 + the index of the stop string that cut it, else 0 */
} kvp_stop_text;

/* Adds tokens[h->ntok, n) of a sample (tokens[0] follows token prev0, -1: none) to h's text, a token at a time
 * when there are stop strings: when one is found, h->ntok is the count up to the token that completed it (the
 * sample keeps those: kvp_session_stop_at). Returns 1 when the text changed; nothing changes after a stop
 * string was found. A decode or an allocation that
 * fails leaves h as it was (the next call tries again with more tokens). */
int kvp_stop_text_add(kvp_stop_text *h, const kvp_stop_set *set, const kvp_tokenizer *tok, int32_t prev0,
                      const int32_t *tokens, int32_t n);
void kvp_stop_text_free(kvp_stop_text *h); /* the text; h is zeroed */

#endif
