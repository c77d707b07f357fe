/* runtime/engine/gen.c — continuous batching on the CPU executor (see gen.h for the step). */
#include "runtime/engine/gen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/block_mgr.h"
#include "common/alloc.h"
#include "common/json.h"
#include "common/log.h"
#include "common/timer.h"
#include "prefix_cache/host_cache.h"

typedef enum { SEQ_WAITING = 0, SEQ_RUNNING, SEQ_DONE } seq_state;

/* A kvp_gen_logprobs that grows a place at a time. */
typedef struct {
    kvp_gen_logprobs a;
    size_t cap_lp, cap_ids, cap_lps;
} lp_acc;

typedef struct {
    int64_t id;
    int32_t req;
    int32_t sample;      /* generator stream */
    seq_state state;
    int32_t *toks;       /* prompt + generated (the last one may not be computed yet) */
    int32_t n_toks, cap;
    int32_t n_computed;  /* tokens whose K/V is in the cache */
    int32_t n_alloc;     /* tokens the block table holds slots for (n_toks, or n_toks - 1 after a sample) */
    int32_t n_gen;
    int fork_pending;    /* n > 1 / beam: fork after the prompt's logits */
    int dropped;         /* a beam not kept: freed at the end of the step */
    kvp_gen_finish finish;
    int32_t stop_token;  /* KVP_FINISH_EOS / STOP_TOKEN: the token */
    int inserted;        /* prompt blocks offered to the prefix cache */
    int32_t n_hit;       /* blocks found in the prefix cache at its last admission (a fork: its parent's) */
    double logprob;
    kvp_rng rng;
    lp_acc glp;          /* request.logprobs: the generated tokens' */
    /* per step */
    int32_t ndraft;      /* speculation: drafts at the end of toks, computed this step (0: none) */
    int32_t step_gen0;   /* n_gen before this step's tokens were drawn when it speculated, else INT32_MAX */
    double step_lp[KVP_GEN_MAX_SPEC + 1]; /* logprob before each of them (kvp_gen_session_stop_at) */
    int32_t chunk;       /* tokens computed this step (0: not scheduled) */
    int32_t row;         /* place in this step's schedule */
    int32_t lrow;        /* logits row of its last new token this step */
} gseq;

typedef struct {
    double t_add;        /* when it was added (seconds since the session began) */
    int32_t n_live;      /* sequences not done */
    int32_t reserved;    /* beam search: the blocks its beams may hold at most, kept back while it runs */
    int admitted;
    int32_t cached_tokens;
    double t_first, t_done;
    int32_t max_tokens;
    int done;            /* finished (its result waits in fin, or was taken) */
    int aborted;         /* kvp_gen_session_abort */
    int taken;           /* its result was taken: its records are freed */
    lp_acc plp;          /* request.prompt_logprobs: places recorded so far (plp.a.n) */
} greq;

/* Per-step arrays, grown on demand and reused. */
typedef struct {
    int32_t *tokens, *pos, *qo, *kvi, *kvx, *last, *sched, *snap;
    int64_t *slots;
    uint8_t *every; /* sequences that get the logits of every new token (prompt logprobs, drafts) */
    size_t cap_tokens, cap_pos, cap_qo, cap_kvi, cap_kvx, cap_last, cap_sched, cap_snap, cap_slots, cap_every;
} step_buf;

/* A plain (no beam, no fork) sample drawn ahead of the serial pass, from a copy of the sequence's rng:
 * used only if the rng is still `before` when the serial pass reaches the sequence. */
typedef struct {
    int eligible;
    int32_t tok;
    double lp;
    kvp_rng before, after;
} presample;

enum { GEN_SAMPLE_THREADS = 8 };

struct kvp_gen_session {
    kvp_model *m;
    const kvp_gen_config *cfg; /* = &cfgv */
    kvp_gen_config cfgv;
    /* Requests by index i = id - id_base (a window: the taken ones at its front are dropped now and then). */
    kvp_gen_request *reqs;     /* owned, prompts and stop ids too (copied by kvp_gen_session_add) */
    size_t cap_reqs;
    greq *rq;
    size_t cap_rq;
    int32_t nreq;
    int32_t id_base;
    int32_t front;             /* reqs[0 .. front) are taken */
    int32_t unfinished;        /* requests not finished */
    int32_t waiting;           /* requests neither admitted nor aborted (all at or after next_req) */
    int64_t n_added, n_finished, n_aborted;
    int32_t *fin;              /* finished requests not taken yet, FIFO from fin_head */
    int64_t admitted_prompt_tokens;
    int32_t nfin, fin_head;
    size_t cap_fin;
    kvp_block_mgr *bm;
    kvp_prefix_cache *pc;
    kvp_kv_cache *kv;
    kvp_host_cache *hc;  /* host tier of the prefix cache, or NULL */
    kvp_kv_cache *hkv;   /* its blocks */
    uint64_t *hashes;    /* [max_len / block_size + 1] one sequence's chain hashes */
    int32_t *hslots;     /* [the same] host slots */
    int32_t *hpairs;     /* [twice that] (src, dst) block pairs of a copy to or from the tier */
    const int32_t *loading; /* write_back: the tier slots an admission is about to load from, [n_loading] */
    int32_t n_loading;
    kvp_status write_back_st; /* the first error of write_back */
    kvp_sampler_ws *sws;
    gseq **seqs; /* the sequences of requests not taken (NULL: a free slot, listed in free_slots) */
    int32_t nseqs;
    size_t cap_seqs;
    int32_t *free_slots; /* room for every slot: freeing one never allocates */
    int32_t nfree;
    size_t cap_free;
    int32_t *running; /* indices into seqs, admission order */
    int32_t nrun;
    size_t cap_run;
    int32_t *preempted; /* FIFO of seq indices waiting for recompute */
    int32_t npre;
    size_t cap_pre;
    int32_t next_req;
    int64_t next_id;
    double t0;
    int32_t vocab;
    int32_t beam_reserved; /* sum of greq.reserved over running beam searches */
    kvp_gen_stats st;
    double util_sum;
    int64_t util_n;
    double shared_sum, logical_sum; /* over steps: accounting's shared_savings and logical_tokens */
    step_buf buf;
    float *logits, *lsm;
    size_t cap_logits;
    /* plain sampling spread over the model's threads (helper k >= 1 has its own workspace) */
    presample *pre;
    size_t cap_pre_s;
    kvp_sampler_ws *hws[GEN_SAMPLE_THREADS];
    /* logit bias and penalties: a copy of a row's logits and token counts (zeros), per sampling thread */
    float *pen[GEN_SAMPLE_THREADS];
    int32_t *cnt[GEN_SAMPLE_THREADS];
};
typedef kvp_gen_session gen_ctx;

