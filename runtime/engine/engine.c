/* runtime/engine/engine.c — scheduler + KV memory + executor, stepped in simulated time (contract: engine.h).
 *
 * Data layout (all arrays preallocated so that a step allocates only when a prefix hit is recorded or a
 * generated-token array grows):
 *
 *   seqs[0..n)          one per added request, index = order of addition = block-manager sequence id
 *   waiting  wq[head .. head+n)   seq indices sorted by rank key (ties: index)
 *   running  rq[0..n)             sorted by rank key; the last one is the first preemption victim
 *   swapped  sq[0..n)             sorted by rank key
 *
 * Time accounting: every interval of simulated time (a step, or an idle jump to the next arrival) adds
 * (memory accounting of that interval) x (its length) to running sums; metrics divide by the total time.
 */
#include "runtime/engine/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/block_mgr.h"
#include "blockmgr/contiguous.h"
#include "common/alloc.h"
#include "common/log.h"
#include "common/stats.h"
#include "prefix_cache/host_cache.h"

typedef struct {
    const kvp_request *req;
    double arrival;        /* req->arrival_s, or later for a request that waits for another's answer */
    int64_t parent;        /* the sequence whose answer (after_prompt: computed prompt) this one waits for
                              (kvp_request.after), or -1 */
    int64_t first_child, next_sibling; /* the sequences waiting for this one (-1: none) */
    bool blocked;          /* its arrival time has come but its parent is not ready */
    kvp_req_state state;
    int32_t prompt_len;
    int32_t output_len;    /* clamped */
    int32_t num_computed;  /* tokens whose KV is in memory */
    int32_t num_generated;
    int32_t preemptions;
    int32_t sched_new;     /* tokens scheduled in the current step */
    int32_t n_hit;         /* prefix-cache blocks locked by this sequence */
    int32_t hit_first;     /* prompt tokens found cached (or in the host tier) at the first admission */
    int32_t *hit;          /* [n_hit] */
    int32_t *gen;          /* [gen_cap] generated token ids */
    size_t gen_cap;
    int64_t reserve_len;   /* contiguous: reservation length */
    int32_t lpm_score;
    bool admitted_once;
    bool inserted;         /* computed blocks cached when the prefill (or recompute) ended, since admission */
    bool prompt_done;      /* its prompt was computed once: the parallel samples waiting for it are released */
    double admit_s, first_token_s, finish_s;
} seq_t;

struct kvp_engine {
    kvp_engine_config cfg;
    kvp_executor *ex;
    kvp_block_mgr *bm;
    kvp_prefix_cache *pc;
    kvp_host_cache *hc;   /* host tier, or NULL */
    int32_t hc_base;      /* host id of tier slot 0 (after the swap space) */
    kvp_contig *arena;
    kvp_contig_policy contig_policy;
    int32_t num_blocks;

    seq_t *seqs;
    int64_t n_seqs, cap_seqs;
    int64_t next_arrival; /* first seq not yet moved to waiting */

    int64_t *wq;
    int64_t wq_head, wq_n, wq_cap;
    int64_t *rq;
    int32_t rq_n;
    int64_t *sq;
    int64_t sq_n, sq_cap;

    /* per step scratch (max_num_seqs + 1 entries) */
    int64_t *sched;
    int32_t sched_n;
    kvp_exec_seq *xs;
    int32_t *sampled;
    int64_t *admitted;
    int32_t admitted_n;
    int32_t *hit_scratch;
    int32_t hit_scratch_cap;
    int64_t *lpm_order;
    int32_t *tokbuf; /* token ids of recompute chunks that cross a prompt's end, this step */
    size_t tokbuf_cap;
    int32_t *seqbuf; /* one sequence's prompt + generated token ids, for the prefix cache */
    size_t seqbuf_cap;
    /* host tier: one sequence's chain hashes and slots; the moves for the next executor step */
    uint64_t *hashes;
    int32_t *hslots;
    size_t hashes_cap, hslots_cap;
    kvp_block_copy *tier_store, *tier_load;
    int32_t n_store, n_load;
    size_t store_cap, load_cap;
    int64_t *load_step;      /* [tier slots] the step whose batch loads from the slot (-1: none yet) */
    kvp_status write_back_st; /* the first error of the eviction hook (write_back), reported by evict_until */

    /* requests that wait for another's answer: due at a known time (a min-heap on (time, index)) */
    struct due {
        double t;
        int64_t idx;
    } *due;
    int64_t due_n;
    size_t due_cap;

    double now;
    int32_t step_preempted;

    /* counters */
    int64_t steps, finished, rejected, clamped, preemptions, swap_outs, swap_ins, recomputes;
    int64_t readmit_hit_tokens;
    int64_t host_hit_tokens_first, host_loaded_blocks, host_stored_blocks;
    int64_t prompt_tokens_first, hit_tokens_first, computed_tokens, batch_tokens_sum, max_running;
    int64_t flushed_blocks; /* cached blocks dropped by the end-of-run check (not evictions of the run) */
    double last_finish_s;
    /* time integrals */
    double t_total, t_running;
    double a_token, a_reserved, a_internal, a_external, a_cached, a_free, a_shared, a_in_use, a_cap;
};

/* ---------------------------------------------------------------- names */

static const char *const alloc_names[] = {"paged", "orca-max", "orca-pow2", "orca-oracle"};
static const char *const sched_names[] = {"fcfs", "lpm", "priority"};
static const char *const preempt_names[] = {"recompute", "swap"};

static kvp_status parse_name(const char *s, const char *const *names, int n, const char *what, int *out)
{
    if (s)
        for (int i = 0; i < n; i++)
            if (strcmp(s, names[i]) == 0) {
                *out = i;
                return KVP_OK;
            }
    char list[128] = "";
    size_t off = 0;
    for (int i = 0; i < n && off < sizeof list; i++) {
        int w = snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "", names[i]);
        if (w < 0) break;
        off += (size_t)w;
    }
    return KVP_ERR(KVP_EINVAL, "unknown %s '%s' (use %s)", what, s ? s : "(null)", list);
}

kvp_status kvp_alloc_kind_parse(const char *s, kvp_alloc_kind *out)
{
    int v = 0;
    KVP_TRY(parse_name(s, alloc_names, 4, "allocation strategy", &v));
    *out = (kvp_alloc_kind)v;
    return KVP_OK;
}
kvp_status kvp_sched_policy_parse(const char *s, kvp_sched_policy *out)
{
    int v = 0;
    KVP_TRY(parse_name(s, sched_names, 3, "scheduling policy", &v));
    *out = (kvp_sched_policy)v;
    return KVP_OK;
}
kvp_status kvp_preempt_mode_parse(const char *s, kvp_preempt_mode *out)
{
    int v = 0;
    KVP_TRY(parse_name(s, preempt_names, 2, "preemption mode", &v));
    *out = (kvp_preempt_mode)v;
    return KVP_OK;
}
const char *kvp_alloc_kind_name(kvp_alloc_kind k) { return (unsigned)k < 4 ? alloc_names[k] : "?"; }
const char *kvp_sched_policy_name(kvp_sched_policy p) { return (unsigned)p < 3 ? sched_names[p] : "?"; }
const char *kvp_preempt_mode_name(kvp_preempt_mode m) { return (unsigned)m < 2 ? preempt_names[m] : "?"; }

void kvp_engine_config_default(kvp_engine_config *c)
{
    memset(c, 0, sizeof *c);
    c->alloc = KVP_ALLOC_PAGED;
    c->arena = KVP_CONTIG_BUDDY;
    c->block_size = 16;
    c->max_num_seqs = 256;
    c->max_batched_tokens = 8192;
    c->max_model_len = 4096;
    c->chunked_prefill = true;
    c->sched = KVP_SCHED_FCFS;
    c->preempt = KVP_PREEMPT_RECOMPUTE;
    c->cache = KVP_PC_NONE;
    c->evict = KVP_EVICT_LRU;
}

/* The swap space's host blocks (with swap preemption; block_size >= 1): the first host ids. */
static int32_t swap_blocks(const kvp_engine_config *c)
{
    int64_t n = c->preempt == KVP_PREEMPT_SWAP ? c->host_slots / c->block_size : 0;
    return n > INT32_MAX - 1 ? INT32_MAX - 1 : (int32_t)n;
}

int64_t kvp_engine_host_blocks(const kvp_engine_config *c)
{
    if (c->block_size < 1) return 0;
    return swap_blocks(c) + (c->cache != KVP_PC_NONE ? c->host_cache_slots / c->block_size : 0);
}

/* ---------------------------------------------------------------- ordering */

/* Rank: smaller ranks first. fcfs/lpm: arrival, then addition order; priority: higher priority first. */
static inline bool rank_less(const kvp_engine *e, int64_t a, int64_t b)
{
    if (e->cfg.sched == KVP_SCHED_PRIORITY) {
        int32_t pa = e->seqs[a].req->priority, pb = e->seqs[b].req->priority;
        if (pa != pb) return pa > pb;
    }
    if (e->seqs[a].arrival != e->seqs[b].arrival) return e->seqs[a].arrival < e->seqs[b].arrival;
    return a < b;
}

/* Insert idx into the sorted array arr[0..*n) (capacity guaranteed by the caller). */
static void sorted_insert(const kvp_engine *e, int64_t *arr, int64_t *n, int64_t idx)
{
    int64_t lo = 0, hi = *n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (rank_less(e, arr[mid], idx)) lo = mid + 1;
        else hi = mid;
    }
    memmove(arr + lo + 1, arr + lo, (size_t)(*n - lo) * sizeof *arr);
    arr[lo] = idx;
    (*n)++;
}

