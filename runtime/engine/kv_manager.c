/* runtime/engine/kv_manager.c — the engine's KV memory: the only caller of blockmgr/, prefix_cache/ and the
 * host tier from runtime/ (contract: engine_internal.h).
 *
 *   paged:       block manager (device pool + swap pool) <- prefix cache (radix | hash) -> host tier (LRU)
 *   contiguous:  one arena of slots, a reservation per request (the Orca baselines)
 *
 * Host-tier moves are not run here: they are queued (tier_store, tier_load) and handed to the executor with
 * the next batch, in the order executor.h states.
 */
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/kv_events.h"
#include "runtime/engine/engine_internal.h"

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

/* Whether a load of the next executor step still has to read tier slot `slot` (stores run before loads). */
static bool load_pending(const kvp_engine *e, int32_t slot) { return slot >= 0 && e->load_step[slot] == e->steps; }

/* Appends a host-tier move to *v for the next executor step. */
static kvp_status push_move(kvp_block_copy **v, int32_t *n, size_t *cap, int32_t src, int32_t dst)
{
    KVP_TRY(kvp_grow((void **)v, cap, (size_t)*n + 1, sizeof **v));
    (*v)[(*n)++] = (kvp_block_copy){src, dst};
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
    kvp_ledger_host_stored(e->ledger, &hash, 1);
}

int64_t kvm_blocks_for(const kvp_engine *e, int64_t len) { return (len + e->cfg.block_size - 1) / e->cfg.block_size; }

kvp_status kvm_create(kvp_engine *e)
{
    const kvp_engine_config *c = &e->cfg;
    const int64_t nb = paged(e) ? c->kv_slots / c->block_size : c->kv_slots;
    if (nb < 1)
        return KVP_ERR(KVP_EINVAL, "KV memory of %lld token slots holds no block of %d tokens", (long long)c->kv_slots,
                       (int)c->block_size);
    if (paged(e) && nb > INT32_MAX - 1)
        return KVP_ERR(KVP_EINVAL, "too many KV blocks (%lld): use a larger block size", (long long)nb);
    if (paged(e) && c->watermark_blocks >= nb)
        return KVP_ERR(KVP_EINVAL, "watermark_blocks %d leaves nothing of the %lld KV blocks to admit requests with",
                       (int)c->watermark_blocks, (long long)nb);
    if (!paged(e)) {
        e->contig_policy = c->alloc == KVP_ALLOC_ORCA_MAX    ? KVP_CONTIG_MAX
                           : c->alloc == KVP_ALLOC_ORCA_POW2 ? KVP_CONTIG_POW2
                                                             : KVP_CONTIG_ORACLE;
        return kvp_contig_create(c->kv_slots, c->arena, &e->arena);
    }
    kvp_bm_config bc = {.num_blocks = (int32_t)nb, .block_size = c->block_size, .num_host_blocks = swap_blocks(c),
                        .max_seq_len = c->max_model_len, .watermark_blocks = c->watermark_blocks};
    e->num_blocks = (int32_t)nb;
    KVP_TRY(kvp_bm_create(&bc, &e->bm));
    if (c->cache != KVP_PC_NONE) {
        KVP_TRY(kvp_pc_create(c->cache, c->evict, kvp_bm_pool(e->bm), c->block_size, &e->pc));
        KVP_TRY(kvp_ledger_create(c->block_size, 4 * nb, &e->ledger));
        KVP_TRY(kvp_ledger_attach(e->ledger, e->pc));
        if (c->kv_events) {
            KVP_TRY(kvp_kve_open(c->kv_events, c->block_size, &e->kve));
            KVP_TRY(kvp_kve_attach(e->kve, e->pc));
        }
    }
    e->hc_base = swap_blocks(c);
    const int32_t tier = (int32_t)(c->host_cache_slots / c->block_size);
    if (tier == 0) return KVP_OK;
    KVP_TRY(kvp_hc_create(tier, &e->hc));
    if ((e->load_step = kvp_malloc((size_t)tier * sizeof *e->load_step)) == NULL)
        return KVP_ERR(KVP_ENOMEM, "engine: out of memory for a host tier of %d blocks", tier);
    for (int32_t i = 0; i < tier; i++) e->load_step[i] = -1;
    if (c->host_write_policy == KVP_HC_WRITE_BACK) kvp_pc_set_evict_hook(e->pc, write_back, e);
    return KVP_OK;
}

