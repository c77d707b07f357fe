/* runtime/executor/cpu_executor.c — the engine's cpu executor: block moves, batched forward pass, sampling. */
#include "runtime/executor/cpu_executor.h"

#include <string.h>

#include "attention/attention.h"
#include "common/alloc.h"
#include "common/timer.h"
#include "parallel/comm.h"

typedef struct {
    int64_t req_id;
    int32_t *toks;
    int32_t n, cap;
} tok_log;

typedef struct {
    kvp_model *m;
    kvp_kv_cache *kv;   /* device pools */
    kvp_kv_cache *host; /* host pools (swap), or NULL */
    int32_t block_size;
    kvp_sampler_params sp;
    kvp_sampler_ws *sws;
    int32_t vocab;
    tok_log *logs;
    size_t nlogs, cap_logs;
    /* step buffers */
    int32_t *tokens, *pos, *qo, *kvi, *kvx, *last, *pairs;
    int64_t *slots;
    float *logits;
    size_t c_tokens, c_pos, c_qo, c_kvi, c_kvx, c_last, c_pairs, c_slots, c_logits;
} cpu_ctx;

static void destroy(void *p)
{
    cpu_ctx *c = p;
    if (!c) return;
    kvp_kv_cache_destroy(c->kv);
    kvp_kv_cache_destroy(c->host);
    kvp_sampler_ws_destroy(c->sws);
    for (size_t i = 0; i < c->nlogs; i++) kvp_free(c->logs[i].toks);
    kvp_free(c->logs);
    void *b[] = {c->tokens, c->pos, c->qo, c->kvi, c->kvx, c->last, c->pairs, c->slots, c->logits};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) kvp_free(b[i]);
    kvp_free(c);
}

#define GROW(c, f, need) kvp_grow((void **)&(c)->f, &(c)->c_##f, (size_t)(need), sizeof *(c)->f)

static kvp_status log_token(cpu_ctx *c, int64_t req_id, int32_t tok)
{
    tok_log *l = NULL;
    for (size_t i = c->nlogs; i-- > 0;)
        if (c->logs[i].req_id == req_id) {
            l = &c->logs[i];
            break;
        }
    if (!l) {
        KVP_TRY(kvp_grow((void **)&c->logs, &c->cap_logs, c->nlogs + 1, sizeof *c->logs));
        l = &c->logs[c->nlogs++];
        memset(l, 0, sizeof *l);
        l->req_id = req_id;
    }
    if (l->n + 1 > l->cap) {
        int32_t nc = l->cap ? 2 * l->cap : 64;
        int32_t *p = kvp_realloc(l->toks, (size_t)nc * sizeof *p);
        if (!p) return KVP_ERR(KVP_ENOMEM, "cpu executor: out of memory");
        l->toks = p;
        l->cap = nc;
    }
    l->toks[l->n++] = tok;
    return KVP_OK;
}

/* Swaps between device and host pools, layer by layer. */
static kvp_status move_blocks(cpu_ctx *c, const kvp_block_copy *moves, int32_t n, int to_host)
{
    if (n == 0) return KVP_OK;
    if (!c->host) return KVP_ERR(KVP_EUNSUPPORTED, "cpu executor: a move to or from the host, but no host blocks were given");
    KVP_TRY(GROW(c, pairs, 2 * (size_t)n));
    for (int32_t i = 0; i < n; i++) {
        c->pairs[2 * i] = moves[i].src;
        c->pairs[2 * i + 1] = moves[i].dst;
    }
    return to_host ? kvp_kv_cache_move_blocks(c->host, c->kv, c->pairs, n) : kvp_kv_cache_move_blocks(c->kv, c->host, c->pairs, n);
}

/* The step's time: measured here, or under tensor parallelism rank 0's, so that every rank's engine sees
 * the same clock and takes the same decisions (the scheduler of rank 0 decides for all of them). */
static kvp_status step_time(const cpu_ctx *c, double t0, kvp_exec_result *out)
{
    out->time_s = kvp_now_s() - t0 + 1e-9;
    kvp_comm *comm = kvp_model_comm(c->m);
    return comm ? kvp_comm_broadcast(comm, &out->time_s, sizeof out->time_s, 0) : KVP_OK;
}