static void waiting_insert(kvp_engine *e, int64_t idx)
{
    /* Common case (fcfs arrivals): append at the tail. Room for the tail is guaranteed by wq_cap >= n_seqs
     * after compaction to the front when needed. */
    if (e->wq_n == 0 || rank_less(e, e->wq[e->wq_head + e->wq_n - 1], idx)) {
        if (e->wq_head + e->wq_n == e->wq_cap) {
            memmove(e->wq, e->wq + e->wq_head, (size_t)e->wq_n * sizeof *e->wq);
            e->wq_head = 0;
        }
        e->wq[e->wq_head + e->wq_n++] = idx;
        return;
    }
    if (e->wq_head > 0 && rank_less(e, idx, e->wq[e->wq_head])) {
        e->wq[--e->wq_head] = idx;
        e->wq_n++;
        return;
    }
    if (e->wq_head + e->wq_n == e->wq_cap) {
        memmove(e->wq, e->wq + e->wq_head, (size_t)e->wq_n * sizeof *e->wq);
        e->wq_head = 0;
    }
    sorted_insert(e, e->wq + e->wq_head, &e->wq_n, idx);
}

static void running_insert(kvp_engine *e, int64_t idx)
{
    int64_t n = e->rq_n;
    sorted_insert(e, e->rq, &n, idx);
    e->rq_n = (int32_t)n;
}

/* ---------------------------------------------------------------- memory helpers */

static bool paged(const kvp_engine *e) { return e->cfg.alloc == KVP_ALLOC_PAGED; }

static int32_t num_free_blocks(const kvp_engine *e) { return kvp_bm_num_free(e->bm); }

/* Evicts cached prefix blocks until `need` blocks are free or nothing is evictable (write_back: stores
 * the evicted blocks in the host tier, write_back below). */
static kvp_status evict_until(kvp_engine *e, int32_t need)
{
    if (e->pc == NULL) return KVP_OK;
    KVP_TRY(kvp_pc_evict_until_free(e->pc, need));
    return e->write_back_st;
}

static kvp_status unlock_hits(kvp_engine *e, seq_t *s)
{
    kvp_status st = KVP_OK;
    if (s->n_hit > 0 && e->pc) st = kvp_pc_unlock(e->pc, s->hit, s->n_hit);
    kvp_free(s->hit);
    s->hit = NULL;
    s->n_hit = 0;
    return st;
}

static int32_t total_known(const seq_t *s) { return s->prompt_len + s->num_generated; }

/* The first n <= total_known(s) token ids of s (prompt, then generated), contiguous: the prompt itself, or
 * assembled in e->seqbuf. */
static kvp_status known_tokens(kvp_engine *e, const seq_t *s, int32_t n, const int32_t **out)
{
    *out = s->req->tokens;
    if (n <= s->prompt_len) return KVP_OK;
    KVP_TRY(kvp_grow((void **)&e->seqbuf, &e->seqbuf_cap, (size_t)n, sizeof(int32_t)));
    memcpy(e->seqbuf, s->req->tokens, (size_t)s->prompt_len * sizeof(int32_t));
    memcpy(e->seqbuf + s->prompt_len, s->gen, (size_t)(n - s->prompt_len) * sizeof(int32_t));
    *out = e->seqbuf;
    return KVP_OK;
}

/* Matches s's first n known tokens in the prefix cache: *n_hit cached blocks, their ids in e->hit_scratch.
 * lock = 1: locked for s, with its priority (an admission); 0: a look only (the lpm score). */
static kvp_status lookup(kvp_engine *e, const seq_t *s, int32_t n, int lock, int32_t *n_hit)
{
    const int32_t maxb = n / e->cfg.block_size + 1;
    const int32_t *toks;
    KVP_TRY(known_tokens(e, s, n, &toks));
    if (maxb > e->hit_scratch_cap) {
        size_t cap = (size_t)e->hit_scratch_cap;
        KVP_TRY(kvp_grow((void **)&e->hit_scratch, &cap, (size_t)maxb, sizeof(int32_t)));
        e->hit_scratch_cap = (int32_t)cap;
    }
    const kvp_pc_hint hint = {.priority = s->req->priority};
    return kvp_pc_match(e->pc, toks, n, lock ? &hint : NULL, lock, e->hit_scratch, maxb, n_hit);
}

/* The chain hashes of s's first n_blocks full blocks (known tokens) in e->hashes, and room for as many
 * slots in e->hslots. */
static kvp_status chain_hashes(kvp_engine *e, const seq_t *s, int32_t n_blocks)
{
    const int32_t *toks;
    KVP_TRY(known_tokens(e, s, n_blocks * e->cfg.block_size, &toks));
    KVP_TRY(kvp_grow((void **)&e->hashes, &e->hashes_cap, (size_t)n_blocks + 1, sizeof *e->hashes));
    KVP_TRY(kvp_grow((void **)&e->hslots, &e->hslots_cap, (size_t)n_blocks + 1, sizeof *e->hslots));
    kvp_pc_chain_hashes(toks, n_blocks, e->cfg.block_size, 0, e->hashes);
    return KVP_OK;
}

/* Host tier: how many of s's blocks after its n_hit cached ones (a prefix of its first n known tokens, never
 * the last) are held there; their slots in e->hslots[0..*n_load). */
static kvp_status host_lookup(kvp_engine *e, const seq_t *s, int32_t n, int32_t n_hit, int32_t *n_load)
{
    *n_load = 0;
    const int32_t maxb = (n - 1) / e->cfg.block_size;
    if (e->hc == NULL || maxb <= n_hit) return KVP_OK;
    KVP_TRY(chain_hashes(e, s, maxb));
    *n_load = kvp_hc_match(e->hc, e->hashes + n_hit, maxb - n_hit, e->hslots);
    return KVP_OK;
}

/* Appends a host-tier move to *v for the next executor step (tier_store / tier_load). */
static kvp_status push_move(kvp_block_copy **v, int32_t *n, size_t *cap, int32_t src, int32_t dst)
{
    KVP_TRY(kvp_grow((void **)v, cap, (size_t)*n + 1, sizeof **v));
    (*v)[(*n)++] = (kvp_block_copy){src, dst};
    return KVP_OK;
}

/* Whether a load of the next executor step still has to read tier slot `slot` (stores run before loads). */
static bool load_pending(const kvp_engine *e, int32_t slot)
{
    return slot >= 0 && e->load_step[slot] == e->steps;
}

/* Write-through (and its selective form): blocks[0..n_full) of s, just cached, go to the host tier too (those
 * not held there). The moves run first in the next executor step, before anything can overwrite the blocks.
 * Stores are decided after a step ran (prefill done, finish) or while scheduling preempts by recompute, which
 * comes before any admission, and loads only at admissions, run in the same step: so no store can take a slot
 * that a pending load still has to read (checked). */
static kvp_status host_store(kvp_engine *e, const seq_t *s, const int32_t *blocks, int32_t n_full)
{
    KVP_TRY(chain_hashes(e, s, n_full));
    if (kvp_hc_store(e->hc, e->hashes, n_full, e->hslots) == 0) return KVP_OK;
    for (int32_t i = 0; i < n_full; i++) {
        if (e->hslots[i] < 0) continue;
        if (load_pending(e, e->hslots[i]))
            return KVP_ERR(KVP_ESTATE, "engine: a host-tier store would overwrite slot %d before its load", e->hslots[i]);
        KVP_TRY(push_move(&e->tier_store, &e->n_store, &e->store_cap, blocks[i], e->hc_base + e->hslots[i]));
        e->host_stored_blocks++;
    }
    return KVP_OK;
}

/* Write-back (the prefix cache's eviction hook): an evicted block that the eviction frees goes to the host
 * tier unless held there. One a running sequence still holds is not stored: the sequence caches it again
 * when it finishes or is preempted (as SGLang never evicts a node a request holds). Evictions happen while
 * admissions are scheduled, after some loads of this step were decided: a store that would take a slot one
 * of them still reads is dropped (the block is lost, as without a tier). The stores run first in the step,
 * before the evicted blocks can be reused. */
static void write_back(void *ctx, uint64_t hash, int32_t block)
{
    kvp_engine *e = ctx;
    int32_t slot;
    if (e->write_back_st != KVP_OK || kvp_pool_refcount(kvp_bm_pool(e->bm), block) > 1 ||
        load_pending(e, kvp_hc_victim(e->hc)) || kvp_hc_store(e->hc, &hash, 1, &slot) == 0)
        return;
    e->write_back_st = push_move(&e->tier_store, &e->n_store, &e->store_cap, block, e->hc_base + slot);
    e->host_stored_blocks++;
}

/* Caches the full blocks of every token of s whose KV is computed (prompt and generated), as vLLM v1 and
 * SGLang do: when its prefill ends, when it is preempted by recompute (it finds its own blocks again when
 * readmitted) and when it finishes with a known answer (the next turn of a chat finds it). The host tier
 * gets what the write policy offers it (kvp_hc_blocks_to_store; s->n_hit: the blocks s found cached). */
