/* runtime/text/reasoning.h — an answer's reasoning apart from its content, as vLLM's deepseek_r1 parser
 * splits it (serve --reasoning-parser deepseek_r1): up to the first "</think>" is reasoning (less a leading
 * "<think>"), after it content; with no "</think>" yet, all is reasoning. Streamed, kvp_reasoning_next holds
 * back bytes that could still become "<think>" or "</think>": its pieces, joined, are the split's parts.
 */
#ifndef KVP_RUNTIME_REASONING_H
#define KVP_RUNTIME_REASONING_H

#include <stddef.h>

typedef struct {
    const char *reasoning, *content; /* reasoning never NULL; content NULL: none (no "</think>" yet) */
    size_t reasoning_len, content_len;
} kvp_reasoning_parts;

typedef struct {
    size_t sent; /* bytes of the text given out or left out */
    int phase;   /* 0: whether it opens with "<think>" is not known yet; 1: in the reasoning; 2: in the content */
} kvp_reasoning_stream; /* zeroed: before the first byte */

kvp_reasoning_parts kvp_reasoning_split(const char *text, size_t len); /* of the whole text */

/* The new parts of text[0, len), a prefix of the same text no shorter at each call, ending on a whole UTF-8
 * character; last: complete, nothing held back. content is non-NULL once past "</think>" (maybe empty). */
kvp_reasoning_parts kvp_reasoning_next(kvp_reasoning_stream *s, const char *text, size_t len, int last);

#endif
