/* runtime/text/reasoning.c — reasoning and content of an answer (see reasoning.h). */
#include "runtime/text/reasoning.h"

#include <string.h>

static const char k_open[] = "<think>", k_close[] = "</think>";
enum { OPEN_LEN = 7, CLOSE_LEN = 8 };

kvp_reasoning_parts kvp_reasoning_split(const char *text, size_t len)
{
    kvp_reasoning_stream s = {0};
    return kvp_reasoning_next(&s, text, len, 1);
}

kvp_reasoning_parts kvp_reasoning_next(kvp_reasoning_stream *s, const char *text, size_t len, int last)
{
    kvp_reasoning_parts p = {text + s->sent, NULL, 0, 0};
    if (s->phase == 2) {
        p.content = text + s->sent;
        p.content_len = len - s->sent;
        s->sent = len;
        return p;
    }
    if (s->phase == 0) {
        if (!last && len < OPEN_LEN && memcmp(text, k_open, len) == 0) return p; /* may still be "<think>" */
        if (len >= OPEN_LEN && memcmp(text, k_open, OPEN_LEN) == 0) s->sent = OPEN_LEN;
        s->phase = 1;
        p.reasoning = text + s->sent;
    }
    const char *e = memmem(text + s->sent, len - s->sent, k_close, CLOSE_LEN);
    if (e) {
        p.reasoning_len = (size_t)(e - p.reasoning);
        p.content = e + CLOSE_LEN;
        p.content_len = (size_t)(text + len - p.content);
        s->phase = 2;
        s->sent = len;
        return p;
    }
    p.reasoning_len = len - s->sent;
    if (!last) /* a tail that may become "</think>" waits */
        for (size_t k = p.reasoning_len < CLOSE_LEN - 1 ? p.reasoning_len : CLOSE_LEN - 1; k > 0; k--)
            if (memcmp(text + len - k, k_close, k) == 0) {
                p.reasoning_len -= k;
                break;
            }
    s->sent += p.reasoning_len;
    return p;
}