static kvp_status cache_computed(kvp_engine *e, int64_t idx)
{
    seq_t *s = &e->seqs[idx];
    const int32_t n_full = s->num_computed / e->cfg.block_size;
    if (e->pc == NULL || n_full == 0) return KVP_OK;
    const int32_t *toks;
    KVP_TRY(known_tokens(e, s, s->num_computed, &toks));
    kvp_bm_table_view v;
    KVP_TRY(kvp_bm_table(e->bm, idx, &v));
    kvp_pc_hint hint = {.priority = s->req->priority};
    KVP_TRY(kvp_pc_insert(e->pc, toks, s->num_computed, v.blocks, n_full, &hint, 0, NULL));
    const int32_t n_store = e->hc ? kvp_hc_blocks_to_store(e->cfg.host_write_policy, n_full, s->n_hit) : 0;
    return n_store > 0 ? host_store(e, s, v.blocks, n_store) : KVP_OK;
}

/* ---------------------------------------------------------------- create / destroy */

kvp_status kvp_engine_create(const kvp_engine_config *cfg, kvp_executor *ex, kvp_engine **out)
{
    if (cfg == NULL || ex == NULL || out == NULL || ex->step == NULL)
        return KVP_ERR(KVP_EINVAL, "engine: NULL argument or executor without a step function");
    const kvp_engine_config *c = cfg;
    if ((unsigned)c->alloc > KVP_ALLOC_ORCA_ORACLE) return KVP_ERR(KVP_EINVAL, "engine: unknown allocation strategy");
    if ((unsigned)c->sched > KVP_SCHED_PRIORITY) return KVP_ERR(KVP_EINVAL, "engine: unknown scheduling policy");
    if ((unsigned)c->preempt > KVP_PREEMPT_SWAP) return KVP_ERR(KVP_EINVAL, "engine: unknown preemption mode");
    if (c->block_size < 1) return KVP_ERR(KVP_EINVAL, "block size must be >= 1 (got %d)", (int)c->block_size);
    if (c->max_num_seqs < 1) return KVP_ERR(KVP_EINVAL, "max_num_seqs must be >= 1 (got %d)", (int)c->max_num_seqs);
    if (c->max_batched_tokens < 1)
        return KVP_ERR(KVP_EINVAL, "max_batched_tokens must be >= 1 (got %d)", (int)c->max_batched_tokens);
    if (c->max_model_len < 2) return KVP_ERR(KVP_EINVAL, "max_model_len must be >= 2 (got %d)", (int)c->max_model_len);
    if (!c->chunked_prefill && c->max_batched_tokens < c->max_model_len)
        return KVP_ERR(KVP_EINVAL,
                       "without chunked prefill max_batched_tokens (%d) must be >= max_model_len (%d)",
                       (int)c->max_batched_tokens, (int)c->max_model_len);
    if (c->watermark_blocks < 0) return KVP_ERR(KVP_EINVAL, "watermark_blocks must be >= 0");
    if (c->host_slots < 0) return KVP_ERR(KVP_EINVAL, "host_slots must be >= 0");
    if (c->host_cache_slots < 0) return KVP_ERR(KVP_EINVAL, "host_cache_slots must be >= 0");
    if ((unsigned)c->host_write_policy >= KVP_HC_WRITE_POLICIES) return KVP_ERR(KVP_EINVAL, "engine: unknown host-tier write policy");
    if (c->host_cache_slots > 0 && c->cache == KVP_PC_NONE)
        return KVP_ERR(KVP_EINVAL, "a host tier of the prefix cache needs a prefix cache (radix or hash)");
    if (c->host_cache_slots > 0 && c->host_cache_slots / c->block_size < 1)
        return KVP_ERR(KVP_EINVAL, "a host tier of %lld token slots holds no block of %d tokens",
                       (long long)c->host_cache_slots, (int)c->block_size);
    if (kvp_engine_host_blocks(c) > INT32_MAX - 1)
        return KVP_ERR(KVP_EINVAL, "too many host blocks (%lld swap + host tier): use a larger block size",
                       (long long)kvp_engine_host_blocks(c));
    if (c->alloc != KVP_ALLOC_PAGED && c->cache != KVP_PC_NONE)
        return KVP_ERR(KVP_EINVAL, "prefix caching needs paged allocation (got %s)", kvp_alloc_kind_name(c->alloc));
    if (c->cache != KVP_PC_NONE && c->evict == KVP_EVICT_BELADY)
        return KVP_ERR(KVP_EUNSUPPORTED, "eviction policy belady needs next-use hints, which the engine does not "
                                         "compute (use lru, lfu, fifo or priority)");
    int64_t nb = c->alloc == KVP_ALLOC_PAGED ? c->kv_slots / c->block_size : c->kv_slots;
    if (nb < 1)
        return KVP_ERR(KVP_EINVAL, "KV memory of %lld token slots holds no block of %d tokens",
                       (long long)c->kv_slots, (int)c->block_size);
    if (c->alloc == KVP_ALLOC_PAGED && nb > INT32_MAX - 1)
        return KVP_ERR(KVP_EINVAL, "too many KV blocks (%lld): use a larger block size", (long long)nb);
    if (c->alloc == KVP_ALLOC_PAGED && c->watermark_blocks >= nb)
        return KVP_ERR(KVP_EINVAL, "watermark_blocks %d leaves nothing of the %lld KV blocks to admit requests with",
                       (int)c->watermark_blocks, (long long)nb);

    kvp_engine *e = kvp_calloc(1, sizeof *e);
    if (e == NULL) return KVP_ERR(KVP_ENOMEM, "engine: out of memory");
    e->cfg = *c;
    e->ex = ex;
    kvp_status st = KVP_OK;
    if (paged(e)) {
        kvp_bm_config bc = {.num_blocks = (int32_t)nb,
                            .block_size = c->block_size,
                            .num_host_blocks = swap_blocks(c),
                            .max_seq_len = c->max_model_len,
                            .watermark_blocks = c->watermark_blocks};
        e->num_blocks = (int32_t)nb;
        st = kvp_bm_create(&bc, &e->bm);
        if (st == KVP_OK && c->cache != KVP_PC_NONE)
            st = kvp_pc_create(c->cache, c->evict, kvp_bm_pool(e->bm), c->block_size, &e->pc);
        e->hc_base = swap_blocks(c);
        const int32_t tier = (int32_t)(c->host_cache_slots / c->block_size);
        if (st == KVP_OK && tier > 0) st = kvp_hc_create(tier, &e->hc);
        if (st == KVP_OK && tier > 0 && (e->load_step = kvp_malloc((size_t)tier * sizeof *e->load_step)) == NULL)
            st = KVP_ERR(KVP_ENOMEM, "engine: out of memory for a host tier of %d blocks", tier);
        for (int32_t i = 0; st == KVP_OK && i < tier; i++) e->load_step[i] = -1;
        if (st == KVP_OK && tier > 0 && c->host_write_policy == KVP_HC_WRITE_BACK) kvp_pc_set_evict_hook(e->pc, write_back, e);
    } else {
        e->contig_policy = c->alloc == KVP_ALLOC_ORCA_MAX    ? KVP_CONTIG_MAX
                           : c->alloc == KVP_ALLOC_ORCA_POW2 ? KVP_CONTIG_POW2
                                                             : KVP_CONTIG_ORACLE;
        st = kvp_contig_create(c->kv_slots, c->arena, &e->arena);
    }
    size_t m = (size_t)c->max_num_seqs + 1;
    if (st == KVP_OK) {
        e->rq = kvp_malloc(m * sizeof *e->rq);
        e->sched = kvp_malloc(m * sizeof *e->sched);
        e->xs = kvp_malloc(m * sizeof *e->xs);
        e->sampled = kvp_malloc(m * sizeof *e->sampled);
        e->admitted = kvp_malloc(m * sizeof *e->admitted);
        e->lpm_order = kvp_malloc((size_t)KVP_LPM_WINDOW * sizeof *e->lpm_order);
        if (!e->rq || !e->sched || !e->xs || !e->sampled || !e->admitted || !e->lpm_order)
            st = KVP_ERR(KVP_ENOMEM, "engine: out of memory");
    }
    if (st != KVP_OK) {
        kvp_engine_destroy(e);
        return st;
    }
    *out = e;
    return KVP_OK;
}

void kvp_engine_destroy(kvp_engine *e)
{
    if (e == NULL) return;
    for (int64_t i = 0; i < e->n_seqs; i++) {
        kvp_free(e->seqs[i].hit);
        kvp_free(e->seqs[i].gen);
    }
    kvp_pc_destroy(e->pc); /* before the block manager: it holds references on its pool */
    kvp_hc_destroy(e->hc);
    kvp_free(e->hashes);
    kvp_free(e->hslots);
    kvp_free(e->tier_store);
    kvp_free(e->tier_load);
    kvp_free(e->load_step);
    kvp_bm_destroy(e->bm);
    kvp_contig_destroy(e->arena);
    kvp_free(e->seqs);
    kvp_free(e->wq);
    kvp_free(e->rq);
    kvp_free(e->sq);
    kvp_free(e->sched);
    kvp_free(e->xs);
    kvp_free(e->sampled);
    kvp_free(e->admitted);
    kvp_free(e->hit_scratch);
    kvp_free(e->lpm_order);
    kvp_free(e->tokbuf);
    kvp_free(e->seqbuf);
    kvp_free(e->due);
    kvp_free(e);
}

/* ---------------------------------------------------------------- requests */

