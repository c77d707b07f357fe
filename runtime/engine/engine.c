/* runtime/engine/engine.c — the engine's records and its step: scheduler -> batch -> executor -> output stage
 * (contract: engine.h; the parts: engine_internal.h).
 *
 * Time accounting: every interval of engine time (a step, or an idle jump to the next arrival) adds (memory
 * accounting of that interval) x (its length) to running sums; metrics divide by the total time.
 */
#include "runtime/engine/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/stats.h"
#include "common/timer.h"
#include "runtime/engine/engine_internal.h"

/* ---------------------------------------------------------------- names and defaults */

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

const char *kvp_finish_name(kvp_finish_reason f)
{
    static const char *const names[] = {"length", "eos", "stop_token", "stopped", "aborted"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

kvp_output_params kvp_output_params_default(void)
{
    return (kvp_output_params){.sampler = kvp_sampler_default(), .n = 1};
}

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
    c->stop_at_eos = true;
    c->spec.ngram_min = c->spec.ngram_max = 5;
}

/* ---------------------------------------------------------------- records */

/* Room for n slots in the sequence records and in every queue (a queue never grows during a step). */
static kvp_status grow_slots(kvp_engine *e, size_t n)
{
    if (n <= (size_t)e->cap_slots) return KVP_OK;
    size_t c0 = (size_t)e->cap_slots, c1 = c0, c2 = c0, c3 = c0, c4 = c0;
    KVP_TRY(kvp_grow((void **)&e->seqs, &c0, n, sizeof *e->seqs));
    KVP_TRY(kvp_grow((void **)&e->wq, &c1, c0, sizeof *e->wq));
    KVP_TRY(kvp_grow((void **)&e->rq, &c2, c0, sizeof *e->rq));
    KVP_TRY(kvp_grow((void **)&e->sq, &c3, c0, sizeof *e->sq));
    KVP_TRY(kvp_grow((void **)&e->free_slots, &c4, c0, sizeof *e->free_slots));
    e->cap_slots = (int64_t)c0;
    return KVP_OK;
}

kvp_status eng_new_seq(kvp_engine *e, int64_t req, int32_t sample, int64_t *out)
{
    if (e->n_free_slots == 0) KVP_TRY(grow_slots(e, (size_t)e->n_slots + 1));
    const int64_t slot = e->n_free_slots > 0 ? e->free_slots[--e->n_free_slots] : e->n_slots++;
    seq_t *s = S_(e, slot);
    req_t *r = R_(e, req);
    memset(s, 0, sizeof *s);
    s->req = req;
    s->bm_id = e->next_bm_id++;
    s->next = -1;
    s->sample = sample;
    s->state = SEQ_WAITING;
    s->row = -1;
    s->step_gen0 = INT32_MAX;
    s->stop_token = -1;
    s->reserve_len = 0;
    const kvp_output_params *q = r->req->out;
    s->glp.a.k = q && q->logprobs ? q->top_logprobs : 0;
    kvp_rng_seed(&s->rng, q ? q->sampler.seed : 0, (uint64_t)sample);
    if (!paged(e)) kvp_contig_reserve_len(e->contig_policy, e->cfg.max_model_len, r->prompt_len, r->output_len, &s->reserve_len);
    /* the request's list, in creation order */
    if (r->first_seq < 0) {
        r->first_seq = slot;
    } else {
        int64_t q2 = r->first_seq;
        while (S_(e, q2)->next >= 0) q2 = S_(e, q2)->next;
        S_(e, q2)->next = slot;
    }
    r->n_live++;
    *out = slot;
    return KVP_OK;
}

void eng_free_seq(kvp_engine *e, int64_t slot)
{
    seq_t *s = S_(e, slot);
    req_t *r = RQ_(e, s);
    if (r->first_seq == slot) {
        r->first_seq = s->next;
    } else {
        for (int64_t q = r->first_seq; q >= 0; q = S_(e, q)->next)
            if (S_(e, q)->next == slot) {
                S_(e, q)->next = s->next;
                break;
            }
    }
    kvp_free(s->gen);
    kvp_free(s->hit);
    lp_acc_free(&s->glp);
    memset(s, 0, sizeof *s);
    s->state = SEQ_DONE;
    s->req = -1;
    e->free_slots[e->n_free_slots++] = slot;
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
        return KVP_ERR(KVP_EINVAL, "without chunked prefill max_batched_tokens (%d) must be >= max_model_len (%d)",
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
    const kvp_spec_config *sp = &c->spec;
    if (sp->tokens < 0 || sp->tokens > KVP_MAX_SPEC || sp->max_batch < 0 ||
        (sp->tokens > 0 && (sp->ngram_min < 1 || sp->ngram_min > sp->ngram_max || sp->ngram_max > KVP_MAX_NGRAM)))
        return KVP_ERR(KVP_EINVAL, "speculation: %d tokens in 0..%d, n-gram lengths %d..%d within 1..%d, batch limit %d >= 0",
                       sp->tokens, KVP_MAX_SPEC, sp->ngram_min, sp->ngram_max, KVP_MAX_NGRAM, sp->max_batch);
    if (c->n_eos < 0 || (c->n_eos > 0 && !c->eos_ids)) return KVP_ERR(KVP_EINVAL, "engine: %d EOS ids without an array", c->n_eos);

    kvp_engine *e = kvp_calloc(1, sizeof *e);
    if (e == NULL) return KVP_ERR(KVP_ENOMEM, "engine: out of memory");
    e->cfg = *c;
    e->ex = ex;
    e->t0_wall = kvp_now_s();
    kvp_status st = kvm_create(e);
    if (st == KVP_OK) st = out_create(e);
    if (st == KVP_OK && (e->lpm_order = kvp_malloc((size_t)KVP_LPM_WINDOW * sizeof *e->lpm_order)) == NULL)
        st = KVP_ERR(KVP_ENOMEM, "engine: out of memory");
    if (st == KVP_OK) st = grow_slots(e, (size_t)c->max_num_seqs + 1);
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
    for (int64_t i = 0; i < e->n_slots; i++) {
        kvp_free(e->seqs[i].gen);
        kvp_free(e->seqs[i].hit);
        lp_acc_free(&e->seqs[i].glp);
    }
    for (int64_t i = 0; i < e->n_reqs; i++) lp_acc_free(&e->reqs[i].plp);
    kvm_destroy(e);
    out_destroy(e);
    void *b[] = {e->reqs, e->seqs, e->free_slots, e->wq, e->rq, e->sq, e->due, e->fin, e->sched, e->admitted,
                 e->lpm_order, e->xs, e->tokbuf, e->f_tokens, e->f_pos, e->f_qo, e->f_kvi, e->f_kvx, e->f_last,
                 e->f_slots, e->f_every};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) kvp_free(b[i]);
    kvp_free(e);
}

/* ---------------------------------------------------------------- requests */

/* The output params' own checks (the vocabulary is the caller's to check). */
static kvp_status check_params(const kvp_engine *e, const kvp_request *r)
{
    const kvp_output_params *q = r->out;
    const long long id = (long long)r->id;
    if (q->n < 1 || q->n > KVP_MAX_SAMPLES || q->beam_width < 0 || q->beam_width > KVP_MAX_SAMPLES ||
        (q->beam_width > 1 && q->n > q->beam_width))
        return KVP_ERR(KVP_EINVAL, "request %lld: n %d in 1..%d and <= the beam width %d", id, q->n, KVP_MAX_SAMPLES,
                       q->beam_width);
    KVP_TRY(kvp_sampler_check(&q->sampler));
    if (q->min_tokens < 0 || q->min_tokens > r->output_len || (q->beam_width > 1 && q->min_tokens > 0))
        return KVP_ERR(KVP_EINVAL, "request %lld: min_tokens %d must be in 0..max_tokens (%d), sampling only", id,
                       q->min_tokens, r->output_len);
    if (q->n_bias < 0 || q->n_bias > KVP_MAX_BIAS || (q->n_bias > 0 && (!q->bias_ids || !q->bias)) ||
        (q->beam_width > 1 && (q->n_bias > 0 || kvp_sampler_penalized(&q->sampler))))
        return KVP_ERR(KVP_EINVAL, "request %lld: %d logit biases (0 to %d, and their arrays); a logit bias or a penalty "
                                   "needs sampling, not beam search", id, q->n_bias, KVP_MAX_BIAS);
    for (int32_t j = 0; j < q->n_bias; j++)
        if (!(fabsf(q->bias[j]) <= 100.0f))
            return KVP_ERR(KVP_EINVAL, "request %lld logit bias %d: %g not in [-100, 100]", id, j, (double)q->bias[j]);
    if (q->top_logprobs < 0 || q->top_logprobs > KVP_MAX_TOP_LOGPROBS || (q->logprobs && q->beam_width > 1))
        return KVP_ERR(KVP_EINVAL, "request %lld: top_logprobs %d must be in 0..%d, and token logprobs need sampling, not "
                                   "beam search", id, q->top_logprobs, KVP_MAX_TOP_LOGPROBS);
    if (q->n_stop_ids < 0 || q->n_stop_ids > KVP_MAX_STOP_IDS || (q->n_stop_ids > 0 && !q->stop_ids))
        return KVP_ERR(KVP_EINVAL, "request %lld: %d stop ids (0 to %d, and an array)", id, q->n_stop_ids, KVP_MAX_STOP_IDS);
    if ((q->beam_width > 1 || q->n > 1) && !paged(e))
        return KVP_ERR(KVP_EINVAL, "request %lld: several samples need paged allocation", id);
    return KVP_OK;
}

kvp_status kvp_engine_fits(const kvp_engine *e, int32_t prompt_len, int32_t output_len, int32_t group, bool beams)
{
    const int32_t L = e->cfg.max_model_len;
    if (prompt_len >= L)
        return KVP_ERR(KVP_EINVAL, "a prompt of %d tokens leaves no room in a context of %d tokens", prompt_len, L);
    if (group > e->cfg.max_num_seqs)
        return KVP_ERR(KVP_EINVAL, "%d %s are more than max_num_seqs (%d) can run at once", group,
                       beams ? "beams" : "samples", e->cfg.max_num_seqs);
    if (beams && group > e->cfg.max_batched_tokens)
        return KVP_ERR(KVP_EINVAL, "%d beams decode together: more than the %d tokens of a step", group,
                       e->cfg.max_batched_tokens);
    const int64_t len = (int64_t)prompt_len + (output_len < L - prompt_len ? output_len : L - prompt_len);
    if (paged(e)) {
        const int64_t blocks = kvm_blocks_for(e, len), room = (int64_t)e->num_blocks - e->cfg.watermark_blocks;
        if (blocks > room)
            return KVP_ERR(KVP_ENOBLOCKS, "one sequence of %lld tokens needs %lld blocks of %d tokens; the KV cache has %lld",
                           (long long)len, (long long)blocks, e->cfg.block_size, (long long)room);
        return KVP_OK;
    }
    int64_t reserve = 0;
    if (kvp_contig_reserve_len(e->contig_policy, L, prompt_len, (int32_t)(len - prompt_len), &reserve) != KVP_OK ||
        reserve > kvp_contig_max_reserve(e->arena))
        return KVP_ERR(KVP_ENOBLOCKS, "a reservation of %lld slots does not fit the arena", (long long)reserve);
    return KVP_OK;
}

kvp_status kvp_engine_add_request(kvp_engine *e, const kvp_request *r, int64_t *index)
{
    if (e == NULL || r == NULL) return KVP_ERR(KVP_EINVAL, "engine: NULL argument");
    if (r->prompt_len < 1 || r->output_len < 0 || (r->tokens == NULL && (e->pc != NULL || r->out)))
        return KVP_ERR(KVP_EINVAL, "request %lld: prompt_len must be >= 1, output_len >= 0, tokens given",
                       (long long)r->id);
    const double wall = kvp_now_s() - e->t0_wall;
    const double arrival = !e->cfg.wall_clock ? r->arrival_s : wall > e->now ? wall : e->now;
    if (!e->cfg.wall_clock && (!(r->arrival_s >= 0) || !isfinite(r->arrival_s)))
        return KVP_ERR(KVP_EINVAL, "request %lld: arrival time must be a finite number >= 0", (long long)r->id);
    if (e->n_reqs > 0 && arrival < e->reqs[e->n_reqs - 1].arrival)
        return KVP_ERR(KVP_EINVAL, "request %lld arrives before the previous one: add requests in arrival order",
                       (long long)r->id);
    if (r->out) KVP_TRY(check_params(e, r));
    size_t cap = (size_t)e->cap_reqs;
    KVP_TRY(kvp_grow((void **)&e->reqs, &cap, (size_t)e->n_reqs + 1, sizeof *e->reqs));
    e->cap_reqs = (int64_t)cap;
    req_t *q = &e->reqs[e->n_reqs];
    memset(q, 0, sizeof *q);
    q->req = r;
    q->arrival = arrival;
    q->parent = q->first_child = q->next_sibling = q->first_seq = -1;
    q->state = KVP_REQ_PENDING;
    q->prompt_len = r->prompt_len;
    q->admit_s = q->first_token_s = q->finish_s = -1;
    q->beams = r->out && r->out->beam_width > 1;
    q->group = !r->out ? 1 : q->beams ? r->out->beam_width : r->out->n;
    q->plp.a.k = r->out && r->out->prompt_logprobs ? r->out->top_logprobs : 0;
    const int32_t L = e->cfg.max_model_len;
    int32_t out = r->output_len;
    if (out < 1 && !r->out) out = 1; /* a trace's request always yields a token */
    if (r->prompt_len < L && out > L - r->prompt_len) out = L - r->prompt_len;
    if (out != r->output_len) e->clamped++;
    q->output_len = out;
    e->n_reqs++;
    e->live_reqs++;
    if (kvp_engine_fits(e, r->prompt_len, out, q->group, q->beams) != KVP_OK) {
        kvp_error_clear();
        q->state = KVP_REQ_REJECTED;
        e->rejected++;
        KVP_LOG_I("engine: request %lld (prompt %d, output %d) can never run: rejected", (long long)r->id,
                  (int)r->prompt_len, (int)out);
    }
    if (index) *index = e->req_base + e->n_reqs - 1;
    return KVP_OK;
}

int kvp_engine_pending(const kvp_engine *e)
{
    return e->rq_n > 0 || e->wq_n > 0 || e->sq_n > 0 || e->due_n > 0 || e->next_arrival < e->req_base + e->n_reqs;
}

/* ---------------------------------------------------------------- the step */

static void integrate(kvp_engine *e, double dt)
{
    if (!(dt > 0)) return;
    kvp_kv_accounting a;
    kvm_account(e, &a);
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

/* The per-step counts of memory (before the forward pass): peaks and means over steps. */
static void step_memory(kvp_engine *e)
{
    if (!paged(e)) return;
    kvp_kv_accounting a;
    kvm_account(e, &a);
    const int64_t used_slots = a.capacity - a.free - a.cached, used_blocks = used_slots / e->cfg.block_size;
    if (used_blocks > e->peak_used_blocks) e->peak_used_blocks = used_blocks;
    if (a.token_states > e->peak_token_states) e->peak_token_states = a.token_states;
    if (a.logical_tokens > e->peak_logical_tokens) e->peak_logical_tokens = a.logical_tokens;
    if (a.shared_savings > e->peak_shared_savings) e->peak_shared_savings = a.shared_savings;
    if (used_slots > 0) {
        e->util_sum += (double)a.token_states / (double)used_slots;
        e->util_n++;
    }
    e->shared_sum += (double)a.shared_savings;
    e->logical_sum += (double)a.logical_tokens;
}

/* Token ids of the chunk s computes this step. A recompute chunk that crosses the prompt's end (prompt tail
 * + generated tokens) is assembled in the step's token buffer (e->tokbuf, at *off). */
static const int32_t *chunk_tokens(kvp_engine *e, const seq_t *s, size_t *off)
{
    const req_t *r = RQ_(e, s);
    const int32_t a = s->num_computed, b = s->num_computed + s->sched_new, P = r->prompt_len;
    if (b <= P) return r->req->tokens ? r->req->tokens + a : NULL;
    if (a >= P) return s->gen ? s->gen + (a - P) : NULL;
    if (r->req->tokens == NULL || s->gen == NULL) return NULL;
    int32_t *dst = e->tokbuf + *off;
    memcpy(dst, r->req->tokens + a, (size_t)(P - a) * sizeof *dst);
    memcpy(dst + (P - a), s->gen, (size_t)(b - P) * sizeof *dst);
    *off += (size_t)(b - a);
    return dst;
}

#define GROW(f, c, need) kvp_grow((void **)&e->f, &e->c, (size_t)(need), sizeof *e->f)

/* The batch as one forward pass takes it (kvp_exec_flat), from the per-sequence entries. */
static kvp_status flatten(kvp_engine *e, kvp_exec_batch *b, int32_t ntok)
{
    const int32_t bs = e->cfg.block_size, n = b->n;
    int64_t npages = 0;
    for (int32_t i = 0; i < n; i++) npages += (b->seqs[i].context_len + b->seqs[i].num_new + bs - 1) / bs;
    KVP_TRY(GROW(f_tokens, c_tokens, ntok));
    KVP_TRY(GROW(f_pos, c_pos, ntok));
    KVP_TRY(GROW(f_slots, c_slots, ntok));
    KVP_TRY(GROW(f_qo, c_qo, n + 1));
    KVP_TRY(GROW(f_kvi, c_kvi, n + 1));
    KVP_TRY(GROW(f_last, c_last, n));
    KVP_TRY(GROW(f_every, c_every, n));
    KVP_TRY(GROW(f_kvx, c_kvx, npages + 1));
    int32_t t = 0, p = 0, rows = 0;
    for (int32_t i = 0; i < n; i++) {
        const kvp_exec_seq *s = &b->seqs[i];
        e->f_qo[i] = t;
        for (int32_t j = 0; j < s->num_new; j++, t++) {
            const int32_t q = s->context_len + j;
            e->f_tokens[t] = s->tokens ? s->tokens[j] : 0;
            e->f_pos[t] = q;
            e->f_slots[t] = (int64_t)s->block_table[q / bs] * bs + q % bs;
        }
        const int32_t len = s->context_len + s->num_new, pages = (len + bs - 1) / bs;
        e->f_kvi[i] = p;
        memcpy(e->f_kvx + p, s->block_table, (size_t)pages * sizeof(int32_t));
        p += pages;
        e->f_last[i] = len - (pages - 1) * bs;
        e->f_every[i] = (uint8_t)s->all_logits;
        rows += s->all_logits ? s->num_new : 1;
    }
    e->f_qo[n] = t;
    e->f_kvi[n] = p;
    b->flat = (kvp_exec_flat){.num_tokens = t, .tokens = e->f_tokens, .positions = e->f_pos, .slot_mapping = e->f_slots,
                              .qo_indptr = e->f_qo, .kv_indptr = e->f_kvi, .kv_indices = e->f_kvx,
                              .kv_last_page_len = e->f_last, .all_logits = e->f_every, .num_rows = rows};
    return KVP_OK;
}

/* The executor's batch from the step's schedule; logits rows assigned to the sequences. */
static kvp_status build_batch(kvp_engine *e, kvp_exec_batch *batch, int32_t *ntok_out)
{
    size_t cross = 0, off = 0;
    for (int32_t i = 0; i < e->sched_n; i++) { /* room for the chunks that cross a prompt's end */
        const seq_t *s = S_(e, e->sched[i]);
        const int32_t P = RQ_(e, s)->prompt_len;
        if (s->num_computed < P && s->num_computed + s->sched_new > P) cross += (size_t)s->sched_new;
    }
    if (cross > e->tokbuf_cap) KVP_TRY(kvp_grow((void **)&e->tokbuf, &e->tokbuf_cap, cross, sizeof(int32_t)));
    KVP_TRY(kvp_grow((void **)&e->xs, &e->xs_cap, (size_t)e->sched_n, sizeof *e->xs));
    int32_t ntok = 0, rows = 0;
    for (int32_t i = 0; i < e->sched_n; i++) {
        seq_t *s = S_(e, e->sched[i]);
        const req_t *r = RQ_(e, s);
        kvp_exec_seq *x = &e->xs[i];
        x->req_id = r->req->id;
        x->context_len = s->num_computed;
        x->num_new = s->sched_new;
        x->sample = s->num_computed + s->sched_new - s->ndraft == total_known(e, s);
        x->all_logits = s->ndraft > 0 || (r->req->out && r->req->out->prompt_logprobs && r->plp.a.n < r->prompt_len);
        x->tokens = chunk_tokens(e, s, &off);
        x->block_table = NULL;
        x->num_blocks = 0;
        if (paged(e)) {
            kvp_bm_table_view v;
            KVP_TRY(kvm_table(e, s, &v));
            x->block_table = v.blocks;
            x->num_blocks = v.num_blocks;
        }
        s->row = rows;
        s->lrow = x->all_logits && s->ndraft == 0 ? rows + x->num_new - 1 : rows;
        s->step_gen0 = INT32_MAX;
        rows += x->all_logits ? x->num_new : 1;
        ntok += s->sched_new;
        e->attended += (int64_t)s->sched_new * s->num_computed + (int64_t)s->sched_new * (s->sched_new + 1) / 2;
    }
    *batch = (kvp_exec_batch){.seqs = e->xs, .n = e->sched_n, .block_size = paged(e) ? e->cfg.block_size : 0};
    kvm_batch_moves(e, batch);
    if (e->ex->flat && paged(e)) KVP_TRY(flatten(e, batch, ntok));
    *ntok_out = ntok;
    return KVP_OK;
}

static double wall_now(const kvp_engine *e) { return kvp_now_s() - e->t0_wall; }

kvp_status kvp_engine_step(kvp_engine *e, kvp_step_info *info)
{
    kvp_step_info inf = {0};
    if (e->cfg.wall_clock && wall_now(e) > e->now) e->now = wall_now(e);
    KVP_TRY(sch_arrivals(e));
    /* nothing to do: jump to the next arrival (rejected arrivals join no queue: jump again) */
    while (e->rq_n == 0 && e->wq_n == 0 && e->sq_n == 0) {
        const double t = sch_next_arrival_time(e);
        if (t == INFINITY || e->cfg.wall_clock) { /* a request still held would need a parent still to finish */
            inf.idle = e->rq_n == 0 && e->wq_n == 0 && e->sq_n == 0 && !kvp_engine_pending(e);
            inf.time_s = e->now;
            if (info) *info = inf;
            return KVP_OK;
        }
        if (t > e->now) {
            integrate(e, t - e->now);
            e->now = t;
        }
        KVP_TRY(sch_arrivals(e));
    }
    e->step_finished = 0;
    kvm_step_begin(e);
    KVP_TRY(sch_schedule(e));
    inf.num_preempted = e->step_preempted;
    if (e->sched_n == 0) {
        if (e->step_preempted == 0) {
            /* nothing could be scheduled and nothing changed: only an arrival could change that, and
             * arrivals never free memory, so this is a state the engine cannot leave */
            const int64_t head = e->wq_n > 0 ? e->wq[e->wq_head] : -1;
            return KVP_ERR(KVP_ESTATE, "engine stalled: request %lld cannot be admitted into empty memory",
                           head >= 0 ? (long long)RQ_(e, S_(e, head))->req->id : -1LL);
        }
        inf.time_s = e->now;
        if (info) *info = inf;
        return KVP_OK;
    }
    kvp_exec_batch batch;
    int32_t ntok = 0;
    KVP_TRY(build_batch(e, &batch, &ntok));
    step_memory(e);
    kvp_exec_result res = {0};
    const double t0 = e->cfg.wall_clock ? wall_now(e) : 0;
#ifndef NDEBUG /* debug builds: the batch addresses only the pools the engine owns */
    KVP_TRY(kvp_exec_batch_check(&batch, e->num_blocks, (int32_t)kvp_engine_host_blocks(&e->cfg)));
#endif
    KVP_TRY(e->ex->step(e->ex->ctx, &batch, &res));
    kvm_step_done(e);
    if (!(res.time_s > 0) || !isfinite(res.time_s))
        return KVP_ERR(KVP_ESTATE, "executor %s returned a step time of %g s", e->ex->name ? e->ex->name : "?", res.time_s);
    const double dt = e->cfg.wall_clock ? wall_now(e) - t0 + 1e-9 : res.time_s;
    integrate(e, dt);
    e->now += dt;
    e->steps++;
    e->computed_tokens += ntok;
    e->batch_tokens_sum += ntok;
    if (e->rq_n > e->max_running) e->max_running = e->rq_n;
    KVP_TRY(out_step(e, &res));
    KVP_TRY(kvm_step_end(e));
    inf.time_s = e->now;
    inf.step_s = dt;
    inf.num_scheduled = e->sched_n;
    inf.num_tokens = ntok;
    inf.num_finished = e->step_finished;
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

kvp_status kvp_engine_run(kvp_engine *e, const kvp_request *reqs, int64_t n, kvp_progress_fn progress, void *pctx)
{
    if (e == NULL || (reqs == NULL && n > 0)) return KVP_ERR(KVP_EINVAL, "engine run: NULL argument");
    const kvp_request **order = kvp_malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    int64_t *pos = kvp_malloc((size_t)(n > 0 ? n : 1) * sizeof *pos); /* request index -> absolute number */
    kvp_status st = order && pos ? KVP_OK : KVP_ERR(KVP_ENOMEM, "engine run: out of memory");
    bool sorted = true;
    for (int64_t i = 0; st == KVP_OK && i < n; i++) {
        order[i] = &reqs[i];
        if (i > 0 && reqs[i].arrival_s < reqs[i - 1].arrival_s) sorted = false;
    }
    if (st == KVP_OK && !sorted) qsort(order, (size_t)n, sizeof *order, cmp_arrival);
    const int64_t base = e->req_base + e->n_reqs;
    for (int64_t i = 0; i < n && st == KVP_OK; i++) {
        pos[order[i] - reqs] = base + i;
        st = kvp_engine_add_request(e, order[i], NULL);
    }
    for (int64_t i = 0; i < n && st == KVP_OK; i++) { /* answers waited for: parents come first */
        req_t *q = R_(e, base + i);
        const int64_t a = q->req->after;
        if (a == 0) {
            if (q->req->after_prompt)
                st = KVP_ERR(KVP_EINVAL, "request %lld: a parallel sample (after_prompt) needs the request it samples "
                                         "from (after)", (long long)q->req->id);
            continue;
        }
        if (a < 0 || a > n || pos[a - 1] >= base + i || !(q->req->think_s >= 0) || !isfinite(q->req->think_s) ||
            (q->req->after_prompt && reqs[a - 1].arrival_s != q->req->arrival_s))
            st = KVP_ERR(KVP_EINVAL, "request %lld: after %lld is not an earlier request of the workload, or think_s %g "
                                     "is not a finite number >= 0, or a parallel sample (after_prompt) does not arrive "
                                     "with it", (long long)q->req->id, (long long)a, q->req->think_s);
        else {
            q->parent = pos[a - 1];
            q->next_sibling = R_(e, q->parent)->first_child;
            R_(e, q->parent)->first_child = base + i;
        }
    }
    kvp_free(pos);
    kvp_free(order);
    KVP_TRY(st);
    const int64_t total = e->n_reqs;
    for (;;) {
        kvp_step_info inf;
        KVP_TRY(kvp_engine_step(e, &inf));
        if (inf.idle) break;
        if (e->cfg.on_step && inf.num_scheduled > 0) KVP_TRY(e->cfg.on_step(e->cfg.on_step_ctx, e, &inf));
        if (progress && (e->steps & 4095) == 0) progress(pctx, e->finished + e->rejected, total, e->now);
    }
    if (progress) progress(pctx, e->finished + e->rejected, total, e->now);
    return kvm_check_empty(e);
}

/* ---------------------------------------------------------------- metrics */

kvp_status kvp_engine_metrics_get(const kvp_engine *e, kvp_engine_metrics *m)
{
    if (e == NULL || m == NULL) return KVP_ERR(KVP_EINVAL, "engine metrics: NULL argument");
    memset(m, 0, sizeof *m);
    size_t n = (size_t)(e->n_reqs > 0 ? e->n_reqs : 1);
    double *ttft = kvp_malloc(n * sizeof *ttft), *tpot = kvp_malloc(n * sizeof *tpot), *e2e = kvp_malloc(n * sizeof *e2e);
    if (!ttft || !tpot || !e2e) {
        kvp_free(ttft);
        kvp_free(tpot);
        kvp_free(e2e);
        return KVP_ERR(KVP_ENOMEM, "engine metrics: out of memory");
    }
    int64_t nt = 0, np = 0;
    double norm_sum = 0;
    for (int64_t i = 0; i < e->n_reqs; i++) {
        const req_t *r = &e->reqs[i];
        if (r->state != KVP_REQ_FINISHED || r->released || r->aborted) continue;
        int64_t gen = 0;
        for (int64_t q = r->first_seq; q >= 0; q = S_(e, q)->next) gen += S_(e, q)->num_generated;
        const double first = r->first_token_s >= 0 ? r->first_token_s : r->finish_s;
        ttft[nt] = first - r->arrival;
        e2e[nt] = r->finish_s - r->arrival;
        norm_sum += r->max_generated > 0 ? e2e[nt] / r->max_generated : e2e[nt];
        nt++;
        m->prompt_tokens += r->prompt_len;
        m->output_tokens += gen;
        if (r->max_generated >= 2) tpot[np++] = (r->finish_s - first) / (r->max_generated - 1);
    }
    kvp_sort_doubles(ttft, nt);
    kvp_sort_doubles(tpot, np);
    kvp_sort_doubles(e2e, nt);
    m->requests = e->req_base + e->n_reqs;
    m->finished = e->finished;
    m->rejected = e->rejected;
    m->clamped = e->clamped;
    m->aborted = e->aborted;
    m->steps = e->steps;
    m->sim_duration_s = e->last_finish_s;
    m->computed_tokens = e->computed_tokens;
    m->attended_positions = e->attended;
    const double d = m->sim_duration_s;
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
    const double T = e->t_total;
    m->mean_running = T > 0 ? e->t_running / T : 0;
    m->mean_batch_tokens = e->steps > 0 ? (double)e->batch_tokens_sum / (double)e->steps : 0;
    m->max_running = e->max_running;
    m->preemptions = e->preemptions;
    m->swap_outs = e->swap_outs;
    m->swap_ins = e->swap_ins;
    m->recomputes = e->recomputes;
    m->readmit_hit_tokens = e->readmit_hit_tokens;
    m->admitted_prompt_tokens = e->prompt_tokens_first;
    m->prefix_hit_tokens = e->hit_tokens_first;
    m->prefix_hit_rate = e->prompt_tokens_first > 0 ? (double)e->hit_tokens_first / (double)e->prompt_tokens_first : 0;
    m->host_hit_tokens = e->host_hit_tokens_first;
    m->prefix_host_hit_rate = e->prompt_tokens_first > 0 ? (double)e->host_hit_tokens_first / (double)e->prompt_tokens_first : 0;
    m->host_loaded_blocks = e->host_loaded_blocks;
    m->host_stored_blocks = e->host_stored_blocks;
    m->evicted_blocks = kvm_evicted_blocks(e);
    m->cow_copies = e->cow_copies;
    kvp_ledger_stats ls;
    kvm_ledger_stats(e, &ls);
    memcpy(m->miss_tokens, ls.miss_tokens, sizeof m->miss_tokens);
    m->block_lifetime = ls.lifetime;
    m->block_idle_before_evict = ls.idle_before_evict;
    m->block_reuse_gap = ls.reuse_gap;
    m->spec_drafts = e->spec_drafts;
    m->spec_draft_tokens = e->spec_draft_tokens;
    m->spec_accepted_tokens = e->spec_accepted_tokens;
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
    m->peak_used_blocks = e->peak_used_blocks;
    m->peak_token_states = e->peak_token_states;
    m->peak_logical_tokens = e->peak_logical_tokens;
    m->peak_shared_savings = e->peak_shared_savings;
    m->step_kv_utilization = e->util_n ? e->util_sum / (double)e->util_n : 0;
    m->step_shared_savings = e->logical_sum > 0 ? e->shared_sum / e->logical_sum : 0;
    m->kv_capacity_slots = kvm_capacity_slots(e);
    const bool over = e->rq_n + e->wq_n + e->sq_n == 0 && !kvp_engine_pending(e);
    if (paged(e)) {
        m->num_blocks = e->num_blocks;
        int32_t held = e->num_blocks - kvm_free_blocks(e);
        m->free_blocks = kvm_free_blocks(e);
        if (e->pc) held -= (int32_t)kvp_pc_num_evictable(e->pc); /* cached and unused: reclaimable */
        m->leaked_blocks = over ? held : 0;
    } else {
        m->leaked_blocks = over ? kvp_contig_taken(e->arena) : 0;
    }
    return KVP_OK;
}

void kvp_engine_account(const kvp_engine *e, kvp_kv_accounting *a) { kvm_account(e, a); }

kvp_status kvp_engine_ledger_stats(const kvp_engine *e, kvp_ledger_stats *out)
{
    if (!e->ledger) return KVP_ENOTFOUND;
    kvm_ledger_stats(e, out);
    return KVP_OK;
}

/* ---------------------------------------------------------------- checks and getters */

kvp_status kvp_engine_check(const kvp_engine *e)
{
    KVP_TRY(kvm_check(e));
    kvp_kv_accounting a;
    kvm_account(e, &a);
    if (kvp_kv_accounting_residual(&a) != 0)
        return KVP_ERR(KVP_ESTATE, "accounting identity broken by %lld slots", (long long)kvp_kv_accounting_residual(&a));
    int64_t cnt[SEQ_DONE + 1] = {0}, logical = 0, seqs = 0;
    int32_t seats = 0;
    for (int64_t i = 0; i < e->n_slots; i++) {
        const seq_t *s = S_(e, i);
        if (s->req < 0) continue; /* a free slot */
        seqs++;
        const req_t *r = RQ_(e, s);
        cnt[s->state]++;
        if (s->num_computed < 0 || s->num_computed > total_known(e, s) || s->num_generated > r->output_len)
            return KVP_ERR(KVP_ESTATE, "sequence %lld: computed %d, generated %d of %d out of range", (long long)s->bm_id,
                           (int)s->num_computed, (int)s->num_generated, (int)r->output_len);
        const bool holds = s->state == SEQ_RUNNING || s->state == SEQ_SWAPPED;
        KVP_TRY(kvm_check_seq(e, s, holds, &logical));
        if (s->state == SEQ_RUNNING) seats += seats_of(e, s);
        if (r->state == KVP_REQ_FINISHED && s->state != SEQ_DONE)
            return KVP_ERR(KVP_ESTATE, "request %lld finished with a live sequence", (long long)r->req->id);
        if (r->state == KVP_REQ_FINISHED && !r->aborted && s->finish == KVP_FINISH_LENGTH && !s->dropped &&
            s->num_generated != r->output_len && s->finish != KVP_FINISH_STOPPED)
            return KVP_ERR(KVP_ESTATE, "request %lld finished with %d of %d tokens", (long long)r->req->id,
                           (int)s->num_generated, (int)r->output_len);
    }
    if (seqs != e->n_slots - e->n_free_slots)
        return KVP_ERR(KVP_ESTATE, "%lld sequences in use, %lld slots less %lld free", (long long)seqs,
                       (long long)e->n_slots, (long long)e->n_free_slots);
    if (seats != e->seats || seats > e->cfg.max_num_seqs)
        return KVP_ERR(KVP_ESTATE, "running sequences hold %d seats, the engine counts %d (max %d)", seats, e->seats,
                       e->cfg.max_num_seqs);
    if (!paged(e) && kvp_contig_num_reqs(e->arena) != cnt[SEQ_RUNNING])
        return KVP_ERR(KVP_ESTATE, "%d reservations for %lld running requests", (int)kvp_contig_num_reqs(e->arena),
                       (long long)cnt[SEQ_RUNNING]);
    if (paged(e) && kvp_bm_num_seqs(e->bm) != cnt[SEQ_RUNNING] + cnt[SEQ_SWAPPED])
        return KVP_ERR(KVP_ESTATE, "the block manager holds %d sequences, the engine %lld", (int)kvp_bm_num_seqs(e->bm),
                       (long long)(cnt[SEQ_RUNNING] + cnt[SEQ_SWAPPED]));
    if (cnt[SEQ_RUNNING] != e->rq_n || cnt[SEQ_WAITING] != e->wq_n || cnt[SEQ_SWAPPED] != e->sq_n)
        return KVP_ERR(KVP_ESTATE, "queue sizes (running %d, waiting %lld, swapped %lld) disagree with states",
                       (int)e->rq_n, (long long)e->wq_n, (long long)e->sq_n);
    if (a.logical_tokens != logical)
        return KVP_ERR(KVP_ESTATE, "accounting counts %lld logical tokens, sequences hold %lld",
                       (long long)a.logical_tokens, (long long)logical);
    if (a.token_states > logical)
        return KVP_ERR(KVP_ESTATE, "more token states (%lld) than tokens held (%lld)", (long long)a.token_states,
                       (long long)logical);
    for (int32_t i = 1; i < e->rq_n; i++)
        if (!sch_rank_less(e, e->rq[i - 1], e->rq[i])) return KVP_ERR(KVP_ESTATE, "running queue out of rank order");
    for (int64_t i = 1; i < e->wq_n; i++)
        if (!sch_rank_less(e, e->wq[e->wq_head + i - 1], e->wq[e->wq_head + i]))
            return KVP_ERR(KVP_ESTATE, "waiting queue out of rank order");
    for (int64_t i = 0; i < e->wq_n; i++)
        if (S_(e, e->wq[e->wq_head + i])->state != SEQ_WAITING)
            return KVP_ERR(KVP_ESTATE, "waiting queue holds a sequence in another state");
    for (int32_t i = 0; i < e->rq_n; i++)
        if (S_(e, e->rq[i])->state != SEQ_RUNNING)
            return KVP_ERR(KVP_ESTATE, "running queue holds a sequence in another state");
    return KVP_OK;
}

int64_t kvp_engine_steps(const kvp_engine *e) { return e->steps; }
int32_t kvp_engine_num_running(const kvp_engine *e) { return e->rq_n; }
int32_t kvp_engine_num_waiting(const kvp_engine *e) { return (int32_t)e->wq_n; }
int32_t kvp_engine_num_swapped(const kvp_engine *e) { return (int32_t)e->sq_n; }
double kvp_engine_now(const kvp_engine *e) { return e->now; }

void kvp_engine_counts_get(const kvp_engine *e, kvp_engine_counts *o)
{
    int64_t readmit = 0;
    for (int64_t i = 0; i < e->wq_n; i++) readmit += RQ_(e, S_(e, e->wq[e->wq_head + i]))->admitted_once;
    int64_t running_reqs = 0; /* a request's sequences rank together: adjacent in rq */
    for (int32_t i = 0; i < e->rq_n; i++) running_reqs += i == 0 || S_(e, e->rq[i])->req != S_(e, e->rq[i - 1])->req;
    *o = (kvp_engine_counts){.requests = e->req_base + e->n_reqs, .finished = e->finished, .rejected = e->rejected,
                             .aborted = e->aborted,
                             .waiting_requests = e->req_base + e->n_reqs - e->admitted_reqs - e->rejected -
                                                 e->aborted_unadmitted,
                             .running_seqs = e->rq_n, .running_requests = running_reqs, .waiting_seqs = e->wq_n, .swapped_seqs = e->sq_n,
                             .readmit_seqs = readmit, .request_records = e->n_reqs,
                             .seq_records = e->n_slots - e->n_free_slots, .steps = e->steps,
                             .computed_tokens = e->computed_tokens, .prefix_hit_tokens = e->hit_tokens_first,
                             .admitted_prompt_tokens = e->prompt_tokens_first, .preemptions = e->preemptions,
                             .spec_drafts = e->spec_drafts, .spec_draft_tokens = e->spec_draft_tokens,
                             .spec_accepted_tokens = e->spec_accepted_tokens, .host_hit_tokens = e->host_hit_tokens_first,
                             .host_loaded_blocks = e->host_loaded_blocks, .host_stored_blocks = e->host_stored_blocks,
                             .evicted_blocks = kvm_evicted_blocks(e), .num_blocks = e->num_blocks, .free_blocks = paged(e) ? kvm_free_blocks(e) : 0};
}

/* Request index i, or NULL when unknown or released. */
static req_t *req_at(const kvp_engine *e, int64_t i)
{
    if (i < e->req_base || i >= e->req_base + e->n_reqs) return NULL;
    req_t *r = R_(e, i);
    return r->released ? NULL : r;
}

/* Samples a request reports: its sequences but dropped beams; a beam search's best n. */
static int32_t n_samples(const kvp_engine *e, const req_t *r)
{
    int32_t n = 0;
    for (int64_t q = r->first_seq; q >= 0; q = S_(e, q)->next) n += !S_(e, q)->dropped;
    return r->beams && n > r->req->out->n ? r->req->out->n : n;
}

kvp_status kvp_engine_request(const kvp_engine *e, int64_t index, kvp_req_result *out)
{
    const req_t *r = e && out ? req_at(e, index) : NULL;
    if (r == NULL) return KVP_ERR(KVP_EINVAL, "engine: no request with index %lld", (long long)index);
    const seq_t *s = r->first_seq >= 0 ? S_(e, r->first_seq) : NULL;
    static const kvp_req_state of_seq[] = {KVP_REQ_WAITING, KVP_REQ_RUNNING, KVP_REQ_SWAPPED, KVP_REQ_FINISHED};
    *out = (kvp_req_result){.id = r->req->id, .arrival_s = r->arrival, .prompt_len = r->prompt_len,
                            .cached_tokens = r->hit_first, .state = r->state, .num_generated = r->max_generated,
                            .output_len = r->output_len, .preemptions = r->preemptions, .n_samples = n_samples(e, r),
                            .aborted = r->aborted, .admit_s = r->admit_s, .first_token_s = r->first_token_s,
                            .finish_s = r->finish_s};
    if (s && r->state == KVP_REQ_WAITING) out->state = of_seq[s->state];
    if (s) out->num_computed = s->num_computed;
    return KVP_OK;
}

static int cmp_beam(const void *a, const void *b, void *ctx)
{
    const kvp_engine *e = ctx;
    const seq_t *x = S_(e, *(const int64_t *)a), *y = S_(e, *(const int64_t *)b);
    if (x->logprob != y->logprob) return x->logprob > y->logprob ? -1 : 1;
    return x->bm_id < y->bm_id ? -1 : (x->bm_id > y->bm_id);
}

/* The slot of sample k of r (beams: k-th best), -1 when there is none (yet). */
static int64_t sample_slot(const kvp_engine *e, const req_t *r, int32_t k)
{
    if (!r->beams) {
        for (int64_t q = r->first_seq; q >= 0; q = S_(e, q)->next)
            if (S_(e, q)->sample == k && !S_(e, q)->dropped) return q;
        return -1;
    }
    int64_t slots[KVP_MAX_SAMPLES];
    int32_t n = 0;
    for (int64_t q = r->first_seq; q >= 0 && n < KVP_MAX_SAMPLES; q = S_(e, q)->next)
        if (!S_(e, q)->dropped) slots[n++] = q;
    qsort_r(slots, (size_t)n, sizeof *slots, cmp_beam, (void *)e);
    return k < n ? slots[k] : -1;
}

kvp_status kvp_engine_sample(const kvp_engine *e, int64_t i, int32_t k, kvp_sample_view *out)
{
    const req_t *r = req_at(e, i);
    memset(out, 0, sizeof *out);
    out->stop_token = -1;
    const int32_t want = r ? (r->req->out ? r->req->out->n : 1) : 0;
    if (r == NULL || k < 0 || k >= want || (r->beams && r->state != KVP_REQ_FINISHED)) return KVP_ENOTFOUND;
    const int64_t q = sample_slot(e, r, k);
    if (q < 0) return KVP_OK; /* not admitted, or not forked yet */
    const seq_t *s = S_(e, q);
    out->tokens = s->gen;
    out->n_tokens = s->num_generated;
    out->logprob = s->logprob;
    out->finish = s->finish;
    out->stop_token = s->stop_token;
    out->logprobs = r->req->out && r->req->out->logprobs ? &s->glp.a : NULL;
    out->done = s->state == SEQ_DONE;
    return KVP_OK;
}

kvp_status kvp_engine_prompt_logprobs(const kvp_engine *e, int64_t i, const kvp_logprobs **lp)
{
    const req_t *r = req_at(e, i);
    if (r == NULL || !r->req->out || !r->req->out->prompt_logprobs) return KVP_ENOTFOUND;
    *lp = &r->plp.a;
    return KVP_OK;
}

kvp_status kvp_engine_take_finished(kvp_engine *e, int64_t *i)
{
    if (e->fin_head == e->fin_n) return KVP_ENOTFOUND; /* nothing finished: not an error worth a message */
    *i = e->fin[e->fin_head++];
    R_(e, *i)->taken = true;
    if (e->fin_head == e->fin_n) e->fin_head = e->fin_n = 0;
    return KVP_OK;
}

/* Drops the released requests at the front of the window once they are half of it (each record moves O(1)
 * times on average). */
static void compact_requests(kvp_engine *e)
{
    int64_t d = 0;
    while (d < e->n_reqs && e->reqs[d].released) d++;
    if (d < 64 || 2 * d < e->n_reqs) return;
    memmove(e->reqs, e->reqs + d, (size_t)(e->n_reqs - d) * sizeof *e->reqs);
    e->n_reqs -= d;
    e->req_base += d;
    if (e->next_arrival < e->req_base) e->next_arrival = e->req_base;
}

void kvp_engine_release(kvp_engine *e, int64_t i)
{
    req_t *r = req_at(e, i);
    if (r == NULL || r->state != KVP_REQ_FINISHED) return;
    while (r->first_seq >= 0) eng_free_seq(e, r->first_seq);
    lp_acc_free(&r->plp);
    r->released = true;
    e->live_reqs--;
    compact_requests(e);
}

/* Takes sequence slot out of its queue (it is being ended outside a step). */
static void unqueue(kvp_engine *e, int64_t slot)
{
    const seq_t *s = S_(e, slot);
    if (s->state == SEQ_WAITING) sch_remove_waiting(e, slot);
    else if (s->state == SEQ_SWAPPED) sch_remove_swapped(e, slot);
}

kvp_status kvp_engine_stop(kvp_engine *e, int64_t i, int32_t k, int32_t n_keep)
{
    req_t *r = req_at(e, i);
    if (r == NULL || r->beams || !r->req->out || k < 0 || k >= r->req->out->n) return KVP_ENOTFOUND;
    const int64_t q = sample_slot(e, r, k);
    if (q < 0 || S_(e, q)->fork_pending) return KVP_ENOTFOUND;
    seq_t *s = S_(e, q);
    const bool cut = n_keep >= s->step_gen0 && n_keep < s->num_generated; /* only this step's tokens */
    if (s->state == SEQ_DONE && !cut) return KVP_ENOTFOUND;
    if (cut) {
        s->logprob = s->step_lp[n_keep - s->step_gen0];
        s->num_generated = n_keep;
        if (s->glp.a.n > n_keep) s->glp.a.n = n_keep;
        if (s->num_computed > total_known(e, s)) s->num_computed = total_known(e, s);
        s->stop_token = -1;
        r->max_generated = 0;
        for (int64_t o = r->first_seq; o >= 0; o = S_(e, o)->next)
            if (S_(e, o)->num_generated > r->max_generated) r->max_generated = S_(e, o)->num_generated;
    }
    if (s->state == SEQ_DONE) {
        s->finish = KVP_FINISH_STOPPED;
        return KVP_OK;
    }
    if (cut && (s->state == SEQ_RUNNING) && paged(e)) KVP_TRY(kvm_truncate(e, s, s->num_computed));
    unqueue(e, q);
    KVP_TRY(out_finish_seq(e, q, KVP_FINISH_STOPPED));
    sch_compact_running(e);
    return KVP_OK;
}

kvp_status kvp_engine_abort(kvp_engine *e, int64_t i)
{
    req_t *r = req_at(e, i);
    if (r == NULL || r->state == KVP_REQ_FINISHED || r->state == KVP_REQ_REJECTED) return KVP_ENOTFOUND;
    r->aborted = true;
    e->aborted++;
    if (!r->admitted_once) { /* nothing ran: it finishes with no sample */
        e->aborted_unadmitted++;
        while (r->first_seq >= 0) {
            unqueue(e, r->first_seq);
            eng_free_seq(e, r->first_seq);
        }
        r->n_live = 0;
        return out_finish_req(e, i);
    }
    for (int64_t q = r->first_seq; q >= 0; q = S_(e, q)->next) {
        if (S_(e, q)->state == SEQ_DONE) continue;
        unqueue(e, q);
        KVP_TRY(out_finish_seq(e, q, KVP_FINISH_ABORTED));
    }
    sch_compact_running(e);
    return KVP_OK;
}

kvp_status kvp_engine_reset_prefix_cache(kvp_engine *e, int64_t *evicted) { return kvm_reset_prefix_cache(e, evicted); }
