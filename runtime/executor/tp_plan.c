/* runtime/executor/tp_plan.c — rank 0 broadcasts each step's plan, the other ranks execute it (tp_plan.h).
 *
 * A message: int64 length, then that many bytes: a header of H_N int64s, then the arrays it counts, each
 * padded to 8 bytes:
 *   INIT  the header alone: blocks, block size, host blocks, KV dtype, max tokens and sequences of a step
 *   STEP  seqs (n x {req_id, context_len, num_new, sample, all_logits, num_blocks, has_tokens}), their token ids,
 *         their block tables, the flat batch when the executor takes one, the block moves
 */
#include "runtime/executor/tp_plan.h"

#include <string.h>

#include "common/alloc.h"

enum { MSG_INIT = 1, MSG_STEP, MSG_QUIT };
enum { H_TYPE, H_N, H_BS, H_TOKS, H_TABLES, H_FLAT, H_FTOK, H_ROWS, H_KVX, H_SOUT, H_SIN, H_COPY, H_STORE, H_LOAD,
       H_SYNC, H_N_ };

typedef struct {
    int64_t req_id;
    int32_t context_len, num_new, sample, all_logits, num_blocks, has_tokens;
} wire_seq;

/* ---------------------------------------------------------------- buffers */

typedef struct {
    unsigned char *p;
    size_t len, cap;
    int oom;
} wbuf;

static void put(wbuf *w, const void *src, size_t n)
{
    const size_t pad = (n + 7) & ~(size_t)7;
    if (w->oom || kvp_grow((void **)&w->p, &w->cap, w->len + pad, 1) != KVP_OK) {
        w->oom = 1;
        return;
    }
    if (n) memcpy(w->p + w->len, src, n);
    memset(w->p + w->len + n, 0, pad - n);
    w->len += pad;
}

typedef struct {
    const unsigned char *p;
    size_t len, at;
    int bad;
} rbuf;

/* The next n bytes (NULL, and bad set, past the end). */
static const void *take(rbuf *r, size_t n)
{
    const size_t pad = (n + 7) & ~(size_t)7;
    if (r->bad || pad > r->len - r->at) {
        r->bad = 1;
        return NULL;
    }
    const void *q = r->p + r->at;
    r->at += pad;
    return q;
}

static kvp_status send(kvp_comm *c, const wbuf *w)
{
    if (w->oom) return KVP_ERR(KVP_ENOMEM, "tensor parallelism: out of memory writing a step's plan");
    int64_t len = (int64_t)w->len;
    KVP_TRY(kvp_comm_broadcast_idle(c, &len, sizeof len, 0));
    return kvp_comm_broadcast(c, w->p, len, 0);
}

static kvp_status send_header(kvp_comm *c, wbuf *w, const int64_t *h)
{
    w->len = 0;
    put(w, h, H_N_ * sizeof *h);
    return send(c, w);
}

/* ---------------------------------------------------------------- rank 0 */

typedef struct {
    kvp_comm *comm;
    kvp_executor inner;
    wbuf w;
    int64_t steps;
} leader;

