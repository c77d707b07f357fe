/* Randomized test: >= 100,000 mixed operations (allocate, allocate with cached prefix, append by id or by a
 * kept kvp_bm_seq_ref, fork, CoW, truncate, reserve, free, swap out/in, cache take/evict, bad calls) against a trivially simple model.
 *
 * The model is each sequence's token list. The test plays the executor too: it owns "KV memory" (one int64
 * per slot, device and host), runs the step ops the manager emits (swap out, swap in, CoW copies) and writes
 * every new token through the slot mapping. After every operation it reads every sequence back through its
 * block table and compares with the model, so a block written while shared, a missing copy or a wrong swap
 * shows up as wrong tokens; the invariant walker runs after every operation too, and every failing call is
 * checked to leave the manager unchanged. At the end everything is freed and both pools must be fully free.
 */
#include <criterion/criterion.h>
#include <stdio.h>

#include "blockmgr/block_mgr.h"
#include "bm_testutil.h"

enum { MAXSEQ = 24, MAXCACHE = 32 };

typedef struct {
    int64_t id;
    int64_t *tok;
    int32_t n, cap;
    bool host;
    bool has_ref;       /* ref taken (kept across every later operation, so its cached position goes stale) */
    kvp_bm_seq_ref ref;
} mseq;

typedef struct {
    kvp_block_mgr *bm;
    int32_t nb, bs, nh, maxlen;
    int64_t *dev, *hst; /* KV memory: [nb * bs], [nh * bs] */
    mseq s[MAXSEQ];
    int ns;
    int64_t next_id, next_tok;
    int32_t cache[MAXCACHE]; /* device blocks the "prefix cache" holds a reference on */
    int64_t cache_tok[MAXCACHE][256];
    int ncache;
    uint64_t seed, seed0;
    int it;
    int64_t counts[16];
    /* Step mode: the step ops and the token writes of a whole step are deferred to its end, as an executor
     * runs them (swap out, swap in, copies, then the forward pass writes the new tokens). */
    bool deferred;
    int64_t (*pend)[2]; /* (slot, token) writes of this step */
    int64_t npend, cappend;
} world;

static void kv_write(world *w, int64_t slot, int64_t tok)
{
    if (!w->deferred) {
        w->dev[slot] = tok;
        return;
    }
    if (w->npend == w->cappend) {
        w->cappend = w->cappend ? w->cappend * 2 : 1024;
        w->pend = realloc(w->pend, sizeof *w->pend * (size_t)w->cappend);
    }
    w->pend[w->npend][0] = slot;
    w->pend[w->npend][1] = tok;
    w->npend++;
}

#define WASSERT(w, cond, ...)                                                                                     \
    cr_assert(cond, "[seed %llu, op %d] " __VA_ARGS__)
/* The messages print w->seed0 (the test's fixed seed) through this substitution. */

static void push_tok(mseq *q, int64_t t)
{
    if (q->n == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 16;
        q->tok = realloc(q->tok, sizeof(int64_t) * (size_t)q->cap);
    }
    q->tok[q->n++] = t;
}

static void run_step_ops(world *w)
{
    kvp_bm_step_ops ops;
    kvp_bm_step_ops_get(w->bm, &ops);
    const int32_t bs = w->bs;
    for (int32_t i = 0; i < ops.n_swap_out; i++)
        memcpy(&w->hst[(int64_t)ops.swap_out[i].dst * bs], &w->dev[(int64_t)ops.swap_out[i].src * bs], sizeof(int64_t) * (size_t)bs);
    for (int32_t i = 0; i < ops.n_swap_in; i++)
        memcpy(&w->dev[(int64_t)ops.swap_in[i].dst * bs], &w->hst[(int64_t)ops.swap_in[i].src * bs], sizeof(int64_t) * (size_t)bs);
    for (int32_t i = 0; i < ops.n_copies; i++)
        memcpy(&w->dev[(int64_t)ops.copies[i].dst * bs], &w->dev[(int64_t)ops.copies[i].src * bs], sizeof(int64_t) * (size_t)bs);
    kvp_bm_step_ops_clear(w->bm);
}

