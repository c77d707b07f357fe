/* runtime/executor/cpu_executor.c — the engine's cpu executor: block moves, one batched forward pass, logits
 * (contract: cpu_executor.h). */
#include "runtime/executor/cpu_executor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/timer.h"
#include "parallel/comm.h"

typedef struct {
    kvp_model *m;
    kvp_kv_cache *kv;   /* device pools */
    kvp_kv_cache *host; /* host pools (swap, host tier), or NULL */
    int32_t block_size;
    int32_t vocab;
    int32_t *pairs;
    float *logits;
    size_t c_pairs, c_logits;
} cpu_ctx;

static void destroy(void *p)
{
    cpu_ctx *c = p;
    if (!c) return;
    kvp_kv_cache_destroy(c->kv);
    kvp_kv_cache_destroy(c->host);
    kvp_free(c->pairs);
    kvp_free(c->logits);
    kvp_free(c);
}

/* (src, dst) pairs of moves into c->pairs. */
static kvp_status pairs_of(cpu_ctx *c, const kvp_block_copy *moves, int32_t n)
{
    KVP_TRY(kvp_grow((void **)&c->pairs, &c->c_pairs, 2 * (size_t)n, sizeof *c->pairs));
    for (int32_t i = 0; i < n; i++) {
        c->pairs[2 * i] = moves[i].src;
        c->pairs[2 * i + 1] = moves[i].dst;
    }
    return KVP_OK;
}

/* Moves between device and host pools, layer by layer. */
static kvp_status move_blocks(void *ctx, const kvp_block_copy *moves, int32_t n, int to_host)
{
    cpu_ctx *c = ctx;
    if (n == 0) return KVP_OK;
    if (!c->host) return KVP_ERR(KVP_EUNSUPPORTED, "cpu executor: a move to or from the host, but no host blocks were given");
    KVP_TRY(pairs_of(c, moves, n));
    return to_host ? kvp_kv_cache_move_blocks(c->host, c->kv, c->pairs, n) : kvp_kv_cache_move_blocks(c->kv, c->host, c->pairs, n);
}

/* The step's time: measured here, or under tensor parallelism rank 0's, so that every rank's engine sees
 * the same clock and takes the same decisions. */
static kvp_status step_time(const cpu_ctx *c, double t0, kvp_exec_result *out)
{
    out->time_s = kvp_now_s() - t0 + 1e-9;
    kvp_comm *comm = kvp_model_comm(c->m);
    return comm ? kvp_comm_broadcast(comm, &out->time_s, sizeof out->time_s, 0) : KVP_OK;
}

static kvp_status step(void *ctx, const kvp_exec_batch *b, kvp_exec_result *out)
{
    cpu_ctx *c = ctx;
    const double t0 = kvp_now_s();
    if (b->n > 0 && b->block_size != c->block_size)
        return KVP_ERR(KVP_EINVAL, "cpu executor: block size %d, the engine uses %d (or contiguous allocation)",
                       c->block_size, b->block_size);
    KVP_TRY(kvp_exec_batch_moves(b, c, move_blocks));
    if (b->ops.n_copies > 0) {
        KVP_TRY(pairs_of(c, b->ops.copies, b->ops.n_copies));
        KVP_TRY(kvp_kv_cache_copy_blocks(c->kv, c->pairs, b->ops.n_copies));
    }
    out->logits = NULL;
    out->vocab = c->vocab;
    if (b->n == 0) return step_time(c, t0, out);
    for (int32_t i = 0; i < b->n; i++)
        if (!b->seqs[i].tokens)
            return KVP_ERR(KVP_EUNSUPPORTED, "cpu executor: request %lld has no token ids (a %d-token chunk at %d)",
                           (long long)b->seqs[i].req_id, b->seqs[i].num_new, b->seqs[i].context_len);
    const kvp_exec_flat *f = &b->flat;
    if (f->qo_indptr == NULL) return KVP_ERR(KVP_EINVAL, "cpu executor: the batch has no flat form");
    KVP_TRY(kvp_grow((void **)&c->logits, &c->c_logits, (size_t)f->num_rows * (size_t)c->vocab, sizeof *c->logits));
    const kvp_fwd_batch fb = {.num_seqs = b->n, .num_tokens = f->num_tokens, .tokens = f->tokens,
                              .positions = f->positions, .slot_mapping = f->slot_mapping, .qo_indptr = f->qo_indptr,
                              .kv_indptr = f->kv_indptr, .kv_indices = f->kv_indices,
                              .kv_last_page_len = f->kv_last_page_len, .all_logits = 0,
                              .all_logits_of = f->num_rows > b->n ? f->all_logits : NULL};
    KVP_TRY(kvp_model_forward(c->m, c->kv, &fb, c->logits));
    out->logits = c->logits;
    return step_time(c, t0, out);
}

