/* runtime/text/stop_text.c — stop strings over a sample's incremental text (see stop_text.h). */
#include "runtime/text/stop_text.h"

#include <string.h>

#include "common/alloc.h"

/* Bytes at the end of h's text that could be the start of one of the stop strings (held back). */
static size_t prefix_held(const kvp_stop_text *h, const kvp_stop_set *set)
{
    if (set->nstop == 0) return 0;
    for (size_t n = h->len < set->stop_max - 1 ? h->len : set->stop_max - 1; n > 0; n--)
        for (int s = 0; s < set->nstop; s++)
            if (set->stop_len[s] > n && memcmp(h->text + h->len - n, set->stop[s], n) == 0) return n;
    return 0;
}

/* kvp_stop_text_add of tokens[h->ntok, n) at once. */
static int add_upto(kvp_stop_text *h, const kvp_stop_set *set, const kvp_tokenizer *tok, int32_t prev0,
                    const int32_t *tokens, int32_t n)
{
    char *dec = NULL;
    if (kvp_tok_decode(tok, h->ntok > 0 ? tokens[h->ntok - 1] : prev0, tokens + h->ntok, n - h->ntok, &dec) != KVP_OK)
        return 0;
    const size_t nd = strlen(dec);
    if (kvp_grow((void **)&h->text, &h->cap, h->len + nd + 1, 1) != KVP_OK) {
        kvp_free(dec);
        return 0;
    }
    const size_t from = h->len + 1 > set->stop_max ? h->len + 1 - set->stop_max : 0; /* new matches start here */
    memcpy(h->text + h->len, dec, nd + 1);
    h->len += nd;
    h->ntok = n;
    kvp_free(dec);
    size_t at = h->len;
    for (int s = 0; n >= set->min_tokens && s < set->nstop; s++) { /* vLLM's: none before min_tokens */
        const char *p = memmem(h->text + from, h->len - from, set->stop[s], set->stop_len[s]);
        if (p && (size_t)(p - h->text) < at) {
            at = (size_t)(p - h->text);
            h->stop = s + 1;
        }
    }
    if (h->stop) {
        h->len = at + (set->include ? set->stop_len[h->stop - 1] : 0);
        h->text[h->len] = '\0';
        h->ready = h->len;
    } else {
        const size_t ready = h->len - prefix_held(h, set);
        h->ready = ready > h->ready ? ready : h->ready;
    }
    return 1;
}

int kvp_stop_text_add(kvp_stop_text *h, const kvp_stop_set *set, const kvp_tokenizer *tok, int32_t prev0,
                      const int32_t *tokens, int32_t n)
{
    if (h->stop || n <= h->ntok) return 0;
    if (set->nstop == 0) return add_upto(h, set, tok, prev0, tokens, n);
    int grew = 0; /* a token at a time: the stop lands on the token that completes it (and min_tokens counts) */
    while (!h->stop && h->ntok < n && add_upto(h, set, tok, prev0, tokens, h->ntok + 1)) grew = 1;
    return grew;
}

void kvp_stop_text_free(kvp_stop_text *h)
{
    kvp_free(h->text);
    *h = (kvp_stop_text){0};
}