kvp_status kvp_engine_add_request(kvp_engine *e, const kvp_request *r)
{
    if (e == NULL || r == NULL) return KVP_ERR(KVP_EINVAL, "engine: NULL argument");
    if (r->prompt_len < 1 || r->output_len < 0 || (r->tokens == NULL && e->pc != NULL))
        return KVP_ERR(KVP_EINVAL, "request %lld: prompt_len must be >= 1, output_len >= 0, tokens given",
                       (long long)r->id);
    if (!(r->arrival_s >= 0) || !isfinite(r->arrival_s))
        return KVP_ERR(KVP_EINVAL, "request %lld: arrival time must be a finite number >= 0", (long long)r->id);
    if (e->n_seqs > 0 && r->arrival_s < e->seqs[e->n_seqs - 1].req->arrival_s)
        return KVP_ERR(KVP_EINVAL, "request %lld arrives before the previous one: add requests in arrival order",
                       (long long)r->id);
    size_t cap = (size_t)e->cap_seqs;
    if ((size_t)e->n_seqs + 1 > cap) {
        size_t c1 = cap, c2 = (size_t)e->wq_cap, c3 = (size_t)e->sq_cap;
        KVP_TRY(kvp_grow((void **)&e->seqs, &c1, (size_t)e->n_seqs + 1, sizeof *e->seqs));
        e->cap_seqs = (int64_t)c1;
        /* waiting and swapped can hold every request at once: never grow during a step */
        KVP_TRY(kvp_grow((void **)&e->wq, &c2, c1, sizeof *e->wq));
        e->wq_cap = (int64_t)c2;
        KVP_TRY(kvp_grow((void **)&e->sq, &c3, c1, sizeof *e->sq));
        e->sq_cap = (int64_t)c3;
    }
    seq_t *s = &e->seqs[e->n_seqs];
    memset(s, 0, sizeof *s);
    s->req = r;
    s->arrival = r->arrival_s;
    s->parent = s->first_child = s->next_sibling = -1;
    s->state = KVP_REQ_PENDING;
    s->prompt_len = r->prompt_len;
    s->admit_s = s->first_token_s = s->finish_s = -1;
    const int32_t L = e->cfg.max_model_len;
    int32_t out = r->output_len;
    if (out < 1) out = 1;
    if (r->prompt_len < L && out > L - r->prompt_len) out = L - r->prompt_len;
    if (out != r->output_len) e->clamped++;
    s->output_len = out;
    int64_t final_len = (int64_t)r->prompt_len + out;
    bool reject = r->prompt_len >= L;
    if (!reject && paged(e)) {
        int64_t blocks = (final_len + e->cfg.block_size - 1) / e->cfg.block_size;
        reject = blocks > (int64_t)e->num_blocks - e->cfg.watermark_blocks;
    } else if (!reject) {
        if (kvp_contig_reserve_len(e->contig_policy, L, r->prompt_len, out, &s->reserve_len) != KVP_OK) reject = true;
        else reject = s->reserve_len > kvp_contig_max_reserve(e->arena);
    }
    if (reject) {
        s->state = KVP_REQ_REJECTED;
        e->rejected++;
        KVP_LOG_I("engine: request %lld (prompt %d, output %d) can never run: rejected", (long long)r->id,
                  (int)r->prompt_len, (int)out);
    }
    e->n_seqs++;
    return KVP_OK;
}

/* ---------------------------------------------------------------- preemption */

static kvp_status preempt(kvp_engine *e, int64_t idx)
{
    seq_t *s = &e->seqs[idx];
    e->preemptions++;
    e->step_preempted++;
    s->preemptions++;
    if (e->cfg.preempt == KVP_PREEMPT_SWAP && e->bm && kvp_bm_host_pool(e->bm)) {
        kvp_bm_table_view v;
        KVP_TRY(kvp_bm_table(e->bm, idx, &v));
        if (kvp_pool_num_free(kvp_bm_host_pool(e->bm)) >= v.num_blocks) {
            KVP_TRY(unlock_hits(e, s));
            kvp_status st = kvp_bm_swap_out(e->bm, &idx, 1);
            if (st == KVP_OK) {
                e->swap_outs++;
                s->state = KVP_REQ_SWAPPED;
                sorted_insert(e, e->sq, &e->sq_n, idx);
                return KVP_OK;
            }
            if (st != KVP_ENOBLOCKS) return st;
        }
    }
    /* recompute: drop the KV (its full blocks stay cached), prefill prompt + generated tokens again later */
    e->recomputes++;
    KVP_TRY(cache_computed(e, idx));
    KVP_TRY(unlock_hits(e, s));
    KVP_TRY(kvp_bm_free(e->bm, idx));
    s->num_computed = 0;
    s->inserted = false;
    s->state = KVP_REQ_WAITING;
    waiting_insert(e, idx);
    return KVP_OK;
}

/* ---------------------------------------------------------------- scheduling */

/* Tokens to compute for a running sequence this step given the budget. */
static int32_t want_tokens(const seq_t *s, int32_t budget)
{
    int32_t need = total_known(s) - s->num_computed;
    return need < budget ? need : budget;
}

/* Schedules running sequences in rank order; preempts from the bottom when blocks run out. */
static kvp_status schedule_running(kvp_engine *e, int32_t *budget)
{
    int32_t n = e->rq_n; /* effective length: victims are cut from the end */
    for (int32_t i = 0; i < n && *budget > 0; i++) {
        int64_t idx = e->rq[i];
        seq_t *s = &e->seqs[idx];
        int32_t k = want_tokens(s, *budget);
        if (k <= 0) continue;
        if (paged(e)) {
            int32_t need;
            KVP_TRY(kvp_bm_append_blocks_needed(e->bm, idx, k, &need));
            bool self = false;
            while (num_free_blocks(e) < need) {
                KVP_TRY(evict_until(e, need));
                if (num_free_blocks(e) >= need) break;
                int64_t victim = e->rq[n - 1];
                n--;
                KVP_TRY(preempt(e, victim));
                if (victim == idx) {
                    self = true;
                    break;
                }
            }
            if (self) break;
            KVP_TRY(kvp_bm_append(e->bm, idx, k, NULL));
        } else {
            KVP_TRY(kvp_contig_grow(e->arena, idx, k));
        }
        s->sched_new = k;
        e->sched[e->sched_n++] = idx;
        *budget -= k;
    }
    if (n < e->rq_n) e->rq_n = n; /* victims were the tail, already moved to waiting/swapped */
    return KVP_OK;
}

/* Brings swapped sequences back (rank order) while memory and max_num_seqs allow; schedules them. */
static kvp_status swap_in(kvp_engine *e, int32_t *budget)
{
    int64_t done = 0;
    while (done < e->sq_n && *budget > 0 && e->rq_n + e->admitted_n < e->cfg.max_num_seqs) {
        int64_t idx = e->sq[done];
        seq_t *s = &e->seqs[idx];
        int32_t need_in;
        KVP_TRY(kvp_bm_swap_in_blocks_needed(e->bm, &idx, 1, &need_in));
        int32_t k = want_tokens(s, *budget);
        /* blocks appending k tokens will add once the sequence is back (its blocks are unshared then) */
        const int32_t bs = e->cfg.block_size;
        int32_t extra = (s->num_computed + k + bs - 1) / bs - (s->num_computed + bs - 1) / bs;
        KVP_TRY(evict_until(e, need_in + extra + e->cfg.watermark_blocks));
        if (num_free_blocks(e) < need_in + extra + e->cfg.watermark_blocks) break;
        KVP_TRY(kvp_bm_swap_in(e->bm, &idx, 1));
        e->swap_ins++;
        KVP_TRY(kvp_bm_append(e->bm, idx, k, NULL));
        s->state = KVP_REQ_RUNNING;
        s->sched_new = k;
        e->sched[e->sched_n++] = idx;
        e->admitted[e->admitted_n++] = idx;
        *budget -= k;
        done++;
    }
    if (done > 0) {
        memmove(e->sq, e->sq + done, (size_t)(e->sq_n - done) * sizeof *e->sq);
        e->sq_n -= done;
    }
    return KVP_OK;
}

/* Tries to admit waiting sequence idx with the budget left. *ok = false when it does not fit (nothing
 * changed then). */
