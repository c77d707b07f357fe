/* runtime/engine/executor.h — what the engine asks of an executor, one step at a time.
 *
 * The engine (runtime/engine/engine.h) decides each step which sequences run and how many tokens each
 * computes; the executor runs that batch, says how long it took (simulated seconds for `sim`, measured for
 * `cpu`) and returns the logits rows of the sequences that sample. The engine samples (output stage), so
 * every executor makes the same tokens from the same logits. Executors: `sim` (runtime/executor/
 * sim_executor.h: the roofline cost model, no weights, no logits), `cpu` (runtime/executor/cpu_executor.h).
 *
 *   kvp_exec_batch
 *     seqs[0..n)    kvp_exec_seq { req_id, context_len, num_new, sample, all_logits, tokens, block_table }
 *     flat          with kvp_executor.flat: the batch as one forward pass takes it (FlashInfer's layout)
 *                     tokens, positions, slot_mapping  [num_tokens]
 *                     qo_indptr [n + 1]; kv_indptr [n + 1], kv_indices [kv_indptr[n]], kv_last_page_len [n]
 *                     (the CSR page table: a sequence's pages cover its context and this step's tokens)
 *     ops           block moves before the forward pass (swap out, swap in, copy-on-write)
 *     offload       the prefix cache's host tier: stores (device -> host) and loads (host -> device)
 *
 * Order of the moves: offload.store, ops.swap_out, ops.swap_in, offload.load, ops.copies, then the forward
 * pass. A store copies a block computed in an earlier step before anything of this step can overwrite it; a
 * load fills a block allocated in this step (it may be one that a swap-out just emptied).
 *
 * Logits: every sequence gets one row (its last new token's; the engine reads those with sample = 1), one
 * with all_logits = 1 a row for every new token (prompt logprobs, speculative drafts); rows in batch order. kvp_exec_result.logits holds
 * num_rows x vocab floats, owned by the executor and valid until its next step; an executor without a model
 * (sim) returns none (logits NULL, vocab 0).
 * Token ids of the new tokens: prompt tokens for prefill chunks, the token sampled last for a decode (and its
 * drafts), the prompt tail then the generated tokens for a recompute chunk. NULL when the request has none.
 * Everything in the batch is borrowed for the call only.
 */
#ifndef KVP_RUNTIME_ENGINE_EXECUTOR_H
#define KVP_RUNTIME_ENGINE_EXECUTOR_H

#include <stdint.h>

#include "blockmgr/block_mgr.h"
#include "common/status.h"

typedef struct {
    int64_t req_id;
    int32_t context_len;        /* tokens of this sequence already in the KV cache */
    int32_t num_new;            /* tokens computed now (>= 1); their KV is written at context_len.. */
    int32_t sample;             /* 1: it produces a token after the last new one (its logits are read) */
    int32_t all_logits;         /* 1: a logits row for every new token, not only the last */
    const int32_t *tokens;      /* [num_new] token ids (NULL when the request carries none) */
    const int32_t *block_table; /* [num_blocks] physical blocks (paged allocation), NULL for contiguous */
    int32_t num_blocks;
} kvp_exec_seq;

typedef struct {
    const kvp_block_copy *store; /* [n_store] device block -> host block */
    int32_t n_store;
    const kvp_block_copy *load;  /* [n_load] host block -> device block */
    int32_t n_load;
    int32_t sync_stores;         /* 1: the stores are write-backs of evicted blocks that this step may reuse:
                                    they finish before the step goes on (0: write-through, in the background) */
} kvp_exec_offload;

/* The whole batch as one forward pass reads it (filled when kvp_executor.flat is set; paged only). */
typedef struct {
    int32_t num_tokens;
    const int32_t *tokens;           /* [num_tokens] */
    const int32_t *positions;        /* [num_tokens] */
    const int64_t *slot_mapping;     /* [num_tokens] block * block_size + offset */
    const int32_t *qo_indptr;        /* [n + 1] sequence i's tokens are qo_indptr[i] .. qo_indptr[i + 1] */
    const int32_t *kv_indptr;        /* [n + 1] */
    const int32_t *kv_indices;       /* [kv_indptr[n]] */
    const int32_t *kv_last_page_len; /* [n] */
    const uint8_t *all_logits;       /* [n] the seqs' all_logits flags */
    int32_t num_rows;                /* logits rows wanted in all */
} kvp_exec_flat;

typedef struct {
    const kvp_exec_seq *seqs; /* [n] */
    int32_t n;
    int32_t block_size;       /* 0 for contiguous allocation */
    kvp_bm_step_ops ops;      /* zeroed when there are none */
    kvp_exec_offload offload; /* zeroed when there are none */
    kvp_exec_flat flat;       /* zeroed unless the executor asked for it */
} kvp_exec_batch;

typedef struct {
    double time_s;       /* duration of the step in seconds (> 0) */
    const float *logits; /* [num_rows, vocab] or NULL (no model); owned by the executor */
    int32_t vocab;
} kvp_exec_result;

typedef struct {
    const char *name;
    void *ctx;        /* owned by the executor; released by destroy */
    int flat;         /* 1: fill kvp_exec_batch.flat for it */
    kvp_status (*step)(void *ctx, const kvp_exec_batch *batch, kvp_exec_result *out);
    void (*destroy)(void *ctx);
    /* Optional: run fn(arg, 0 .. n-1) on n of the executor's threads and return when all are done (the
     * engine draws samples there); threads() says how many it has (NULL: 1). */
    void (*parallel)(void *ctx, int n, void (*fn)(void *arg, int i), void *arg);
    int (*threads)(void *ctx);
} kvp_executor;

/* Checks that a batch addresses only a KV pool of num_blocks device blocks and num_host_blocks host
 * blocks: every block-table entry, slot, page index and move in range, a block table covering each
 * sequence's context and new tokens, counts and CSR offsets consistent with the sequences. Cost O(tokens +
 * blocks). A follower rank runs it on every plan it receives; the engine on every batch in debug builds.
 * KVP_EPARSE naming the first field out of range. */
kvp_status kvp_exec_batch_check(const kvp_exec_batch *b, int32_t num_blocks, int32_t num_host_blocks);

/* Runs a batch's host-side block moves in the order above (offload stores, swap-outs, swap-ins, offload
 * loads) through move(ctx, moves, n, to_host); stops at the first error. Copy-on-write pairs are not moves. */
static inline kvp_status kvp_exec_batch_moves(const kvp_exec_batch *b, void *ctx,
                                              kvp_status (*move)(void *ctx, const kvp_block_copy *m, int32_t n, int to_host))
{
    kvp_status st = move(ctx, b->offload.store, b->offload.n_store, 1);
    if (st == KVP_OK) st = move(ctx, b->ops.swap_out, b->ops.n_swap_out, 1);
    if (st == KVP_OK) st = move(ctx, b->ops.swap_in, b->ops.n_swap_in, 0);
    if (st == KVP_OK) st = move(ctx, b->offload.load, b->offload.n_load, 0);
    return st;
}

/* Releases the executor's context (NULL-safe; a zeroed executor is a no-op). */
static inline void kvp_executor_destroy(kvp_executor *ex)
{
    if (ex && ex->destroy) ex->destroy(ex->ctx);
    if (ex) ex->ctx = 0;
}

#endif
