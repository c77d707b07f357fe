/* tests/fuzz_testutil.h — seeded random corruption of a file's bytes, for the bad-input tests (static,
 * header-only): the same seed makes the same mutants on every run. */
#ifndef KVP_TESTS_FUZZ_TESTUTIL_H
#define KVP_TESTS_FUZZ_TESTUTIL_H

#include <stdint.h>
#include <string.h>

#include "common/kvp_test.h"
#include "common/status.h"

static inline uint64_t fz_next(uint64_t *x) /* xorshift64 */
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static inline int fz_alnum(unsigned char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'); }

/* 1 to 4 edits in buf[lo, hi): a random byte, a byte that often sits at a boundary or in JSON, in a binary
 * file an 8-byte word set to an extreme count or length, in a text file (half the edits) the next letter or
 * digit changed for another of its kind, which mostly keeps JSON or CSV well formed and changes a name, a
 * piece or a number. */
static inline void fz_mutate(unsigned char *buf, size_t lo, size_t hi, int binary, uint64_t *rng)
{
    static const unsigned char bytes[] = {0x00, 0xff, 0x7f, 0x80, 0x01, '9', '-', '"', ',', '{', '}', '[', ']', ':', 'e'};
    static const uint64_t words[] = {0, 1, 0xffffffffu, 0x80000000u, UINT64_MAX, 1ull << 63, 1ull << 40};
    for (int e = 0, ne = 1 + (int)(fz_next(rng) % 4); e < ne; e++) {
        size_t at = lo + fz_next(rng) % (hi - lo);
        const uint64_t how = fz_next(rng) % 8;
        if (binary && how == 0 && at + 8 <= hi) memcpy(buf + at, &words[fz_next(rng) % 7], 8);
        else if (how < (uint64_t)(2 + 2 * binary)) buf[at] = (unsigned char)fz_next(rng);
        else if (!binary && how >= 4) { /* the next letter becomes another letter, or the next digit a digit */
            while (at + 1 < hi && !fz_alnum(buf[at])) at++;
            if (buf[at] >= '0' && buf[at] <= '9') buf[at] = (unsigned char)('0' + fz_next(rng) % 10);
            else buf[at] = (unsigned char)"abcdefghijklmnopqrstuvwxyz"[fz_next(rng) % 26];
        } else buf[at] = bytes[fz_next(rng) % sizeof bytes];
    }
}

/* Checks a failed call: an error whose message names `file` (the checkpoint, or one of its files), nothing
 * made. */
#define FZ_FAILED_CLEANLY(st, obj, file, trial)                                                                  \
    do {                                                                                                       \
        cr_assert_null(obj, "trial %d: an object came back with %s", trial, kvp_status_str(st));              \
        cr_assert(strstr(kvp_error_message(), file), "trial %d: the error does not name %s: %s", trial, file, \
                  kvp_error_message());                                                                        \
    } while (0)

#endif