static kvp_status try_admit(kvp_engine *e, int64_t idx, int32_t *budget, bool *ok)
{
    seq_t *s = &e->seqs[idx];
    const int32_t bs = e->cfg.block_size;
    *ok = false;
    int32_t total = total_known(s);
    if (!paged(e)) {
        int32_t k = total < *budget ? total : *budget;
        if (!e->cfg.chunked_prefill && k < total) return KVP_OK;
        if (k <= 0 || !kvp_contig_can_reserve(e->arena, s->reserve_len)) return KVP_OK;
        KVP_TRY(kvp_contig_reserve(e->arena, idx, s->reserve_len, (int64_t)s->prompt_len + s->output_len, NULL));
        kvp_status st = kvp_contig_grow(e->arena, idx, k);
        if (st != KVP_OK) {
            kvp_contig_free(e->arena, idx);
            return st;
        }
        s->num_computed = 0;
        s->sched_new = k;
        *budget -= k;
        *ok = true;
        return KVP_OK;
    }
    int32_t n_hit = 0, n_load = 0; /* readmitted after recompute: its generated tokens may be cached too */
    if (e->pc) KVP_TRY(lookup(e, s, total, 1, &n_hit));
    kvp_status hst = host_lookup(e, s, total, n_hit, &n_load);
    if (hst != KVP_OK) {
        if (n_hit) kvp_pc_unlock(e->pc, e->hit_scratch, n_hit);
        return hst;
    }
    /* the slots to load from are pending from now on: the evictions below may write back (if the admission
     * fails, they stay marked for this step, which only drops write-backs) */
    for (int32_t i = 0; i < n_load; i++) e->load_step[e->hslots[i]] = e->steps;
    int32_t hit_tok = (n_hit + n_load) * bs; /* cached or loaded: not computed */
    int32_t remaining = total - hit_tok;
    int32_t k = remaining < *budget ? remaining : *budget;
    bool fits = k > 0 && (e->cfg.chunked_prefill || k == remaining);
    int32_t need = 0;
    if (fits) {
        need = (hit_tok + k + bs - 1) / bs - n_hit;
        kvp_status st = evict_until(e, need + e->cfg.watermark_blocks);
        if (st != KVP_OK) {
            if (n_hit) kvp_pc_unlock(e->pc, e->hit_scratch, n_hit);
            return st;
        }
        fits = num_free_blocks(e) >= need + e->cfg.watermark_blocks;
    }
    int32_t *hits = NULL;
    kvp_status st = KVP_OK;
    if (fits && n_hit > 0) {
        hits = kvp_malloc((size_t)n_hit * sizeof *hits);
        if (hits == NULL) st = KVP_ERR(KVP_ENOMEM, "engine: out of memory recording a prefix hit");
        else memcpy(hits, e->hit_scratch, (size_t)n_hit * sizeof *hits);
    }
    if (fits && st == KVP_OK) st = kvp_bm_allocate_prefixed(e->bm, idx, hit_tok + k, hits, n_hit);
    if (!fits || st != KVP_OK) {
        if (n_hit) kvp_pc_unlock(e->pc, e->hit_scratch, n_hit);
        kvp_free(hits);
        return st;
    }
    s->hit = hits;
    s->n_hit = n_hit;
    if (n_load > 0) {
        kvp_bm_table_view v;
        st = kvp_bm_table(e->bm, idx, &v);
        for (int32_t i = 0; st == KVP_OK && i < n_load; i++)
            st = push_move(&e->tier_load, &e->n_load, &e->load_cap, e->hc_base + e->hslots[i], v.blocks[n_hit + i]);
        if (st != KVP_OK) return st; /* the sequence is admitted: the engine's state is undefined (engine.h) */
        e->host_loaded_blocks += n_load;
    }
    if (!s->admitted_once) {
        e->prompt_tokens_first += s->prompt_len;
        e->hit_tokens_first += n_hit * bs;
        e->host_hit_tokens_first += n_load * bs;
        s->hit_first = hit_tok;
    } else {
        e->readmit_hit_tokens += hit_tok;
    }
    s->num_computed = hit_tok;
    s->sched_new = k;
    *budget -= k;
    *ok = true;
    return KVP_OK;
}

static void mark_admitted(kvp_engine *e, int64_t idx)
{
    seq_t *s = &e->seqs[idx];
    s->state = KVP_REQ_RUNNING;
    if (!s->admitted_once) {
        s->admitted_once = true;
        s->admit_s = e->now;
    }
    e->sched[e->sched_n++] = idx;
    e->admitted[e->admitted_n++] = idx;
}

static int cmp_lpm(const void *a, const void *b, void *ctx)
{
    const kvp_engine *e = ctx;
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    if (e->seqs[x].lpm_score != e->seqs[y].lpm_score) return e->seqs[x].lpm_score > e->seqs[y].lpm_score ? -1 : 1;
    return rank_less(e, x, y) ? -1 : rank_less(e, y, x); /* ties: arrival order */
}

/* Admits waiting requests in policy order; stops at the first that does not fit. */
static kvp_status admit_waiting(kvp_engine *e, int32_t *budget)
{
    if (e->wq_n == 0) return KVP_OK;
    if (e->cfg.sched == KVP_SCHED_LPM && e->pc) {
        int64_t w = e->wq_n < KVP_LPM_WINDOW ? e->wq_n : KVP_LPM_WINDOW;
        for (int64_t i = 0; i < w; i++) {
            int64_t idx = e->wq[e->wq_head + i];
            seq_t *s = &e->seqs[idx];
            int32_t n_hit = 0, n_host = 0;
            KVP_TRY(lookup(e, s, s->prompt_len, 0, &n_hit));
            KVP_TRY(host_lookup(e, s, s->prompt_len, n_hit, &n_host)); /* a host hit is not computed either */
            s->lpm_score = n_hit + n_host;
            e->lpm_order[i] = idx;
        }
        qsort_r(e->lpm_order, (size_t)w, sizeof *e->lpm_order, cmp_lpm, e);
        int64_t taken = 0;
        for (int64_t i = 0; i < w && *budget > 0 && e->rq_n + e->admitted_n < e->cfg.max_num_seqs; i++) {
            bool ok;
            KVP_TRY(try_admit(e, e->lpm_order[i], budget, &ok));
            if (!ok) break;
            mark_admitted(e, e->lpm_order[i]);
            taken++;
        }
        if (taken > 0) { /* drop the admitted ones from the window, keep the rank order of the rest */
            int64_t k = 0;
            for (int64_t i = 0; i < e->wq_n; i++) {
                int64_t idx = e->wq[e->wq_head + i];
                if (e->seqs[idx].state == KVP_REQ_WAITING) e->wq[e->wq_head + k++] = idx;
            }
            e->wq_n = k;
        }
        return KVP_OK;
    }
    while (e->wq_n > 0 && *budget > 0 && e->rq_n + e->admitted_n < e->cfg.max_num_seqs) {
        int64_t idx = e->wq[e->wq_head];
        bool ok;
        KVP_TRY(try_admit(e, idx, budget, &ok));
        if (!ok) break;
        e->wq_head++;
        e->wq_n--;
        mark_admitted(e, idx);
    }
    if (e->wq_n == 0) e->wq_head = 0;
    return KVP_OK;
}

static kvp_status schedule(kvp_engine *e)
{
    int32_t budget = e->cfg.max_batched_tokens;
    e->sched_n = 0;
    e->admitted_n = 0;
    e->step_preempted = 0;
    if (!e->cfg.chunked_prefill) {
        /* vLLM v0 order: a prefill-only step whenever new requests can be admitted (none swapped) */
        if (e->sq_n == 0) {
            KVP_TRY(admit_waiting(e, &budget));
            if (e->admitted_n > 0) goto done;
        }
        KVP_TRY(schedule_running(e, &budget));
        if (e->step_preempted == 0) KVP_TRY(swap_in(e, &budget));
    } else {
        KVP_TRY(schedule_running(e, &budget));
        if (e->step_preempted == 0) {
            KVP_TRY(swap_in(e, &budget));
            if (e->sq_n == 0) KVP_TRY(admit_waiting(e, &budget));
        }
    }
done:
    for (int32_t i = 0; i < e->admitted_n; i++) running_insert(e, e->admitted[i]);
    return KVP_OK;
}

/* ---------------------------------------------------------------- accounting */

void kvp_engine_account(const kvp_engine *e, kvp_kv_accounting *a)
{
    if (paged(e)) {
        kvp_bm_account(e->bm, false, a);
        return;
    }
    int64_t pending = 0;
    if (e->wq_n > 0) pending = e->seqs[e->wq[e->wq_head]].reserve_len;
    kvp_contig_account(e->arena, pending, a);
}

static void integrate(kvp_engine *e, double dt)
{
    if (!(dt > 0)) return;
    kvp_kv_accounting a;
    kvp_engine_account(e, &a);
    e->t_total += dt;
    e->t_running += dt * e->rq_n;
    e->a_token += dt * (double)a.token_states;
    e->a_reserved += dt * (double)a.reserved;
    e->a_internal += dt * (double)a.internal_frag;
    e->a_external += dt * (double)a.external_frag;
    e->a_cached += dt * (double)a.cached;
    e->a_free += dt * (double)a.free;
    e->a_shared += dt * (double)a.shared_savings;
    e->a_in_use += dt * (double)(a.capacity - a.free - a.cached);
    e->a_cap += dt * (double)a.capacity;
}

/* ---------------------------------------------------------------- step */

static bool due_less(const struct due *a, const struct due *b) { return a->t < b->t || (a->t == b->t && a->idx < b->idx); }

/* Sequence idx, which waited for an answer, arrives at t (>= its own arrival time). */
static kvp_status due_push(kvp_engine *e, int64_t idx, double t)
{
    KVP_TRY(kvp_grow((void **)&e->due, &e->due_cap, (size_t)e->due_n + 1, sizeof *e->due));
    int64_t i = e->due_n++;
    struct due x = {t, idx};
    for (; i > 0 && due_less(&x, &e->due[(i - 1) / 2]); i = (i - 1) / 2) e->due[i] = e->due[(i - 1) / 2];
    e->due[i] = x;
    return KVP_OK;
}

static struct due due_pop(kvp_engine *e)
{
    struct due top = e->due[0], x = e->due[--e->due_n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= e->due_n) break;
        if (c + 1 < e->due_n && due_less(&e->due[c + 1], &e->due[c])) c++;
        if (!due_less(&e->due[c], &x)) break;
        e->due[i] = e->due[c];
        i = c;
    }
    if (e->due_n > 0) e->due[i] = x;
    return top;
}

/* The time of the next arrival, INFINITY when none is known (every request arrived, or waits for an answer
 * not given yet). */