static void parallel(void *ctx, int n, void (*fn)(void *arg, int i), void *arg)
{
    kvp_model_run(((cpu_ctx *)ctx)->m, n, fn, arg);
}

static int threads(void *ctx) { return kvp_model_get_threads(((cpu_ctx *)ctx)->m); }

kvp_status kvp_cpu_executor_create(kvp_model *m, int32_t num_blocks, int32_t block_size, int32_t num_host_blocks,
                                   kvp_dtype kv_dtype, kvp_executor *out)
{
    if (num_host_blocks < 0) return KVP_ERR(KVP_EINVAL, "cpu executor: num_host_blocks %d < 0", num_host_blocks);
    char what[96];
    snprintf(what, sizeof what, "a KV cache of %d blocks of %d tokens", num_blocks, block_size);
    KVP_TRY(kvp_check_fits_in_memory(kvp_kv_cache_bytes(m, kv_dtype, (int64_t)num_blocks + num_host_blocks, block_size), what));
    cpu_ctx *c = kvp_calloc(1, sizeof *c);
    if (!c) return KVP_ERR(KVP_ENOMEM, "cpu executor: out of memory");
    c->m = m;
    c->block_size = block_size;
    c->vocab = (int32_t)kvp_model_cfg(m)->vocab_size;
    kvp_status st = kvp_kv_cache_create(m, kv_dtype, num_blocks, block_size, &c->kv);
    if (st == KVP_OK && num_host_blocks > 0) st = kvp_kv_cache_create(m, kv_dtype, num_host_blocks, block_size, &c->host);
    if (st != KVP_OK) {
        destroy(c);
        return st;
    }
    *out = (kvp_executor){.name = "cpu", .ctx = c, .flat = 1, .step = step, .destroy = destroy, .parallel = parallel,
                          .threads = threads};
    return KVP_OK;
}

kvp_status kvp_exec_session_config(const kvp_model *m, const kvp_session_config *cfg, int32_t *eos,
                                   kvp_session_config *c, int32_t *host_blocks)
{
    *c = *cfg;
    const kvp_model_config *mc = kvp_model_cfg(m);
    for (int32_t i = 0; i < mc->n_eos; i++) eos[i] = (int32_t)mc->eos_token_ids[i];
    c->engine.eos_ids = eos;
    c->engine.n_eos = mc->n_eos;
    c->engine.max_model_len = kvp_model_max_len(m);
    c->vocab = (int32_t)mc->vocab_size;
    if (c->swap_blocks < 0) c->swap_blocks = c->engine.preempt == KVP_PREEMPT_SWAP ? c->num_blocks : 0;
    kvp_engine_config ec = c->engine;
    ec.host_slots = (int64_t)c->swap_blocks * ec.block_size;
    ec.host_cache_slots = (int64_t)c->host_cache_blocks * ec.block_size;
    const int64_t host = kvp_engine_host_blocks(&ec);
    if (host > INT32_MAX / 2) return KVP_ERR(KVP_EINVAL, "generate: %lld host blocks are too many", (long long)host);
    *host_blocks = (int32_t)host;
    return KVP_OK;
}