static kvp_status leader_step(void *ctx, const kvp_exec_batch *b, kvp_exec_result *out)
{
    leader *L = ctx;
    const kvp_exec_flat *f = &b->flat;
    const int flat = f->qo_indptr != NULL;
    int64_t h[H_N_] = {[H_TYPE] = MSG_STEP, [H_N] = b->n, [H_BS] = b->block_size, [H_FLAT] = flat,
                       [H_FTOK] = flat ? f->num_tokens : 0, [H_ROWS] = flat ? f->num_rows : 0,
                       [H_KVX] = flat ? f->kv_indptr[b->n] : 0, [H_SOUT] = b->ops.n_swap_out, [H_SIN] = b->ops.n_swap_in,
                       [H_COPY] = b->ops.n_copies, [H_STORE] = b->offload.n_store, [H_LOAD] = b->offload.n_load,
                       [H_SYNC] = b->offload.sync_stores};
    for (int32_t i = 0; i < b->n; i++) {
        h[H_TOKS] += b->seqs[i].tokens ? b->seqs[i].num_new : 0;
        h[H_TABLES] += b->seqs[i].block_table ? b->seqs[i].num_blocks : 0;
    }
    wbuf *w = &L->w;
    w->len = 0;
    put(w, h, sizeof h);
    for (int32_t i = 0; i < b->n; i++) {
        const kvp_exec_seq *s = &b->seqs[i];
        const wire_seq ws = {s->req_id, s->context_len, s->num_new, s->sample, s->all_logits,
                             s->block_table ? s->num_blocks : 0, s->tokens != NULL};
        put(w, &ws, sizeof ws);
    }
    for (int32_t i = 0; i < b->n; i++)
        if (b->seqs[i].tokens) put(w, b->seqs[i].tokens, (size_t)b->seqs[i].num_new * sizeof(int32_t));
    for (int32_t i = 0; i < b->n; i++)
        if (b->seqs[i].block_table) put(w, b->seqs[i].block_table, (size_t)b->seqs[i].num_blocks * sizeof(int32_t));
    if (flat) {
        const size_t T = (size_t)f->num_tokens, n = (size_t)b->n;
        put(w, f->tokens, T * sizeof *f->tokens);
        put(w, f->positions, T * sizeof *f->positions);
        put(w, f->slot_mapping, T * sizeof *f->slot_mapping);
        put(w, f->qo_indptr, (n + 1) * sizeof *f->qo_indptr);
        put(w, f->kv_indptr, (n + 1) * sizeof *f->kv_indptr);
        put(w, f->kv_indices, (size_t)h[H_KVX] * sizeof *f->kv_indices);
        put(w, f->kv_last_page_len, n * sizeof *f->kv_last_page_len);
        put(w, f->all_logits, n);
    }
    put(w, b->ops.swap_out, (size_t)b->ops.n_swap_out * sizeof *b->ops.swap_out);
    put(w, b->ops.swap_in, (size_t)b->ops.n_swap_in * sizeof *b->ops.swap_in);
    put(w, b->ops.copies, (size_t)b->ops.n_copies * sizeof *b->ops.copies);
    put(w, b->offload.store, (size_t)b->offload.n_store * sizeof *b->offload.store);
    put(w, b->offload.load, (size_t)b->offload.n_load * sizeof *b->offload.load);
    KVP_TRY(send(L->comm, w));
    L->steps++;
    return L->inner.step(L->inner.ctx, b, out);
}

static void leader_destroy(void *ctx)
{
    leader *L = ctx;
    const int64_t h[H_N_] = {[H_TYPE] = MSG_QUIT, [H_N] = L->steps};
    if (send_header(L->comm, &L->w, h) != KVP_OK) kvp_error_clear(); /* a rank gone: the job ends anyway */
    kvp_executor_destroy(&L->inner);
    kvp_free(L->w.p);
    kvp_free(L);
}

static void leader_parallel(void *ctx, int n, void (*fn)(void *, int), void *arg)
{
    leader *L = ctx;
    L->inner.parallel(L->inner.ctx, n, fn, arg);
}

static int leader_threads(void *ctx)
{
    leader *L = ctx;
    return L->inner.threads(L->inner.ctx);
}

