/* tests/runtime/model_testutil.h — helpers shared by the model/loader tests (static, header-only):
 * paths of the stories260K files, a temp dir, file copies with edits, a tiny GGUF writer. */
#ifndef KVP_TESTS_RUNTIME_MODEL_TESTUTIL_H
#define KVP_TESTS_RUNTIME_MODEL_TESTUTIL_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/json.h"
#include "common/kvp_test.h"
#include "common/status.h"
#include "fuzz_testutil.h"
#include "golden_testutil.h" /* S260_DIR, tu_golden */
#include "runtime/executor/cpu_executor.h"

#define S260_GGUF S260_DIR "/stories260K.gguf"
#define S260_HF S260_DIR "/hf"
#define S260_TOKBIN S260_DIR "/llama2c/tok512.bin"
#define S260_GGUF_DATA_START 14176 /* where stories260K.gguf's tensor data starts: everything before is header */

static inline void tu_require_shared(void)
{
    cr_assert(access(S260_GGUF, R_OK) == 0 && access(S260_HF "/model.safetensors", R_OK) == 0,
              "test data missing: %s (run from the project root with ../shared present)", S260_DIR);
}

/* Adds r to session s, steps it until nothing is pending and takes the result (r's own) into res. */
static inline void tu_run_one(kvp_session *s, const kvp_session_request *r, kvp_session_result *res)
{
    int32_t id, got;
    cr_assert_eq(kvp_session_add(s, r, &id), KVP_OK, "%s", kvp_error_detail());
    while (kvp_session_pending(s)) cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_session_take(s, &got, res), KVP_OK);
    cr_assert_eq(got, id);
}

/* The next turn of a chat, on a session of m with cfg (block size bs): turn A (prompt p[0, n), `answer` greedy
 * tokens, EOS ignored), then on the same session turn B = p, A's answer and more[0, n_more) (20 tokens). B must
 * find at least the full blocks of A's computed tokens (prompt + answer - 1) cached, and generate the tokens it
 * generates alone with no prefix cache. *st: the session's stats after B. */
