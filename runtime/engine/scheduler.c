/* runtime/engine/scheduler.c — which sequences run each step and how many tokens each computes: arrivals,
 * the waiting / running / swapped queues in rank order, the token budget, chunked prefill, admission
 * (FCFS, longest prefix match, priority; seats for the samples a request forks into; beam reservations;
 * the watermark), preemption by recompute or swap, n-gram drafts (contract: engine.h, step 1-3).
 * Memory is asked of the KV manager (kv_manager.c) only.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "runtime/engine/engine_internal.h"

/* ---------------------------------------------------------------- ranks and queues */

/* Smaller ranks first: (priority when the policy is priority: larger first), arrival, request, sequence. */
bool sch_rank_less(const kvp_engine *e, int64_t a, int64_t b)
{
    const seq_t *x = S_(e, a), *y = S_(e, b);
    const req_t *rx = RQ_(e, x), *ry = RQ_(e, y);
    if (rx != ry) {
        if (e->cfg.sched == KVP_SCHED_PRIORITY && rx->req->priority != ry->req->priority)
            return rx->req->priority > ry->req->priority;
        if (rx->arrival != ry->arrival) return rx->arrival < ry->arrival;
        return x->req < y->req;
    }
    return x->bm_id < y->bm_id;
}

/* Inserts slot into the sorted arr[0..*n) (room guaranteed by the caller). */
static void sorted_insert(const kvp_engine *e, int64_t *arr, int64_t *n, int64_t slot)
{
    int64_t lo = 0, hi = *n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (sch_rank_less(e, arr[mid], slot)) lo = mid + 1;
        else hi = mid;
    }
    memmove(arr + lo + 1, arr + lo, (size_t)(*n - lo) * sizeof *arr);
    arr[lo] = slot;
    (*n)++;
}

void sch_waiting_insert(kvp_engine *e, int64_t slot)
{
    /* Common case (fcfs arrivals): append at the tail. The queue has room for every slot: compact to the
     * front when the tail is reached. */
    if (e->wq_n == 0 || sch_rank_less(e, e->wq[e->wq_head + e->wq_n - 1], slot)) {
        if (e->wq_head + e->wq_n == e->cap_slots) {
            memmove(e->wq, e->wq + e->wq_head, (size_t)e->wq_n * sizeof *e->wq);
            e->wq_head = 0;
        }
        e->wq[e->wq_head + e->wq_n++] = slot;
        return;
    }
    if (e->wq_head > 0 && sch_rank_less(e, slot, e->wq[e->wq_head])) {
        e->wq[--e->wq_head] = slot;
        e->wq_n++;
        return;
    }
    if (e->wq_head + e->wq_n == e->cap_slots) {
        memmove(e->wq, e->wq + e->wq_head, (size_t)e->wq_n * sizeof *e->wq);
        e->wq_head = 0;
    }
    sorted_insert(e, e->wq + e->wq_head, &e->wq_n, slot);
}

void sch_running_insert(kvp_engine *e, int64_t slot)
{
    int64_t n = e->rq_n;
    sorted_insert(e, e->rq, &n, slot);
    e->rq_n = (int32_t)n;
}

/* Drops slot from the sorted array arr[0..*n) (if there). */
static void remove_from(int64_t *arr, int64_t *n, int64_t slot)
{
    for (int64_t i = 0; i < *n; i++)
        if (arr[i] == slot) {
            memmove(arr + i, arr + i + 1, (size_t)(*n - i - 1) * sizeof *arr);
            (*n)--;
            return;
        }
}

void sch_remove_waiting(kvp_engine *e, int64_t slot)
{
    remove_from(e->wq + e->wq_head, &e->wq_n, slot);
    if (e->wq_n == 0) e->wq_head = 0;
}

void sch_remove_swapped(kvp_engine *e, int64_t slot) { remove_from(e->sq, &e->sq_n, slot); }