static bool ops_empty(world *w)
{
    kvp_bm_step_ops ops;
    kvp_bm_step_ops_get(w->bm, &ops);
    return ops.n_swap_out + ops.n_swap_in + ops.n_copies == 0;
}

static void verify(world *w)
{
    kvp_status st = kvp_bm_check(w->bm);
    WASSERT(w, st == KVP_OK, "walker: %s", (unsigned long long)w->seed0, w->it, kvp_error_detail());
    if (w->deferred && (w->npend > 0 || !ops_empty(w))) return; /* contents are checked at the end of the step */
    WASSERT(w, kvp_bm_num_seqs(w->bm) == w->ns, "num_seqs %d, model %d", (unsigned long long)w->seed0, w->it, kvp_bm_num_seqs(w->bm), w->ns);
    int64_t logical[2] = {0, 0};
    for (int i = 0; i < w->ns; i++) {
        mseq *q = &w->s[i];
        kvp_bm_table_view t;
        WASSERT(w, kvp_bm_table(w->bm, q->id, &t) == KVP_OK, "seq %lld missing", (unsigned long long)w->seed0, w->it, (long long)q->id);
        WASSERT(w, t.num_tokens == q->n && t.on_host == q->host, "seq %lld: %d tokens host %d, model %d host %d", w->seed,
                w->it, (long long)q->id, t.num_tokens, t.on_host, q->n, q->host);
        const int64_t *mem = q->host ? w->hst : w->dev;
        for (int32_t p = 0; p < q->n; p++) {
            int64_t slot = (int64_t)t.blocks[p / w->bs] * w->bs + p % w->bs;
            WASSERT(w, mem[slot] == q->tok[p], "seq %lld token %d: memory holds %lld, expected %lld", (unsigned long long)w->seed0, w->it,
                    (long long)q->id, p, (long long)mem[slot], (long long)q->tok[p]);
        }
        logical[q->host] += q->n;
    }
    for (int c = 0; c < w->ncache; c++)
        for (int32_t j = 0; j < w->bs; j++)
            WASSERT(w, w->dev[(int64_t)w->cache[c] * w->bs + j] == w->cache_tok[c][j], "cached block %d was overwritten",
                    (unsigned long long)w->seed0, w->it, w->cache[c]);
    kvp_kv_accounting a;
    kvp_bm_account(w->bm, false, &a);
    WASSERT(w, a.logical_tokens == logical[0], "device logical %lld, model %lld", (unsigned long long)w->seed0, w->it, (long long)a.logical_tokens,
            (long long)logical[0]);
    WASSERT(w, a.token_states <= a.logical_tokens && a.token_states >= 0, "token states", (unsigned long long)w->seed0, w->it);
    kvp_bm_account(w->bm, true, &a);
    WASSERT(w, a.logical_tokens == logical[1], "host logical %lld, model %lld", (unsigned long long)w->seed0, w->it, (long long)a.logical_tokens,
            (long long)logical[1]);
}

/* Calls that must fail: the manager must stay exactly as it was. */
static void expect_fail(world *w, kvp_status got, kvp_status want, const snap_t *before, const char *what)
{
    WASSERT(w, got == want, "%s: got %s, expected %s (%s)", (unsigned long long)w->seed0, w->it, what, kvp_status_str(got), kvp_status_str(want),
            kvp_error_detail());
    snap_t after = {0};
    snap_take(w->bm, &after);
    WASSERT(w, snap_equal(before, &after), "%s failed but changed the manager", (unsigned long long)w->seed0, w->it, what);
    snap_free(&after);
}

static int pick(world *w, int host) /* a random sequence on the given side (-1: any), or -1 */
{
    int idx[MAXSEQ], n = 0;
    for (int i = 0; i < w->ns; i++)
        if (host < 0 || w->s[i].host == host) idx[n++] = i;
    return n ? idx[rng_int(&w->seed, 0, n - 1)] : -1;
}

static void write_prompt(world *w, mseq *q, int32_t from)
{
    kvp_bm_table_view t;
    kvp_bm_table(w->bm, q->id, &t);
    for (int32_t p = from; p < q->n; p++) kv_write(w, (int64_t)t.blocks[p / w->bs] * w->bs + p % w->bs, q->tok[p]);
}