static double next_arrival_time(const kvp_engine *e)
{
    double t = e->next_arrival < e->n_seqs ? e->seqs[e->next_arrival].req->arrival_s : INFINITY;
    return e->due_n > 0 && e->due[0].t < t ? e->due[0].t : t;
}

static void join_waiting(kvp_engine *e, int64_t idx, double t)
{
    e->seqs[idx].arrival = t;
    e->seqs[idx].state = KVP_REQ_WAITING;
    waiting_insert(e, idx);
}

/* A parallel sample (after_prompt) ranks with its own arrival, its parent's: it is part of that request. */
static double rank_arrival(const seq_t *s, double t) { return s->req->after_prompt ? s->req->arrival_s : t; }

/* Moves the requests whose time has come to waiting. One whose parent is not ready (has not finished; for a
 * parallel sample, has not computed its prompt) is held (blocked) until it is; one whose parent finished
 * arrives think_s after that, and not before its own time. */
static kvp_status arrivals(kvp_engine *e)
{
    while (e->next_arrival < e->n_seqs && e->seqs[e->next_arrival].req->arrival_s <= e->now) {
        int64_t idx = e->next_arrival++;
        seq_t *s = &e->seqs[idx];
        if (s->state == KVP_REQ_REJECTED) continue;
        const seq_t *p = s->parent >= 0 ? &e->seqs[s->parent] : NULL;
        const bool sample = s->req->after_prompt;
        if (p && p->state != KVP_REQ_FINISHED && p->state != KVP_REQ_REJECTED && !(sample && p->prompt_done)) {
            s->blocked = true;
            continue;
        }
        double t = p && p->state == KVP_REQ_FINISHED && !sample ? p->finish_s + s->req->think_s : s->req->arrival_s;
        if (t > e->now) KVP_TRY(due_push(e, idx, t));
        else join_waiting(e, idx, t > s->req->arrival_s ? t : s->req->arrival_s);
    }
    while (e->due_n > 0 && e->due[0].t <= e->now) {
        struct due d = due_pop(e);
        join_waiting(e, d.idx, rank_arrival(&e->seqs[d.idx], d.t));
    }
    return KVP_OK;
}

/* Sequence idx finished (prompt_only: computed its prompt): the requests held for it (prompt_only: only its
 * parallel samples) are due, think_s from now (a parallel sample: now). */
static kvp_status release_children(kvp_engine *e, int64_t idx, bool prompt_only)
{
    for (int64_t c = e->seqs[idx].first_child; c >= 0; c = e->seqs[c].next_sibling) {
        seq_t *s = &e->seqs[c];
        if (!s->blocked || (prompt_only && !s->req->after_prompt)) continue;
        s->blocked = false;
        KVP_TRY(due_push(e, c, e->now + (s->req->after_prompt ? 0.0 : s->req->think_s)));
    }
    return KVP_OK;
}

/* Token ids of the chunk a sequence computes this step. A recompute chunk that crosses the prompt's end
 * (prompt tail + generated tokens) is assembled in the step's token buffer (e->tokbuf, at *off). */
static const int32_t *chunk_tokens(kvp_engine *e, const seq_t *s, size_t *off)
{
    int32_t a = s->num_computed, b = s->num_computed + s->sched_new;
    if (b <= s->prompt_len) return s->req->tokens ? s->req->tokens + a : NULL;
    if (a >= s->prompt_len) return s->gen ? s->gen + (a - s->prompt_len) : NULL;
    if (s->req->tokens == NULL || s->gen == NULL) return NULL;
    int32_t *dst = e->tokbuf + *off;
    memcpy(dst, s->req->tokens + a, (size_t)(s->prompt_len - a) * sizeof *dst);
    memcpy(dst + (s->prompt_len - a), s->gen, (size_t)(b - s->prompt_len) * sizeof *dst);
    *off += (size_t)(b - a);
    return dst;
}

static kvp_status finish(kvp_engine *e, int64_t idx)
{
    seq_t *s = &e->seqs[idx];
    if (s->req->output_tokens) KVP_TRY(cache_computed(e, idx)); /* its answer is known: reusable */
    KVP_TRY(unlock_hits(e, s));
    if (paged(e)) KVP_TRY(kvp_bm_free(e->bm, idx));
    else KVP_TRY(kvp_contig_free(e->arena, idx));
    s->state = KVP_REQ_FINISHED;
    s->finish_s = e->now;
    KVP_TRY(release_children(e, idx, false));
    kvp_free(s->gen);
    s->gen = NULL;
    s->gen_cap = 0;
    e->finished++;
    e->last_finish_s = e->now;
    return KVP_OK;
}

kvp_status kvp_engine_step(kvp_engine *e, kvp_step_info *info)
{
    kvp_step_info inf = {0};
    KVP_TRY(arrivals(e));
    /* nothing to do: jump to the next arrival (rejected arrivals join no queue: jump again) */
    while (e->rq_n == 0 && e->wq_n == 0 && e->sq_n == 0) {
        double t = next_arrival_time(e);
        if (t == INFINITY) { /* a request still held would need a parent still to finish: none is left */
            inf.idle = true;
            inf.time_s = e->now;
            if (info) *info = inf;
            return KVP_OK;
        }
        if (t > e->now) {
            integrate(e, t - e->now);
            e->now = t;
        }
        KVP_TRY(arrivals(e));
    }
    KVP_TRY(schedule(e));
    inf.num_preempted = e->step_preempted;
    if (e->sched_n == 0) {
        if (e->step_preempted == 0) {
            /* nothing could be scheduled and nothing changed: only an arrival could change that, and
             * arrivals never free memory, so this is a state the engine cannot leave */
            int64_t head = e->wq_n > 0 ? e->wq[e->wq_head] : -1;
            return KVP_ERR(KVP_ESTATE, "engine stalled: request %lld cannot be admitted into empty memory",
                           head >= 0 ? (long long)e->seqs[head].req->id : -1LL);
        }
        inf.time_s = e->now;
        if (info) *info = inf;
        return KVP_OK;
    }
    /* room for the chunks that cross a prompt's end (recompute after preemption) */
    size_t cross = 0, off = 0;
    for (int32_t i = 0; i < e->sched_n; i++) {
        const seq_t *s = &e->seqs[e->sched[i]];
        if (s->num_computed < s->prompt_len && s->num_computed + s->sched_new > s->prompt_len)
            cross += (size_t)s->sched_new;
    }
    if (cross > e->tokbuf_cap) KVP_TRY(kvp_grow((void **)&e->tokbuf, &e->tokbuf_cap, cross, sizeof(int32_t)));
    int32_t ntok = 0;
    for (int32_t i = 0; i < e->sched_n; i++) {
        seq_t *s = &e->seqs[e->sched[i]];
        kvp_exec_seq *x = &e->xs[i];
        x->req_id = s->req->id;
        x->context_len = s->num_computed;
        x->num_new = s->sched_new;
        x->sample = s->num_computed + s->sched_new == total_known(s);
        x->tokens = chunk_tokens(e, s, &off);
        x->block_table = NULL;
        x->num_blocks = 0;
        if (paged(e)) {
            kvp_bm_table_view v;
            KVP_TRY(kvp_bm_table(e->bm, e->sched[i], &v));
            x->block_table = v.blocks;
            x->num_blocks = v.num_blocks;
        }
        ntok += s->sched_new;
    }
    kvp_exec_batch batch = {.seqs = e->xs, .n = e->sched_n, .block_size = paged(e) ? e->cfg.block_size : 0};
    if (paged(e)) kvp_bm_step_ops_get(e->bm, &batch.ops);
    batch.offload = (kvp_exec_offload){e->tier_store, e->n_store, e->tier_load, e->n_load,
                                       e->cfg.host_write_policy == KVP_HC_WRITE_BACK};
    kvp_exec_result res = {.time_s = 0, .sampled = e->sampled};
    KVP_TRY(e->ex->step(e->ex->ctx, &batch, &res));
    if (paged(e)) kvp_bm_step_ops_clear(e->bm);
    e->n_store = e->n_load = 0;
    if (!(res.time_s > 0) || !isfinite(res.time_s))
        return KVP_ERR(KVP_ESTATE, "executor %s returned a step time of %g s", e->ex->name ? e->ex->name : "?",
                       res.time_s);
    integrate(e, res.time_s);
    e->now += res.time_s;
    e->steps++;
    e->computed_tokens += ntok;
    e->batch_tokens_sum += ntok;
    if (e->rq_n > e->max_running) e->max_running = e->rq_n;

    int32_t nfin = 0;
    for (int32_t i = 0; i < e->sched_n; i++) {
        int64_t idx = e->sched[i];
        seq_t *s = &e->seqs[idx];
        bool was_prefill = s->num_computed < s->prompt_len;
        s->num_computed += s->sched_new;
        s->sched_new = 0;
        if (was_prefill && s->num_computed >= s->prompt_len && !s->inserted) { /* prefill done */
            KVP_TRY(cache_computed(e, idx));
            s->inserted = true;
            if (!s->prompt_done) { /* its parallel samples find the prompt cached */
                s->prompt_done = true;
                KVP_TRY(release_children(e, idx, true));
            }
        }
        if (!e->xs[i].sample) continue;
        if ((size_t)s->num_generated + 1 > s->gen_cap)
            KVP_TRY(kvp_grow((void **)&s->gen, &s->gen_cap, (size_t)s->num_generated + 1, sizeof(int32_t)));
        /* a known answer is replayed (teacher forcing): a later prompt contains exactly these tokens */
        const bool known = s->req->output_tokens && s->num_generated < s->req->output_len;
        s->gen[s->num_generated] = known ? s->req->output_tokens[s->num_generated] : e->sampled[i];
        s->num_generated++;
        if (s->num_generated == 1) s->first_token_s = e->now;
        if (s->num_generated >= s->output_len) {
            KVP_TRY(finish(e, idx));
            nfin++;
        }
    }
    if (nfin > 0) { /* finished sequences leave the running queue at once */
        int32_t k = 0;
        for (int32_t i = 0; i < e->rq_n; i++)
            if (e->seqs[e->rq[i]].state == KVP_REQ_RUNNING) e->rq[k++] = e->rq[i];
        e->rq_n = k;
    }
    inf.time_s = e->now;
    inf.step_s = res.time_s;
    inf.num_scheduled = e->sched_n;
    inf.num_tokens = ntok;
    inf.num_finished = nfin;
    if (e->cfg.check_every_step) KVP_TRY(kvp_engine_check(e));
    if (info) *info = inf;
    return KVP_OK;
}