kvp_status kvp_tp_leader_create(kvp_comm *comm, const kvp_tp_shape *shape, kvp_executor inner, kvp_executor *out)
{
    leader *L = comm && shape ? kvp_calloc(1, sizeof *L) : NULL;
    if (!L) {
        kvp_executor_destroy(&inner);
        return comm && shape ? KVP_ERR(KVP_ENOMEM, "tensor parallelism: out of memory")
                             : KVP_ERR(KVP_EINVAL, "tensor parallelism: NULL communicator or shape");
    }
    L->comm = comm;
    L->inner = inner;
    const int64_t h[H_N_] = {[H_TYPE] = MSG_INIT, [H_N] = shape->num_blocks, [H_BS] = shape->block_size,
                             [H_TOKS] = shape->num_host_blocks, [H_TABLES] = shape->kv_dtype,
                             [H_FLAT] = shape->max_tokens, [H_FTOK] = shape->max_seqs};
    kvp_status st = send_header(comm, &L->w, h);
    if (st != KVP_OK) {
        kvp_executor_destroy(&L->inner);
        kvp_free(L->w.p);
        kvp_free(L);
        return st;
    }
    *out = (kvp_executor){.name = inner.name, .ctx = L, .flat = inner.flat, .step = leader_step,
                          .destroy = leader_destroy, .parallel = inner.parallel ? leader_parallel : NULL,
                          .threads = inner.threads ? leader_threads : NULL};
    return KVP_OK;
}

/* ---------------------------------------------------------------- the other ranks */

/* The batch of a STEP message whose header is h; its arrays point into r's buffer (seqs into *seqs). */
static kvp_status read_step(rbuf *r, const int64_t *h, kvp_exec_seq **seqs, size_t *cap, kvp_exec_batch *b)
{
    const int64_t n = h[H_N];
    if (n < 0 || n > INT32_MAX || h[H_FTOK] < 0 || h[H_KVX] < 0 || h[H_SOUT] < 0 || h[H_SIN] < 0 || h[H_COPY] < 0 ||
        h[H_STORE] < 0 || h[H_LOAD] < 0)
        return KVP_ERR(KVP_EPARSE, "tensor parallelism: a plan with negative counts");
    KVP_TRY(kvp_grow((void **)seqs, cap, (size_t)n + 1, sizeof **seqs));
    memset(b, 0, sizeof *b);
    b->n = (int32_t)n;
    b->block_size = (int32_t)h[H_BS];
    b->seqs = *seqs;
    for (int64_t i = 0; i < n; i++) {
        const wire_seq *ws = take(r, sizeof *ws);
        if (!ws) break;
        (*seqs)[i] = (kvp_exec_seq){.req_id = ws->req_id, .context_len = ws->context_len, .num_new = ws->num_new,
                                    .sample = ws->sample, .all_logits = ws->all_logits, .num_blocks = ws->num_blocks,
                                    .tokens = ws->has_tokens ? (const int32_t *)1 : NULL};
    }
    for (int64_t i = 0; i < n && !r->bad; i++)
        if ((*seqs)[i].tokens) (*seqs)[i].tokens = take(r, (size_t)(*seqs)[i].num_new * sizeof(int32_t));
    for (int64_t i = 0; i < n && !r->bad; i++)
        (*seqs)[i].block_table = (*seqs)[i].num_blocks ? take(r, (size_t)(*seqs)[i].num_blocks * sizeof(int32_t)) : NULL;
    if (h[H_FLAT]) {
        kvp_exec_flat *f = &b->flat;
        const size_t T = (size_t)h[H_FTOK];
        f->num_tokens = (int32_t)T;
        f->num_rows = (int32_t)h[H_ROWS];
        f->tokens = take(r, T * sizeof *f->tokens);
        f->positions = take(r, T * sizeof *f->positions);
        f->slot_mapping = take(r, T * sizeof *f->slot_mapping);
        f->qo_indptr = take(r, ((size_t)n + 1) * sizeof *f->qo_indptr);
        f->kv_indptr = take(r, ((size_t)n + 1) * sizeof *f->kv_indptr);
        f->kv_indices = take(r, (size_t)h[H_KVX] * sizeof *f->kv_indices);
        f->kv_last_page_len = take(r, (size_t)n * sizeof *f->kv_last_page_len);
        f->all_logits = take(r, (size_t)n);
    }
    b->ops = (kvp_bm_step_ops){.n_swap_out = (int32_t)h[H_SOUT], .n_swap_in = (int32_t)h[H_SIN], .n_copies = (int32_t)h[H_COPY]};
    b->ops.swap_out = take(r, (size_t)h[H_SOUT] * sizeof *b->ops.swap_out);
    b->ops.swap_in = take(r, (size_t)h[H_SIN] * sizeof *b->ops.swap_in);
    b->ops.copies = take(r, (size_t)h[H_COPY] * sizeof *b->ops.copies);
    b->offload = (kvp_exec_offload){.n_store = (int32_t)h[H_STORE], .n_load = (int32_t)h[H_LOAD], .sync_stores = (int32_t)h[H_SYNC]};
    b->offload.store = take(r, (size_t)h[H_STORE] * sizeof *b->offload.store);
    b->offload.load = take(r, (size_t)h[H_LOAD] * sizeof *b->offload.load);
    return r->bad || r->at != r->len ? KVP_ERR(KVP_EPARSE, "tensor parallelism: a plan of %zu bytes that does not match "
                                                          "its header", r->len)
                                     : KVP_OK;
}