static void op_allocate(world *w, snap_t *before)
{
    if (w->ns == MAXSEQ) return;
    int32_t n = rng_int(&w->seed, 0, 3 * w->bs + 2);
    int32_t pre[MAXCACHE], npre = 0;
    if (w->ncache && rng_int(&w->seed, 0, 1)) { /* a prefix-cache hit: a few cached blocks in a row */
        npre = rng_int(&w->seed, 1, w->ncache < 3 ? w->ncache : 3);
        int start = rng_int(&w->seed, 0, w->ncache - npre);
        for (int i = 0; i < npre; i++) pre[i] = w->cache[start + i];
        if (n < npre * w->bs) n = npre * w->bs + rng_int(&w->seed, 0, w->bs);
    }
    const int64_t id = w->next_id++;
    const int32_t limit = w->maxlen ? w->maxlen : INT32_MAX;
    const int32_t need = (n + w->bs - 1) / w->bs - npre, free0 = kvp_bm_num_free(w->bm);
    kvp_status st = kvp_bm_allocate_prefixed(w->bm, id, n, pre, npre);
    if (n > limit) return expect_fail(w, st, KVP_EINVAL, before, "allocate past max_seq_len");
    if (need > free0) return expect_fail(w, st, KVP_ENOBLOCKS, before, "allocate without blocks");
    WASSERT(w, st == KVP_OK, "allocate %d tokens (%d prefix blocks): %s", (unsigned long long)w->seed0, w->it, n, npre, kvp_error_detail());
    mseq *q = &w->s[w->ns++];
    memset(q, 0, sizeof *q);
    q->id = id;
    for (int i = 0; i < npre; i++) {
        int c = 0;
        while (w->cache[c] != pre[i]) c++;
        for (int32_t j = 0; j < w->bs; j++) push_tok(q, w->cache_tok[c][j]);
    }
    while (q->n < n) push_tok(q, w->next_tok++);
    write_prompt(w, q, npre * w->bs);
    w->counts[npre ? 1 : 0]++;
}

static void op_append(world *w, snap_t *before)
{
    int i = pick(w, -1);
    if (i < 0) return;
    mseq *q = &w->s[i];
    int32_t k = rng_int(&w->seed, 0, 3) ? 1 : rng_int(&w->seed, 0, 2 * w->bs + 1);
    const int32_t limit = w->maxlen ? w->maxlen : INT32_MAX;
    int32_t need = -1;
    if (!q->host && q->n + k <= limit) kvp_bm_append_blocks_needed(w->bm, q->id, k, &need);
    int32_t slots[600];
    const int32_t free0 = kvp_bm_num_free(w->bm);
    kvp_status st;
    if (rng_int(&w->seed, 0, 1)) { /* by reference (taken once, kept for the sequence's life) or by id */
        if (!q->has_ref) {
            WASSERT(w, kvp_bm_seq_ref_get(w->bm, q->id, &q->ref) == KVP_OK, "seq_ref_get: %s", (unsigned long long)w->seed0, w->it, kvp_error_detail());
            q->has_ref = true;
        }
        st = kvp_bm_append_ref(w->bm, &q->ref, k, slots);
        WASSERT(w, q->ref.seq_id == q->id, "reference changed its id", (unsigned long long)w->seed0, w->it);
        w->counts[12]++;
    } else {
        st = kvp_bm_append(w->bm, q->id, k, slots);
    }
    if (q->host) return expect_fail(w, st, KVP_ESTATE, before, "append to a swapped-out sequence");
    if (q->n + k > limit) return expect_fail(w, st, KVP_EINVAL, before, "append past max_seq_len");
    if (need > free0) return expect_fail(w, st, KVP_ENOBLOCKS, before, "append without blocks");
    WASSERT(w, st == KVP_OK, "append %d: %s", (unsigned long long)w->seed0, w->it, k, kvp_error_detail());
    kvp_bm_step_ops ops;
    kvp_bm_step_ops_get(w->bm, &ops);
    w->counts[2] += ops.n_copies;
    if (!w->deferred) run_step_ops(w); /* copies before the new tokens are written */
    for (int32_t j = 0; j < k; j++) {
        int64_t t = w->next_tok++;
        push_tok(q, t);
        WASSERT(w, slots[j] >= 0 && slots[j] < w->nb * w->bs, "slot %d out of range", (unsigned long long)w->seed0, w->it, slots[j]);
        kv_write(w, slots[j], t);
    }
    w->counts[3]++;
}

