/* parallel/comm_check.c — the communicator contract (comm_check.h). Every rank makes the same calls in the
 * same order whatever its checks find, so a failed check never leaves a peer waiting; a call that fails
 * outright ends the run on that rank (its peers then fail or time out in their next collective).
 *
 * What is checked (n elements per rank, n in 0, 1, 2, 3, 7, 31, 64, 255, 1000, 4099):
 *   all_reduce f32   values whose sums are exact in any order: the exact sum, bit for bit; random values:
 *                    within 1e-6 x size of the float64 sum; the same bits on every rank (a digest compared
 *                    over the host plane)
 *   all_reduce bf16  small integers (exact sums); random bf16 values within size^2 x 2^-8 of the float64
 *                    sum of the bf16 inputs; the same bits on every rank
 *   all_gather       byte counts 0, 1, 3, 5, 4n: out of place and in place (send = recv + rank x bytes)
 *   broadcast        from every root, odd byte counts, over a destination filled with another pattern
 *   sequences        all_reduce, all_gather, broadcast enqueued back to back, then all downloaded
 *   barrier, wait, broadcast_idle, check_same (equal values pass; unequal ones fail on every rank)
 *   errors           negative sizes, NULL buffers, an unknown dtype, roots out of range, overlapping
 *                    all_gather buffers: KVP_EINVAL on every rank, and a collective after them still works
 *   memory           upload/download round trips of 0 and odd byte counts
 */
#include "parallel/comm_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "parallel/comm_internal.h"

typedef struct {
    kvp_comm *c;
    kvp_comm_check_report *rep;
    int rank, size;
} ctx;