const char *kvp_gen_finish_name(kvp_gen_finish f)
{
    static const char *const names[] = {"length", "eos", "stop_token", "stopped", "aborted"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

kvp_gen_config kvp_gen_config_default(void)
{
    kvp_gen_config c = {.block_size = 16, .num_blocks = 0, .cache = KVP_PC_RADIX, .max_num_seqs = 256,
                        .max_batched_tokens = 2048, .stop_at_eos = 1, .kv_dtype = KVP_DTYPE_F32,
                        .spec_ngram_min = 5, .spec_ngram_max = 5};
    return c;
}

/* Integer member key of o in 1 .. hi into *out (absent: *out unchanged, *given 0; given may be NULL). */
static kvp_status spec_int(const cJSON *o, const char *key, int32_t hi, int32_t *out, int *given)
{
    int64_t v = 0;
    int has = 0;
    KVP_TRY(kvp_json_int(o, key, &v, &has));
    if (has && (v < 1 || v > hi))
        return KVP_ERR(KVP_EINVAL, "speculative config: \"%s\" is %lld, not in 1..%d", key, (long long)v, hi);
    if (has) *out = (int32_t)v;
    if (given) *given = has;
    return KVP_OK;
}

kvp_status kvp_gen_spec_parse(const char *json, kvp_gen_config *cfg)
{
    cJSON *o;
    KVP_TRY(kvp_json_parse(json, strlen(json), "the speculative config", &o));
    static const char *const keys[] = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                                       "disable_by_batch_size"};
    enum { NKEYS = sizeof keys / sizeof keys[0] };
    kvp_status st = cJSON_IsObject(o) ? KVP_OK : KVP_ERR(KVP_EPARSE, "speculative config: not a JSON object");
    for (const cJSON *it = st == KVP_OK ? o->child : NULL; st == KVP_OK && it; it = it->next) {
        size_t k = 0;
        while (k < NKEYS && strcmp(it->string, keys[k]) != 0) k++;
        if (k == NKEYS)
            st = KVP_ERR(KVP_EINVAL, "speculative config: unknown key \"%s\" (method, num_speculative_tokens, "
                                     "prompt_lookup_max, prompt_lookup_min, disable_by_batch_size)", it->string);
    }
    const char *method = NULL;
    int has = 0, gk = 0, gmax = 0, gmin = 0;
    int32_t k = 0, nmax = 5, nmin = 5, batch = 0;
    if (st == KVP_OK) st = kvp_json_str(o, "method", &method, &has);
    if (st == KVP_OK && (!has || strcmp(method, "ngram") != 0))
        st = KVP_ERR(KVP_EINVAL, "speculative config: \"method\" is %s%s%s, not \"ngram\" (the other methods need a "
                                 "draft model)", has ? "\"" : "missing", has ? method : "", has ? "\"" : "");
    if (st == KVP_OK) st = spec_int(o, "num_speculative_tokens", KVP_GEN_MAX_SPEC, &k, &gk);
    if (st == KVP_OK && !gk) st = KVP_ERR(KVP_EINVAL, "speculative config: \"num_speculative_tokens\" is required");
    if (st == KVP_OK) st = spec_int(o, "prompt_lookup_max", KVP_GEN_MAX_NGRAM, &nmax, &gmax);
    if (st == KVP_OK) st = spec_int(o, "prompt_lookup_min", KVP_GEN_MAX_NGRAM, &nmin, &gmin);
    if (st == KVP_OK) st = spec_int(o, "disable_by_batch_size", 1 << 20, &batch, NULL);
    if (gmax && !gmin) nmin = nmax;
    if (gmin && !gmax) nmax = nmin;
    if (st == KVP_OK && nmin > nmax)
        st = KVP_ERR(KVP_EINVAL, "speculative config: prompt_lookup_min %d is above prompt_lookup_max %d", nmin, nmax);
    cJSON_Delete(o);
    if (st != KVP_OK) return st;
    cfg->spec_tokens = k;
    cfg->spec_ngram_min = nmin;
    cfg->spec_ngram_max = nmax;
    cfg->spec_max_batch = batch;
    return KVP_OK;
}

static kvp_status push_tok(gseq *s, int32_t t)
{
    if (s->n_toks + 1 > s->cap) {
        int32_t nc = s->cap ? s->cap * 2 : 64;
        int32_t *p = kvp_realloc(s->toks, (size_t)nc * sizeof *p);
        if (!p) return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
        s->toks = p;
        s->cap = nc;
    }
    s->toks[s->n_toks++] = t;
    return KVP_OK;
}

/* kvp_grow for any pointer type. */
#define grow_to(pp, capp, need, elem) kvp_grow((void **)(pp), (capp), (need), (elem))

void kvp_gen_logprobs_free(kvp_gen_logprobs *a)
{
    kvp_free(a->lp);
    kvp_free(a->top_ids);
    kvp_free(a->top_lps);
    *a = (kvp_gen_logprobs){0};
}

/* Appends a place to x: the log-probability of tok under logits (V of them) and x's k most likely tokens
 * there; logits NULL: a place with nothing before it (NaN, ids -1). lsm: V floats of scratch. */
static kvp_status lp_push(lp_acc *x, const float *logits, int32_t V, int32_t tok, float *lsm)
{
    kvp_gen_logprobs *a = &x->a;
    const size_t n = (size_t)a->n, k = (size_t)a->k;
    KVP_TRY(grow_to(&a->lp, &x->cap_lp, n + 1, sizeof *a->lp));
    if (k) {
        KVP_TRY(grow_to(&a->top_ids, &x->cap_ids, (n + 1) * k, sizeof *a->top_ids));
        KVP_TRY(grow_to(&a->top_lps, &x->cap_lps, (n + 1) * k, sizeof *a->top_lps));
    }
    if (logits) kvp_log_softmax(logits, V, lsm);
    a->lp[n] = logits ? lsm[tok] : NAN;
    if (k && logits) kvp_top_logprobs(lsm, V, (int32_t)k, a->top_ids + n * k, a->top_lps + n * k);
    for (size_t i = 0; k && !logits && i < k; i++) {
        a->top_ids[n * k + i] = -1;
        a->top_lps[n * k + i] = NAN;
    }
    a->n++;
    return KVP_OK;
}

kvp_status kvp_gen_logprobs_copy(const kvp_gen_logprobs *src, kvp_gen_logprobs *dst)
{
    const size_t n = (size_t)src->n, nk = n * (size_t)src->k;
    *dst = (kvp_gen_logprobs){.n = src->n, .k = src->k, .lp = kvp_malloc((n + 1) * sizeof(float)),
                              .top_ids = kvp_malloc((nk + 1) * sizeof(int32_t)),
                              .top_lps = kvp_malloc((nk + 1) * sizeof(float))};
    if (!dst->lp || !dst->top_ids || !dst->top_lps) {
        kvp_gen_logprobs_free(dst);
        return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    }
    if (n) memcpy(dst->lp, src->lp, n * sizeof(float));
    if (nk) {
        memcpy(dst->top_ids, src->top_ids, nk * sizeof(int32_t));
        memcpy(dst->top_lps, src->top_lps, nk * sizeof(float));
    }
    return KVP_OK;
}

static kvp_status new_seq(gen_ctx *g, int32_t req, int32_t sample, const int32_t *toks, int32_t n, int32_t *index)
{
    if (g->nfree == 0) {
        KVP_TRY(kvp_grow((void **)&g->seqs, &g->cap_seqs, (size_t)g->nseqs + 1, sizeof *g->seqs));
        KVP_TRY(kvp_grow((void **)&g->free_slots, &g->cap_free, (size_t)g->nseqs + 1, sizeof *g->free_slots));
    }
    gseq *s = kvp_calloc(1, sizeof *s);
    if (!s) return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    s->cap = n + 64;
    s->toks = kvp_malloc((size_t)s->cap * sizeof *s->toks);
    if (!s->toks) {
        kvp_free(s);
        return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    }
    memcpy(s->toks, toks, (size_t)n * sizeof *toks);
    s->n_toks = n;
    s->id = g->next_id++;
    s->req = req;
    s->sample = sample;
    s->state = SEQ_WAITING;
    s->stop_token = -1;
    s->step_gen0 = INT32_MAX;
    s->glp.a.k = g->reqs[req].logprobs ? g->reqs[req].top_logprobs : 0;
    kvp_rng_seed(&s->rng, g->reqs[req].sampler.seed, (uint64_t)sample);
    *index = g->nfree > 0 ? g->free_slots[--g->nfree] : g->nseqs++;
    g->seqs[*index] = s;
    return KVP_OK;
}

/* Frees sequence idx (done, or never admitted) and its slot. */
static void drop_seq(gen_ctx *g, int32_t idx)
{
    kvp_gen_logprobs_free(&g->seqs[idx]->glp.a);
    kvp_free(g->seqs[idx]->toks);
    kvp_free(g->seqs[idx]);
    g->seqs[idx] = NULL;
    g->free_slots[g->nfree++] = idx;
}

static kvp_status run_push(gen_ctx *g, int32_t idx)
{
    size_t cap = g->cap_run;
    KVP_TRY(kvp_grow((void **)&g->running, &cap, (size_t)g->nrun + 1, sizeof *g->running));
    g->cap_run = cap;
    g->running[g->nrun++] = idx;
    return KVP_OK;
}

static void run_remove(gen_ctx *g, int32_t idx)
{
    for (int32_t i = 0; i < g->nrun; i++)
        if (g->running[i] == idx) {
            memmove(g->running + i, g->running + i + 1, (size_t)(g->nrun - i - 1) * sizeof *g->running);
            g->nrun--;
            return;
        }
}

static int is_beam(const gen_ctx *g, const gseq *s) { return g->reqs[s->req].beam_width > 1; }

/* Seats a request needs once forked. */
static int32_t group_size(const kvp_gen_request *r)
{
    return r->beam_width > 1 ? r->beam_width : r->n;
}

/* Request r is finished: to the queue of results (room was made when it was added). */
static void finish_req(gen_ctx *g, int32_t r)
{
    g->rq[r].t_done = kvp_now_s() - g->t0;
    g->rq[r].done = 1;
    g->fin[g->nfin++] = r;
    g->unfinished--;
    g->n_finished++;
}

/* Running seats sequence s holds: its request's group while it has yet to fork. */
static int32_t seats_of(const gen_ctx *g, const gseq *s)
{
    return s->fork_pending ? group_size(&g->reqs[s->req]) : 1;
}

/* Write-back (the prefix cache's eviction hook): an evicted block that no sequence holds is copied to the
 * host tier now, unless held there, or unless it would take a slot the admission under way loads from. */
static void write_back(void *ctx, uint64_t hash, int32_t block)
{
    gen_ctx *g = ctx;
    if (g->write_back_st != KVP_OK || kvp_pool_refcount(kvp_bm_pool(g->bm), block) > 1) return;
    const int32_t victim = kvp_hc_victim(g->hc);
    for (int32_t i = 0; victim >= 0 && i < g->n_loading; i++)
        if (g->loading[i] == victim) return;
    int32_t slot, pair[2];
    if (kvp_hc_store(g->hc, &hash, 1, &slot) == 0) return;
    pair[0] = block;
    pair[1] = slot;
    g->write_back_st = kvp_kv_cache_move_blocks(g->hkv, g->kv, pair, 1);
    g->st.host_stored_blocks++;
}

/* Evicts cached blocks until `need` are free or none is evictable (write_back stores them). */
static kvp_status evict_until(gen_ctx *g, int32_t need)
{
    KVP_TRY(kvp_pc_evict_until_free(g->pc, need));
    return g->write_back_st;
}

/* Caches sequence s's first nfull full blocks (computed) in the prefix cache and, write-through, in its host
 * tier those the write policy offers (kvp_hc_blocks_to_store): the blocks the tier did not hold are copied
 * there now. */
static kvp_status cache_blocks(gen_ctx *g, const gseq *s, int32_t nfull)
{
    kvp_bm_table_view tv;
    KVP_TRY(kvp_bm_table(g->bm, s->id, &tv));
    KVP_TRY(kvp_pc_insert(g->pc, s->toks, s->n_toks, tv.blocks, nfull, NULL, 0, NULL));
    const int32_t nstore = g->hc ? kvp_hc_blocks_to_store(g->cfg->host_write_policy, nfull, s->n_hit) : 0;
    if (nstore == 0) return KVP_OK;
    kvp_pc_chain_hashes(s->toks, nstore, g->cfg->block_size, 0, g->hashes);
    int32_t n = kvp_hc_store(g->hc, g->hashes, nstore, g->hslots), k = 0;
    for (int32_t i = 0; n > 0 && i < nstore; i++)
        if (g->hslots[i] >= 0) {
            g->hpairs[2 * k] = tv.blocks[i];
            g->hpairs[2 * k + 1] = g->hslots[i];
            k++;
        }
    KVP_TRY(kvp_kv_cache_move_blocks(g->hkv, g->kv, g->hpairs, n)); /* the caches are alike: cannot fail */
    g->st.host_stored_blocks += n;
    return KVP_OK;
}

/* Offers the full blocks of sequence s's computed tokens, generated ones too, to the prefix cache (before its
 * blocks are freed): a later request that starts with them (the next turn of a chat carries this answer)
 * finds them there, as in the engine. */
static kvp_status offer_computed(gen_ctx *g, const gseq *s)
{
    const int32_t nfull = s->n_computed / kvp_bm_block_size(g->bm);
    return g->pc && nfull >= 1 ? cache_blocks(g, s, nfull) : KVP_OK;
}

/* Frees a sequence's blocks (a kept one's full blocks go to the prefix cache first: a failure there only
 * loses those hits) and marks it done. */
static void finish_seq(gen_ctx *g, int32_t idx)
{
    gseq *s = g->seqs[idx];
    if (!s->dropped) (void)offer_computed(g, s);
    kvp_bm_free(g->bm, s->id);
    kvp_error_clear();
    s->state = SEQ_DONE;
    run_remove(g, idx);
    greq *r = &g->rq[s->req];
    if (--r->n_live == 0) {
        g->beam_reserved -= r->reserved;
        r->reserved = 0;
        finish_req(g, s->req);
    }
}

/* Ends sequence idx, running or preempted, for `why`. */
static void end_seq(gen_ctx *g, int32_t idx, kvp_gen_finish why)
{
    for (int32_t i = 0; i < g->npre; i++)
        if (g->preempted[i] == idx) {
            memmove(g->preempted + i, g->preempted + i + 1, (size_t)(g->npre - i - 1) * sizeof *g->preempted);
            g->npre--;
            break;
        }
    g->seqs[idx]->finish = why;
    finish_seq(g, idx);
}

/* The blocks the W beams of request r may hold at once: the prompt's full blocks, shared, and for each beam
 * the rest of a whole sequence of its own. Beams are never preempted (they advance in lockstep), so a beam
 * search is admitted only while the running ones' reservations and its own fit the cache together. */
static int32_t beam_blocks(const gen_ctx *g, int32_t r)
{
    const int64_t bs = g->cfg->block_size, p = g->reqs[r].n_prompt, len = p + g->rq[r].max_tokens;
    const int64_t nb = p / bs + (int64_t)g->reqs[r].beam_width * ((len + bs - 1) / bs - p / bs);
    return nb > INT32_MAX ? INT32_MAX : (int32_t)nb;
}

/* 1 while sequence s computes prompt places whose log-probabilities its request still wants: the logits of
 * every prompt token, so no prefix-cache hit. */
static int wants_prompt_logits(const gen_ctx *g, const gseq *s)
{
    return g->reqs[s->req].prompt_logprobs && g->rq[s->req].plp.a.n < g->reqs[s->req].n_prompt;
}

enum { MAX_HIT = 4096 }; /* blocks a match looks at, at most */

/* The full blocks of toks[0..n) found cached, never the last token: *n_hit in the prefix cache (hit[0..), locked
 * with lock = 1), then *n_load after them in the host tier (their slots in g->hslots). */
static kvp_status match_tiers(gen_ctx *g, const int32_t *toks, int32_t n, int lock, int32_t *hit, int32_t *n_hit,
                              int32_t *n_load)
{
    const int32_t bs = g->cfg->block_size, max_hit = (n - 1) / bs, cap = max_hit < MAX_HIT ? max_hit : MAX_HIT;
    *n_load = 0;
    KVP_TRY(kvp_pc_match(g->pc, toks, n, NULL, lock, hit, cap, n_hit));
    if (g->hc && cap > *n_hit) {
        kvp_pc_chain_hashes(toks, cap, bs, 0, g->hashes);
        *n_load = kvp_hc_match(g->hc, g->hashes + *n_hit, cap - *n_hit, g->hslots);
    }
    return KVP_OK;
}

/* Tries to admit one sequence (fresh or preempted): prefix-cache match, then a table holding the hit
 * blocks. Returns 1 when admitted, 0 when it does not fit now. */
static kvp_status admit(gen_ctx *g, int32_t idx, int32_t *budget, int *admitted)
{
    gseq *s = g->seqs[idx];
    const int32_t bs = g->cfg->block_size;
    *admitted = 0;
    int32_t hit[MAX_HIT], n_hit = 0;
    int32_t n_load = 0; /* blocks after the hit that the host tier holds: copied, not computed */
    if (!wants_prompt_logits(g, s)) KVP_TRY(match_tiers(g, s->toks, s->n_toks, 1, hit, &n_hit, &n_load));
    int32_t need_blocks = (s->n_toks + bs - 1) / bs - n_hit;
    int32_t to_compute = s->n_toks - (n_hit + n_load) * bs;
    int fits = to_compute <= *budget || g->nrun == 0;
    kvp_status st = KVP_OK;
    if (fits) { /* the hit blocks are locked: never evicted here; the slots to load from are kept */
        g->loading = g->hslots;
        g->n_loading = n_load;
        st = evict_until(g, need_blocks);
        g->n_loading = 0;
        fits = need_blocks <= kvp_bm_num_free(g->bm);
    }
    /* The table gets slots for every known token now: prompt chunks then never wait for blocks. */
    if (fits && st == KVP_OK) st = kvp_bm_allocate_prefixed(g->bm, s->id, s->n_toks, hit, n_hit);
    kvp_status st2 = kvp_pc_unlock(g->pc, hit, n_hit); /* our own references now protect the blocks */
    KVP_TRY(st);
    KVP_TRY(st2);
    if (!fits) return KVP_OK;
    if (n_load > 0) {
        kvp_bm_table_view tv;
        st = kvp_bm_table(g->bm, s->id, &tv);
        for (int32_t i = 0; i < n_load; i++) {
            g->hpairs[2 * i] = g->hslots[i];
            g->hpairs[2 * i + 1] = tv.blocks[n_hit + i];
        }
        if (st == KVP_OK) st = kvp_kv_cache_move_blocks(g->kv, g->hkv, g->hpairs, n_load);
        if (st != KVP_OK) {
            kvp_bm_free(g->bm, s->id);
            return st;
        }
        g->st.host_loaded_blocks += n_load;
    }
    s->n_computed = (n_hit + n_load) * bs;
    s->n_alloc = s->n_toks;
    s->n_hit = n_hit;
    s->state = SEQ_RUNNING;
    greq *r = &g->rq[s->req];
    if (!r->admitted) {
        r->admitted = 1;
        r->cached_tokens = (n_hit + n_load) * bs;
        g->st.prefix_hit_tokens += n_hit * bs;
        g->st.host_hit_tokens += n_load * bs;
    }
    *budget -= to_compute;
    KVP_TRY(run_push(g, idx));
    *admitted = 1;
    return KVP_OK;
}

/* Recompute preemption of running sequence idx: the full blocks of all it computed are cached (readmitted,
 * it finds them unless evicted meanwhile, as in the engine), its blocks are freed and it waits to be
 * prefilled again. The preempted list grows first and an insert fails with nothing changed, so a failure
 * leaves everything as it was. */
static kvp_status preempt(gen_ctx *g, int32_t idx)
{
    gseq *s = g->seqs[idx];
    size_t cap = g->cap_pre;
    KVP_TRY(kvp_grow((void **)&g->preempted, &cap, (size_t)g->npre + 1, sizeof *g->preempted));
    g->cap_pre = cap;
    KVP_TRY(offer_computed(g, s));
    KVP_TRY(kvp_bm_free(g->bm, s->id));
    s->n_computed = 0;
    s->n_alloc = 0;
    s->state = SEQ_WAITING;
    run_remove(g, idx);
    g->preempted[g->npre++] = idx;
    g->st.preemptions++;
    return KVP_OK;
}

/* The priority of sequence idx's request (lower: more urgent). */
static int32_t seq_priority(const gen_ctx *g, int32_t idx) { return g->reqs[g->seqs[idx]->req].priority; }

/* Preempts (recompute) a preemptible running sequence other than `keep` (not a beam, not scheduled this step):
 * the most recently admitted, or under the priority policy the least urgent (the largest priority, then the
 * most recent), unless keep is less urgent still. Returns 0 in *done when none goes (the caller then preempts
 * keep). */
static kvp_status preempt_one(gen_ctx *g, int32_t keep, int *done)
{
    *done = 0;
    const int prio = g->cfg->sched == KVP_SCHED_PRIORITY;
    int32_t victim = -1;
    for (int32_t i = g->nrun - 1; i >= 0 && (victim < 0 || prio); i--) {
        int32_t idx = g->running[i];
        gseq *s = g->seqs[idx];
        if (idx == keep || is_beam(g, s) || s->chunk > 0) continue;
        if (victim < 0 || seq_priority(g, idx) > seq_priority(g, victim)) victim = idx;
    }
    if (victim < 0 || (prio && !is_beam(g, g->seqs[keep]) && seq_priority(g, keep) > seq_priority(g, victim)))
        return KVP_OK;
    KVP_TRY(preempt(g, victim));
    *done = 1;
    return KVP_OK;
}

int32_t kvp_ngram_propose(const int32_t *t, int32_t len, int32_t nmin, int32_t nmax, int32_t max_out, int32_t *out)
{
    if (nmax > len - 1) nmax = len - 1;
    if (nmin < 1 || nmax < nmin || max_out < 1) return 0;
    /* one pass from the latest end e of an occurrence (t[e] = the last token) to the earliest: the longest match
     * so far (n), and where its occurrence ends (at; settled once it has max_out tokens after it) */
    int32_t n = 0, at = -1, settled = 0;
    for (int32_t e = len - 2; e >= 0; e--) {
        if (t[e] != t[len - 1]) continue;
        int32_t m = 1;
        while (m < nmax && m <= e && t[e - m] == t[len - 1 - m]) m++;
        if (m < nmin || m < n || (m == n && settled)) continue;
        n = m; /* longer: this n's first (latest) occurrence; as long: an earlier one, with more after it */
        at = e;
        settled = len - 1 - e >= max_out;
    }
    if (at < 0) return 0;
    const int32_t c = len - 1 - at < max_out ? len - 1 - at : max_out;
    memcpy(out, t + at + 1, (size_t)c * sizeof *t);
    return c;
}

/* Speculation for decoding sequence idx (kvp_gen_config.spec_tokens) in a step that started with `running`
 * sequences: proposes drafts and appends them to its tokens (s->ndraft), as many as the step's budget left, its
 * remaining max_tokens and the free blocks allow. */
static kvp_status propose_drafts(gen_ctx *g, int32_t idx, int32_t budget, int32_t running)
{
    gseq *s = g->seqs[idx];
    const kvp_gen_config *c = g->cfg;
    s->ndraft = 0;
    if (c->spec_tokens < 1 || is_beam(g, s) || s->fork_pending || (c->spec_max_batch > 0 && running > c->spec_max_batch))
        return KVP_OK;
    /* drawing k drafts' places gives k + 1 tokens: the last place needs no draft */
    int32_t k = g->rq[s->req].max_tokens - s->n_gen - 1;
    k = k < c->spec_tokens ? k : c->spec_tokens;
    k = k < budget - 1 ? k : budget - 1;
    if (k < 1) return KVP_OK;
    int32_t d[KVP_GEN_MAX_SPEC];
    k = kvp_ngram_propose(s->toks, s->n_toks, c->spec_ngram_min, c->spec_ngram_max, k, d);
    for (int32_t need = 0; k > 0; k--) { /* free blocks only: a draft never evicts or preempts */
        KVP_TRY(kvp_bm_append_blocks_needed(g->bm, s->id, 1 + k, &need));
        if (need <= kvp_bm_num_free(g->bm)) break;
    }
    for (int32_t i = 0; i < k; i++) KVP_TRY(push_tok(s, d[i]));
    s->ndraft = k;
    g->st.spec_drafts += k > 0;
    g->st.spec_draft_tokens += k;
    return KVP_OK;
}

/* Gets slots for `n` new tokens of sequence idx, evicting cached blocks and preempting unscheduled others
 * (most recent first) as needed; as a last resort the sequence preempts itself (*self = 1, no slots). */
static kvp_status append_slots(gen_ctx *g, int32_t idx, int32_t n, int32_t *slots, int *self)
{
    gseq *s = g->seqs[idx];
    *self = 0;
    for (;;) {
        int32_t need = 0;
        KVP_TRY(kvp_bm_append_blocks_needed(g->bm, s->id, n, &need));
        if (need > kvp_bm_num_free(g->bm)) KVP_TRY(evict_until(g, need));
        if (need > kvp_bm_num_free(g->bm)) {
            int done;
            KVP_TRY(preempt_one(g, idx, &done));
            if (!done && !is_beam(g, s) && g->nrun > 1) {
                s->chunk = 0;
                KVP_TRY(preempt(g, idx));
                *self = 1;
                return KVP_OK;
            }
            if (!done)
                return KVP_ERR(KVP_ENOBLOCKS, "generate: the KV cache (%d blocks of %d tokens) is too small for "
                                              "request %d at %d tokens; raise --num-blocks",
                               g->cfg->num_blocks, g->cfg->block_size, g->id_base + s->req, s->n_computed + n);
            continue;
        }
        KVP_TRY(kvp_bm_append(g->bm, s->id, n, slots));
        s->n_alloc += n;
        return KVP_OK;
    }
}

/* Records the first token time and appends a sampled token (and its log-probabilities under lg, the logits
 * it was drawn from, when its request wants them); finishes the sequence when it is done. */
static kvp_status emit(gen_ctx *g, int32_t idx, int32_t tok, double lp, const float *lg)
{
    gseq *s = g->seqs[idx];
    greq *r = &g->rq[s->req];
    if (r->t_first < 0) r->t_first = kvp_now_s() - g->t0;
    const kvp_gen_request *q = &g->reqs[s->req];
    kvp_gen_finish why = KVP_FINISH_LENGTH;
    if (!is_beam(g, s) && g->cfg->stop_at_eos && !q->ignore_eos && kvp_model_is_eos(g->m, tok)) why = KVP_FINISH_EOS;
    for (int32_t i = 0; why == KVP_FINISH_LENGTH && !is_beam(g, s) && i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == tok) why = KVP_FINISH_STOP_TOKEN;
    if (why != KVP_FINISH_LENGTH) {
        s->stop_token = tok;
        s->finish = why;
        finish_seq(g, idx);
        return KVP_OK;
    }
    if (q->logprobs && lg) KVP_TRY(lp_push(&s->glp, lg, g->vocab, tok, g->lsm));
    KVP_TRY(push_tok(s, tok));
    s->n_gen++;
    s->logprob += lp;
    if (s->n_gen >= r->max_tokens) finish_seq(g, idx);
    return KVP_OK;
}

/* Sampling thread k's scratch for draw (made on first use). */
static kvp_status draw_scratch(gen_ctx *g, int k)
{
    if (!g->pen[k] && !(g->pen[k] = kvp_malloc((size_t)g->vocab * sizeof(float))))
        return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    if (!g->cnt[k] && !(g->cnt[k] = kvp_calloc((size_t)g->vocab, sizeof(int32_t))))
        return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    return KVP_OK;
}

/* Whether sequence s draws from its logits as they are: no logit bias, no penalties, no masks before
 * min_tokens. */
static int draws_unchanged(const gen_ctx *g, const gseq *s)
{
    const kvp_gen_request *r = &g->reqs[s->req];
    return r->n_bias == 0 && !kvp_sampler_penalized(&r->sampler) && s->n_gen >= r->min_tokens;
}

/* Sequence s's next token from its logits lg, drawn with rng by sampling thread k (scratch ws): with its
 * request's logit bias and penalties applied to a copy first, and before min_tokens, EOS and the stop ids
 * masked. *lp: the token's log-probability under lg (0 with skip_logprob). */
static int32_t draw(const gen_ctx *g, const gseq *s, kvp_rng *rng, const float *lg, int k, kvp_sampler_ws *ws,
                    double *lp)
{
    const kvp_gen_request *r = &g->reqs[s->req];
    const int32_t V = g->vocab;
    const int early = s->n_gen < r->min_tokens, skip = g->cfg->skip_logprob;
    *lp = 0.0;
    if (draws_unchanged(g, s))
        return skip ? kvp_sample(&r->sampler, rng, lg, V, ws) : kvp_sample_logprob(&r->sampler, rng, lg, V, ws, lp);
    float *x = g->pen[k];
    memcpy(x, lg, (size_t)V * sizeof *x);
    for (int32_t i = 0; i < r->n_bias; i++) x[r->bias_ids[i]] += r->bias[i];
    const kvp_model_config *mc = kvp_model_cfg(g->m);
    for (int32_t i = 0; early && g->cfg->stop_at_eos && !r->ignore_eos && i < mc->n_eos; i++)
        x[mc->eos_token_ids[i]] = -INFINITY; /* ids checked against the vocabulary at load */
    for (int32_t i = 0; early && i < r->n_stop_ids; i++) x[r->stop_ids[i]] = -INFINITY;
    if (kvp_sampler_penalized(&r->sampler))
        kvp_apply_penalties(&r->sampler, x, V, s->toks, s->n_toks - s->n_gen, s->toks + (s->n_toks - s->n_gen),
                            s->n_gen, g->cnt[k]);
    const int32_t tok = kvp_sample(&r->sampler, rng, x, V, ws);
    if (!skip) *lp = kvp_token_logprob(lg, V, tok);
    return tok;
}

typedef struct {
    gen_ctx *g;
    int32_t i0, i1;
    int k; /* sampling thread */
    kvp_sampler_ws *ws;
} sample_job;

/* Draws the eligible presamples of batch rows i0 .. i1-1 (reads logits and sequences, writes only pre[]).
 * Draws from unchanged logits go KVP_SAMPLE_MANY at a time through kvp_sample_many (the same tokens). */
static void sample_main(void *arg, int k)
{
    sample_job *j = (sample_job *)arg + k;
    gen_ctx *g = j->g;
    const int skip = g->cfg->skip_logprob;
    const kvp_sampler_params *gp[KVP_SAMPLE_MANY];
    kvp_rng *gr[KVP_SAMPLE_MANY];
    const float *gl[KVP_SAMPLE_MANY];
    presample *gps[KVP_SAMPLE_MANY];
    int32_t gt[KVP_SAMPLE_MANY];
    double glp[KVP_SAMPLE_MANY];
    int ng = 0;
    for (int32_t i = j->i0; i < j->i1; i++) {
        presample *ps = &g->pre[i];
        if (ps->eligible) {
            gseq *s = g->seqs[g->buf.sched[i]];
            const float *lg = g->logits + (int64_t)s->lrow * g->vocab;
            ps->before = ps->after = s->rng;
            if (!draws_unchanged(g, s)) {
                ps->tok = draw(g, s, &ps->after, lg, j->k, j->ws, &ps->lp);
            } else {
                gp[ng] = &g->reqs[s->req].sampler, gr[ng] = &ps->after, gl[ng] = lg, gps[ng] = ps;
                ng++;
            }
        }
        if (ng == KVP_SAMPLE_MANY || (ng > 0 && i + 1 == j->i1)) {
            kvp_sample_many(ng, gp, gr, gl, g->vocab, j->ws, gt, skip ? NULL : glp);
            for (int q = 0; q < ng; q++) gps[q]->tok = gt[q], gps[q]->lp = skip ? 0.0 : glp[q];
            ng = 0;
        }
    }
}

/* Sampling (a pass of exp over the vocabulary per token) is the serial part of a batched step: the
 * plain samples of the step are drawn on the model's threads first. Results are the same as drawing them
 * in the serial pass (each sequence owns its rng, the logits are fixed). Returns 0 (nothing drawn: the
 * serial pass samples as before) when there is too little to share or a helper cannot be set up. */
static int presample_step(gen_ctx *g, int32_t ns)
{
    int nt = kvp_model_get_threads(g->m);
    if (nt > GEN_SAMPLE_THREADS) nt = GEN_SAMPLE_THREADS;
    if (nt < 2 || ns < 16) return 0;
    if (grow_to(&g->pre, &g->cap_pre_s, (size_t)ns, sizeof *g->pre) != KVP_OK) return 0;
    for (int k = 1; k < nt; k++) {
        if (!g->hws[k] && kvp_sampler_ws_create(g->vocab, &g->hws[k]) != KVP_OK) return 0;
        if (draw_scratch(g, k) != KVP_OK) return 0;
    }
    int32_t n_el = 0;
    for (int32_t i = 0; i < ns; i++) {
        gseq *s = g->seqs[g->buf.sched[i]];
        const kvp_gen_request *r = &g->reqs[s->req];
        g->pre[i].eligible = s->state == SEQ_RUNNING && s->n_computed >= s->n_toks &&
                             g->rq[s->req].max_tokens != 0 && r->beam_width <= 1 && !s->fork_pending && !s->ndraft;
        n_el += g->pre[i].eligible;
    }
    if (n_el < 16) return 0;
    sample_job jobs[GEN_SAMPLE_THREADS];
    for (int k = 0; k < nt; k++)
        jobs[k] = (sample_job){.g = g, .i0 = (int32_t)((int64_t)ns * k / nt), .i1 = (int32_t)((int64_t)ns * (k + 1) / nt),
                               .k = k, .ws = k ? g->hws[k] : g->sws};
    kvp_model_run(g->m, nt, sample_main, jobs); /* the model's sleeping workers: no thread made per step */
    return 1;
}

/* Forks sequence idx into a new running sequence (shared blocks, copied token list). */
static kvp_status fork_seq(gen_ctx *g, int32_t idx, int32_t sample, int32_t *child)
{
    gseq *p = g->seqs[idx];
    int32_t c = -1;
    KVP_TRY(new_seq(g, p->req, sample, p->toks, p->n_toks, &c));
    gseq *s = g->seqs[c];
    s->n_computed = p->n_computed;
    s->n_alloc = p->n_alloc;
    s->n_gen = p->n_gen;
    s->n_hit = p->n_hit;
    s->logprob = p->logprob;
    s->inserted = 1;
    s->state = SEQ_RUNNING;
    KVP_TRY(kvp_bm_fork(g->bm, p->id, s->id));
    KVP_TRY(run_push(g, c));
    g->rq[p->req].n_live++;
    *child = c;
    return KVP_OK;
}

typedef struct {
    double score;
    int32_t parent; /* seq index */
    int32_t pos;    /* parent's order among the beams */
    int32_t tok;
    float lp;
} cand;

/* Candidate order: score desc, then parent order, then token id (a total order: (pos, tok) is unique). */
static int cand_before(const cand *a, const cand *b)
{
    if (a->score != b->score) return a->score > b->score;
    return a->pos != b->pos ? a->pos < b->pos : a->tok < b->tok;
}

static int cand_cmp(const void *a, const void *b)
{
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* Restores the heap below i: h[0] is the worst of the kept candidates (the one any better one replaces). */
static void cand_sift_down(cand *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && cand_before(&h[w], &h[l])) w = l;
        if (r < n && cand_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Beam step for request r: every live beam has logits in rows. The W best extensions over every
 * (beam, token) pair are kept in a heap of W (nb x V x log W, not a scan per kept token), then sorted. */
static kvp_status beam_step(gen_ctx *g, int32_t r, const int32_t *beams, int32_t nb)
{
    const int32_t W = g->reqs[r].beam_width, V = g->vocab;
    cand *c = kvp_malloc((size_t)W * sizeof *c);
    int32_t *sel = kvp_calloc((size_t)nb, sizeof *sel);
    if (!c || !sel) {
        kvp_free(c);
        kvp_free(sel);
        return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    }
    int32_t nc = 0;
    for (int32_t b = 0; b < nb; b++) {
        gseq *s = g->seqs[beams[b]];
        kvp_log_softmax(g->logits + (int64_t)s->lrow * V, V, g->lsm);
        for (int32_t t = 0; t < V; t++) {
            const cand x = {s->logprob + g->lsm[t], beams[b], b, t, g->lsm[t]};
            if (nc < W) { /* fill, then heapify once full */
                c[nc++] = x;
                if (nc == W)
                    for (int32_t i = W / 2; i-- > 0;) cand_sift_down(c, W, i);
            } else if (cand_before(&x, &c[0])) {
                c[0] = x;
                cand_sift_down(c, W, 0);
            }
        }
    }
    qsort(c, (size_t)nc, sizeof *c, cand_cmp);
    int32_t keep = nc < W ? nc : W;
    kvp_status st = KVP_OK;
    /* Forks first (from parents still alive), then frees, then appends. */
    int32_t *target = kvp_malloc((size_t)keep * sizeof *target);
    if (!target) st = KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    for (int32_t i = 0; st == KVP_OK && i < keep; i++) {
        int32_t b = c[i].pos;
        if (sel[b]++ == 0) {
            target[i] = c[i].parent;
        } else {
            st = fork_seq(g, c[i].parent, 0, &target[i]);
        }
    }
    for (int32_t b = 0; st == KVP_OK && b < nb; b++)
        if (sel[b] == 0) { /* a dropped beam is no result: its record goes at the end of the step */
            finish_seq(g, beams[b]);
            g->seqs[beams[b]]->dropped = 1;
        }
    for (int32_t i = 0; st == KVP_OK && i < keep; i++) {
        gseq *s = g->seqs[target[i]];
        s->logprob = c[i].score - c[i].lp; /* emit adds lp back */
        st = emit(g, target[i], c[i].tok, c[i].lp, NULL);
    }
    kvp_free(target);
    kvp_free(c);
    kvp_free(sel);
    return st;
}

/* Speculating sequence idx after the forward pass: its last token and its drafts were computed (rows lrow - ndraft ..
 * lrow). Each place's token is drawn as without speculation and emitted; a draft equal to it is kept (its K/V
 * stays valid) and the next place is drawn, else the drawing stops there. Then the slots past the kept tokens
 * are truncated away. */
static kvp_status verify_drafts(gen_ctx *g, int32_t idx)
{
    gseq *s = g->seqs[idx];
    const int32_t k = s->ndraft, base = s->n_toks - k; /* toks[base ..) are the drafts */
    int32_t d[KVP_GEN_MAX_SPEC];
    memcpy(d, s->toks + base, (size_t)k * sizeof *d);
    s->ndraft = 0;
    s->n_toks = s->n_computed = base; /* the last token's K/V is in; drafts count once kept */
    s->step_gen0 = s->n_gen;
    const float *row0 = g->logits + (int64_t)(s->lrow - k) * g->vocab;
    for (int32_t i = 0; i <= k; i++) {
        const float *lg = row0 + (int64_t)i * g->vocab;
        double lp;
        s->step_lp[i] = s->logprob;
        const int32_t t = draw(g, s, &s->rng, lg, 0, g->sws, &lp);
        KVP_TRY(emit(g, idx, t, lp, lg));
        if (s->state == SEQ_DONE || i == k || t != d[i]) break;
        s->n_computed++;
        g->st.spec_accepted_tokens++;
    }
    if (s->state == SEQ_DONE) return KVP_OK; /* its blocks are freed */
    KVP_TRY(kvp_bm_truncate(g->bm, s->id, s->n_computed));
    s->n_alloc = s->n_computed;
    return KVP_OK;
}

/* The prompt places sequence s's step (a chunk of its prompt, every token's logits from row lrow - chunk + 1)
 * predicts, recorded once each: the logits at position p are those of token p + 1. */
static kvp_status record_prompt_logprobs(gen_ctx *g, gseq *s)
{
    const kvp_gen_request *r = &g->reqs[s->req];
    lp_acc *x = &g->rq[s->req].plp;
    if (x->a.n == 0) KVP_TRY(lp_push(x, NULL, g->vocab, 0, g->lsm));
    const int32_t row0 = s->lrow - s->chunk + 1;
    for (int32_t j = 0; j < s->chunk; j++) {
        const int32_t place = s->n_computed + j + 1;
        if (place == x->a.n && place < r->n_prompt)
            KVP_TRY(lp_push(x, g->logits + (int64_t)(row0 + j) * g->vocab, g->vocab, r->prompt[place], g->lsm));
    }
    return KVP_OK;
}

/* The preempted sequence to readmit next, its place in g->preempted: the first preempted, or under the priority
 * policy the most urgent (then the first preempted), as vLLM's waiting queue orders them. */
static int32_t pick_preempted(const gen_ctx *g)
{
    int32_t at = 0;
    for (int32_t i = 1; g->cfg->sched == KVP_SCHED_PRIORITY && i < g->npre; i++)
        if (seq_priority(g, g->preempted[i]) < seq_priority(g, g->preempted[at])) at = i;
    return at;
}

/* The waiting request to admit next (g->next_req is the oldest): see kvp_gen_config.sched. */
static kvp_status pick_request(gen_ctx *g, int32_t *out)
{
    *out = g->next_req;
    if (g->cfg->sched == KVP_SCHED_FCFS) return KVP_OK;
    const int lpm = g->cfg->sched == KVP_SCHED_LPM;
    int32_t best_key = 0, seen = 0;
    for (int32_t i = g->next_req; i < g->nreq && (!lpm || seen < KVP_LPM_WINDOW); i++) {
        if (g->rq[i].admitted || g->rq[i].aborted) continue;
        const kvp_gen_request *r = &g->reqs[i];
        int32_t key = r->priority; /* the smallest key wins, the oldest among equals */
        if (lpm) { /* a look only: nothing locked; the host tier's blocks count too, as SGLang's */
            int32_t hit[MAX_HIT], n_hit = 0, n_host = 0;
            if (!r->prompt_logprobs) KVP_TRY(match_tiers(g, r->prompt, r->n_prompt, 0, hit, &n_hit, &n_host));
            key = -(n_hit + n_host);
        }
        if (seen++ == 0 || key < best_key) *out = i, best_key = key;
    }
    return KVP_OK;
}

static kvp_status step(gen_ctx *g)
{
    const kvp_gen_config *cfg = g->cfg;
    const int32_t bs = cfg->block_size;
    int32_t budget = cfg->max_batched_tokens;
    /* Budget taken by decodes (always scheduled); seats held (a sequence that will fork holds its group's). */
    int32_t seats = 0;
    for (int32_t i = 0; i < g->nrun; i++) {
        gseq *s = g->seqs[g->running[i]];
        if (s->n_alloc == s->n_toks - 1) budget--;
        seats += seats_of(g, s);
    }
    /* (1) admission: preempted first, then new requests in the policy's order (pick_request), head-of-line. */
    int blocked = 0;
    while (!blocked && g->npre > 0) {
        const int32_t at = pick_preempted(g), idx = g->preempted[at];
        if (seats + seats_of(g, g->seqs[idx]) > cfg->max_num_seqs) break;
        int ok;
        KVP_TRY(admit(g, idx, &budget, &ok));
        if (!ok) {
            blocked = 1;
            break;
        }
        memmove(g->preempted + at, g->preempted + at + 1, (size_t)(g->npre - at - 1) * sizeof *g->preempted);
        g->npre--;
        seats += seats_of(g, g->seqs[idx]);
    }
    int32_t ri = g->next_req; /* the request admission tried last */
    while (!blocked && g->waiting > 0 && budget > 0) {
        while (g->rq[g->next_req].admitted || g->rq[g->next_req].aborted) g->next_req++; /* a waiting one follows */
        KVP_TRY(pick_request(g, &ri));
        const kvp_gen_request *r = &g->reqs[ri];
        if (seats + group_size(r) > cfg->max_num_seqs && g->nrun > 0) break;
        const int32_t reserve = r->beam_width > 1 ? beam_blocks(g, ri) : 0;
        if (reserve > 0 && g->beam_reserved > 0 && (int64_t)g->beam_reserved + reserve > cfg->num_blocks) break;
        int32_t idx = -1;
        KVP_TRY(new_seq(g, ri, 0, r->prompt, r->n_prompt, &idx));
        g->seqs[idx]->fork_pending = group_size(r) > 1 || r->beam_width > 1;
        int ok;
        KVP_TRY(admit(g, idx, &budget, &ok));
        if (!ok) {
            drop_seq(g, idx); /* the unadmitted sequence object goes again */
            g->next_id--;
            break;
        }
        g->rq[ri].n_live = 1;
        seats += group_size(r);
        g->admitted_prompt_tokens += r->n_prompt;
        g->rq[ri].reserved = reserve;
        g->beam_reserved += reserve;
        g->waiting--;
    }
    if (g->nrun == 0) {
        if (kvp_gen_session_pending(g)) {
            const gseq *w = g->npre > 0 ? g->seqs[g->preempted[0]] : NULL;
            return KVP_ERR(KVP_ENOBLOCKS, "generate: the KV cache (%d blocks of %d tokens) cannot hold request %d at %d "
                                          "tokens; raise --num-blocks",
                           cfg->num_blocks, bs, g->id_base + (w ? w->req : ri),
                           w ? w->n_toks : g->reqs[ri].n_prompt);
        }
        return KVP_OK;
    }
    /* (2) schedule: decodes first (they may need a block: evict, then preempt the most recent unscheduled
     * sequence), then prompt chunks (their slots were allocated at admission) with what is left of the
     * budget. Iterate over a snapshot: preemption edits the running list. */
    budget = cfg->max_batched_tokens;
    int32_t ntok = 0, nsched = 0;
    for (int32_t i = 0; i < g->nrun; i++) {
        gseq *s = g->seqs[g->running[i]];
        s->chunk = s->ndraft = 0;
        s->step_gen0 = INT32_MAX;
    }
    KVP_TRY(grow_to(&g->buf.snap, &g->buf.cap_snap, (size_t)g->nrun, sizeof *g->buf.snap));
    int32_t nsnap = g->nrun;
    memcpy(g->buf.snap, g->running, (size_t)nsnap * sizeof *g->buf.snap);
    if (cfg->sched == KVP_SCHED_PRIORITY) /* the most urgent get their slots first (stable: then admission order) */
        for (int32_t i = 1; i < nsnap; i++) {
            const int32_t x = g->buf.snap[i];
            int32_t k = i;
            for (; k > 0 && seq_priority(g, g->buf.snap[k - 1]) > seq_priority(g, x); k--) g->buf.snap[k] = g->buf.snap[k - 1];
            g->buf.snap[k] = x;
        }
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; i < nsnap; i++) {
            int32_t idx = g->buf.snap[i];
            gseq *s = g->seqs[idx];
            if (s->state != SEQ_RUNNING || s->chunk > 0) continue;
            int is_decode = s->n_alloc == s->n_toks - 1;
            if ((pass == 0) != is_decode) continue;
            int32_t n = s->n_toks - s->n_computed;
            if (!is_decode) {
                if (budget <= 0) continue;
                if (n > budget) n = budget;
            }
            if (is_decode) {
                KVP_TRY(propose_drafts(g, idx, budget, nsnap));
                n = 1 + s->ndraft;
            }
            KVP_TRY(grow_to(&g->buf.slots, &g->buf.cap_slots, (size_t)(ntok + n), sizeof *g->buf.slots));
            if (is_decode) {
                int32_t slot[1 + KVP_GEN_MAX_SPEC];
                int self;
                KVP_TRY(append_slots(g, idx, n, slot, &self)); /* drafts fit free blocks: never self with them */
                if (self) continue;
                for (int32_t j = 0; j < n; j++) g->buf.slots[ntok + j] = slot[j];
            } else {
                kvp_bm_table_view tv;
                KVP_TRY(kvp_bm_table(g->bm, s->id, &tv));
                for (int32_t j = 0; j < n; j++) {
                    int32_t p = s->n_computed + j;
                    g->buf.slots[ntok + j] = (int64_t)tv.blocks[p / bs] * bs + p % bs;
                }
            }
            s->chunk = n;
            s->row = nsched;
            budget -= n;
            ntok += n;
            nsched++;
        }
    if (nsched == 0) return KVP_ERR(KVP_ESTATE, "generate: nothing could be scheduled");
    /* Batch arrays in scheduling order (row order). */
    step_buf *B = &g->buf;
    KVP_TRY(grow_to(&B->sched, &B->cap_sched, (size_t)nsched, sizeof *B->sched));
    KVP_TRY(grow_to(&B->qo, &B->cap_qo, (size_t)nsched + 1, sizeof *B->qo));
    KVP_TRY(grow_to(&B->kvi, &B->cap_kvi, (size_t)nsched + 1, sizeof *B->kvi));
    KVP_TRY(grow_to(&B->last, &B->cap_last, (size_t)nsched, sizeof *B->last));
    KVP_TRY(grow_to(&B->tokens, &B->cap_tokens, (size_t)ntok, sizeof *B->tokens));
    KVP_TRY(grow_to(&B->pos, &B->cap_pos, (size_t)ntok, sizeof *B->pos));
    KVP_TRY(grow_to(&B->every, &B->cap_every, (size_t)nsched, sizeof *B->every));
    for (int32_t i = 0; i < g->nrun; i++) {
        gseq *s = g->seqs[g->running[i]];
        if (s->chunk > 0) B->sched[s->row] = g->running[i];
    }
    int32_t ns = nsched, nt = 0, nkvx = 0, nrows = 0;
    int64_t attended = 0;
    for (int32_t r = 0; r < ns; r++) {
        gseq *s = g->seqs[B->sched[r]];
        /* rows at positions n_computed .. n_computed + chunk - 1, each attending its position + 1 keys */
        attended += (int64_t)s->chunk * s->n_computed + (int64_t)s->chunk * (s->chunk + 1) / 2;
        B->every[r] = (uint8_t)(wants_prompt_logits(g, s) || s->ndraft > 0); /* a draft's place is drawn too */
        nrows += B->every[r] ? s->chunk : 1;
        s->lrow = nrows - 1;
        B->qo[r] = nt;
        for (int32_t j = 0; j < s->chunk; j++) {
            B->tokens[nt + j] = s->toks[s->n_computed + j];
            B->pos[nt + j] = s->n_computed + j;
        }
        nt += s->chunk;
        nkvx += (s->n_computed + s->chunk + bs - 1) / bs;
    }
    B->qo[ns] = nt;
    KVP_TRY(grow_to(&B->kvx, &B->cap_kvx, (size_t)nkvx + 1, sizeof *B->kvx));
    int32_t at = 0;
    for (int32_t r = 0; r < ns; r++) {
        gseq *s = g->seqs[B->sched[r]];
        kvp_bm_table_view tv;
        KVP_TRY(kvp_bm_table(g->bm, s->id, &tv));
        /* The page table covers the tokens computed so far plus this step's (not the whole prompt whose
         * slots were allocated at admission). */
        int32_t len = s->n_computed + s->chunk, pages = (len + bs - 1) / bs;
        B->kvi[r] = at;
        memcpy(B->kvx + at, tv.blocks, (size_t)pages * sizeof *B->kvx);
        at += pages;
        B->last[r] = len - (pages - 1) * bs;
    }
    B->kvi[ns] = at;
    /* (3) copy-on-write */
    kvp_bm_step_ops ops;
    kvp_bm_step_ops_get(g->bm, &ops);
    if (ops.n_copies > 0) {
        int32_t *pairs = kvp_malloc((size_t)ops.n_copies * 2 * sizeof *pairs);
        if (!pairs) return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
        for (int32_t i = 0; i < ops.n_copies; i++) {
            pairs[2 * i] = ops.copies[i].src;
            pairs[2 * i + 1] = ops.copies[i].dst;
        }
        kvp_status st = kvp_kv_cache_copy_blocks(g->kv, pairs, ops.n_copies);
        kvp_free(pairs);
        KVP_TRY(st);
        g->st.cow_copies += ops.n_copies;
    }
    kvp_bm_step_ops_clear(g->bm);
    /* accounting */
    kvp_kv_accounting a;
    kvp_bm_account(g->bm, false, &a);
    int64_t used_slots = a.capacity - a.free - a.cached;
    int64_t used_blocks = used_slots / bs;
    if (used_blocks > g->st.peak_used_blocks) g->st.peak_used_blocks = used_blocks;
    if (a.token_states > g->st.peak_token_states) g->st.peak_token_states = a.token_states;
    if (a.logical_tokens > g->st.peak_logical_tokens) g->st.peak_logical_tokens = a.logical_tokens;
    if (a.shared_savings > g->st.peak_shared_savings) g->st.peak_shared_savings = a.shared_savings;
    if (used_slots > 0) {
        g->util_sum += (double)a.token_states / (double)used_slots;
        g->util_n++;
    }
    g->shared_sum += (double)a.shared_savings;
    g->logical_sum += (double)a.logical_tokens;
    /* (4) forward */
    KVP_TRY(grow_to(&g->logits, &g->cap_logits, (size_t)nrows * (size_t)g->vocab, sizeof *g->logits));
    kvp_fwd_batch b = {.num_seqs = ns, .num_tokens = nt, .tokens = B->tokens, .positions = B->pos,
                       .slot_mapping = B->slots, .qo_indptr = B->qo, .kv_indptr = B->kvi,
                       .kv_indices = B->kvx, .kv_last_page_len = B->last, .all_logits = 0,
                       .all_logits_of = nrows > ns ? B->every : NULL};
    KVP_TRY(kvp_model_forward(g->m, g->kv, &b, g->logits));
    g->st.computed_tokens += nt;
    g->st.attended_positions += attended;
    g->st.steps++;
    /* (5) sample / fork / finish, in batch order */
    for (int32_t i = 0; i < ns; i++) {
        int32_t idx = B->sched[i];
        gseq *s = g->seqs[idx];
        if (B->every[i] && s->ndraft == 0) KVP_TRY(record_prompt_logprobs(g, s));
        s->n_computed += s->chunk;
        if (!s->inserted && s->n_computed >= g->reqs[s->req].n_prompt) {
            int32_t nfull = g->reqs[s->req].n_prompt / bs;
            if (nfull > 0) KVP_TRY(cache_blocks(g, s, nfull));
            s->inserted = 1;
        }
    }
    const int pre = presample_step(g, ns);
    /* beams grouped by request */
    for (int32_t i = 0; i < ns; i++) {
        int32_t idx = B->sched[i];
        gseq *s = g->seqs[idx];
        if (s->state != SEQ_RUNNING || s->n_computed < s->n_toks) continue;
        const kvp_gen_request *r = &g->reqs[s->req];
        const float *lg = g->logits + (int64_t)s->lrow * g->vocab;
        if (g->rq[s->req].max_tokens == 0) { /* prompt only: nothing to generate */
            finish_seq(g, idx);
            continue;
        }
        if (r->beam_width > 1) {
            if (s->chunk < 0) continue;
            int32_t beams[1024], nb = 0;
            for (int32_t j = i; j < ns && nb < 1024; j++) {
                gseq *o = g->seqs[B->sched[j]];
                if (o->req == s->req && o->state == SEQ_RUNNING && o->n_computed == o->n_toks && o->chunk > 0) {
                    beams[nb++] = B->sched[j];
                    o->chunk = -1; /* handled */
                }
            }
            KVP_TRY(beam_step(g, s->req, beams, nb));
            continue;
        }
        if (s->ndraft > 0) {
            KVP_TRY(verify_drafts(g, idx));
            continue;
        }
        if (s->fork_pending) {
            s->fork_pending = 0;
            int32_t kids[1024];
            int32_t nk = r->n - 1 < 1024 ? r->n - 1 : 1023;
            for (int32_t k = 0; k < nk; k++) KVP_TRY(fork_seq(g, idx, k + 1, &kids[k]));
            double lp0, lp;
            int32_t t0 = draw(g, s, &s->rng, lg, 0, g->sws, &lp0);
            for (int32_t k = 0; k < nk; k++) {
                gseq *c = g->seqs[kids[k]];
                int32_t t = draw(g, c, &c->rng, lg, 0, g->sws, &lp);
                KVP_TRY(emit(g, kids[k], t, lp, lg));
            }
            KVP_TRY(emit(g, idx, t0, lp0, lg));
            continue;
        }
        const presample *ps = pre ? &g->pre[i] : NULL;
        if (ps && ps->eligible && memcmp(&ps->before, &s->rng, sizeof s->rng) == 0) {
            s->rng = ps->after;
            KVP_TRY(emit(g, idx, ps->tok, ps->lp, lg));
            continue;
        }
        double lp;
        int32_t t = draw(g, s, &s->rng, lg, 0, g->sws, &lp);
        KVP_TRY(emit(g, idx, t, lp, lg));
    }
    for (int32_t i = 0; i < ns; i++)
        if (g->seqs[B->sched[i]]->dropped) drop_seq(g, B->sched[i]);
    return KVP_OK;
}

static void ctx_free(gen_ctx *g)
{
    if (g->seqs)
        for (int32_t i = 0; i < g->nseqs; i++) {
            if (g->seqs[i]) {
                kvp_gen_logprobs_free(&g->seqs[i]->glp.a);
                kvp_free(g->seqs[i]->toks);
            }
            kvp_free(g->seqs[i]);
        }
    kvp_free(g->seqs);
    kvp_free(g->free_slots);
    kvp_free(g->running);
    kvp_free(g->preempted);
    for (int32_t i = 0; g->rq && i < g->nreq; i++) kvp_gen_logprobs_free(&g->rq[i].plp.a);
    kvp_free(g->rq);
    for (int32_t i = 0; i < g->nreq; i++) {
        kvp_free((void *)g->reqs[i].prompt);
        kvp_free((void *)g->reqs[i].stop_ids);
        kvp_free((void *)g->reqs[i].bias_ids);
    }
    kvp_free(g->reqs);
    kvp_free(g->fin);
    step_buf *B = &g->buf;
    void *bufs[] = {B->tokens, B->pos, B->qo, B->kvi, B->kvx, B->last, B->sched, B->snap, B->slots, B->every};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvp_free(bufs[i]);
    kvp_free(g->logits);
    kvp_free(g->lsm);
    kvp_sampler_ws_destroy(g->sws);
    kvp_free(g->pre);
    for (int k = 0; k < GEN_SAMPLE_THREADS; k++) {
        kvp_sampler_ws_destroy(g->hws[k]);
        kvp_free(g->pen[k]);
        kvp_free(g->cnt[k]);
    }
    kvp_pc_destroy(g->pc);
    kvp_kv_cache_destroy(g->kv);
    kvp_hc_destroy(g->hc);
    kvp_kv_cache_destroy(g->hkv);
    kvp_free(g->hashes);
    kvp_free(g->hslots);
    kvp_free(g->hpairs);
    kvp_bm_destroy(g->bm);
}

void kvp_gen_results_free(kvp_gen_result *res, int32_t n)
{
    if (!res) return;
    for (int32_t i = 0; i < n; i++) {
        if (res[i].tokens)
            for (int32_t j = 0; j < res[i].n_samples; j++) kvp_free(res[i].tokens[j]);
        kvp_free(res[i].tokens);
        kvp_free(res[i].n_tokens);
        kvp_free(res[i].logprob);
        kvp_free(res[i].finish);
        kvp_free(res[i].stop_token);
        for (int32_t j = 0; res[i].logprobs && j < res[i].n_samples; j++) kvp_gen_logprobs_free(&res[i].logprobs[j]);
        kvp_free(res[i].logprobs);
        kvp_gen_logprobs_free(&res[i].prompt_logprobs);
        memset(&res[i], 0, sizeof res[i]);
    }
}

/* Collects the results of request r from its sequences (all done; dropped beams are gone; beams: best first). */
static kvp_status collect(gen_ctx *g, int32_t r, kvp_gen_result *out)
{
    const kvp_gen_request *q = &g->reqs[r];
    int32_t cnt = 0;
    for (int32_t i = 0; i < g->nseqs; i++) cnt += g->seqs[i] && g->seqs[i]->req == r;
    int32_t *order = kvp_malloc((size_t)(cnt + 1) * sizeof *order);
    if (!order) return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    int32_t k = 0;
    for (int32_t i = 0; i < g->nseqs; i++)
        if (g->seqs[i] && g->seqs[i]->req == r) order[k++] = i;
    /* sampling: by sample index; beams: by score desc (ties: creation order) */
    for (int32_t i = 0; i < cnt; i++)
        for (int32_t j = i + 1; j < cnt; j++) {
            gseq *a = g->seqs[order[i]], *b = g->seqs[order[j]];
            int swap = q->beam_width > 1 ? b->logprob > a->logprob || (b->logprob == a->logprob && b->id < a->id)
                                         : b->sample < a->sample;
            if (swap) {
                int32_t t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
        }
    int32_t ns = q->beam_width > 1 ? (q->n < cnt ? q->n : cnt) : cnt;
    memset(out, 0, sizeof *out);
    out->n_samples = ns;
    out->tokens = kvp_calloc((size_t)ns + 1, sizeof *out->tokens);
    out->n_tokens = kvp_calloc((size_t)ns + 1, sizeof *out->n_tokens);
    out->logprob = kvp_calloc((size_t)ns + 1, sizeof *out->logprob);
    out->finish = kvp_calloc((size_t)ns + 1, sizeof *out->finish);
    out->stop_token = kvp_calloc((size_t)ns + 1, sizeof *out->stop_token);
    out->user = q->user;
    if (q->logprobs) out->logprobs = kvp_calloc((size_t)ns + 1, sizeof *out->logprobs);
    kvp_status st = out->tokens && out->n_tokens && out->logprob && out->finish && out->stop_token &&
                            (out->logprobs || !q->logprobs)
                        ? KVP_OK : KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    if (st == KVP_OK && q->prompt_logprobs) st = kvp_gen_logprobs_copy(&g->rq[r].plp.a, &out->prompt_logprobs);
    for (int32_t i = 0; st == KVP_OK && i < ns; i++) {
        gseq *s = g->seqs[order[i]];
        out->tokens[i] = kvp_malloc((size_t)(s->n_gen + 1) * sizeof(int32_t));
        if (!out->tokens[i]) {
            st = KVP_ERR(KVP_ENOMEM, "generate: out of memory");
            break;
        }
        memcpy(out->tokens[i], s->toks + (s->n_toks - s->n_gen), (size_t)s->n_gen * sizeof(int32_t));
        out->n_tokens[i] = s->n_gen;
        out->logprob[i] = s->logprob;
        out->finish[i] = s->finish;
        out->stop_token[i] = s->stop_token;
        if (q->logprobs && (st = kvp_gen_logprobs_copy(&s->glp.a, &out->logprobs[i])) != KVP_OK) break;
    }
    kvp_free(order);
    if (st != KVP_OK) {
        kvp_gen_results_free(out, 1);
        return st;
    }
    const greq *gr = &g->rq[r];
    out->prompt_cached_tokens = gr->cached_tokens;
    const double first = gr->t_first >= 0 ? gr->t_first : gr->t_done;
    out->ttft_s = first - gr->t_add;
    int32_t maxgen = 0;
    for (int32_t i = 0; i < ns; i++) maxgen = out->n_tokens[i] > maxgen ? out->n_tokens[i] : maxgen;
    out->tpot_s = maxgen > 1 ? (gr->t_done - first) / (maxgen - 1) : 0.0;
    out->finish_s = gr->t_done - gr->t_add;
    return KVP_OK;
}

/* The checks of one request (i names it in errors). */
static kvp_status check_request(const kvp_model *m, const kvp_gen_request *r, int32_t i)
{
    const int32_t maxlen = kvp_model_max_len(m);
    const int64_t V = kvp_model_cfg(m)->vocab_size;
    if (r->n_prompt < 1 || !r->prompt)
        return KVP_ERR(KVP_EINVAL, "generate: prompt %d is empty (it needs at least a BOS token)", i);
    if (r->n_prompt >= maxlen)
        return KVP_ERR(KVP_EINVAL, "generate: prompt %d has %d tokens but the model's context is %d tokens", i,
                       r->n_prompt, maxlen);
    if (r->max_tokens < 0 || r->n < 1 || r->beam_width < 0 || (r->beam_width > 1 && r->n > r->beam_width) ||
        r->n > 1000 || r->beam_width > 1000)
        return KVP_ERR(KVP_EINVAL, "generate: request %d: max_tokens %d >= 0, n %d in 1..1000 and <= beam width %d", i,
                       r->max_tokens, r->n, r->beam_width);
    KVP_TRY(kvp_sampler_check(&r->sampler));
    if (r->min_tokens < 0 || r->min_tokens > r->max_tokens || (r->beam_width > 1 && r->min_tokens > 0))
        return KVP_ERR(KVP_EINVAL, "generate: request %d: min_tokens %d must be in 0..max_tokens (%d), sampling only", i,
                       r->min_tokens, r->max_tokens);
    if (r->n_bias < 0 || r->n_bias > 1024 || (r->n_bias > 0 && (!r->bias_ids || !r->bias)) ||
        (r->beam_width > 1 && (r->n_bias > 0 || kvp_sampler_penalized(&r->sampler))))
        return KVP_ERR(KVP_EINVAL, "generate: request %d: %d logit biases (0 to 1024, and their arrays); a logit bias or "
                                   "a penalty needs sampling, not beam search", i, r->n_bias);
    for (int32_t j = 0; j < r->n_bias; j++)
        if (r->bias_ids[j] < 0 || r->bias_ids[j] >= V || !(fabsf(r->bias[j]) <= 100.0f))
            return KVP_ERR(KVP_EINVAL, "generate: request %d logit bias %d: token %d (vocabulary %lld), bias %g in "
                                       "[-100, 100]", i, j, r->bias_ids[j], (long long)V, (double)r->bias[j]);
    if (r->top_logprobs < 0 || r->top_logprobs > KVP_GEN_MAX_TOP_LOGPROBS || r->top_logprobs > V ||
        (r->logprobs && r->beam_width > 1))
        return KVP_ERR(KVP_EINVAL, "generate: request %d: top_logprobs %d must be in 0..%d (and the vocabulary), "
                                   "and token logprobs need sampling, not beam search", i, r->top_logprobs,
                       KVP_GEN_MAX_TOP_LOGPROBS);
    if (r->n_stop_ids < 0 || r->n_stop_ids > 1024 || (r->n_stop_ids > 0 && !r->stop_ids))
        return KVP_ERR(KVP_EINVAL, "generate: request %d: %d stop ids (0 to 1024, and an array)", i, r->n_stop_ids);
    for (int32_t j = 0; j < r->n_stop_ids; j++)
        if (r->stop_ids[j] < 0 || r->stop_ids[j] >= V)
            return KVP_ERR(KVP_EINVAL, "generate: request %d stop id %d is %d, outside the vocabulary (%lld)", i, j,
                           r->stop_ids[j], (long long)V);
    for (int32_t j = 0; j < r->n_prompt; j++)
        if (r->prompt[j] < 0 || r->prompt[j] >= V)
            return KVP_ERR(KVP_EINVAL, "generate: prompt %d token %d is %d, outside the vocabulary (%lld)", i, j,
                           r->prompt[j], (long long)V);
    return KVP_OK;
}

/* max_tokens clamped so that prompt + max_tokens fits the model's context. */
static int32_t clamp_max_tokens(const kvp_model *m, const kvp_gen_request *r)
{
    const int32_t maxlen = kvp_model_max_len(m);
    return r->n_prompt + r->max_tokens > maxlen ? maxlen - r->n_prompt : r->max_tokens;
}

kvp_status kvp_gen_blocks_in(const kvp_model *m, kvp_dtype dt, int32_t bs, int64_t bytes, const char *opt, int32_t *blocks)
{
    const double per_block = kvp_kv_cache_bytes(m, dt, 1, bs), nb = floor((double)bytes / per_block);
    if (nb < 1)
        return KVP_ERR(KVP_EINVAL, "%s of %lld bytes holds no block of %d tokens (%.0f bytes each)", opt, (long long)bytes,
                       bs, per_block);
    if (nb > INT32_MAX / 2)
        return KVP_ERR(KVP_EINVAL, "%s of %lld bytes is more than %d blocks", opt, (long long)bytes, INT32_MAX / 2);
    *blocks = (int32_t)nb;
    return KVP_OK;
}

/* KV slots a request holds at most: every sequence of its group at its full length, in whole blocks. */
static int64_t request_slots(const kvp_model *m, const kvp_gen_request *r, int32_t bs)
{
    const int64_t len = r->n_prompt + clamp_max_tokens(m, r);
    return (len + bs - 1) / bs * bs * group_size(r);
}

kvp_status kvp_gen_session_create(kvp_model *m, const kvp_gen_config *cfg, kvp_gen_session **out)
{
    if (!m || !cfg || !out) return KVP_ERR(KVP_EINVAL, "generate: NULL argument");
    if (cfg->block_size < 1 || cfg->max_num_seqs < 1 || cfg->max_batched_tokens < 1 || cfg->num_blocks < 1)
        return KVP_ERR(KVP_EINVAL, "generate: block_size, num_blocks, max_num_seqs and max_batched_tokens must be >= 1");
    if (cfg->spec_tokens < 0 || cfg->spec_tokens > KVP_GEN_MAX_SPEC ||
        (cfg->spec_tokens > 0 && (cfg->spec_ngram_min < 1 || cfg->spec_ngram_min > cfg->spec_ngram_max ||
                                  cfg->spec_ngram_max > KVP_GEN_MAX_NGRAM)))
        return KVP_ERR(KVP_EINVAL, "generate: spec_tokens %d in 0..%d, n-gram lengths %d..%d within 1..%d",
                       cfg->spec_tokens, KVP_GEN_MAX_SPEC, cfg->spec_ngram_min, cfg->spec_ngram_max, KVP_GEN_MAX_NGRAM);
    if (cfg->spec_max_batch < 0) return KVP_ERR(KVP_EINVAL, "generate: spec_max_batch %d < 0", cfg->spec_max_batch);
    if ((unsigned)cfg->host_write_policy >= KVP_HC_WRITE_POLICIES)
        return KVP_ERR(KVP_EINVAL, "generate: unknown host-tier write policy %d", (int)cfg->host_write_policy);
    if (cfg->host_cache_blocks < 0 || (cfg->host_cache_blocks > 0 && cfg->cache == KVP_PC_NONE))
        return KVP_ERR(KVP_EINVAL, "generate: a host tier of %d blocks needs a prefix cache (radix or hash)",
                       cfg->host_cache_blocks);
    gen_ctx *g = kvp_calloc(1, sizeof *g);
    if (!g) return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    g->m = m;
    g->cfgv = *cfg;
    g->cfg = &g->cfgv;
    const kvp_gen_config *c = g->cfg;
    g->vocab = (int32_t)kvp_model_cfg(m)->vocab_size;
    kvp_bm_config bc = {.num_blocks = c->num_blocks, .block_size = c->block_size, .num_host_blocks = 0,
                        .max_seq_len = kvp_model_max_len(m), .watermark_blocks = 0};
    char what[96];
    snprintf(what, sizeof what, "generate: a KV cache of %d blocks of %d tokens", c->num_blocks, c->block_size);
    kvp_status st = kvp_check_fits_in_memory(kvp_kv_cache_bytes(m, c->kv_dtype, c->num_blocks, c->block_size), what);
    if (st == KVP_OK) st = kvp_bm_create(&bc, &g->bm);
    if (st == KVP_OK) st = kvp_pc_create(c->cache, KVP_EVICT_LRU, kvp_bm_pool(g->bm), c->block_size, &g->pc);
    if (st == KVP_OK) st = kvp_kv_cache_create(m, c->kv_dtype, c->num_blocks, c->block_size, &g->kv);
    if (st == KVP_OK && c->host_cache_blocks > 0) {
        snprintf(what, sizeof what, "generate: a host tier of %d blocks of %d tokens", c->host_cache_blocks, c->block_size);
        const size_t nb = (size_t)kvp_model_max_len(m) / (size_t)c->block_size + 1;
        st = kvp_check_fits_in_memory(kvp_kv_cache_bytes(m, c->kv_dtype, c->host_cache_blocks, c->block_size), what);
        if (st == KVP_OK) st = kvp_hc_create(c->host_cache_blocks, &g->hc);
        if (st == KVP_OK) st = kvp_kv_cache_create(m, c->kv_dtype, c->host_cache_blocks, c->block_size, &g->hkv);
        g->hashes = kvp_malloc(nb * sizeof *g->hashes);
        g->hslots = kvp_malloc(nb * sizeof *g->hslots);
        g->hpairs = kvp_malloc(2 * nb * sizeof *g->hpairs);
        if (st == KVP_OK && !(g->hashes && g->hslots && g->hpairs))
            st = KVP_ERR(KVP_ENOMEM, "generate: out of memory for the host tier");
        if (st == KVP_OK && c->host_write_policy == KVP_HC_WRITE_BACK) kvp_pc_set_evict_hook(g->pc, write_back, g);
    }
    if (st == KVP_OK) st = kvp_sampler_ws_create(g->vocab, &g->sws);
    if (st == KVP_OK) st = draw_scratch(g, 0);
    if (st == KVP_OK) {
        g->lsm = kvp_malloc((size_t)g->vocab * sizeof *g->lsm);
        if (!g->lsm) st = KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    }
    if (st != KVP_OK) {
        kvp_gen_session_destroy(g);
        return st;
    }
    g->t0 = kvp_now_s();
    *out = g;
    return KVP_OK;
}

void kvp_gen_session_destroy(kvp_gen_session *g)
{
    if (!g) return;
    ctx_free(g);
    kvp_free(g);
}

/* Copies n elements of src (NULL when n is 0). */
static kvp_status dup_ids(const int32_t *src, int32_t n, int32_t **out)
{
    *out = NULL;
    if (n <= 0) return KVP_OK;
    *out = kvp_malloc((size_t)n * sizeof **out);
    if (!*out) return KVP_ERR(KVP_ENOMEM, "generate: out of memory");
    memcpy(*out, src, (size_t)n * sizeof **out);
    return KVP_OK;
}

kvp_status kvp_gen_session_add(kvp_gen_session *g, const kvp_gen_request *r, int32_t *id)
{
    const int32_t i = g->nreq;
    if (g->id_base > INT32_MAX - i - 1) return KVP_ERR(KVP_ESTATE, "generate: the session has used every request id");
    KVP_TRY(check_request(g->m, r, g->id_base + i));
    const int32_t bs = g->cfg->block_size;
    const int64_t one = (r->n_prompt + clamp_max_tokens(g->m, r) + bs - 1) / bs; /* one sequence, whole */
    if (one > g->cfg->num_blocks)
        return KVP_ERR(KVP_ENOBLOCKS, "generate: request %d needs %lld blocks of %d tokens for one sequence, the KV "
                                      "cache has %d; raise --num-blocks", g->id_base + i, (long long)one, bs,
                       g->cfg->num_blocks);
    /* room first, so that nothing below fails (finish_req pushes to fin without growing it) */
    KVP_TRY(grow_to(&g->reqs, &g->cap_reqs, (size_t)i + 1, sizeof *g->reqs));
    KVP_TRY(grow_to(&g->rq, &g->cap_rq, (size_t)i + 1, sizeof *g->rq));
    KVP_TRY(grow_to(&g->fin, &g->cap_fin, (size_t)g->nfin + (size_t)g->unfinished + 1, sizeof *g->fin));
    int32_t *prompt, *stop_ids;
    KVP_TRY(dup_ids(r->prompt, r->n_prompt, &prompt));
    kvp_status st = dup_ids(r->stop_ids, r->n_stop_ids, &stop_ids);
    int32_t *bias = NULL; /* the ids, then the biases */
    if (st == KVP_OK && r->n_bias > 0) {
        if (!(bias = kvp_malloc((size_t)r->n_bias * (sizeof(int32_t) + sizeof(float))))) {
            st = KVP_ERR(KVP_ENOMEM, "generate: out of memory");
        } else {
            memcpy(bias, r->bias_ids, (size_t)r->n_bias * sizeof(int32_t));
            memcpy(bias + r->n_bias, r->bias, (size_t)r->n_bias * sizeof(float));
        }
    }
    if (st != KVP_OK) {
        kvp_free(prompt);
        kvp_free(stop_ids);
        return st;
    }
    g->reqs[i] = *r;
    g->reqs[i].prompt = prompt;
    g->reqs[i].stop_ids = stop_ids;
    g->reqs[i].n_stop_ids = stop_ids ? r->n_stop_ids : 0;
    g->reqs[i].bias_ids = bias;
    g->reqs[i].bias = bias ? (const float *)(bias + r->n_bias) : NULL;
    g->reqs[i].n_bias = bias ? r->n_bias : 0;
    g->rq[i] = (greq){.t_add = kvp_now_s() - g->t0, .t_first = -1, .max_tokens = clamp_max_tokens(g->m, r)};
    g->rq[i].plp.a.k = r->prompt_logprobs ? r->top_logprobs : 0;
    if (g->rq[i].max_tokens < r->max_tokens)
        KVP_LOG_W("generate: request %d: max_tokens %d clamped to %d (context %d)", g->id_base + i, r->max_tokens,
                  g->rq[i].max_tokens, kvp_model_max_len(g->m));
    g->nreq++;
    g->unfinished++;
    g->waiting++;
    g->n_added++;
    if (id) *id = g->id_base + i;
    return KVP_OK;
}

int kvp_gen_session_pending(const kvp_gen_session *g)
{
    return g->nrun > 0 || g->npre > 0 || g->waiting > 0;
}

kvp_status kvp_gen_session_step(kvp_gen_session *g) { return kvp_gen_session_pending(g) ? step(g) : KVP_OK; }

/* The index of request id, or -1 when it is unknown or taken. */
static int32_t req_index(const gen_ctx *g, int32_t id)
{
    const int64_t i = (int64_t)id - g->id_base;
    return i >= 0 && i < g->nreq && !g->rq[i].taken ? (int32_t)i : -1;
}

/* Drops the taken requests at the front of the window once they are half of it (each request moves O(1)
 * times on average): every index into reqs shifts down by their number. */
static void compact_requests(gen_ctx *g)
{
    while (g->front < g->nreq && g->rq[g->front].taken) g->front++;
    const int32_t d = g->front;
    if (d < 64 || 2 * d < g->nreq) return;
    if (g->next_req < d) g->next_req = d; /* taken before admission: aborted ones the admission did not pass yet */
    memmove(g->reqs, g->reqs + d, (size_t)(g->nreq - d) * sizeof *g->reqs);
    memmove(g->rq, g->rq + d, (size_t)(g->nreq - d) * sizeof *g->rq);
    for (int32_t i = 0; i < g->nseqs; i++)
        if (g->seqs[i]) g->seqs[i]->req -= d;
    for (int32_t i = g->fin_head; i < g->nfin; i++) g->fin[i] -= d;
    g->nreq -= d;
    g->next_req -= d;
    g->id_base += d;
    g->front = 0;
}

kvp_status kvp_gen_session_take(kvp_gen_session *g, int32_t *id, kvp_gen_result *res)
{
    if (g->fin_head == g->nfin) return KVP_ENOTFOUND; /* nothing finished: not an error worth a message */
    const int32_t r = g->fin[g->fin_head];
    KVP_TRY(collect(g, r, res));
    if (++g->fin_head == g->nfin) g->fin_head = g->nfin = 0;
    for (int32_t i = 0; i < g->nseqs; i++) /* its sequences' tokens are in res now */
        if (g->seqs[i] && g->seqs[i]->req == r) drop_seq(g, i);
    kvp_free((void *)g->reqs[r].prompt);
    kvp_free((void *)g->reqs[r].stop_ids);
    kvp_free((void *)g->reqs[r].bias_ids);
    g->reqs[r].prompt = g->reqs[r].stop_ids = g->reqs[r].bias_ids = NULL;
    g->reqs[r].bias = NULL;
    kvp_gen_logprobs_free(&g->rq[r].plp.a);
    g->rq[r].taken = 1;
    if (id) *id = g->id_base + r;
    compact_requests(g);
    return KVP_OK;
}

/* The running (or preempted) sequence of sample k of request index r, or -1. */
static int32_t sample_seq(const gen_ctx *g, int32_t r, int32_t k)
{
    for (int32_t i = 0; i < g->nseqs; i++) {
        const gseq *q = g->seqs[i];
        if (q && q->req == r && q->sample == k) return i;
    }
    return -1;
}

kvp_status kvp_gen_session_partial(const kvp_gen_session *g, int32_t id, int32_t k, const int32_t **tokens, int32_t *n)
{
    *tokens = NULL;
    *n = 0;
    const int32_t r = req_index(g, id);
    if (r < 0 || g->reqs[r].beam_width > 1 || k < 0 || k >= g->reqs[r].n) return KVP_ENOTFOUND;
    const int32_t i = sample_seq(g, r, k);
    if (i >= 0) {
        const gseq *q = g->seqs[i];
        *tokens = q->toks + (q->n_toks - q->n_gen);
        *n = q->n_gen;
    }
    return KVP_OK; /* not admitted or not forked yet: nothing */
}

kvp_status kvp_gen_session_partial_logprobs(const kvp_gen_session *g, int32_t id, int32_t k, const kvp_gen_logprobs **lp)
{
    static const kvp_gen_logprobs none = {0};
    *lp = &none;
    const int32_t r = req_index(g, id);
    if (r < 0 || !g->reqs[r].logprobs || k < 0 || k >= g->reqs[r].n) return KVP_ENOTFOUND;
    const int32_t i = sample_seq(g, r, k);
    if (i >= 0) *lp = &g->seqs[i]->glp.a;
    return KVP_OK;
}

kvp_status kvp_gen_session_prompt_logprobs(const kvp_gen_session *g, int32_t id, const kvp_gen_logprobs **lp)
{
    const int32_t r = req_index(g, id);
    if (r < 0 || !g->reqs[r].prompt_logprobs) return KVP_ENOTFOUND;
    *lp = &g->rq[r].plp.a;
    return KVP_OK;
}

kvp_status kvp_gen_session_stop(kvp_gen_session *g, int32_t id, int32_t k)
{
    return kvp_gen_session_stop_at(g, id, k, INT32_MAX);
}

kvp_status kvp_gen_session_stop_at(kvp_gen_session *g, int32_t id, int32_t k, int32_t n_keep)
{
    const int32_t r = req_index(g, id);
    if (r < 0 || g->reqs[r].beam_width > 1) return KVP_ENOTFOUND;
    const int32_t i = sample_seq(g, r, k);
    if (i < 0 || g->seqs[i]->fork_pending) return KVP_ENOTFOUND;
    gseq *s = g->seqs[i];
    const int cut = n_keep >= s->step_gen0 && n_keep < s->n_gen; /* only this step's tokens */
    if (s->state == SEQ_DONE && !cut) return KVP_ENOTFOUND;
    if (cut) {
        const int32_t drop = s->n_gen - n_keep;
        s->logprob = s->step_lp[n_keep - s->step_gen0];
        s->n_toks -= drop;
        s->n_gen = n_keep;
        if (s->glp.a.n > n_keep) s->glp.a.n = n_keep;
        if (s->n_computed > s->n_toks) s->n_computed = s->n_toks;
        s->stop_token = -1;
    }
    if (s->state == SEQ_DONE) s->finish = KVP_FINISH_STOPPED;
    else end_seq(g, i, KVP_FINISH_STOPPED);
    return KVP_OK;
}

kvp_status kvp_gen_session_abort(kvp_gen_session *g, int32_t id)
{
    const int32_t r = req_index(g, id);
    if (r < 0 || g->rq[r].done) return KVP_ENOTFOUND;
    g->rq[r].aborted = 1;
    g->n_aborted++;
    if (!g->rq[r].admitted) { /* no sequence yet: admission will pass it */
        g->waiting--;
        finish_req(g, r);
        return KVP_OK;
    }
    for (int32_t i = 0; i < g->nseqs; i++)
        if (g->seqs[i] && g->seqs[i]->req == r && g->seqs[i]->state != SEQ_DONE) end_seq(g, i, KVP_FINISH_ABORTED);
    return KVP_OK;
}

kvp_status kvp_gen_session_reset_prefix_cache(kvp_gen_session *g, int64_t *evicted)
{
    int64_t n = 0;
    if (g->pc) kvp_pc_flush(g->pc, &n);
    if (g->hc) kvp_hc_clear(g->hc); /* its host tier too: a cold cache */
    if (evicted) *evicted = n;
    return KVP_OK;
}

void kvp_gen_session_stats_get(const kvp_gen_session *g, kvp_gen_session_stats *out)
{
    memset(out, 0, sizeof *out);
    out->requests = g->n_added;
    out->finished = g->n_finished;
    out->aborted = g->n_aborted;
    out->waiting = g->waiting;
    out->request_records = g->nreq;
    out->seq_records = g->nseqs - g->nfree;
    out->running_seqs = g->nrun;
    out->preempted_seqs = g->npre;
    out->steps = g->st.steps;
    out->computed_tokens = g->st.computed_tokens;
    out->prefix_hit_tokens = g->st.prefix_hit_tokens;
    out->preemptions = g->st.preemptions;
    out->spec_drafts = g->st.spec_drafts;
    out->spec_draft_tokens = g->st.spec_draft_tokens;
    out->spec_accepted_tokens = g->st.spec_accepted_tokens;
    out->num_blocks = g->cfg->num_blocks;
    out->free_blocks = kvp_bm_num_free(g->bm);
    out->host_hit_tokens = g->st.host_hit_tokens;
    out->host_loaded_blocks = g->st.host_loaded_blocks;
    out->host_stored_blocks = g->st.host_stored_blocks;
    out->admitted_prompt_tokens = g->admitted_prompt_tokens; /* kept as requests are admitted: this runs every step of a server */
}

double kvp_gen_spec_acceptance(const kvp_gen_stats *st)
{
    return st->spec_draft_tokens > 0 ? (double)st->spec_accepted_tokens / (double)st->spec_draft_tokens : 0.0;
}

kvp_status kvp_gen_run(kvp_model *m, const kvp_gen_config *cfg, const kvp_gen_request *reqs, int32_t n,
                       kvp_gen_result *results, kvp_gen_stats *stats)
{
    return kvp_gen_run_stepped(m, cfg, reqs, n, results, stats, NULL, NULL);
}

kvp_status kvp_gen_run_stepped(kvp_model *m, const kvp_gen_config *cfg, const kvp_gen_request *reqs, int32_t n,
                               kvp_gen_result *results, kvp_gen_stats *stats,
                               void (*on_step)(void *ctx, kvp_gen_session *s), void *ctx)
{
    if (!m || !cfg || (n > 0 && (!reqs || !results))) return KVP_ERR(KVP_EINVAL, "generate: NULL argument");
    if (cfg->block_size < 1 || cfg->max_num_seqs < 1 || cfg->max_batched_tokens < 1 || cfg->num_blocks < 0)
        return KVP_ERR(KVP_EINVAL, "generate: block_size, max_num_seqs and max_batched_tokens must be >= 1");
    if (n < 1) return KVP_ERR(KVP_EINVAL, "generate: no request");
    kvp_gen_config c = *cfg;
    int64_t need_slots = 0;
    for (int32_t i = 0; i < n; i++) {
        KVP_TRY(check_request(m, &reqs[i], i));
        need_slots += request_slots(m, &reqs[i], c.block_size);
    }
    if (c.num_blocks == 0) { /* enough for every request at once */
        int64_t nb = need_slots / c.block_size;
        c.num_blocks = nb > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)nb;
    }
    gen_ctx *g;
    KVP_TRY(kvp_gen_session_create(m, &c, &g));
    kvp_status st = KVP_OK;
    for (int32_t i = 0; st == KVP_OK && i < n; i++) st = kvp_gen_session_add(g, &reqs[i], NULL);
    g->t0 = kvp_now_s(); /* the run's clock: requests count from here */
    for (int32_t i = 0; i < g->nreq; i++) g->rq[i].t_add = 0;
    while (st == KVP_OK && kvp_gen_session_pending(g))
        if ((st = step(g)) == KVP_OK && on_step) on_step(ctx, g);
    double wall = kvp_now_s() - g->t0;
    int32_t done = 0;
    while (st == KVP_OK && done < n) /* a failing collect leaves nothing behind in its result */
        if ((st = collect(g, done, &results[done])) == KVP_OK) done++;
    if (st != KVP_OK) {
        kvp_gen_results_free(results, done);
        kvp_gen_session_destroy(g);
        return st;
    }
    if (stats) {
        g->st.wall_s = wall;
        g->st.generated_tokens = 0; /* what the results hold: a beam search's dropped beams do not count */
        for (int32_t i = 0; i < n; i++) {
            g->st.prompt_tokens += reqs[i].n_prompt;
            for (int32_t s = 0; s < results[i].n_samples; s++) g->st.generated_tokens += results[i].n_tokens[s];
        }
        g->st.tokens_per_s = wall > 0 ? (double)g->st.generated_tokens / wall : 0.0;
        g->st.prefix_hit_rate = g->st.prompt_tokens > 0 ? (double)g->st.prefix_hit_tokens / (double)g->st.prompt_tokens : 0.0;
        g->st.mean_kv_utilization = g->util_n ? g->util_sum / (double)g->util_n : 0.0;
        g->st.mean_shared_savings = g->logical_sum > 0 ? g->shared_sum / g->logical_sum : 0.0;
        g->st.num_blocks = c.num_blocks;
        g->st.block_size = c.block_size;
        g->st.kv_pool_bytes = (int64_t)kvp_kv_cache_bytes(m, c.kv_dtype, c.num_blocks, c.block_size);
        *stats = g->st;
    }
    kvp_gen_session_destroy(g);
    return KVP_OK;
}