kvp_status kvp_tp_follow(kvp_comm *comm, kvp_status (*make)(void *ctx, const kvp_tp_shape *shape, kvp_executor *ex),
                         void *ctx, int64_t *steps)
{
    unsigned char *buf = NULL;
    size_t cap = 0, scap = 0;
    kvp_exec_seq *seqs = NULL;
    kvp_executor ex = {0};
    kvp_tp_shape shape = {0};
    int64_t done = 0;
    kvp_status st = KVP_OK;
    for (int quit = 0; st == KVP_OK && !quit;) {
        int64_t len = 0;
        st = kvp_comm_broadcast_idle(comm, &len, sizeof len, 0);
        if (st == KVP_OK && (len < (int64_t)(H_N_ * sizeof(int64_t)) || len > ((int64_t)1 << 40)))
            st = KVP_ERR(KVP_EPARSE, "tensor parallelism: a message of %lld bytes", (long long)len);
        if (st == KVP_OK) st = kvp_grow((void **)&buf, &cap, (size_t)len, 1);
        if (st == KVP_OK) st = kvp_comm_broadcast(comm, buf, len, 0);
        if (st != KVP_OK) break;
        rbuf r = {.p = buf, .len = (size_t)len};
        int64_t h[H_N_];
        memcpy(h, take(&r, sizeof h), sizeof h);
        if (h[H_TYPE] == MSG_INIT && !ex.step) {
            shape = (kvp_tp_shape){(int32_t)h[H_N], (int32_t)h[H_BS], (int32_t)h[H_TOKS], (int32_t)h[H_TABLES],
                                   (int32_t)h[H_FLAT], (int32_t)h[H_FTOK]};
            st = make(ctx, &shape, &ex);
        } else if (h[H_TYPE] == MSG_STEP && ex.step) {
            kvp_exec_batch b;
            kvp_exec_result res = {0};
            st = read_step(&r, h, &seqs, &scap, &b);
            /* rank 0's block ids must fit this rank's pool: a plan that does not is refused, never run */
            if (st == KVP_OK) st = kvp_exec_batch_check(&b, shape.num_blocks, shape.num_host_blocks);
            if (st == KVP_OK) st = ex.step(ex.ctx, &b, &res);
            done++;
        } else if (h[H_TYPE] == MSG_QUIT) {
            quit = 1;
            if (h[H_N] != done)
                st = KVP_ERR(KVP_ESTATE, "tensor parallelism: rank %d ran %lld steps, rank 0 %lld", kvp_comm_rank(comm),
                             (long long)done, (long long)h[H_N]);
        } else {
            st = KVP_ERR(KVP_EPARSE, "tensor parallelism: message %lld out of order", (long long)h[H_TYPE]);
        }
    }
    kvp_executor_destroy(&ex);
    kvp_free(buf);
    kvp_free(seqs);
    if (steps) *steps = done;
    return st;
}