/* Running sequences that are no longer running (finished, dropped, preempted) leave the queue. */
void sch_compact_running(kvp_engine *e)
{
    int32_t k = 0;
    for (int32_t i = 0; i < e->rq_n; i++)
        if (S_(e, e->rq[i])->state == SEQ_RUNNING) e->rq[k++] = e->rq[i];
    e->rq_n = k;
}

/* ---------------------------------------------------------------- arrivals */

static bool due_less(const struct due *a, const struct due *b) { return a->t < b->t || (a->t == b->t && a->req < b->req); }

kvp_status sch_due_push(kvp_engine *e, int64_t req, double t)
{
    KVP_TRY(kvp_grow((void **)&e->due, &e->due_cap, (size_t)e->due_n + 1, sizeof *e->due));
    int64_t i = e->due_n++;
    struct due x = {t, req};
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

double sch_next_arrival_time(const kvp_engine *e)
{
    const int64_t end = e->req_base + e->n_reqs;
    double t = e->next_arrival < end ? R_(e, e->next_arrival)->req->arrival_s : INFINITY;
    if (e->cfg.wall_clock && e->next_arrival < end) t = R_(e, e->next_arrival)->arrival;
    return e->due_n > 0 && e->due[0].t < t ? e->due[0].t : t;
}

/* Request a joins the waiting queue at time t with its first sequence. */
static kvp_status join_waiting(kvp_engine *e, int64_t a, double t)
{
    req_t *r = R_(e, a);
    int64_t slot;
    KVP_TRY(eng_new_seq(e, a, 0, &slot));
    seq_t *s = S_(e, slot);
    s->fork_pending = r->group > 1 || r->beams;
    r->arrival = t;
    r->state = KVP_REQ_WAITING;
    sch_waiting_insert(e, slot);
    return KVP_OK;
}

/* A parallel sample (after_prompt) ranks with its own arrival, its parent's: it is part of that request. */
static double rank_arrival(const req_t *r, double t) { return r->req->after_prompt ? r->req->arrival_s : t; }

/* Moves the requests whose time has come to waiting. One whose parent is not ready (has not finished; for a
 * parallel sample, has not computed its prompt) is held (blocked) until it is; one whose parent finished
 * arrives think_s after that, and not before its own time. */
kvp_status sch_arrivals(kvp_engine *e)
{
    const int64_t end = e->req_base + e->n_reqs;
    while (e->next_arrival < end) {
        req_t *r = R_(e, e->next_arrival);
        const double at = e->cfg.wall_clock ? r->arrival : r->req->arrival_s;
        if (at > e->now) break;
        const int64_t a = e->next_arrival++;
        if (r->state != KVP_REQ_PENDING) continue; /* rejected, or aborted before it arrived */
        const req_t *p = r->parent >= 0 ? R_(e, r->parent) : NULL;
        const bool sample = r->req->after_prompt;
        if (p && p->state != KVP_REQ_FINISHED && p->state != KVP_REQ_REJECTED && !(sample && p->prompt_done)) {
            r->blocked = true;
            continue;
        }
        double t = p && p->state == KVP_REQ_FINISHED && !sample ? p->finish_s + r->req->think_s : at;
        if (t > e->now) KVP_TRY(sch_due_push(e, a, t));
        else KVP_TRY(join_waiting(e, a, t > at ? t : at));
    }
    while (e->due_n > 0 && e->due[0].t <= e->now) {
        struct due d = due_pop(e);
        if (R_(e, d.req)->state != KVP_REQ_PENDING) continue;
        KVP_TRY(join_waiting(e, d.req, rank_arrival(R_(e, d.req), d.t)));
    }
    return KVP_OK;
}

kvp_status sch_release_children(kvp_engine *e, int64_t a, bool prompt_only)
{
    for (int64_t c = R_(e, a)->first_child; c >= 0; c = R_(e, c)->next_sibling) {
        req_t *r = R_(e, c);
        if (!r->blocked || (prompt_only && !r->req->after_prompt)) continue;
        r->blocked = false;
        KVP_TRY(sch_due_push(e, c, e->now + (r->req->after_prompt ? 0.0 : r->req->think_s)));
    }
    return KVP_OK;
}

/* ---------------------------------------------------------------- preemption */

static kvp_status preempt(kvp_engine *e, int64_t slot)
{
    seq_t *s = S_(e, slot);
    e->preemptions++;
    e->step_preempted++;
    s->preemptions++;
    RQ_(e, s)->preemptions++;
    e->seats -= seats_of(e, s);
    if (e->cfg.preempt == KVP_PREEMPT_SWAP && paged(e)) {
        kvp_status st = kvm_swap_out(e, s);
        if (st == KVP_OK) {
            e->swap_outs++;
            s->state = SEQ_SWAPPED;
            sorted_insert(e, e->sq, &e->sq_n, slot);
            return KVP_OK;
        }
        if (st != KVP_ENOBLOCKS) return st;
    }
    /* recompute: drop the KV (its full blocks stay cached), compute prompt + generated tokens again later */
    e->recomputes++;
    KVP_TRY(kvm_cache_computed(e, s));
    KVP_TRY(kvm_release(e, s));
    s->num_computed = 0;
    s->inserted = false;
    s->state = SEQ_WAITING;
    sch_waiting_insert(e, slot);
    return KVP_OK;
}

/* ---------------------------------------------------------------- scheduling */

static int32_t want_tokens(const kvp_engine *e, const seq_t *s, int32_t budget)
{
    int32_t need = total_known(e, s) - s->num_computed;
    return need < budget ? need : budget;
}

/* A beam of a search past its prompt: beams advance together and are never preempted. */
static bool is_beam(const kvp_engine *e, const seq_t *s) { return RQ_(e, s)->beams; }

/* Drafts for decoding sequence s (its next token's slot is secured): as many as the budget left after its
 * token, its remaining tokens, the spec config and the free blocks allow; appended after its generated ids. */
static kvp_status propose_drafts(kvp_engine *e, seq_t *s, int32_t budget)
{
    const kvp_spec_config *c = &e->cfg.spec;
    const req_t *r = RQ_(e, s);
    s->ndraft = 0;
    if (c->tokens < 1 || r->req->out == NULL || r->beams || s->fork_pending || s->num_generated < 1 ||
        s->num_computed != total_known(e, s) - 1 || (c->max_batch > 0 && e->step_running > c->max_batch))
        return KVP_OK;
    /* drawing k drafts' places gives k + 1 tokens: the last place needs no draft */
    int32_t k = r->output_len - s->num_generated - 1;
    k = k < c->tokens ? k : c->tokens;
    k = k < budget - 1 ? k : budget - 1;
    if (k < 1) return KVP_OK;
    const int32_t len = total_known(e, s);
    const int32_t *toks;
    KVP_TRY(kvm_known_tokens(e, s, len, &toks));
    int32_t d[KVP_MAX_SPEC];
    k = kvp_ngram_propose(toks, len, c->ngram_min, c->ngram_max, k, d);
    for (int32_t need = 0; k > 0; k--) { /* free blocks only: a draft never evicts or preempts */
        KVP_TRY(kvm_append_needed(e, s, 1 + k, &need));
        if (need <= kvm_free_blocks(e)) break;
    }
    if (k == 0) return KVP_OK;
    KVP_TRY(kvp_grow((void **)&s->gen, &s->gen_cap, (size_t)(s->num_generated + k), sizeof *s->gen));
    memcpy(s->gen + s->num_generated, d, (size_t)k * sizeof *d);
    s->ndraft = k;
    e->spec_drafts++;
    e->spec_draft_tokens += k;
    return KVP_OK;
}

static kvp_status sched_push(kvp_engine *e, int64_t slot)
{
    KVP_TRY(kvp_grow((void **)&e->sched, &e->sched_cap, (size_t)e->sched_n + 1, sizeof *e->sched));
    e->sched[e->sched_n++] = slot;
    return KVP_OK;
}

/* Live beams of s's request that follow rq[i] (them included) and decode now. */
static int32_t beam_group(const kvp_engine *e, int32_t i, int32_t n)
{
    const int64_t req = S_(e, e->rq[i])->req;
    int32_t g = 0;
    while (i + g < n && S_(e, e->rq[i + g])->req == req) g++;
    return g;
}

/* Schedules running sequences in rank order; preempts from the bottom when blocks run out. */
static kvp_status schedule_running(kvp_engine *e, int32_t *budget)
{
    int32_t n = e->rq_n; /* effective length: victims leave the queue at once */
    for (int32_t i = 0; i < n && *budget > 0; i++) {
        seq_t *s = S_(e, e->rq[i]);
        int32_t k = want_tokens(e, s, *budget);
        if (k <= 0) continue;
        if (is_beam(e, s) && !s->fork_pending && (i == 0 || S_(e, e->rq[i - 1])->req != s->req)) {
            const int32_t g = beam_group(e, i, n); /* lockstep: all of them or none */
            if (g > *budget) {
                i += g - 1;
                continue;
            }
        }
        if (paged(e)) {
            int32_t need;
            KVP_TRY(kvm_append_needed(e, s, k, &need));
            bool self = false;
            while (kvm_free_blocks(e) < need) {
                KVP_TRY(kvm_make_room(e, need));
                if (kvm_free_blocks(e) >= need) break;
                int32_t v = n - 1;
                while (v > i && is_beam(e, S_(e, e->rq[v]))) v--;
                if (v == i && is_beam(e, s))
                    return KVP_ERR(KVP_ENOBLOCKS, "engine: the KV cache (%d blocks of %d tokens) cannot grow beam "
                                                  "search %lld to %d tokens; give it more blocks",
                                   e->num_blocks, e->cfg.block_size, (long long)RQ_(e, s)->req->id,
                                   s->num_computed + k);
                const int64_t victim = e->rq[v];
                memmove(e->rq + v, e->rq + v + 1, (size_t)(n - v - 1) * sizeof *e->rq);
                n--;
                KVP_TRY(preempt(e, victim));
                if (v == i) {
                    self = true;
                    break;
                }
            }
            if (self) {
                i--; /* the next sequence moved into place i */
                continue;
            }
            KVP_TRY(propose_drafts(e, s, *budget));
            KVP_TRY(kvm_append(e, s, k + s->ndraft));
        } else {
            KVP_TRY(kvm_append(e, s, k));
        }
        s->sched_new = k + s->ndraft;
        KVP_TRY(sched_push(e, e->rq[i]));
        *budget -= s->sched_new;
    }
    e->rq_n = n;
    return KVP_OK;
}

static kvp_status admitted_push(kvp_engine *e, int64_t slot)
{
    KVP_TRY(kvp_grow((void **)&e->admitted, &e->admitted_cap, (size_t)e->admitted_n + 1, sizeof *e->admitted));
    e->admitted[e->admitted_n++] = slot;
    return sched_push(e, slot);
}

/* Brings swapped sequences back (rank order) while memory and the seats allow; schedules them. */
static kvp_status swap_in(kvp_engine *e, int32_t *budget)
{
    while (e->sq_n > 0 && *budget > 0) {
        const int64_t slot = e->sq[0];
        seq_t *s = S_(e, slot);
        if (e->seats + seats_of(e, s) > e->cfg.max_num_seqs) break;
        int32_t need_in;
        KVP_TRY(kvm_swap_in_needed(e, s, &need_in));
        const int32_t k = want_tokens(e, s, *budget), bs = e->cfg.block_size;
        /* blocks appending k tokens will add once the sequence is back (its blocks are unshared then) */
        const int32_t extra = (s->num_computed + k + bs - 1) / bs - (s->num_computed + bs - 1) / bs;
        const int32_t want = need_in + extra + e->cfg.watermark_blocks;
        KVP_TRY(kvm_make_room(e, want));
        if (kvm_free_blocks(e) < want) break;
        KVP_TRY(kvm_swap_in(e, s));
        e->swap_ins++;
        KVP_TRY(kvm_append(e, s, k));
        s->state = SEQ_RUNNING;
        s->sched_new = k;
        e->seats += seats_of(e, s);
        KVP_TRY(admitted_push(e, slot));
        *budget -= k;
        memmove(e->sq, e->sq + 1, (size_t)(e->sq_n - 1) * sizeof *e->sq);
        e->sq_n--;
    }
    return KVP_OK;
}

/* The blocks the W beams of request r may hold at once: the prompt's full blocks, shared, and for each beam
 * the rest of a whole sequence of its own. */
static int32_t beam_blocks(const kvp_engine *e, const req_t *r)
{
    const int64_t bs = e->cfg.block_size, p = r->prompt_len, len = p + r->output_len;
    const int64_t nb = p / bs + (int64_t)r->group * ((len + bs - 1) / bs - p / bs);
    return nb > INT32_MAX ? INT32_MAX : (int32_t)nb;
}

/* Whether the sequence still has prompt places whose log-probabilities its request wants: every prompt
 * token's logits, so no prefix-cache hit. */
static bool wants_prompt_logits(const kvp_engine *e, const seq_t *s)
{
    const req_t *r = RQ_(e, s);
    return r->req->out && r->req->out->prompt_logprobs && r->plp.a.n < r->prompt_len;
}

/* Tries to admit waiting sequence s with the budget left. *ok = false when it does not fit (nothing changed
 * then). */
static kvp_status try_admit(kvp_engine *e, seq_t *s, int32_t *budget, bool *ok)
{
    req_t *r = RQ_(e, s);
    const int32_t bs = e->cfg.block_size, total = total_known(e, s);
    *ok = false;
    if (e->seats + seats_of(e, s) > e->cfg.max_num_seqs) return KVP_OK;
    const bool fresh_beams = r->beams && !r->admitted_once;
    const int32_t reserve = fresh_beams ? beam_blocks(e, r) : 0;
    if (reserve > 0 && e->beam_reserved > 0 && (int64_t)e->beam_reserved + reserve > e->num_blocks) return KVP_OK;
    if (!paged(e)) {
        int32_t k = total < *budget ? total : *budget;
        if ((!e->cfg.chunked_prefill && k < total) || k <= 0 || !kvm_can_reserve(e, s)) return KVP_OK;
        KVP_TRY(kvm_admit(e, s, 0, 0, k, false));
        s->num_computed = 0;
        s->sched_new = k;
        *budget -= k;
        *ok = true;
        return KVP_OK;
    }
    int32_t n_hit = 0, n_load = 0; /* readmitted after recompute: its generated tokens may be cached too */
    if (!wants_prompt_logits(e, s)) KVP_TRY(kvm_match(e, s, total, true, &n_hit, &n_load));
    const int32_t hit_tok = (n_hit + n_load) * bs; /* cached or loaded: not computed */
    const int32_t remaining = total - hit_tok;
    const int32_t k = remaining < *budget ? remaining : *budget;
    bool fits = k > 0 && (e->cfg.chunked_prefill || k == remaining);
    if (fits) {
        const int32_t need = (hit_tok + k + bs - 1) / bs - n_hit;
        kvp_status st = kvm_make_room(e, need + e->cfg.watermark_blocks);
        if (st != KVP_OK) {
            kvm_unmatch(e, n_hit);
            return st;
        }
        fits = kvm_free_blocks(e) >= need + e->cfg.watermark_blocks;
    }
    kvp_status st = fits ? kvm_admit(e, s, n_hit, n_load, hit_tok + k, r->admitted_once) : KVP_OK;
    if (!fits || st != KVP_OK) {
        kvm_unmatch(e, n_hit);
        return st;
    }
    if (!r->admitted_once) {
        e->prompt_tokens_first += r->prompt_len;
        e->hit_tokens_first += n_hit * bs;
        e->host_hit_tokens_first += n_load * bs;
        r->hit_first = hit_tok;
    } else {
        e->readmit_hit_tokens += hit_tok;
    }
    if (reserve > 0) {
        r->reserved = reserve;
        e->beam_reserved += reserve;
    }
    s->num_computed = hit_tok;
    s->sched_new = k;
    *budget -= k;
    *ok = true;
    return KVP_OK;
}

static kvp_status mark_admitted(kvp_engine *e, int64_t slot)
{
    seq_t *s = S_(e, slot);
    req_t *r = RQ_(e, s);
    s->state = SEQ_RUNNING;
    e->seats += seats_of(e, s);
    if (!r->admitted_once) {
        r->admitted_once = true;
        r->admit_s = e->now;
        e->admitted_reqs++;
    }
    return admitted_push(e, slot);
}

static int cmp_lpm(const void *a, const void *b, void *ctx)
{
    const kvp_engine *e = ctx;
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    const int32_t sx = S_(e, x)->lpm_score, sy = S_(e, y)->lpm_score;
    if (sx != sy) return sx > sy ? -1 : 1;
    return sch_rank_less(e, x, y) ? -1 : sch_rank_less(e, y, x); /* ties: arrival order */
}

/* Admits waiting requests in policy order; stops at the first that does not fit. */
static kvp_status admit_waiting(kvp_engine *e, int32_t *budget)
{
    if (e->wq_n == 0) return KVP_OK;
    if (e->cfg.sched == KVP_SCHED_LPM && e->pc) {
        const int64_t w = e->wq_n < KVP_LPM_WINDOW ? e->wq_n : KVP_LPM_WINDOW;
        for (int64_t i = 0; i < w; i++) {
            const int64_t slot = e->wq[e->wq_head + i];
            seq_t *s = S_(e, slot);
            int32_t n_hit = 0, n_host = 0; /* a host hit is not computed either */
            if (!wants_prompt_logits(e, s)) KVP_TRY(kvm_match(e, s, RQ_(e, s)->prompt_len, false, &n_hit, &n_host));
            s->lpm_score = n_hit + n_host;
            e->lpm_order[i] = slot;
        }
        qsort_r(e->lpm_order, (size_t)w, sizeof *e->lpm_order, cmp_lpm, e);
        int64_t taken = 0;
        for (int64_t i = 0; i < w && *budget > 0; i++) {
            bool ok;
            KVP_TRY(try_admit(e, S_(e, e->lpm_order[i]), budget, &ok));
            if (!ok) break;
            KVP_TRY(mark_admitted(e, e->lpm_order[i]));
            taken++;
        }
        if (taken > 0) { /* drop the admitted ones from the window, keep the rank order of the rest */
            int64_t k = 0;
            for (int64_t i = 0; i < e->wq_n; i++) {
                const int64_t slot = e->wq[e->wq_head + i];
                if (S_(e, slot)->state == SEQ_WAITING) e->wq[e->wq_head + k++] = slot;
            }
            e->wq_n = k;
        }
        return KVP_OK;
    }
    while (e->wq_n > 0 && *budget > 0) {
        const int64_t slot = e->wq[e->wq_head];
        bool ok;
        KVP_TRY(try_admit(e, S_(e, slot), budget, &ok));
        if (!ok) break;
        e->wq_head++;
        e->wq_n--;
        KVP_TRY(mark_admitted(e, slot));
    }
    if (e->wq_n == 0) e->wq_head = 0;
    return KVP_OK;
}

kvp_status sch_schedule(kvp_engine *e)
{
    int32_t budget = e->cfg.max_batched_tokens;
    e->sched_n = 0;
    e->admitted_n = 0;
    e->step_preempted = 0;
    e->step_running = e->rq_n;
    for (int32_t i = 0; i < e->rq_n; i++) S_(e, e->rq[i])->ndraft = 0;
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
    for (int32_t i = 0; i < e->admitted_n; i++) sch_running_insert(e, e->admitted[i]);
    return KVP_OK;
}