/* ---------------------------------------------------------------- run */

static int cmp_arrival(const void *a, const void *b)
{
    const kvp_request *x = *(const kvp_request *const *)a, *y = *(const kvp_request *const *)b;
    if (x->arrival_s != y->arrival_s) return x->arrival_s < y->arrival_s ? -1 : 1;
    return x < y ? -1 : (x > y);
}

static kvp_status check_empty(kvp_engine *e)
{
    if (paged(e)) {
        if (kvp_bm_num_seqs(e->bm) != 0)
            return KVP_ERR(KVP_ESTATE, "after the run %d sequences still hold blocks", (int)kvp_bm_num_seqs(e->bm));
        if (e->pc && kvp_pc_num_evictable(e->pc) != kvp_pc_num_cached(e->pc))
            return KVP_ERR(KVP_ESTATE, "after the run %lld cached blocks are still locked",
                           (long long)(kvp_pc_num_cached(e->pc) - kvp_pc_num_evictable(e->pc)));
        if (e->pc && kvp_pc_num_cached(e->pc) > 0) {
            e->flushed_blocks += kvp_pc_num_cached(e->pc);
            kvp_pc_flush(e->pc, NULL); /* every block (none is locked): the run is over, nothing to write back */
        }
        int32_t nfree = kvp_bm_num_free(e->bm);
        if (nfree != e->num_blocks)
            return KVP_ERR(KVP_ESTATE, "after the run %d of %d blocks are not back in the pool",
                           (int)(e->num_blocks - nfree), (int)e->num_blocks);
        kvp_block_pool *hp = kvp_bm_host_pool(e->bm);
        if (hp && kvp_pool_num_free(hp) != kvp_pool_num_blocks(hp))
            return KVP_ERR(KVP_ESTATE, "after the run %d host blocks are not back in the pool",
                           (int)(kvp_pool_num_blocks(hp) - kvp_pool_num_free(hp)));
        return kvp_bm_check(e->bm);
    }
    if (kvp_contig_num_reqs(e->arena) != 0 || kvp_contig_taken(e->arena) != 0)
        return KVP_ERR(KVP_ESTATE, "after the run %d reservations remain, %lld of %lld slots taken",
                       (int)kvp_contig_num_reqs(e->arena), (long long)kvp_contig_taken(e->arena), (long long)e->cfg.kv_slots);
    return kvp_contig_check(e->arena);
}

kvp_status kvp_engine_run(kvp_engine *e, const kvp_workload *w, kvp_progress_fn progress, void *pctx)
{
    if (e == NULL || w == NULL) return KVP_ERR(KVP_EINVAL, "engine run: NULL argument");
    const kvp_request **order = kvp_malloc((size_t)(w->n > 0 ? w->n : 1) * sizeof *order);
    if (order == NULL) return KVP_ERR(KVP_ENOMEM, "engine run: out of memory");
    bool sorted = true;
    for (int64_t i = 0; i < w->n; i++) {
        order[i] = &w->reqs[i];
        if (i > 0 && w->reqs[i].arrival_s < w->reqs[i - 1].arrival_s) sorted = false;
    }
    if (!sorted) qsort(order, (size_t)w->n, sizeof *order, cmp_arrival);
    kvp_status st = KVP_OK;
    const int64_t base = e->n_seqs;
    int64_t *pos = kvp_malloc((size_t)(w->n > 0 ? w->n : 1) * sizeof *pos); /* workload index -> sequence */
    if (pos == NULL) st = KVP_ERR(KVP_ENOMEM, "engine run: out of memory");
    for (int64_t i = 0; i < w->n && st == KVP_OK; i++) {
        pos[order[i] - w->reqs] = base + i;
        st = kvp_engine_add_request(e, order[i]);
    }
    for (int64_t i = 0; i < w->n && st == KVP_OK; i++) { /* answers waited for: parents come first */
        seq_t *s = &e->seqs[base + i];
        const int64_t a = s->req->after;
        if (a == 0) {
            if (s->req->after_prompt)
                st = KVP_ERR(KVP_EINVAL, "request %lld: a parallel sample (after_prompt) needs the request it samples "
                                         "from (after)", (long long)s->req->id);
            continue;
        }
        if (a < 0 || a > w->n || pos[a - 1] >= base + i || !(s->req->think_s >= 0) || !isfinite(s->req->think_s) ||
            (s->req->after_prompt && w->reqs[a - 1].arrival_s != s->req->arrival_s))
            st = KVP_ERR(KVP_EINVAL, "request %lld: after %lld is not an earlier request of the workload, or think_s %g "
                                     "is not a finite number >= 0, or a parallel sample (after_prompt) does not arrive "
                                     "with it", (long long)s->req->id, (long long)a, s->req->think_s);
        else {
            s->parent = pos[a - 1];
            s->next_sibling = e->seqs[s->parent].first_child;
            e->seqs[s->parent].first_child = base + i;
        }
    }
    kvp_free(pos);
    kvp_free(order);
    KVP_TRY(st);
    int64_t total = e->n_seqs;
    for (;;) {
        kvp_step_info inf;
        KVP_TRY(kvp_engine_step(e, &inf));
        if (inf.idle) break;
        if (e->cfg.on_step && inf.num_scheduled > 0) KVP_TRY(e->cfg.on_step(e->cfg.on_step_ctx, e, &inf));
        if (progress && (e->steps & 4095) == 0) progress(pctx, e->finished + e->rejected, total, e->now);
    }
    if (progress) progress(pctx, e->finished + e->rejected, total, e->now);
    return check_empty(e);
}

/* ---------------------------------------------------------------- metrics */

kvp_status kvp_engine_metrics_get(const kvp_engine *e, kvp_engine_metrics *m)
{
    if (e == NULL || m == NULL) return KVP_ERR(KVP_EINVAL, "engine metrics: NULL argument");
    memset(m, 0, sizeof *m);
    size_t n = (size_t)(e->finished > 0 ? e->finished : 1);
    double *ttft = kvp_malloc(n * sizeof *ttft), *tpot = kvp_malloc(n * sizeof *tpot),
           *e2e = kvp_malloc(n * sizeof *e2e);
    if (!ttft || !tpot || !e2e) {
        kvp_free(ttft);
        kvp_free(tpot);
        kvp_free(e2e);
        return KVP_ERR(KVP_ENOMEM, "engine metrics: out of memory");
    }
    int64_t nt = 0, np = 0;
    double norm_sum = 0;
    for (int64_t i = 0; i < e->n_seqs; i++) {
        const seq_t *s = &e->seqs[i];
        if (s->state != KVP_REQ_FINISHED) continue;
        double arr = s->arrival;
        ttft[nt] = s->first_token_s - arr;
        e2e[nt] = s->finish_s - arr;
        norm_sum += e2e[nt] / s->num_generated; /* >= 1: a finished request yielded a token */
        nt++;
        m->prompt_tokens += s->prompt_len;
        m->output_tokens += s->num_generated;
        if (s->num_generated >= 2) tpot[np++] = (s->finish_s - s->first_token_s) / (s->num_generated - 1);
    }
    kvp_sort_doubles(ttft, nt);
    kvp_sort_doubles(tpot, np);
    kvp_sort_doubles(e2e, nt);
    m->requests = e->n_seqs;
    m->finished = e->finished;
    m->rejected = e->rejected;
    m->clamped = e->clamped;
    m->steps = e->steps;
    m->sim_duration_s = e->last_finish_s;
    m->computed_tokens = e->computed_tokens;
    double d = m->sim_duration_s;
    m->throughput_tok_s = d > 0 ? (double)m->output_tokens / d : 0;
    m->total_tok_s = d > 0 ? (double)(m->output_tokens + m->prompt_tokens) / d : 0;
    m->req_per_s = d > 0 ? (double)m->finished / d : 0;
    m->ttft_p50_s = kvp_percentile(ttft, nt, 50);
    m->ttft_p99_s = kvp_percentile(ttft, nt, 99);
    m->ttft_mean_s = kvp_mean(ttft, nt);
    m->tpot_p50_s = kvp_percentile(tpot, np, 50);
    m->tpot_p99_s = kvp_percentile(tpot, np, 99);
    m->tpot_mean_s = kvp_mean(tpot, np);
    m->e2e_p50_s = kvp_percentile(e2e, nt, 50);
    m->e2e_p99_s = kvp_percentile(e2e, nt, 99);
    m->norm_latency_s = nt > 0 ? norm_sum / (double)nt : 0;
    kvp_free(ttft);
    kvp_free(tpot);
    kvp_free(e2e);
    double T = e->t_total;
    m->mean_running = T > 0 ? e->t_running / T : 0;
    m->mean_batch_tokens = e->steps > 0 ? (double)e->batch_tokens_sum / (double)e->steps : 0;
    m->max_running = e->max_running;
    m->preemptions = e->preemptions;
    m->swap_outs = e->swap_outs;
    m->swap_ins = e->swap_ins;
    m->recomputes = e->recomputes;
    m->readmit_hit_tokens = e->readmit_hit_tokens;
    m->prefix_hit_tokens = e->hit_tokens_first;
    m->prefix_hit_rate = e->prompt_tokens_first > 0 ? (double)e->hit_tokens_first / (double)e->prompt_tokens_first : 0;
    m->host_hit_tokens = e->host_hit_tokens_first;
    m->prefix_host_hit_rate =
        e->prompt_tokens_first > 0 ? (double)e->host_hit_tokens_first / (double)e->prompt_tokens_first : 0;
    m->host_loaded_blocks = e->host_loaded_blocks;
    m->host_stored_blocks = e->host_stored_blocks;
    if (e->pc) {
        kvp_pc_stats ps;
        kvp_pc_get_stats(e->pc, &ps);
        m->evicted_blocks = ps.evicted_blocks - e->flushed_blocks;
    }
    if (e->a_cap > 0) {
        m->kv_token_states = e->a_token / e->a_cap;
        m->kv_reserved = e->a_reserved / e->a_cap;
        m->kv_internal_frag = e->a_internal / e->a_cap;
        m->kv_external_frag = e->a_external / e->a_cap;
        m->kv_cached = e->a_cached / e->a_cap;
        m->kv_free = e->a_free / e->a_cap;
        m->kv_shared_savings = e->a_shared / e->a_cap;
    } else {
        m->kv_free = 1;
    }
    m->kv_util_in_use = e->a_in_use > 0 ? e->a_token / e->a_in_use : 0;
    m->kv_capacity_slots = paged(e) ? (int64_t)e->num_blocks * e->cfg.block_size : e->cfg.kv_slots;
    if (paged(e)) {
        int32_t held = e->num_blocks - kvp_bm_num_free(e->bm);
        if (e->pc) held -= (int32_t)kvp_pc_num_evictable(e->pc); /* cached and unused: reclaimable */
        m->leaked_blocks = e->rq_n + e->wq_n + e->sq_n == 0 && e->next_arrival >= e->n_seqs ? held : 0;
    } else {
        m->leaked_blocks = e->rq_n + e->wq_n + e->sq_n == 0 && e->next_arrival >= e->n_seqs
                               ? kvp_contig_taken(e->arena)
                               : 0;
    }
    return KVP_OK;
}