static void op_fork(world *w, snap_t *before)
{
    if (w->ns == MAXSEQ) return;
    int i = pick(w, -1);
    if (i < 0) return;
    const int64_t id = w->next_id++;
    kvp_status st = kvp_bm_fork(w->bm, w->s[i].id, id);
    if (w->s[i].host) return expect_fail(w, st, KVP_ESTATE, before, "fork of a swapped-out sequence");
    WASSERT(w, st == KVP_OK, "fork: %s", (unsigned long long)w->seed0, w->it, kvp_error_detail());
    mseq *q = &w->s[w->ns++];
    memset(q, 0, sizeof *q);
    q->id = id;
    for (int32_t p = 0; p < w->s[i].n; p++) push_tok(q, w->s[i].tok[p]);
    w->counts[4]++;
}

static void op_free(world *w, snap_t *before)
{
    int i = pick(w, -1);
    if (i < 0 || rng_int(&w->seed, 0, 15) == 0) { /* an id that does not exist (never, or already freed) */
        int64_t id = rng_int(&w->seed, 0, 1) ? -12345 : w->next_id - 1;
        for (int j = 0; j < w->ns; j++)
            if (w->s[j].id == id) return;
        return expect_fail(w, kvp_bm_free(w->bm, id), KVP_ENOTFOUND, before, "free of an unknown id");
    }
    WASSERT(w, kvp_bm_free(w->bm, w->s[i].id) == KVP_OK, "free: %s", (unsigned long long)w->seed0, w->it, kvp_error_detail());
    free(w->s[i].tok);
    w->s[i] = w->s[--w->ns];
    w->counts[5]++;
}

static void op_truncate(world *w, snap_t *before)
{
    int i = pick(w, -1);
    if (i < 0) return;
    mseq *q = &w->s[i];
    int32_t n = rng_int(&w->seed, 0, q->n + 1);
    kvp_status st = kvp_bm_truncate(w->bm, q->id, n);
    if (q->host) return expect_fail(w, st, KVP_ESTATE, before, "truncate of a swapped-out sequence");
    if (n > q->n) return expect_fail(w, st, KVP_EINVAL, before, "truncate past the end");
    WASSERT(w, st == KVP_OK, "truncate: %s", (unsigned long long)w->seed0, w->it, kvp_error_detail());
    q->n = n;
    w->counts[6]++;
}

static void op_reserve(world *w, snap_t *before)
{
    int i = pick(w, 0);
    if (i < 0) return;
    mseq *q = &w->s[i];
    int32_t k = rng_int(&w->seed, 0, 2 * w->bs);
    const int32_t limit = w->maxlen ? w->maxlen : INT32_MAX;
    kvp_bm_table_view t;
    kvp_bm_table(w->bm, q->id, &t);
    int32_t need = (q->n + k + w->bs - 1) / w->bs - t.num_blocks, free0 = kvp_bm_num_free(w->bm);
    kvp_status st = kvp_bm_reserve(w->bm, q->id, k);
    if (q->n + k > limit) return expect_fail(w, st, KVP_EINVAL, before, "reserve past max_seq_len");
    if (need > free0) return expect_fail(w, st, KVP_ENOBLOCKS, before, "reserve without blocks");
    WASSERT(w, st == KVP_OK, "reserve: %s", (unsigned long long)w->seed0, w->it, kvp_error_detail());
    w->counts[7]++;
}