kvp_status kvp_cpu_session_create(kvp_model *m, const kvp_session_config *cfg, kvp_session **out)
{
    if (!m || !cfg || !out) return KVP_ERR(KVP_EINVAL, "generate: NULL argument");
    if (cfg->num_blocks < 1 || cfg->engine.block_size < 1)
        return KVP_ERR(KVP_EINVAL, "generate: num_blocks (%d) and block_size (%d) must be >= 1", cfg->num_blocks,
                       cfg->engine.block_size);
    kvp_session_config c;
    int32_t eos[KVP_MAX_EOS_IDS], host = 0;
    KVP_TRY(kvp_exec_session_config(m, cfg, eos, &c, &host));
    kvp_executor ex;
    KVP_TRY(kvp_cpu_executor_create_tp(m, c.num_blocks, c.engine.block_size, host, c.kv_dtype, &ex));
    return kvp_session_create(&c, ex, out);
}

kvp_status kvp_cpu_executor_create_tp(kvp_model *m, int32_t num_blocks, int32_t block_size, int32_t num_host_blocks,
                                      kvp_dtype kv_dtype, kvp_executor *out)
{
    kvp_comm *comm = kvp_model_comm(m);
    if (comm && kvp_comm_size(comm) > 1 && kvp_comm_rank(comm) != 0)
        return KVP_ERR(KVP_ESTATE, "tensor parallelism: rank %d executes rank 0's plans (kvp_cpu_follow)",
                       kvp_comm_rank(comm));
    kvp_executor ex;
    KVP_TRY(kvp_cpu_executor_create(m, num_blocks, block_size, num_host_blocks, kv_dtype, &ex));
    if (!comm || kvp_comm_size(comm) == 1) {
        *out = ex;
        return KVP_OK;
    }
    const kvp_tp_shape shape = {num_blocks, block_size, num_host_blocks, (int32_t)kv_dtype, 0, 0};
    return kvp_tp_leader_create(comm, &shape, ex, out);
}

static kvp_status make_follower(void *ctx, const kvp_tp_shape *sh, kvp_executor *ex)
{
    return kvp_cpu_executor_create(ctx, sh->num_blocks, sh->block_size, sh->num_host_blocks, (kvp_dtype)sh->kv_dtype, ex);
}

kvp_status kvp_cpu_follow(kvp_model *m, int64_t *steps)
{
    kvp_comm *comm = kvp_model_comm(m);
    if (!comm || kvp_comm_size(comm) < 2 || kvp_comm_rank(comm) == 0)
        return KVP_ERR(KVP_EINVAL, "tensor parallelism: only ranks but 0 of several follow rank 0's plans");
    return kvp_tp_follow(comm, make_follower, m, steps);
}

kvp_status kvp_cpu_generate(kvp_model *m, const kvp_session_config *cfg, const kvp_session_request *reqs, int32_t n,
                            kvp_session_result *results, kvp_run_stats *stats,
                            void (*on_step)(void *ctx, kvp_session *s), void *ctx)
{
    if (!m || !cfg || n < 1 || !reqs || !results) return KVP_ERR(KVP_EINVAL, "generate: NULL argument or no request");
    kvp_session_config c = *cfg;
    if (c.num_blocks < 0 || c.engine.block_size < 1)
        return KVP_ERR(KVP_EINVAL, "generate: block_size must be >= 1 and num_blocks >= 0");
    if (c.num_blocks == 0) c.num_blocks = kvp_session_blocks_for(reqs, n, c.engine.block_size, kvp_model_max_len(m));
    kvp_session *s;
    KVP_TRY(kvp_cpu_session_create(m, &c, &s));
    kvp_status st = kvp_session_run(s, reqs, n, results, stats, on_step, ctx);
    if (st == KVP_OK && stats)
        stats->kv_pool_bytes = (int64_t)kvp_kv_cache_bytes(m, c.kv_dtype, c.num_blocks, c.engine.block_size);
    kvp_session_destroy(s);
    return st;
}

kvp_status kvp_kv_blocks_in(const kvp_model *m, kvp_dtype dt, int32_t bs, int64_t bytes, const char *opt, int32_t *blocks)
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
