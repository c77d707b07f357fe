/* The deepseek_r1 reasoning split (runtime/text/reasoning.h): whole answers against hand-written parts, and streams
 * cut at every way into chunks against the whole answer's parts (joined pieces equal; nothing is given that
 * could still turn into "<think>" or "</think>"). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/text/reasoning.h"

Test(reasoning, whole_answers_split_at_the_first_close)
{
    static const struct {
        const char *text, *reasoning, *content; /* content NULL: none */
    } k[] = {{"<think>abc</think>def", "abc", "def"},
             {"abc</think>def", "abc", "def"},
             {"abc", "abc", NULL},
             {"", "", NULL},
             {"</think>x", "", "x"},
             {"<think>a</think>b</think>c", "a", "b</think>c"},
             {"<think>", "", NULL},
             {"<thin", "<thin", NULL},
             {"x<think>y</think>", "x<think>y", ""},
             {"<think><think>y</think>\n\nz", "<think>y", "\n\nz"},
             {"</think", "</think", NULL}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        const kvp_reasoning_parts p = kvp_reasoning_split(k[i].text, strlen(k[i].text));
        cr_assert_eq(p.reasoning_len, strlen(k[i].reasoning), "[%s]", k[i].text);
        cr_assert(memcmp(p.reasoning, k[i].reasoning, p.reasoning_len) == 0, "[%s]: reasoning [%.*s]", k[i].text,
                  (int)p.reasoning_len, p.reasoning);
        if (!k[i].content) {
            cr_assert_null(p.content, "[%s] has no content", k[i].text);
            continue;
        }
        cr_assert_not_null(p.content, "[%s]", k[i].text);
        cr_assert_eq(p.content_len, strlen(k[i].content), "[%s]", k[i].text);
        cr_assert(memcmp(p.content, k[i].content, p.content_len) == 0, "[%s]", k[i].text);
    }
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

/* Random answers of pieces that make and nearly make the markers, streamed in random chunks ending on whole
 * characters: the pieces joined are the whole answer's parts, content comes only after the reasoning ended,
 * and until the end no piece of reasoning ends with a start of "</think>". */
Test(reasoning, streams_give_the_whole_answers_parts)
{
    static const char *const pieces[] = {"<think>", "</think>", "<", "</", "</th", "think>", "<thi", "a", "\xc3\xa9",
                                         "\n", "\xf0\x9f\x98\x80", "k>"};
    for (int trial = 0; trial < 4000; trial++) {
        char text[256];
        size_t len = 0, cuts[64];
        int ncut = 0;
        for (int n = (int)rnd(12); n > 0; n--) {
            const char *pc = pieces[rnd(sizeof pieces / sizeof *pieces)];
            memcpy(text + len, pc, strlen(pc));
            len += strlen(pc);
            if (rnd(2)) cuts[ncut++] = len; /* piece boundaries are character boundaries */
        }
        cuts[ncut++] = len;
        const kvp_reasoning_parts whole = kvp_reasoning_split(text, len);
        char r[256], c[256];
        size_t rn = 0, cn = 0;
        int has_content = 0;
        kvp_reasoning_stream s = {0};
        for (int i = 0; i < ncut; i++) {
            const int last = i == ncut - 1;
            const kvp_reasoning_parts p = kvp_reasoning_next(&s, text, cuts[i], last);
            cr_assert(!(has_content && p.reasoning_len > 0), "trial %d: reasoning after the content began", trial);
            memcpy(r + rn, p.reasoning, p.reasoning_len);
            rn += p.reasoning_len;
            if (p.content) {
                has_content = 1;
                memcpy(c + cn, p.content, p.content_len);
                cn += p.content_len;
            }
            cr_assert(s.sent <= cuts[i]);
            if (!last && !has_content)
                for (size_t k = 1; k < 8 && k <= rn; k++)
                    cr_assert(memcmp(r + rn - k, "</think>", k) != 0 || s.sent < cuts[i],
                              "trial %d: gave [%.*s], which may still become </think>", trial, (int)rn, r);
        }
        cr_assert_eq(s.sent, len, "trial %d: all given", trial);
        cr_assert_eq(rn, whole.reasoning_len, "trial %d: [%.*s]: %zu reasoning bytes streamed, %zu whole", trial,
                     (int)len, text, rn, whole.reasoning_len);
        cr_assert(memcmp(r, whole.reasoning, rn) == 0, "trial %d", trial);
        cr_assert_eq(has_content, whole.content != NULL, "trial %d: [%.*s]", trial, (int)len, text);
        if (has_content) {
            cr_assert_eq(cn, whole.content_len, "trial %d", trial);
            cr_assert(memcmp(c, whole.content, cn) == 0, "trial %d", trial);
        }
    }
}