void kvm_destroy(kvp_engine *e)
{
    if (e->kve && kvp_kve_close(e->kve) != KVP_OK) kvp_error_clear(); /* a write error was reported at its step */
    kvp_ledger_destroy(e->ledger);
    kvp_pc_destroy(e->pc); /* before the block manager: it holds references on its pool */
    kvp_hc_destroy(e->hc);
    kvp_bm_destroy(e->bm);
    kvp_contig_destroy(e->arena);
    void *b[] = {e->hit_scratch, e->seqbuf, e->hashes, e->hslots, e->tier_store, e->tier_load, e->load_step};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) kvp_free(b[i]);
}

int32_t kvm_free_blocks(const kvp_engine *e) { return kvp_bm_num_free(e->bm); }

kvp_status kvm_known_tokens(kvp_engine *e, const seq_t *s, int32_t n, const int32_t **out)
{
    const req_t *r = RQ_(e, s);
    *out = r->req->tokens;
    if (n <= r->prompt_len) return KVP_OK;
    KVP_TRY(kvp_grow((void **)&e->seqbuf, &e->seqbuf_cap, (size_t)n, sizeof(int32_t)));
    memcpy(e->seqbuf, r->req->tokens, (size_t)r->prompt_len * sizeof(int32_t));
    memcpy(e->seqbuf + r->prompt_len, s->gen, (size_t)(n - r->prompt_len) * sizeof(int32_t));
    *out = e->seqbuf;
    return KVP_OK;
}

/* The chain hashes of s's first n_blocks full blocks in e->hashes, and room for as many slots in e->hslots. */
static kvp_status chain_hashes(kvp_engine *e, const seq_t *s, int32_t n_blocks)
{
    const int32_t *toks;
    KVP_TRY(kvm_known_tokens(e, s, n_blocks * e->cfg.block_size, &toks));
    KVP_TRY(kvp_grow((void **)&e->hashes, &e->hashes_cap, (size_t)n_blocks + 1, sizeof *e->hashes));
    KVP_TRY(kvp_grow((void **)&e->hslots, &e->hslots_cap, (size_t)n_blocks + 1, sizeof *e->hslots));
    kvp_pc_chain_hashes(toks, n_blocks, e->cfg.block_size, 0, e->hashes);
    return KVP_OK;
}

kvp_status kvm_match(kvp_engine *e, const seq_t *s, int32_t n, bool lock, int32_t *n_hit, int32_t *n_load)
{
    *n_hit = *n_load = 0;
    if (e->pc == NULL) return KVP_OK;
    const int32_t bs = e->cfg.block_size, maxb = n / bs + 1;
    const int32_t *toks;
    KVP_TRY(kvm_known_tokens(e, s, n, &toks));
    if (maxb > e->hit_scratch_cap) {
        size_t cap = (size_t)e->hit_scratch_cap;
        KVP_TRY(kvp_grow((void **)&e->hit_scratch, &cap, (size_t)maxb, sizeof(int32_t)));
        e->hit_scratch_cap = (int32_t)cap;
    }
    const kvp_pc_hint hint = {.priority = RQ_(e, s)->req->priority};
    KVP_TRY(kvp_pc_match(e->pc, toks, n, lock ? &hint : NULL, lock, e->hit_scratch, maxb, n_hit));
    /* the host tier: the blocks after the hit, a prefix of the first n tokens, never the last */
    const int32_t tier_max = (n - 1) / bs;
    if (e->hc == NULL || tier_max <= *n_hit) return KVP_OK;
    kvp_status st = chain_hashes(e, s, tier_max);
    if (st != KVP_OK) {
        if (lock) kvm_unmatch(e, *n_hit);
        return st;
    }
    *n_load = kvp_hc_match(e->hc, e->hashes + *n_hit, tier_max - *n_hit, e->hslots);
    /* the slots an admission loads from are pending from now on: evictions may write back (if the admission
     * fails, they stay marked for this step, which only drops write-backs) */
    for (int32_t i = 0; lock && i < *n_load; i++) e->load_step[e->hslots[i]] = e->steps;
    return KVP_OK;
}

void kvm_unmatch(kvp_engine *e, int32_t n_hit)
{
    if (n_hit > 0) kvp_pc_unlock(e->pc, e->hit_scratch, n_hit);
}

kvp_status kvm_make_room(kvp_engine *e, int32_t need)
{
    if (e->pc == NULL) return KVP_OK;
    KVP_TRY(kvp_pc_evict_until_free(e->pc, need));
    return e->write_back_st;
}

