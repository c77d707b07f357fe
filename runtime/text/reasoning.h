/* runtime/text/reasoning.h — an answer's reasoning apart from its content, as vLLM's deepseek_r1 reasoning parser
 * splits it (serve --reasoning-parser deepseek_r1): the text up to the first "</think>" is the reasoning (a
 * leading "<think>", which a model writes when its prompt did not open the thought, left out), what follows it
 * the content; while no "</think>" has come, all of it is reasoning.
 *
 * Streamed, kvp_reasoning_next gives the parts of the text that came since its last call and holds back the
 * bytes that could still become that leading "<think>" or a "</think>": its pieces, joined, are
 * kvp_reasoning_split's parts of the whole text.
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

/* The parts of the whole text[0, len). */
kvp_reasoning_parts kvp_reasoning_split(const char *text, size_t len);

/* The new parts of text[0, len), a longer (or equal) prefix of the same text at each call, ending on a whole
 * UTF-8 character; last: the text is complete (nothing is held back). content is non-NULL once past
 * "</think>" (its new bytes, maybe none). */
kvp_reasoning_parts kvp_reasoning_next(kvp_reasoning_stream *s, const char *text, size_t len, int last);

#endif