static void op_swap(world *w, snap_t *before, int out)
{
    int64_t ids[3];
    int n = 0, want = rng_int(&w->seed, 1, 3);
    for (int tries = 0; tries < 6 && n < want; tries++) {
        int i = pick(w, out ? 0 : 1);
        if (i < 0) break;
        bool dup = false;
        for (int j = 0; j < n; j++) dup |= ids[j] == w->s[i].id;
        if (!dup) ids[n++] = w->s[i].id;
    }
    if (n == 0) return;
    /* distinct blocks to move, from the tables */
    int32_t distinct[1024], nd = 0;
    for (int j = 0; j < n; j++) {
        kvp_bm_table_view t;
        kvp_bm_table(w->bm, ids[j], &t);
        for (int32_t b = 0; b < t.num_blocks; b++) {
            bool seen = false;
            for (int32_t x = 0; x < nd && !seen; x++) seen = distinct[x] == t.blocks[b];
            if (!seen) distinct[nd++] = t.blocks[b];
        }
    }
    int32_t target_free = out ? kvp_pool_num_free(kvp_bm_host_pool(w->bm)) : kvp_bm_num_free(w->bm);
    if (!out) {
        int32_t need;
        WASSERT(w, kvp_bm_swap_in_blocks_needed(w->bm, ids, n, &need) == KVP_OK && need == nd, "swap-in estimate", (unsigned long long)w->seed0, w->it);
    }
    if (rng_int(&w->seed, 0, 9) == 0 && n < 3) { /* a repeated id is rejected */
        ids[n] = ids[0];
        kvp_status st = out ? kvp_bm_swap_out(w->bm, ids, n + 1) : kvp_bm_swap_in(w->bm, ids, n + 1);
        return expect_fail(w, st, KVP_ESTATE, before, "swap with a repeated id");
    }
    kvp_status st = out ? kvp_bm_swap_out(w->bm, ids, n) : kvp_bm_swap_in(w->bm, ids, n);
    if (nd > target_free) return expect_fail(w, st, KVP_ENOBLOCKS, before, "swap without room");
    WASSERT(w, st == KVP_OK, "swap %s: %s", (unsigned long long)w->seed0, w->it, out ? "out" : "in", kvp_error_detail());
    if (!w->deferred) run_step_ops(w);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < w->ns; i++)
            if (w->s[i].id == ids[j]) w->s[i].host = out;
    w->counts[out ? 8 : 9]++;
}

static void op_cache_take(world *w, snap_t *before)
{
    (void)before;
    if (w->ncache == MAXCACHE) return;
    int i = pick(w, 0);
    if (i < 0 || w->s[i].n < w->bs) return;
    kvp_bm_table_view t;
    kvp_bm_table(w->bm, w->s[i].id, &t);
    int32_t lb = rng_int(&w->seed, 0, w->s[i].n / w->bs - 1), b = t.blocks[lb];
    for (int c = 0; c < w->ncache; c++)
        if (w->cache[c] == b) return;
    WASSERT(w, kvp_bm_incref(w->bm, b) == KVP_OK, "cache incref: %s", (unsigned long long)w->seed0, w->it, kvp_error_detail());
    w->cache[w->ncache] = b;
    for (int32_t j = 0; j < w->bs; j++) w->cache_tok[w->ncache][j] = w->s[i].tok[lb * w->bs + j];
    w->ncache++;
    w->counts[10]++;
}

static void op_cache_evict(world *w, snap_t *before)
{
    (void)before;
    if (w->ncache == 0) return;
    int c = rng_int(&w->seed, 0, w->ncache - 1);
    WASSERT(w, kvp_bm_decref(w->bm, w->cache[c]) == KVP_OK, "cache decref: %s", (unsigned long long)w->seed0, w->it, kvp_error_detail());
    w->ncache--;
    w->cache[c] = w->cache[w->ncache];
    memcpy(w->cache_tok[c], w->cache_tok[w->ncache], sizeof w->cache_tok[c]);
    w->counts[11]++;
}

/* A fresh world: an empty block manager of nb device / nh host blocks of bs slots and its slot models.
 * deferred: step mode (the step ops and token writes of a whole step run at its end, as in run_steps). */