bool kvm_can_reserve(const kvp_engine *e, const seq_t *s) { return kvp_contig_can_reserve(e->arena, s->reserve_len); }

kvp_status kvm_admit(kvp_engine *e, seq_t *s, int32_t n_hit, int32_t n_load, int32_t n_tokens, bool readmission)
{
    if (!paged(e)) {
        const req_t *r = RQ_(e, s);
        KVP_TRY(kvp_contig_reserve(e->arena, s->bm_id, s->reserve_len, (int64_t)r->prompt_len + r->output_len, NULL));
        kvp_status st = kvp_contig_grow(e->arena, s->bm_id, n_tokens);
        if (st != KVP_OK) kvp_contig_free(e->arena, s->bm_id);
        return st;
    }
    int32_t *hits = NULL;
    if (n_hit > 0) {
        if ((hits = kvp_malloc((size_t)n_hit * sizeof *hits)) == NULL)
            return KVP_ERR(KVP_ENOMEM, "engine: out of memory recording a prefix hit");
        memcpy(hits, e->hit_scratch, (size_t)n_hit * sizeof *hits);
    }
    kvp_status st = kvp_bm_allocate_prefixed(e->bm, s->bm_id, n_tokens, hits, n_hit);
    if (st != KVP_OK) {
        kvp_free(hits);
        return st;
    }
    s->hit = hits;
    s->n_hit = n_hit;
    s->seen_hit = n_hit;
    if (e->ledger) { /* why the rest missed, before the blocks it computes are cached */
        const int32_t n = total_known(e, s);
        const int32_t *toks;
        st = kvm_known_tokens(e, s, n, &toks);
        if (st == KVP_OK) st = kvp_ledger_lookup(e->ledger, toks, n, 0, n_hit, n_load, readmission, NULL);
        if (st != KVP_OK) return st;
    }
    if (n_load == 0) return KVP_OK;
    kvp_bm_table_view v;
    st = kvp_bm_table(e->bm, s->bm_id, &v);
    for (int32_t i = 0; st == KVP_OK && i < n_load; i++)
        st = push_move(&e->tier_load, &e->n_load, &e->load_cap, e->hc_base + e->hslots[i], v.blocks[n_hit + i]);
    e->host_loaded_blocks += n_load;
    return st; /* after the allocation a failure leaves the engine undefined (engine.h) */
}

kvp_status kvm_append_needed(const kvp_engine *e, const seq_t *s, int32_t k, int32_t *need)
{
    return kvp_bm_append_blocks_needed(e->bm, s->bm_id, k, need);
}

kvp_status kvm_append(kvp_engine *e, seq_t *s, int32_t k)
{
    return paged(e) ? kvp_bm_append(e->bm, s->bm_id, k, NULL) : kvp_contig_grow(e->arena, s->bm_id, k);
}

/* Write-through (and its selective form): blocks[0..n_full) of s, just cached, go to the host tier too (those
 * not held there). The moves run first in the next executor step, before anything can overwrite the blocks.
 * Stores are decided after a step ran or while scheduling preempts by recompute, which comes before any
 * admission, and loads only at admissions, run in the same step: so no store can take a slot that a pending
 * load still has to read (checked). */
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
    kvp_ledger_host_stored(e->ledger, e->hashes, n_full);
    return KVP_OK;
}

kvp_status kvm_cache_computed(kvp_engine *e, seq_t *s)
{
    const int32_t n_full = s->num_computed / e->cfg.block_size;
    if (e->pc == NULL || n_full == 0) return KVP_OK;
    const int32_t *toks;
    KVP_TRY(kvm_known_tokens(e, s, s->num_computed, &toks));
    kvp_bm_table_view v;
    KVP_TRY(kvp_bm_table(e->bm, s->bm_id, &v));
    kvp_pc_hint hint = {.priority = RQ_(e, s)->req->priority};
    KVP_TRY(kvp_pc_insert(e->pc, toks, s->num_computed, v.blocks, n_full, &hint, 0, NULL));
    KVP_TRY(kvp_ledger_computed(e->ledger, toks, s->num_computed, 0));
    const int32_t n_store = e->hc ? kvp_hc_blocks_to_store(e->cfg.host_write_policy, n_full, s->seen_hit) : 0;
    return n_store > 0 ? host_store(e, s, v.blocks, n_store) : KVP_OK;
}

