/* runtime/engine/exec_check.c — the bounds of a step's batch (executor.h: kvp_exec_batch_check). */
#include <stddef.h>
#include <stdint.h>

#include "runtime/engine/executor.h"

static kvp_status check_moves(const kvp_block_copy *m, int32_t n, int32_t src_max, int32_t dst_max, const char *what)
{
    if (n < 0 || (n > 0 && m == NULL)) return KVP_ERR(KVP_EPARSE, "batch: %d %s", n, what);
    for (int32_t i = 0; i < n; i++)
        if (m[i].src < 0 || m[i].src >= src_max || m[i].dst < 0 || m[i].dst >= dst_max)
            return KVP_ERR(KVP_EPARSE, "batch: %s %d moves block %d -> %d, outside %d -> %d blocks", what, i,
                           m[i].src, m[i].dst, src_max, dst_max);
    return KVP_OK;
}

static kvp_status check_flat(const kvp_exec_batch *b, int32_t num_blocks)
{
    const kvp_exec_flat *f = &b->flat;
    const int64_t slots = (int64_t)num_blocks * b->block_size;
    if (!f->tokens || !f->positions || !f->slot_mapping || !f->qo_indptr || !f->kv_indptr || !f->kv_last_page_len)
        return KVP_ERR(KVP_EPARSE, "batch: a flat layout with a missing array");
    if (f->qo_indptr[0] != 0 || f->kv_indptr[0] != 0) return KVP_ERR(KVP_EPARSE, "batch: CSR offsets not from 0");
    for (int32_t i = 0; i < b->n; i++) {
        const kvp_exec_seq *s = &b->seqs[i];
        if (f->qo_indptr[i + 1] - f->qo_indptr[i] != s->num_new)
            return KVP_ERR(KVP_EPARSE, "batch: qo_indptr gives sequence %d %d tokens, not %d", i,
                           f->qo_indptr[i + 1] - f->qo_indptr[i], s->num_new);
        const int32_t pages = f->kv_indptr[i + 1] - f->kv_indptr[i];
        const int64_t span = (int64_t)pages * b->block_size;
        if (pages < 1 || f->kv_last_page_len[i] < 1 || f->kv_last_page_len[i] > b->block_size ||
            span - b->block_size + f->kv_last_page_len[i] != (int64_t)s->context_len + s->num_new)
            return KVP_ERR(KVP_EPARSE, "batch: sequence %d's %d pages (last holding %d) do not cover its %d tokens", i,
                           pages, f->kv_last_page_len[i], s->context_len + s->num_new);
    }
    if (f->qo_indptr[b->n] != f->num_tokens)
        return KVP_ERR(KVP_EPARSE, "batch: %d flat tokens, the sequences have %d", f->num_tokens, f->qo_indptr[b->n]);
    if (f->kv_indptr[b->n] > 0 && !f->kv_indices) return KVP_ERR(KVP_EPARSE, "batch: no kv_indices");
    for (int32_t k = 0; k < f->kv_indptr[b->n]; k++)
        if (f->kv_indices[k] < 0 || f->kv_indices[k] >= num_blocks)
            return KVP_ERR(KVP_EPARSE, "batch: page %d is block %d of %d", k, f->kv_indices[k], num_blocks);
    for (int32_t t = 0; t < f->num_tokens; t++)
        if (f->slot_mapping[t] < -1 || f->slot_mapping[t] >= slots || f->positions[t] < 0)
            return KVP_ERR(KVP_EPARSE, "batch: token %d at position %d goes to slot %lld of %lld", t, f->positions[t],
                           (long long)f->slot_mapping[t], (long long)slots);
    return KVP_OK;
}

kvp_status kvp_exec_batch_check(const kvp_exec_batch *b, int32_t num_blocks, int32_t num_host_blocks)
{
    if (b == NULL || b->n < 0 || (b->n > 0 && b->seqs == NULL) || b->block_size < 0 || num_blocks < 0 ||
        num_host_blocks < 0)
        return KVP_ERR(KVP_EPARSE, "batch: NULL or negative counts");
    for (int32_t i = 0; i < b->n; i++) {
        const kvp_exec_seq *s = &b->seqs[i];
        if (s->context_len < 0 || s->num_new < 1 || s->num_blocks < 0)
            return KVP_ERR(KVP_EPARSE, "batch: sequence %d: context %d, %d new tokens, %d blocks", i, s->context_len,
                           s->num_new, s->num_blocks);
        if (b->block_size == 0) continue; /* contiguous: no block table */
        if ((int64_t)s->num_blocks * b->block_size < (int64_t)s->context_len + s->num_new || !s->block_table)
            return KVP_ERR(KVP_EPARSE, "batch: sequence %d's %d blocks of %d do not hold its %d tokens", i,
                           s->num_blocks, b->block_size, s->context_len + s->num_new);
        for (int32_t j = 0; j < s->num_blocks; j++)
            if (s->block_table[j] < 0 || s->block_table[j] >= num_blocks)
                return KVP_ERR(KVP_EPARSE, "batch: sequence %d's block %d is %d of %d", i, j, s->block_table[j],
                               num_blocks);
    }
    KVP_TRY(check_moves(b->ops.swap_out, b->ops.n_swap_out, num_blocks, num_host_blocks, "swap-out"));
    KVP_TRY(check_moves(b->ops.swap_in, b->ops.n_swap_in, num_host_blocks, num_blocks, "swap-in"));
    KVP_TRY(check_moves(b->ops.copies, b->ops.n_copies, num_blocks, num_blocks, "copy"));
    KVP_TRY(check_moves(b->offload.store, b->offload.n_store, num_blocks, num_host_blocks, "host store"));
    KVP_TRY(check_moves(b->offload.load, b->offload.n_load, num_host_blocks, num_blocks, "host load"));
    return b->flat.num_tokens > 0 && b->block_size > 0 ? check_flat(b, num_blocks) : KVP_OK;
}