static world *world_new(int32_t nb, int32_t bs, int32_t nh, int32_t maxlen, uint64_t seed, bool deferred)
{
    world *w = calloc(1, sizeof *w);
    w->nb = nb;
    w->bs = bs;
    w->nh = nh;
    w->maxlen = maxlen;
    w->seed = w->seed0 = seed;
    w->next_id = 1;
    w->next_tok = 1;
    w->deferred = deferred;
    kvp_bm_config cfg = {.num_blocks = nb, .block_size = bs, .num_host_blocks = nh, .max_seq_len = maxlen};
    cr_assert_eq(kvp_bm_create(&cfg, &w->bm), KVP_OK);
    w->dev = calloc((size_t)nb * (size_t)bs, sizeof(int64_t));
    w->hst = calloc((size_t)nh * (size_t)bs, sizeof(int64_t));
    return w;
}

static void run_world(int32_t nb, int32_t bs, int32_t nh, int32_t maxlen, uint64_t seed, int iters)
{
    world *w = world_new(nb, bs, nh, maxlen, seed, false);
    const uint64_t seed0 = seed;
    snap_t before = {0};
    for (w->it = 0; w->it < iters; w->it++) {
        snap_take(w->bm, &before);
        int r = rng_int(&w->seed, 0, 99);
        if (r < 14) op_allocate(w, &before);
        else if (r < 46) op_append(w, &before);
        else if (r < 54) op_fork(w, &before);
        else if (r < 66) op_free(w, &before);
        else if (r < 73) op_truncate(w, &before);
        else if (r < 77) op_reserve(w, &before);
        else if (r < 83) op_swap(w, &before, 1);
        else if (r < 89) op_swap(w, &before, 0);
        else if (r < 95) op_cache_take(w, &before);
        else op_cache_evict(w, &before);
        run_step_ops(w);
        verify(w);
    }
    snap_free(&before);
    while (w->ns) {
        cr_assert_eq(kvp_bm_free(w->bm, w->s[w->ns - 1].id), KVP_OK);
        free(w->s[--w->ns].tok);
        verify(w);
    }
    while (w->ncache) cr_assert_eq(kvp_bm_decref(w->bm, w->cache[--w->ncache]), KVP_OK);
    cr_assert_eq(kvp_bm_num_free(w->bm), nb, "device pool fully free at the end (seed %llu)", (unsigned long long)seed0);
    cr_assert_eq(kvp_pool_num_free(kvp_bm_host_pool(w->bm)), nh, "host pool fully free at the end");
    cr_assert_eq(kvp_bm_check(w->bm), KVP_OK, "%s", kvp_error_detail());
    kvp_kv_accounting a;
    kvp_bm_account(w->bm, false, &a);
    cr_assert_eq(a.free, a.capacity);
    /* every kind of operation happened, many times */
    const char *names[] = {"allocate", "allocate_prefixed", "cow_copy", "append", "fork", "free", "truncate",
                           "reserve", "swap_out", "swap_in", "cache_take", "cache_evict"};
    cr_assert_gt(w->counts[12], 500, "seed %llu: only %lld appends by reference", (unsigned long long)seed0, (long long)w->counts[12]);
    for (int k = 0; k < 12; k++) {
        if (k == 2 && bs == 1) { /* with one-token blocks no block is ever partly filled: nothing to copy */
            cr_assert_eq(w->counts[k], 0, "bs 1 made CoW copies");
            continue;
        }
        cr_assert_gt(w->counts[k], 50, "seed %llu: only %lld successful %s", (unsigned long long)seed0,
                     (long long)w->counts[k], names[k]);
    }
    cr_log_info("bs %d: allocate %lld prefixed %lld cow %lld append %lld fork %lld free %lld truncate %lld swap %lld/%lld",
                bs, (long long)w->counts[0], (long long)w->counts[1], (long long)w->counts[2], (long long)w->counts[3],
                (long long)w->counts[4], (long long)w->counts[5], (long long)w->counts[6], (long long)w->counts[8],
                (long long)w->counts[9]);
    kvp_bm_destroy(w->bm);
    free(w->dev);
    free(w->hst);
    free(w);
}