kvp_status kvm_release(kvp_engine *e, seq_t *s)
{
    kvp_status st = KVP_OK;
    if (s->n_hit > 0 && e->pc) st = kvp_pc_unlock(e->pc, s->hit, s->n_hit);
    kvp_free(s->hit);
    s->hit = NULL;
    s->n_hit = 0;
    KVP_TRY(st);
    return paged(e) ? kvp_bm_free(e->bm, s->bm_id) : kvp_contig_free(e->arena, s->bm_id);
}

kvp_status kvm_swap_out(kvp_engine *e, seq_t *s)
{
    kvp_block_pool *hp = paged(e) ? kvp_bm_host_pool(e->bm) : NULL;
    if (hp == NULL) return KVP_ENOBLOCKS;
    kvp_bm_table_view v;
    KVP_TRY(kvp_bm_table(e->bm, s->bm_id, &v));
    if (kvp_pool_num_free(hp) < v.num_blocks) return KVP_ENOBLOCKS;
    if (s->n_hit > 0 && e->pc) KVP_TRY(kvp_pc_unlock(e->pc, s->hit, s->n_hit));
    kvp_free(s->hit);
    s->hit = NULL;
    s->n_hit = 0;
    kvp_status st = kvp_bm_swap_out(e->bm, &s->bm_id, 1);
    if (st == KVP_ENOBLOCKS) kvp_error_clear();
    return st;
}

kvp_status kvm_swap_in_needed(const kvp_engine *e, const seq_t *s, int32_t *need)
{
    return kvp_bm_swap_in_blocks_needed(e->bm, &s->bm_id, 1, need);
}

kvp_status kvm_swap_in(kvp_engine *e, seq_t *s) { return kvp_bm_swap_in(e->bm, &s->bm_id, 1); }

kvp_status kvm_fork(kvp_engine *e, const seq_t *parent, const seq_t *child)
{
    return kvp_bm_fork(e->bm, parent->bm_id, child->bm_id);
}

kvp_status kvm_truncate(kvp_engine *e, seq_t *s, int32_t n_tokens) { return kvp_bm_truncate(e->bm, s->bm_id, n_tokens); }

kvp_status kvm_table(const kvp_engine *e, const seq_t *s, kvp_bm_table_view *v) { return kvp_bm_table(e->bm, s->bm_id, v); }

void kvm_batch_moves(kvp_engine *e, kvp_exec_batch *b)
{
    if (paged(e)) kvp_bm_step_ops_get(e->bm, &b->ops);
    b->offload = (kvp_exec_offload){e->tier_store, e->n_store, e->tier_load, e->n_load,
                                    e->cfg.host_write_policy == KVP_HC_WRITE_BACK};
    e->cow_copies += b->ops.n_copies;
}

void kvm_step_done(kvp_engine *e)
{
    if (paged(e)) kvp_bm_step_ops_clear(e->bm);
    e->n_store = e->n_load = 0;
}

void kvm_account(const kvp_engine *e, kvp_kv_accounting *a)
{
    if (paged(e)) {
        kvp_bm_account(e->bm, false, a);
        return;
    }
    int64_t pending = 0;
    if (e->wq_n > 0) pending = S_(e, e->wq[e->wq_head])->reserve_len;
    kvp_contig_account(e->arena, pending, a);
}

kvp_status kvm_check(const kvp_engine *e)
{
    if (!paged(e)) return kvp_contig_check(e->arena);
    KVP_TRY(kvp_bm_check(e->bm));
    if (e->pc) KVP_TRY(kvp_pc_check(e->pc));
    if (e->hc) KVP_TRY(kvp_hc_check(e->hc));
    return KVP_OK;
}

/* s holds (running or swapped) or not: its table agrees; *logical counts the device tokens it holds. */
kvp_status kvm_check_seq(const kvp_engine *e, const seq_t *s, bool holds, int64_t *logical)
{
    if (paged(e)) {
        if (kvp_bm_has_seq(e->bm, s->bm_id) != holds)
            return KVP_ERR(KVP_ESTATE, "sequence %lld in state %d %s blocks", (long long)s->bm_id, (int)s->state,
                           holds ? "holds no" : "still holds");
        if (!holds) return KVP_OK;
        kvp_bm_table_view v;
        KVP_TRY(kvp_bm_table(e->bm, s->bm_id, &v));
        if (v.num_tokens != s->num_computed)
            return KVP_ERR(KVP_ESTATE, "sequence %lld: block table holds %d tokens, %d computed", (long long)s->bm_id,
                           (int)v.num_tokens, (int)s->num_computed);
        if (v.on_host != (s->state == SEQ_SWAPPED))
            return KVP_ERR(KVP_ESTATE, "sequence %lld: swapped state disagrees with its table", (long long)s->bm_id);
        if (!v.on_host) *logical += v.num_tokens;
        return KVP_OK;
    }
    if (!holds) return KVP_OK; /* (only holders are looked up: a failed lookup formats an error message) */
    int64_t used;
    if (kvp_contig_get(e->arena, s->bm_id, NULL, NULL, &used) != KVP_OK)
        return KVP_ERR(KVP_ESTATE, "sequence %lld is running without a reservation", (long long)s->bm_id);
    if (used != s->num_computed)
        return KVP_ERR(KVP_ESTATE, "sequence %lld: %lld slots used, %d computed", (long long)s->bm_id, (long long)used,
                       (int)s->num_computed);
    *logical += used;
    return KVP_OK;
}