static inline void tu_next_turn(kvp_model *m, const kvp_session_config *cfg, const int32_t *p, int32_t n, int32_t answer,
                                const int32_t *more, int32_t n_more, kvp_session_stats *st)
{
    kvp_session *s;
    cr_assert_eq(kvp_cpu_session_create(m, cfg, &s), KVP_OK, "%s", kvp_error_detail());
    kvp_session_request a = {.prompt = p, .n_prompt = n, .max_tokens = answer, .n = 1, .ignore_eos = 1,
                         .sampler = kvp_sampler_default()};
    kvp_session_result ra, rb, solo;
    tu_run_one(s, &a, &ra);
    cr_assert_eq(ra.n_tokens[0], answer);
    const int32_t nb = n + answer + n_more;
    int32_t *turn = kvp_malloc((size_t)nb * sizeof *turn);
    memcpy(turn, p, (size_t)n * sizeof *turn);
    memcpy(turn + n, ra.tokens[0], (size_t)answer * sizeof *turn);
    if (n_more) memcpy(turn + n + answer, more, (size_t)n_more * sizeof *turn);
    kvp_session_request b = {.prompt = turn, .n_prompt = nb, .max_tokens = 20, .n = 1, .sampler = kvp_sampler_default()};
    tu_run_one(s, &b, &rb);
    const int32_t bs = cfg->engine.block_size, computed = n + answer - 1;
    cr_assert_geq(rb.prompt_cached_tokens, computed / bs * bs, "%d of the %d computed tokens' full blocks found",
                  rb.prompt_cached_tokens, computed);
    kvp_session_stats_get(s, st);
    kvp_session_destroy(s);
    kvp_session_config none = *cfg;
    none.engine.cache = KVP_PC_NONE;
    none.engine.spec.tokens = 0;
    none.num_blocks = 0;
    cr_assert_eq(kvp_cpu_generate(m, &none, &b, 1, &solo, NULL, NULL, NULL), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(rb.n_tokens[0], solo.n_tokens[0], "the cached turn: %d tokens, alone %d", rb.n_tokens[0],
                 solo.n_tokens[0]);
    for (int32_t i = 0; i < solo.n_tokens[0]; i++)
        cr_assert_eq(rb.tokens[0][i], solo.tokens[0][i], "the cached turn's token %d", i);
    cr_assert_eq(rb.finish[0], solo.finish[0]);
    cr_assert_eq(rb.logprob[0], solo.logprob[0], "the cached turn's logprob %.17g, alone %.17g", rb.logprob[0],
                 solo.logprob[0]);
    kvp_session_results_free(&ra, 1);
    kvp_session_results_free(&rb, 1);
    kvp_session_results_free(&solo, 1);
    kvp_free(turn);
}

/* Calls make(ctx, &obj) with the 1st, 2nd, ... allocation failing until a call makes fewer allocations than
 * that (and succeeds; obj is then destroyed). Every failing call must return KVP_ENOMEM (any error when
 * any_error) and leave obj NULL. */
static inline void tu_every_alloc_failure(const char *what, kvp_status (*make)(void *ctx, void **obj),
                                          void (*destroy)(void *obj), void *ctx, int any_error)
{
    for (int64_t n = 1;; n++) {
        kvp_alloc_fail_at(n);
        void *obj = NULL;
        kvp_status st = make(ctx, &obj);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (made < n) {
            cr_assert_eq(st, KVP_OK, "%s: %s", what, kvp_status_str(st));
            destroy(obj);
            return;
        }
        if (any_error) cr_assert_neq(st, KVP_OK, "%s: failing allocation %lld still succeeded", what, (long long)n);
        else cr_assert_eq(st, KVP_ENOMEM, "%s: failing allocation %lld gave %s", what, (long long)n, kvp_status_str(st));
        cr_assert_null(obj, "%s: failing allocation %lld left an object", what, (long long)n);
    }
}

/* The temp dirs of a test binary live under one parent (KVP_TEST_TMP), made by the runner process at
 * start-up and removed with all it holds when the runner exits: Criterion's workers end with _exit, so a
 * test cannot clean up after itself, and each run used to leave its copies of the model in /tmp. A worker
 * inherits the variables; only the process that made the parent removes it. */
static int tu_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

__attribute__((constructor)) static void tu_tmp_parent_make(void)
{
    if (getenv("KVP_TEST_TMP")) return;
    char dir[64] = "/tmp/kvp_test_XXXXXX", pid[32];
    if (!mkdtemp(dir)) return; /* tu_tmpdir then falls back to /tmp */
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    setenv("KVP_TEST_TMP", dir, 1);
    setenv("KVP_TEST_TMP_OWNER", pid, 1);
}

__attribute__((destructor)) static void tu_tmp_parent_remove(void)
{
    const char *dir = getenv("KVP_TEST_TMP"), *owner = getenv("KVP_TEST_TMP_OWNER");
    if (dir && owner && atol(owner) == (long)getpid()) nftw(dir, tu_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Makes a fresh temp dir under the binary's parent; returns a static path. */
static inline const char *tu_tmpdir(void)
{
    static char buf[256];
    const char *parent = getenv("KVP_TEST_TMP");
    snprintf(buf, sizeof buf, "%s/%s", parent ? parent : "/tmp", parent ? "XXXXXX" : "kvp_test_XXXXXX");
    cr_assert_not_null(mkdtemp(buf));
    return buf;
}

static inline unsigned char *tu_read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static inline void tu_write_all(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    if (len) cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* Writes to path a copy of orig[0, len) with fz_mutate's edits in [lo, hi) (buf: len bytes of scratch). */
static inline void tu_write_mutant(const char *path, const unsigned char *orig, unsigned char *buf, size_t len,
                                   size_t lo, size_t hi, int binary, uint64_t *rng)
{
    memcpy(buf, orig, len);
    fz_mutate(buf, lo, hi, binary, rng);
    tu_write_all(path, buf, len);
}

/* ---- a growable byte buffer and a minimal GGUF writer ---- */
typedef struct {
    unsigned char *p;
    size_t n, cap;
} tu_buf;

static inline void tu_put(tu_buf *b, const void *d, size_t n)
{
    if (n == 0) return; /* d may be an empty buffer's NULL */
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void tu_u32(tu_buf *b, uint32_t v) { tu_put(b, &v, 4); }
static inline void tu_u64(tu_buf *b, uint64_t v) { tu_put(b, &v, 8); }
static inline void tu_f32(tu_buf *b, float v) { tu_put(b, &v, 4); }
static inline void tu_str(tu_buf *b, const char *s)
{
    tu_u64(b, strlen(s));
    tu_put(b, s, strlen(s));
}
static inline void tu_kv_u32(tu_buf *b, const char *k, uint32_t v)
{
    tu_str(b, k);
    tu_u32(b, 4);
    tu_u32(b, v);
}
static inline void tu_kv_f32(tu_buf *b, const char *k, float v)
{
    tu_str(b, k);
    tu_u32(b, 6);
    tu_f32(b, v);
}
static inline void tu_kv_str(tu_buf *b, const char *k, const char *v)
{
    tu_str(b, k);
    tu_u32(b, 8);
    tu_str(b, v);
}
static inline void tu_pad(tu_buf *b, size_t align)
{
    static const unsigned char z[64] = {0};
    while (b->n % align) tu_put(b, z, 1);
}

/* ---- in-place edits of a GGUF image (a copy of stories260K.gguf read with tu_read_all) ---- */

/* Where the GGUF string `s` (u64 length, then the bytes) starts in buf[0..len), asserting it is there. */
static inline size_t tu_gguf_find_str(const unsigned char *buf, size_t len, const char *s)
{
    size_t n = strlen(s);
    for (size_t at = 0; at + 8 + n <= len; at++) {
        uint64_t l;
        memcpy(&l, buf + at, 8);
        if (l == n && memcmp(buf + at + 8, s, n) == 0) return at;
    }
    cr_assert_fail("'%s' is not in the GGUF", s);
    return 0;
}

/* Overwrites the value of 4-byte metadata `key` (GGUF value type `type`: 4 uint32, 5 int32, 6 float32). */
static inline void tu_gguf_set_kv4(unsigned char *buf, size_t len, const char *key, uint32_t type, const void *v)
{
    size_t at = tu_gguf_find_str(buf, len, key) + 8 + strlen(key);
    uint32_t t;
    memcpy(&t, buf + at, 4);
    cr_assert_eq(t, type, "metadata '%s' has type %u, not %u", key, t, type);
    memcpy(buf + at + 4, v, 4);
}

/* Overwrites the data offset in the tensor info of tensor `name`. */
static inline void tu_gguf_set_offset(unsigned char *buf, size_t len, const char *name, uint64_t offset)
{
    size_t at = tu_gguf_find_str(buf, len, name) + 8 + strlen(name);
    uint32_t nd;
    memcpy(&nd, buf + at, 4);
    cr_assert(nd >= 1 && nd <= 4, "'%s' does not look like a tensor info", name);
    memcpy(buf + at + 4 + 8 * (size_t)nd + 4, &offset, 8);
}

#endif
