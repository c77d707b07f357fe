/* tests/common/kvp_test.h — Criterion, or a standalone runner with the same macros for machines without
 * Criterion (the GPU machine: the native CUDA suites are always built this way, see kvp_cuda_test in
 * common/cuda/CMakeLists.txt).
 *
 * Without KVP_TEST_STANDALONE this is <criterion/criterion.h>. With it, one test file (one translation unit)
 * gets: Test(suite, name) (extra Criterion options are ignored), cr_assert, cr_assert_not, cr_assert_eq/neq/
 * lt/leq/gt/geq, cr_assert_null/not_null, cr_assert_float_eq, cr_assert_str_eq, cr_expect (= cr_assert),
 * cr_fail (= cr_assert_fail), cr_skip_test, cr_log_info/warn/error; and a main() that runs every test in order
 * (or those whose "suite/name" matches --filter GLOB), prints [PASS]/[FAIL]/[SKIP] lines and then
 *     [====] Synthesis: Tested: T | Passing: P | Failing: F | Skipped: S
 * and exits 1 when a test failed, 77 when every test skipped (CTest's SKIP_RETURN_CODE), 0 otherwise.
 * A failed assertion ends its test (longjmp); a crash ends the program. Helpers that assert (tests/runtime/
 * *_testutil.c) include this header too; a standalone suite compiles them into its own file with #include.
 */
#ifndef KVP_TESTS_COMMON_KVP_TEST_H
#define KVP_TESTS_COMMON_KVP_TEST_H

#ifndef KVP_TEST_STANDALONE
#include <criterion/criterion.h>
#else

#include <fnmatch.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kvp_test_case {
    const char *suite, *name;
    void (*fn)(void);
    struct kvp_test_case *next;
} kvp_test_case;

static kvp_test_case *kvp_test_head, **kvp_test_tail = &kvp_test_head;
static jmp_buf kvp_test_jmp;
static int kvp_test_result; /* 0 pass, 1 fail, 2 skip */

static void kvp_test_add(kvp_test_case *c)
{
    *kvp_test_tail = c;
    kvp_test_tail = &c->next;
}

static void kvp_test_end(int result, const char *tag, const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((noreturn)); /* no format attribute: an assertion without a message passes "" */
static void kvp_test_end(int result, const char *tag, const char *file, int line, const char *expr, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (result == 1)
        printf("[----] %s:%d: %s: %s%s%s\n", file, line, tag, expr ? expr : "", expr && *msg ? ": " : "", msg);
    else
        printf("[----] %s:%d: %s: %s\n", file, line, tag, msg);
    fflush(stdout);
    kvp_test_result = result;
    longjmp(kvp_test_jmp, 1);
}

#define Test(suite, name, ...)                                                                        \
    static void kvp_test_fn_##suite##_##name(void);                                                   \
    __attribute__((constructor)) static void kvp_test_reg_##suite##_##name(void)                      \
    {                                                                                                 \
        static kvp_test_case c = {#suite, #name, kvp_test_fn_##suite##_##name, NULL};                 \
        kvp_test_add(&c);                                                                             \
    }                                                                                                 \
    static void kvp_test_fn_##suite##_##name(void)

#define cr_assert(cond, ...) \
    do { if (!(cond)) kvp_test_end(1, "Assertion failed", __FILE__, __LINE__, #cond, "" __VA_ARGS__); } while (0)
#define cr_expect cr_assert
#define cr_assert_not(cond, ...) cr_assert(!(cond), __VA_ARGS__)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b), __VA_ARGS__)
#define cr_assert_lt(a, b, ...) cr_assert((a) < (b), __VA_ARGS__)
#define cr_assert_leq(a, b, ...) cr_assert((a) <= (b), __VA_ARGS__)
#define cr_assert_gt(a, b, ...) cr_assert((a) > (b), __VA_ARGS__)
#define cr_assert_geq(a, b, ...) cr_assert((a) >= (b), __VA_ARGS__)
#define cr_assert_null(p, ...) cr_assert((p) == NULL, __VA_ARGS__)
#define cr_assert_not_null(p, ...) cr_assert((p) != NULL, __VA_ARGS__)
#define cr_assert_float_eq(a, b, eps, ...) cr_assert(fabs((double)(a) - (double)(b)) <= (double)(eps), __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) cr_assert(strcmp((a), (b)) == 0, __VA_ARGS__)
#define cr_fail(...) kvp_test_end(1, "Failed", __FILE__, __LINE__, NULL, "" __VA_ARGS__)
#define cr_assert_fail cr_fail
#define cr_skip_test(...) kvp_test_end(2, "Skipped", __FILE__, __LINE__, NULL, "" __VA_ARGS__)
#define cr_log_info(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))
#define cr_log_warn cr_log_info
#define cr_log_error cr_log_info

int main(int argc, char **argv)
{
    static const char *filter; /* static: live across the setjmp below */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) filter = argv[++i];
        else if (strncmp(argv[i], "--filter=", 9) == 0) filter = argv[i] + 9;
        else if (strcmp(argv[i], "--list") == 0) {
            for (kvp_test_case *c = kvp_test_head; c; c = c->next) printf("%s/%s\n", c->suite, c->name);
            return 0;
        } else if (strcmp(argv[i], "--help") == 0) {
            printf("usage: %s [--filter SUITE/NAME-GLOB] [--list]\n", argv[0]);
            return 0;
        } /* other Criterion options (--jobs, --verbose, ...) are accepted and ignored */
    }
    static int tested, passed, failed, skipped;
    for (kvp_test_case *c = kvp_test_head; c; c = c->next) {
        char full[512];
        snprintf(full, sizeof full, "%s/%s", c->suite, c->name);
        if (filter && fnmatch(filter, full, 0) != 0) continue;
        tested++;
        kvp_test_result = 0;
        if (setjmp(kvp_test_jmp) == 0) c->fn();
        const char *tag = kvp_test_result == 0 ? "PASS" : kvp_test_result == 1 ? "FAIL" : "SKIP";
        printf("[%s] %s::%s\n", tag, c->suite, c->name);
        fflush(stdout);
        passed += kvp_test_result == 0, failed += kvp_test_result == 1, skipped += kvp_test_result == 2;
    }
    printf("[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Skipped: %d\n", tested, passed, failed, skipped);
    return failed ? 1 : tested > 0 && skipped == tested ? 77 : 0;
}

#endif /* KVP_TEST_STANDALONE */
#endif