static kvp_status step(void *ctx, const kvp_exec_batch *b, kvp_exec_result *out)
{
    cpu_ctx *c = ctx;
    double t0 = kvp_now_s();
    const int32_t bs = c->block_size;
    if (b->n > 0 && b->block_size != bs)
        return KVP_ERR(KVP_EINVAL, "cpu executor: block size %d, the engine uses %d (or contiguous allocation)", bs,
                       b->block_size);
    KVP_TRY(move_blocks(c, b->offload.store, b->offload.n_store, 1));
    KVP_TRY(move_blocks(c, b->ops.swap_out, b->ops.n_swap_out, 1));
    KVP_TRY(move_blocks(c, b->ops.swap_in, b->ops.n_swap_in, 0));
    KVP_TRY(move_blocks(c, b->offload.load, b->offload.n_load, 0));
    if (b->ops.n_copies > 0) {
        KVP_TRY(GROW(c, pairs, 2 * (size_t)b->ops.n_copies));
        for (int32_t i = 0; i < b->ops.n_copies; i++) {
            c->pairs[2 * i] = b->ops.copies[i].src;
            c->pairs[2 * i + 1] = b->ops.copies[i].dst;
        }
        KVP_TRY(kvp_kv_cache_copy_blocks(c->kv, c->pairs, b->ops.n_copies));
    }
    int64_t ntok = 0, npages = 0;
    for (int32_t i = 0; i < b->n; i++) {
        const kvp_exec_seq *s = &b->seqs[i];
        if (!s->tokens)
            return KVP_ERR(KVP_EUNSUPPORTED, "cpu executor: request %lld has no token ids (a %d-token chunk at %d)",
                           (long long)s->req_id, s->num_new, s->context_len);
        int32_t len = s->context_len + s->num_new, pages = (len + bs - 1) / bs;
        if (pages > s->num_blocks)
            return KVP_ERR(KVP_EINVAL, "cpu executor: request %lld has %d tokens but %d blocks", (long long)s->req_id,
                           len, s->num_blocks);
        ntok += s->num_new;
        npages += pages;
    }
    if (b->n == 0) return step_time(c, t0, out);
    KVP_TRY(GROW(c, tokens, ntok));
    KVP_TRY(GROW(c, pos, ntok));
    KVP_TRY(GROW(c, slots, ntok));
    KVP_TRY(GROW(c, qo, b->n + 1));
    KVP_TRY(GROW(c, kvi, b->n + 1));
    KVP_TRY(GROW(c, last, b->n));
    KVP_TRY(GROW(c, kvx, npages + 1));
    KVP_TRY(GROW(c, logits, (size_t)b->n * (size_t)c->vocab));
    int32_t t = 0, p = 0;
    for (int32_t i = 0; i < b->n; i++) {
        const kvp_exec_seq *s = &b->seqs[i];
        c->qo[i] = t;
        for (int32_t j = 0; j < s->num_new; j++, t++) {
            int32_t q = s->context_len + j;
            c->tokens[t] = s->tokens[j];
            c->pos[t] = q;
            c->slots[t] = (int64_t)s->block_table[q / bs] * bs + q % bs;
        }
        int32_t len = s->context_len + s->num_new, pages = (len + bs - 1) / bs;
        c->kvi[i] = p;
        memcpy(c->kvx + p, s->block_table, (size_t)pages * sizeof(int32_t));
        p += pages;
        c->last[i] = len - (pages - 1) * bs;
    }
    c->qo[b->n] = t;
    c->kvi[b->n] = p;
    kvp_fwd_batch fb = {.num_seqs = b->n, .num_tokens = t, .tokens = c->tokens, .positions = c->pos,
                        .slot_mapping = c->slots, .qo_indptr = c->qo, .kv_indptr = c->kvi, .kv_indices = c->kvx,
                        .kv_last_page_len = c->last, .all_logits = 0};
    KVP_TRY(kvp_model_forward(c->m, c->kv, &fb, c->logits));
    for (int32_t i = 0; i < b->n; i++) {
        const kvp_exec_seq *s = &b->seqs[i];
        if (!s->sample) continue;
        kvp_rng rng;
        kvp_rng_seed(&rng, c->sp.seed + (uint64_t)(s->context_len + s->num_new), (uint64_t)s->req_id);
        int32_t tok = kvp_sample(&c->sp, &rng, c->logits + (int64_t)i * c->vocab, c->vocab, c->sws);
        out->sampled[i] = tok;
        KVP_TRY(log_token(c, s->req_id, tok));
    }
    return step_time(c, t0, out);
}

kvp_status kvp_cpu_executor_create(kvp_model *m, int32_t num_blocks, int32_t block_size, int32_t num_host_blocks,
                                   kvp_dtype kv_dtype, const kvp_sampler_params *sampler, kvp_executor *out)
{
    if (num_host_blocks < 0) return KVP_ERR(KVP_EINVAL, "cpu executor: num_host_blocks %d < 0", num_host_blocks);
    kvp_sampler_params sp = sampler ? *sampler : kvp_sampler_default();
    KVP_TRY(kvp_sampler_check(&sp));
    cpu_ctx *c = kvp_calloc(1, sizeof *c);
    if (!c) return KVP_ERR(KVP_ENOMEM, "cpu executor: out of memory");
    c->m = m;
    c->block_size = block_size;
    c->sp = sp;
    c->vocab = (int32_t)kvp_model_cfg(m)->vocab_size;
    kvp_status st = kvp_kv_cache_create(m, kv_dtype, num_blocks, block_size, &c->kv);
    if (st == KVP_OK && num_host_blocks > 0)
        st = kvp_kv_cache_create(m, kv_dtype, num_host_blocks, block_size, &c->host);
    if (st == KVP_OK) st = kvp_sampler_ws_create(c->vocab, &c->sws);
    if (st != KVP_OK) {
        destroy(c);
        return st;
    }
    out->name = "cpu";
    out->ctx = c;
    out->step = step;
    out->destroy = destroy;
    return KVP_OK;
}

void kvp_cpu_executor_tokens(const kvp_executor *ex, int64_t req_id, const int32_t **tokens, int32_t *n)
{
    const cpu_ctx *c = ex->ctx;
    *tokens = NULL;
    *n = 0;
    for (size_t i = 0; i < c->nlogs; i++)
        if (c->logs[i].req_id == req_id) {
            *tokens = c->logs[i].toks;
            *n = c->logs[i].n;
            return;
        }
}