/* 4 x 26,000 = 104,000 operations with four block sizes (1, 4, 7, 16). */
Test(block_mgr_random, bs16_against_model) { run_world(48, 16, 24, 200, 0xB10C16ull, 26000); }
Test(block_mgr_random, bs1_against_model) { run_world(96, 1, 48, 60, 0xB10C01ull, 26000); }
Test(block_mgr_random, bs7_against_model) { run_world(40, 7, 20, 90, 0xB10C07ull, 26000); }
Test(block_mgr_random, bs4_unlimited_against_model) { run_world(40, 4, 20, 0, 0xB10C04ull, 26000); }

/* Step mode: many operations per step, in the order a scheduler makes them (block_mgr.h): (1) frees,
 * truncations, swap-outs, cache changes; (2) swap-ins; (3) forks; (4) admissions, appends, reservations.
 * The step's block moves and token writes run only at its end, as an executor runs them: swap out, swap in,
 * copy-on-write copies, then the forward pass writes the new tokens through the slot mapping. */
static void end_step(world *w)
{
    run_step_ops(w);
    for (int64_t i = 0; i < w->npend; i++) w->dev[w->pend[i][0]] = w->pend[i][1];
    w->npend = 0;
    verify(w);
}

static void run_steps(int32_t nb, int32_t bs, int32_t nh, int32_t maxlen, uint64_t seed, int steps)
{
    world *w = world_new(nb, bs, nh, maxlen, seed, true);
    snap_t before = {0};
    int64_t ops = 0, copies = 0;
    for (int step = 0; step < steps; step++) {
        const int n[4] = {rng_int(&w->seed, 0, 3), rng_int(&w->seed, 0, 1), rng_int(&w->seed, 0, 2), rng_int(&w->seed, 1, 6)};
        for (int phase = 0; phase < 4; phase++)
            for (int k = 0; k < n[phase]; k++, w->it++, ops++) {
                snap_take(w->bm, &before);
                int r = rng_int(&w->seed, 0, 99);
                if (phase == 0) {
                    if (r < 35) op_free(w, &before);
                    else if (r < 55) op_truncate(w, &before);
                    else if (r < 75) op_swap(w, &before, 1);
                    else if (r < 88) op_cache_take(w, &before);
                    else op_cache_evict(w, &before);
                } else if (phase == 1) {
                    op_swap(w, &before, 0);
                } else if (phase == 2) {
                    op_fork(w, &before);
                } else {
                    if (r < 65) op_append(w, &before);
                    else if (r < 90) op_allocate(w, &before);
                    else op_reserve(w, &before);
                }
                verify(w);
            }
        kvp_bm_step_ops o;
        kvp_bm_step_ops_get(w->bm, &o);
        copies += o.n_copies;
        end_step(w);
    }
    snap_free(&before);
    while (w->ns) {
        cr_assert_eq(kvp_bm_free(w->bm, w->s[w->ns - 1].id), KVP_OK);
        free(w->s[--w->ns].tok);
    }
    end_step(w);
    while (w->ncache) cr_assert_eq(kvp_bm_decref(w->bm, w->cache[--w->ncache]), KVP_OK);
    cr_assert_eq(kvp_bm_num_free(w->bm), nb, "device pool fully free at the end (seed %llu)", (unsigned long long)seed);
    cr_assert_eq(kvp_pool_num_free(kvp_bm_host_pool(w->bm)), nh);
    cr_assert_eq(kvp_bm_check(w->bm), KVP_OK, "%s", kvp_error_detail());
    cr_assert_gt(copies, 100, "few copies were batched (%lld)", (long long)copies);
    cr_assert_gt(w->counts[8], 100, "few swap-outs");
    cr_assert_gt(w->counts[9], 100, "few swap-ins");
    cr_log_info("steps bs %d: %lld ops, %lld batched copies", bs, (long long)ops, (long long)copies);
    kvp_bm_destroy(w->bm);
    free(w->pend);
    free(w->dev);
    free(w->hst);
    free(w);
}

Test(block_mgr_random, steps_bs16_batched_ops) { run_steps(64, 16, 32, 200, 0x57E916ull, 3000); }
Test(block_mgr_random, steps_bs5_batched_ops) { run_steps(48, 5, 24, 80, 0x57E905ull, 3000); }