static void check(ctx *x, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(ctx *x, int ok, const char *fmt, ...)
{
    x->rep->checks++;
    if (ok) return;
    x->rep->failures++;
    if (x->rep->first[0]) return;
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(x->rep->first, sizeof x->rep->first, "%s rank %d of %d: %s", kvp_comm_backend(x->c), x->rank, x->size, what);
}

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A value in [-1, 1) that every rank can compute for any rank q and element i. */
static float rnd(int q, int64_t i, uint64_t salt)
{
    const uint64_t h = mix(salt ^ mix((uint64_t)q * 0x100000001b3ull + (uint64_t)i));
    return (float)((double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint64_t digest(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

/* Every rank's result has the same bits: a failed comparison is a failed check, not an error. */
static kvp_status same_everywhere(ctx *x, const void *p, size_t n, const char *what)
{
    const kvp_status st = kvp_comm_check_same(x->c, digest(p, n), what);
    if (st != KVP_OK && st != KVP_EMPI) return st;
    check(x, st == KVP_OK, "%s: the ranks' results differ", what);
    return KVP_OK;
}

/* Communicator memory holding bytes of host data (or of fill, when host is NULL). */
static kvp_status put(ctx *x, const void *host, int fill, size_t bytes, void **dev)
{
    KVP_TRY(kvp_comm_mem_alloc(x->c, bytes, dev));
    kvp_status st = KVP_OK;
    if (bytes > 0 && host) {
        st = kvp_comm_mem_upload(x->c, *dev, host, bytes);
    } else if (bytes > 0) {
        unsigned char *tmp = kvp_malloc(bytes);
        if (!tmp) st = KVP_ERR(KVP_ENOMEM, "contract: out of memory");
        if (tmp) memset(tmp, fill, bytes), st = kvp_comm_mem_upload(x->c, *dev, tmp, bytes);
        kvp_free(tmp);
    }
    if (st != KVP_OK) kvp_comm_mem_free(x->c, *dev), *dev = NULL;
    return st;
}

/* ---- all_reduce -------------------------------------------------------------------------------------- */

/* Rank q's element i: exact cases use values whose sums are exact in any order. */
static float value(int q, int64_t i, kvp_comm_dtype dt, int exact)
{
    if (exact) return dt == KVP_COMM_F32 ? (float)((q * 7 + i * 3) % 64) * 0.25f - 8.0f : (float)((q + i) % 5) - 2.0f;
    const float v = rnd(q, i, dt == KVP_COMM_F32 ? 11 : 12);
    return dt == KVP_COMM_F32 ? v : kvp_comm_bf16_to_f32(kvp_comm_f32_to_bf16(v));
}

static kvp_status all_reduce_case(ctx *x, int64_t n, kvp_comm_dtype dt, int exact)
{
    const size_t es = kvp_comm_dtype_bytes(dt), nb = (size_t)n * es;
    const char *tn = dt == KVP_COMM_F32 ? "f32" : "bf16";
    double *want = kvp_calloc((size_t)n + 1, sizeof(double));
    unsigned char *mine = kvp_malloc(nb + 1), *got = kvp_malloc(nb + 1);
    kvp_status st = want && mine && got ? KVP_OK : KVP_ERR(KVP_ENOMEM, "contract: out of memory");
    for (int64_t i = 0; st == KVP_OK && i < n; i++) {
        for (int q = 0; q < x->size; q++) want[i] += value(q, i, dt, exact);
        const float v = value(x->rank, i, dt, exact);
        if (dt == KVP_COMM_F32) memcpy(mine + i * 4, &v, 4);
        else ((uint16_t *)(void *)mine)[i] = kvp_comm_f32_to_bf16(v);
    }
    void *d = NULL;
    if (st == KVP_OK) st = put(x, mine, 0, nb, &d);
    if (st == KVP_OK) st = kvp_comm_all_reduce_sum(x->c, d, n, dt);
    if (st == KVP_OK && nb) st = kvp_comm_mem_download(x->c, got, d, nb);
    if (st == KVP_OK) {
        const double tol = exact ? 0 : dt == KVP_COMM_F32 ? 2e-7 * x->size * x->size + 1e-7 : x->size * x->size / 256.0;
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++) {
            float g;
            if (dt == KVP_COMM_F32) memcpy(&g, got + i * 4, 4);
            else g = kvp_comm_bf16_to_f32(((const uint16_t *)(void *)got)[i]);
            if (!(fabs((double)g - want[i]) <= tol)) bad = i;
        }
        float gb = 0;
        if (bad >= 0 && dt == KVP_COMM_F32) memcpy(&gb, got + bad * 4, 4);
        else if (bad >= 0) gb = kvp_comm_bf16_to_f32(((const uint16_t *)(void *)got)[bad]);
        check(x, bad < 0, "all_reduce %s n=%lld (%s values): element %lld is %.9g, the sum is %.9g", tn, (long long)n,
              exact ? "exact" : "random", (long long)bad, gb, bad >= 0 ? want[bad] : 0.0);
        char what[96];
        snprintf(what, sizeof what, "all_reduce %s n=%lld", tn, (long long)n);
        st = same_everywhere(x, got, nb, what);
    }
    kvp_comm_mem_free(x->c, d);
    kvp_free(want);
    kvp_free(mine);
    kvp_free(got);
    return st;
}

/* ---- all_gather and broadcast ------------------------------------------------------------------------ */

static unsigned char pattern(int q, int64_t k) { return (unsigned char)((q * 31 + k * 7 + 1) & 0xff); }

static kvp_status all_gather_case(ctx *x, int64_t bytes, int in_place)
{
    const size_t b = (size_t)bytes, all = b * (size_t)x->size;
    unsigned char *host = kvp_malloc(all + 1), *got = kvp_malloc(all + 1);
    kvp_status st = host && got ? KVP_OK : KVP_ERR(KVP_ENOMEM, "contract: out of memory");
    void *send = NULL, *recv = NULL;
    if (st == KVP_OK) {
        memset(host, 0xee, all); /* the other ranks' slots start as junk */
        for (size_t k = 0; k < b; k++) host[(size_t)x->rank * b + k] = pattern(x->rank, (int64_t)k);
        st = put(x, in_place ? host : NULL, 0xee, all, &recv);
    }
    if (st == KVP_OK && !in_place) st = put(x, host + (size_t)x->rank * b, 0, b, &send);
    const void *src = in_place ? (const void *)((char *)recv + (size_t)x->rank * b) : send;
    if (st == KVP_OK) st = kvp_comm_all_gather(x->c, src, bytes, recv);
    if (st == KVP_OK && all) st = kvp_comm_mem_download(x->c, got, recv, all);
    if (st == KVP_OK) {
        int64_t bad = -1;
        for (size_t k = 0; k < all && bad < 0; k++)
            if (got[k] != pattern((int)(k / b), (int64_t)(k % b))) bad = (int64_t)k;
        check(x, bad < 0, "all_gather of %lld bytes%s: byte %lld (rank %lld's slot) is wrong", (long long)bytes,
              in_place ? " in place" : "", (long long)bad, bad >= 0 ? (long long)(bad / bytes) : -1LL);
    }
    kvp_comm_mem_free(x->c, send);
    kvp_comm_mem_free(x->c, recv);
    kvp_free(host);
    kvp_free(got);
    return st;
}

static kvp_status broadcast_case(ctx *x, int64_t bytes, int root)
{
    const size_t b = (size_t)bytes;
    unsigned char *host = kvp_malloc(b + 1), *got = kvp_malloc(b + 1);
    kvp_status st = host && got ? KVP_OK : KVP_ERR(KVP_ENOMEM, "contract: out of memory");
    void *d = NULL;
    if (st == KVP_OK) {
        for (size_t k = 0; k < b; k++) host[k] = x->rank == root ? pattern(root, (int64_t)k) : 0x5a;
        st = put(x, host, 0, b, &d);
    }
    if (st == KVP_OK) st = kvp_comm_broadcast(x->c, d, bytes, root);
    if (st == KVP_OK && b) st = kvp_comm_mem_download(x->c, got, d, b);
    if (st == KVP_OK) {
        int64_t bad = -1;
        for (size_t k = 0; k < b && bad < 0; k++)
            if (got[k] != pattern(root, (int64_t)k)) bad = (int64_t)k;
        check(x, bad < 0, "broadcast of %lld bytes from root %d: byte %lld is wrong", (long long)bytes, root, (long long)bad);
    }
    kvp_comm_mem_free(x->c, d);
    kvp_free(host);
    kvp_free(got);
    return st;
}

/* Three different collectives enqueued back to back, downloaded only at the end. */
static kvp_status sequence_case(ctx *x)
{
    enum { N = 33, G = 12, B = 9 };
    float v[N], sum[N], got[N];
    unsigned char g[G], gg[G * KVP_COMM_MAX_THREADS], bb[B], gb[B];
    const int root = x->size - 1;
    for (int i = 0; i < N; i++) {
        v[i] = value(x->rank, i, KVP_COMM_F32, 1);
        sum[i] = 0;
        for (int q = 0; q < x->size; q++) sum[i] += value(q, i, KVP_COMM_F32, 1);
    }
    for (int k = 0; k < G; k++) g[k] = pattern(x->rank + 5, k);
    for (int k = 0; k < B; k++) bb[k] = x->rank == root ? pattern(root + 9, k) : 0;
    void *dv = NULL, *dg = NULL, *dr = NULL, *db = NULL;
    kvp_status st = put(x, v, 0, sizeof v, &dv);
    if (st == KVP_OK) st = put(x, g, 0, G, &dg);
    if (st == KVP_OK) st = put(x, NULL, 0, (size_t)G * (size_t)x->size, &dr);
    if (st == KVP_OK) st = put(x, bb, 0, B, &db);
    if (st == KVP_OK) st = kvp_comm_all_reduce_sum_f32(x->c, dv, N);
    if (st == KVP_OK) st = kvp_comm_all_gather(x->c, dg, G, dr);
    if (st == KVP_OK) st = kvp_comm_broadcast(x->c, db, B, root);
    if (st == KVP_OK) st = kvp_comm_wait(x->c);
    if (st == KVP_OK) st = kvp_comm_mem_download(x->c, got, dv, sizeof got);
    if (st == KVP_OK) st = kvp_comm_mem_download(x->c, gg, dr, (size_t)G * (size_t)x->size);
    if (st == KVP_OK) st = kvp_comm_mem_download(x->c, gb, db, B);
    if (st == KVP_OK) {
        check(x, memcmp(got, sum, sizeof sum) == 0, "sequence: the all_reduce after which others were enqueued is wrong");
        int ok = 1;
        for (int q = 0; q < x->size; q++)
            for (int k = 0; k < G; k++) ok &= gg[q * G + k] == pattern(q + 5, k);
        check(x, ok, "sequence: the all_gather between two other collectives is wrong");
        ok = 1;
        for (int k = 0; k < B; k++) ok &= gb[k] == pattern(root + 9, k);
        check(x, ok, "sequence: the broadcast after two other collectives is wrong");
    }
    kvp_comm_mem_free(x->c, dv);
    kvp_comm_mem_free(x->c, dg);
    kvp_comm_mem_free(x->c, dr);
    kvp_comm_mem_free(x->c, db);
    return st;
}

/* ---- errors, memory, host-plane calls ---------------------------------------------------------------- */

static kvp_status error_cases(ctx *x)
{
    void *d = NULL, *r = NULL;
    KVP_TRY(put(x, NULL, 0, 64, &d));
    kvp_status st = put(x, NULL, 0, 4 * (size_t)x->size + 8, &r);
    if (st == KVP_OK) {
        const struct {
            kvp_status got;
            const char *what;
        } e[] = {
            {kvp_comm_all_reduce_sum(x->c, d, -1, KVP_COMM_F32), "all_reduce of -1 elements"},
            {kvp_comm_all_reduce_sum(x->c, NULL, 4, KVP_COMM_F32), "all_reduce of a NULL buffer"},
            {kvp_comm_all_reduce_sum(x->c, d, 4, (kvp_comm_dtype)7), "all_reduce of an unknown type"},
            {kvp_comm_broadcast(x->c, d, 4, x->size), "broadcast from root = size"},
            {kvp_comm_broadcast(x->c, d, 4, -1), "broadcast from root -1"},
            {kvp_comm_broadcast(x->c, d, -2, 0), "broadcast of -2 bytes"},
            {kvp_comm_broadcast_idle(x->c, NULL, 8, 0), "broadcast_idle of a NULL buffer"},
            {kvp_comm_all_gather(x->c, NULL, 4, r), "all_gather from NULL"},
            {kvp_comm_all_gather(x->c, d, -1, r), "all_gather of -1 bytes"},
            {kvp_comm_all_gather(x->c, (char *)r + 1, 4, r), "all_gather overlapping recv other than in place"},
            {kvp_comm_mem_upload(x->c, NULL, d, 4), "upload to NULL"},
        };
        for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
            check(x, e[i].got == KVP_EINVAL, "%s gave %s, not KVP_EINVAL", e[i].what, kvp_status_str(e[i].got));
        if (kvp_comm_memory(x->c) == KVP_COMM_MEM_HOST)
            check(x, kvp_comm_set_stream(x->c, (void *)x, 1) == KVP_EINVAL, "a CUDA stream on a host communicator was accepted");
        /* zero lengths exchange nothing and need no buffers */
        const kvp_status z[] = {kvp_comm_all_reduce_sum(x->c, NULL, 0, KVP_COMM_BF16),
                                kvp_comm_all_gather(x->c, NULL, 0, NULL), kvp_comm_broadcast(x->c, NULL, 0, 0)};
        for (size_t i = 0; i < sizeof z / sizeof z[0]; i++) {
            if (z[i] != KVP_OK) st = z[i];
            check(x, z[i] == KVP_OK, "zero-length collective %zu gave %s", i, kvp_status_str(z[i]));
        }
    }
    kvp_comm_mem_free(x->c, d);
    kvp_comm_mem_free(x->c, r);
    if (st != KVP_OK) return st;
    return all_reduce_case(x, 5, KVP_COMM_F32, 1); /* and the communicator still works */
}

static kvp_status memory_cases(ctx *x)
{
    void *z = NULL, *d = NULL;
    KVP_TRY(kvp_comm_mem_alloc(x->c, 0, &z));
    check(x, z != NULL, "mem_alloc of 0 bytes gave NULL");
    kvp_status st = kvp_comm_mem_upload(x->c, z, "", 0);
    if (st == KVP_OK) st = kvp_comm_mem_download(x->c, NULL, z, 0);
    kvp_comm_mem_free(x->c, z);
    unsigned char in[13], out[13];
    for (int k = 0; k < 13; k++) in[k] = pattern(x->rank, k), out[k] = 0;
    if (st == KVP_OK) st = put(x, in, 0, sizeof in, &d);
    if (st == KVP_OK) st = kvp_comm_mem_download(x->c, out, d, sizeof out);
    if (st == KVP_OK) check(x, memcmp(in, out, sizeof in) == 0, "13 bytes uploaded and downloaded differ");
    kvp_comm_mem_free(x->c, d);
    kvp_comm_mem_free(x->c, NULL);
    return st;
}

static kvp_status host_plane_cases(ctx *x)
{
    KVP_TRY(kvp_comm_barrier(x->c));
    KVP_TRY(kvp_comm_wait(x->c));
    unsigned char m[16];
    const int root = x->size - 1;
    for (int k = 0; k < 16; k++) m[k] = x->rank == root ? pattern(root + 3, k) : 0;
    KVP_TRY(kvp_comm_broadcast_idle(x->c, m, sizeof m, root));
    int ok = 1;
    for (int k = 0; k < 16; k++) ok &= m[k] == pattern(root + 3, k);
    check(x, ok, "broadcast_idle of 16 host bytes from root %d is wrong", root);
    KVP_TRY(same_everywhere(x, "same", 4, "check_same of equal values"));
    const kvp_status st = kvp_comm_check_same(x->c, (uint64_t)x->rank, "the rank");
    if (st != KVP_OK && st != KVP_EMPI) return st;
    check(x, st == (x->size > 1 ? KVP_EMPI : KVP_OK), "check_same of the rank gave %s", kvp_status_str(st));
    return KVP_OK;
}

kvp_status kvp_comm_check_contract(kvp_comm *c, kvp_comm_check_report *rep)
{
    if (!c || !rep) return KVP_ERR(KVP_EINVAL, "contract: NULL argument");
    memset(rep, 0, sizeof *rep);
    ctx x = {c, rep, kvp_comm_rank(c), kvp_comm_size(c)};
    static const int64_t sizes[] = {0, 1, 2, 3, 7, 31, 64, 255, 1000, 4099};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int dt = 0; dt < 2; dt++)
            for (int exact = 1; exact >= 0; exact--) KVP_TRY(all_reduce_case(&x, sizes[i], (kvp_comm_dtype)dt, exact));
    static const int64_t gathers[] = {0, 1, 3, 5, 4 * 31, 4 * 1000};
    for (size_t i = 0; i < sizeof gathers / sizeof gathers[0]; i++)
        for (int in_place = 0; in_place < 2; in_place++) KVP_TRY(all_gather_case(&x, gathers[i], in_place));
    static const int64_t casts[] = {1, 7, 4099};
    for (size_t i = 0; i < sizeof casts / sizeof casts[0]; i++)
        for (int root = 0; root < x.size; root++) KVP_TRY(broadcast_case(&x, casts[i], root));
    if (x.size <= KVP_COMM_MAX_THREADS) KVP_TRY(sequence_case(&x));
    KVP_TRY(error_cases(&x));
    KVP_TRY(memory_cases(&x));
    KVP_TRY(host_plane_cases(&x));
    if (rep->failures) return KVP_ERR(KVP_ESTATE, "%d of %d contract checks failed; the first: %s", rep->failures, rep->checks, rep->first);
    return KVP_OK;
}