kvp_status kvm_check_empty(kvp_engine *e)
{
    if (!paged(e)) {
        if (kvp_contig_num_reqs(e->arena) != 0 || kvp_contig_taken(e->arena) != 0)
            return KVP_ERR(KVP_ESTATE, "after the run %d reservations remain, %lld of %lld slots taken",
                           (int)kvp_contig_num_reqs(e->arena), (long long)kvp_contig_taken(e->arena),
                           (long long)e->cfg.kv_slots);
        return kvp_contig_check(e->arena);
    }
    if (kvp_bm_num_seqs(e->bm) != 0)
        return KVP_ERR(KVP_ESTATE, "after the run %d sequences still hold blocks", (int)kvp_bm_num_seqs(e->bm));
    if (e->pc && kvp_pc_num_evictable(e->pc) != kvp_pc_num_cached(e->pc))
        return KVP_ERR(KVP_ESTATE, "after the run %lld cached blocks are still locked",
                       (long long)(kvp_pc_num_cached(e->pc) - kvp_pc_num_evictable(e->pc)));
    if (e->ledger) { /* before the flush: the blocks still cached are no lifetimes */
        kvp_ledger_get_stats(e->ledger, &e->ledger_final);
        e->ledger_final_taken = true;
    }
    if (e->pc && kvp_pc_num_cached(e->pc) > 0) {
        e->flushed_blocks += kvp_pc_num_cached(e->pc);
        kvp_pc_flush(e->pc, NULL); /* every block (none is locked): the run is over, nothing to write back */
    }
    int32_t nfree = kvp_bm_num_free(e->bm);
    if (nfree != e->num_blocks)
        return KVP_ERR(KVP_ESTATE, "after the run %d of %d blocks are not back in the pool", (int)(e->num_blocks - nfree),
                       (int)e->num_blocks);
    kvp_block_pool *hp = kvp_bm_host_pool(e->bm);
    if (hp && kvp_pool_num_free(hp) != kvp_pool_num_blocks(hp))
        return KVP_ERR(KVP_ESTATE, "after the run %d host blocks are not back in the pool",
                       (int)(kvp_pool_num_blocks(hp) - kvp_pool_num_free(hp)));
    return kvp_bm_check(e->bm);
}

kvp_status kvm_reset_prefix_cache(kvp_engine *e, int64_t *evicted)
{
    int64_t n = 0;
    if (e->pc) kvp_pc_flush(e->pc, &n);
    if (e->hc) kvp_hc_clear(e->hc); /* its host tier too: a cold cache */
    e->flushed_blocks += n;
    if (evicted) *evicted = n;
    return KVP_OK;
}

int64_t kvm_evicted_blocks(const kvp_engine *e)
{
    if (e->pc == NULL) return 0;
    kvp_pc_stats ps;
    kvp_pc_get_stats(e->pc, &ps);
    return ps.evicted_blocks - e->flushed_blocks;
}

int64_t kvm_capacity_slots(const kvp_engine *e)
{
    return paged(e) ? (int64_t)e->num_blocks * e->cfg.block_size : e->cfg.kv_slots;
}

void kvm_step_begin(kvp_engine *e)
{
    if (e->ledger) kvp_ledger_set_time(e->ledger, e->now);
}

kvp_status kvm_step_end(kvp_engine *e) { return e->kve ? kvp_kve_flush(e->kve, e->now) : KVP_OK; }

void kvm_ledger_stats(const kvp_engine *e, kvp_ledger_stats *out)
{
    if (e->ledger_final_taken) *out = e->ledger_final;
    else if (e->ledger) kvp_ledger_get_stats(e->ledger, out);
    else memset(out, 0, sizeof *out);
}