/* ---------------------------------------------------------------- checks and getters */

kvp_status kvp_engine_check(const kvp_engine *e)
{
    if (paged(e)) {
        KVP_TRY(kvp_bm_check(e->bm));
        if (e->pc) KVP_TRY(kvp_pc_check(e->pc));
        if (e->hc) KVP_TRY(kvp_hc_check(e->hc));
    } else {
        KVP_TRY(kvp_contig_check(e->arena));
    }
    kvp_kv_accounting a;
    kvp_engine_account(e, &a);
    if (kvp_kv_accounting_residual(&a) != 0)
        return KVP_ERR(KVP_ESTATE, "accounting identity broken by %lld slots", (long long)kvp_kv_accounting_residual(&a));
    int64_t cnt[KVP_REQ_REJECTED + 1] = {0};
    int64_t logical = 0;
    for (int64_t i = 0; i < e->n_seqs; i++) {
        const seq_t *s = &e->seqs[i];
        cnt[s->state]++;
        if (s->num_computed < 0 || s->num_computed > total_known(s) || s->num_generated > s->output_len)
            return KVP_ERR(KVP_ESTATE, "request %lld: computed %d, generated %d of %d out of range", (long long)i,
                           (int)s->num_computed, (int)s->num_generated, (int)s->output_len);
        bool holds = s->state == KVP_REQ_RUNNING || s->state == KVP_REQ_SWAPPED;
        if (paged(e)) {
            if (kvp_bm_has_seq(e->bm, i) != holds)
                return KVP_ERR(KVP_ESTATE, "request %lld in state %d %s blocks", (long long)i, (int)s->state,
                               holds ? "holds no" : "still holds");
            if (holds) {
                kvp_bm_table_view v;
                KVP_TRY(kvp_bm_table(e->bm, i, &v));
                if (v.num_tokens != s->num_computed)
                    return KVP_ERR(KVP_ESTATE, "request %lld: block table holds %d tokens, %d computed", (long long)i,
                                   (int)v.num_tokens, (int)s->num_computed);
                if (v.on_host != (s->state == KVP_REQ_SWAPPED))
                    return KVP_ERR(KVP_ESTATE, "request %lld: swapped state disagrees with its table", (long long)i);
                if (!v.on_host) logical += v.num_tokens;
            }
        } else {
            /* (only holders are looked up: a failed lookup formats an error message, too slow per step) */
            if (holds) {
                int64_t used;
                if (kvp_contig_get(e->arena, i, NULL, NULL, &used) != KVP_OK)
                    return KVP_ERR(KVP_ESTATE, "request %lld is running without a reservation", (long long)i);
                if (used != s->num_computed)
                    return KVP_ERR(KVP_ESTATE, "request %lld: %lld slots used, %d computed", (long long)i,
                                   (long long)used, (int)s->num_computed);
                logical += used;
            }
        }
        if (s->state == KVP_REQ_FINISHED && s->num_generated != s->output_len)
            return KVP_ERR(KVP_ESTATE, "request %lld finished with %d of %d tokens", (long long)i,
                           (int)s->num_generated, (int)s->output_len);
    }
    if (!paged(e) && kvp_contig_num_reqs(e->arena) != cnt[KVP_REQ_RUNNING])
        return KVP_ERR(KVP_ESTATE, "%d reservations for %lld running requests", (int)kvp_contig_num_reqs(e->arena),
                       (long long)cnt[KVP_REQ_RUNNING]);
    if (paged(e) && kvp_bm_num_seqs(e->bm) != cnt[KVP_REQ_RUNNING] + cnt[KVP_REQ_SWAPPED])
        return KVP_ERR(KVP_ESTATE, "the block manager holds %d sequences, the engine %lld",
                       (int)kvp_bm_num_seqs(e->bm), (long long)(cnt[KVP_REQ_RUNNING] + cnt[KVP_REQ_SWAPPED]));
    if (cnt[KVP_REQ_RUNNING] != e->rq_n || cnt[KVP_REQ_WAITING] != e->wq_n || cnt[KVP_REQ_SWAPPED] != e->sq_n)
        return KVP_ERR(KVP_ESTATE, "queue sizes (running %d, waiting %lld, swapped %lld) disagree with states",
                       (int)e->rq_n, (long long)e->wq_n, (long long)e->sq_n);
    if (a.logical_tokens != logical)
        return KVP_ERR(KVP_ESTATE, "accounting counts %lld logical tokens, sequences hold %lld",
                       (long long)a.logical_tokens, (long long)logical);
    if (a.token_states > logical)
        return KVP_ERR(KVP_ESTATE, "more token states (%lld) than tokens held (%lld)", (long long)a.token_states,
                       (long long)logical);
    for (int32_t i = 1; i < e->rq_n; i++)
        if (!rank_less(e, e->rq[i - 1], e->rq[i])) return KVP_ERR(KVP_ESTATE, "running queue out of rank order");
    for (int64_t i = 1; i < e->wq_n; i++)
        if (!rank_less(e, e->wq[e->wq_head + i - 1], e->wq[e->wq_head + i]))
            return KVP_ERR(KVP_ESTATE, "waiting queue out of rank order");
    for (int64_t i = 0; i < e->wq_n; i++)
        if (e->seqs[e->wq[e->wq_head + i]].state != KVP_REQ_WAITING)
            return KVP_ERR(KVP_ESTATE, "waiting queue holds a request in another state");
    return KVP_OK;
}

int64_t kvp_engine_steps(const kvp_engine *e) { return e->steps; }
int32_t kvp_engine_num_running(const kvp_engine *e) { return e->rq_n; }
int32_t kvp_engine_num_waiting(const kvp_engine *e) { return (int32_t)e->wq_n; }
int32_t kvp_engine_num_swapped(const kvp_engine *e) { return (int32_t)e->sq_n; }
double kvp_engine_now(const kvp_engine *e) { return e->now; }

kvp_status kvp_engine_request(const kvp_engine *e, int64_t index, kvp_req_result *out)
{
    if (e == NULL || out == NULL || index < 0 || index >= e->n_seqs)
        return KVP_ERR(KVP_EINVAL, "engine: no request with index %lld", (long long)index);
    const seq_t *s = &e->seqs[index];
    out->id = s->req->id;
    out->arrival_s = s->arrival;
    out->prompt_len = s->prompt_len;
    out->cached_tokens = s->hit_first;
    out->state = s->state;
    out->num_computed = s->num_computed;
    out->num_generated = s->num_generated;
    out->output_len = s->output_len;
    out->preemptions = s->preemptions;
    out->admit_s = s->admit_s;
    out->first_token_s = s->first_token_s;
    out->finish_s = s->finish_s;
    return KVP_OK;
}
