/* runtime/engine/engine_internal.h — the engine's state, shared by its parts (not a public header):
 *
 *   engine.c      create / destroy, add, the step (batch building, executor call), run, metrics, checks
 *   scheduler.c   arrivals, queues and ranks, admission, chunked prefill, preemption, swap, drafts
 *   kv_manager.c  the only caller of blockmgr/, prefix_cache/ and host_cache: matches, allocation,
 *                 eviction, cache filling, write-back, host-tier moves, accounting
 *   output.c      the output stage: sampling, EOS and stop ids, forks, beam search, draft verification,
 *                 logprobs, finishing
 *
 * Records:
 *   reqs[0 .. n_reqs)    one per added request, absolute number = req_base + index (a window: released
 *                        requests at its front are dropped now and then, so a server's memory stays bounded)
 *   seqs[slot]           one per sequence (a request has 1, its n samples or its beams); free slots are
 *                        reused; a sequence's block-manager id (bm_id) is never reused
 *   wq[wq_head .. +wq_n) waiting sequences in rank order;  rq[0 .. rq_n) running, rank order (the last is the
 *                        first preemption victim);  sq[0 .. sq_n) swapped, rank order
 */
#ifndef KVP_RUNTIME_ENGINE_ENGINE_INTERNAL_H
#define KVP_RUNTIME_ENGINE_ENGINE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "blockmgr/block_mgr.h"
#include "blockmgr/contiguous.h"
#include "prefix_cache/host_cache.h"
#include "prefix_cache/prefix_cache.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/sampler.h"

typedef enum { SEQ_WAITING = 0, SEQ_RUNNING, SEQ_SWAPPED, SEQ_DONE } seq_state;

/* A kvp_logprobs that grows a place at a time. */
typedef struct {
    kvp_logprobs a;
    size_t cap_lp, cap_ids, cap_lps;
} lp_acc;

typedef struct {
    int64_t req;           /* absolute request number */
    int64_t bm_id;         /* block manager (or arena) id; creation order within a request */
    int64_t next;          /* the request's next sequence slot, -1 */
    int32_t sample;        /* generator stream (sample index; beams 0) */
    seq_state state;
    int32_t num_computed;  /* tokens whose KV is in memory */
    int32_t num_generated;
    int32_t *gen;          /* [gen_cap] generated ids, then this step's drafts */
    size_t gen_cap;
    int32_t sched_new;     /* tokens scheduled this step, drafts included */
    int32_t ndraft;        /* drafts among them */
    int32_t n_hit;         /* prefix-cache blocks it locked at its last admission */
    int32_t *hit;          /* [n_hit] */
    int32_t seen_hit;      /* blocks found cached at its last admission (a fork: its parent's), for the
                              host tier's selective write-through */
    int32_t preemptions;
    int32_t lpm_score;
    int32_t row;           /* its first logits row this step, -1 */
    int32_t lrow;          /* the row its next token is drawn from: its last new token's (drafts: its first) */
    int32_t step_gen0;     /* num_generated before this step's draws when it speculated, else INT32_MAX */
    double step_lp[KVP_MAX_SPEC + 1]; /* logprob before each of them (kvp_engine_stop's cut) */
    int64_t reserve_len;   /* contiguous: reservation length */
    bool inserted;         /* its computed prompt blocks were cached since its (re)admission */
    bool fork_pending;     /* forks into its request's group after the prompt */
    bool dropped;          /* a beam not kept: its slot goes at the end of the step */
    double logprob;
    kvp_rng rng;
    lp_acc glp;            /* the generated tokens' logprobs (output params' logprobs) */
    kvp_finish_reason finish;
    int32_t stop_token;
} seq_t;

typedef struct {
    const kvp_request *req;
    double arrival;        /* req->arrival_s, or later for a request that waits for another's answer */
    int64_t parent;        /* absolute number of the request this one waits for (kvp_request.after), -1 */
    int64_t first_child, next_sibling; /* the requests waiting for this one (-1: none) */
    int64_t first_seq;     /* slot of its first sequence, -1 */
    kvp_req_state state;   /* PENDING, WAITING (added to the queues), FINISHED, REJECTED */
    int32_t prompt_len;
    int32_t output_len;    /* clamped */
    int32_t group;         /* seats once forked: n samples or beam width (1 otherwise) */
    int32_t n_live;        /* sequences not done */
    int32_t hit_first;     /* prompt tokens found cached (or in the host tier) at the first admission */
    int32_t reserved;      /* beam search: blocks kept back for its beams while it runs */
    int32_t preemptions;
    int32_t max_generated;
    bool beams, blocked, admitted_once, prompt_done, aborted, released, taken;
    double admit_s, first_token_s, finish_s;
    lp_acc plp;            /* prompt logprobs recorded so far */
} req_t;

struct due {
    double t;
    int64_t req;
};

struct kvp_engine {
    kvp_engine_config cfg;
    kvp_executor *ex;
    /* KV manager (kv_manager.c) */
    kvp_block_mgr *bm;
    kvp_prefix_cache *pc;
    kvp_host_cache *hc;   /* host tier, or NULL */
    int32_t hc_base;      /* host id of tier slot 0 (after the swap space) */
    kvp_contig *arena;
    kvp_contig_policy contig_policy;
    int32_t num_blocks;
    int32_t *hit_scratch;
    int32_t hit_scratch_cap;
    int32_t *seqbuf;      /* one sequence's prompt + generated ids */
    size_t seqbuf_cap;
    uint64_t *hashes;     /* host tier: one sequence's chain hashes and slots */
    int32_t *hslots;
    size_t hashes_cap, hslots_cap;
    kvp_block_copy *tier_store, *tier_load;
    int32_t n_store, n_load;
    size_t store_cap, load_cap;
    int64_t *load_step;   /* [tier slots] the step whose batch loads from the slot (-1: none yet) */
    kvp_status write_back_st;
    int64_t flushed_blocks; /* cached blocks dropped by the end-of-run check or a reset (not evictions) */
    kvp_ledger *ledger;   /* why prompt tokens missed, the cache's health (with a prefix cache) */
    kvp_ledger_stats ledger_final; /* taken before the end-of-run flush */
    bool ledger_final_taken;
    struct kvp_kv_events *kve; /* --kv-events, or NULL */

    /* records */
    req_t *reqs;
    int64_t n_reqs, cap_reqs, req_base;
    int64_t next_arrival; /* absolute number of the first request not yet moved to waiting */
    seq_t *seqs;
    int64_t n_slots, cap_slots;
    int64_t *free_slots;
    int64_t n_free_slots;
    int64_t next_bm_id;
    int64_t live_reqs;    /* not released */

    /* queues (capacity: every slot) */
    int64_t *wq;
    int64_t wq_head, wq_n;
    int64_t *rq;
    int32_t rq_n;
    int64_t *sq;
    int64_t sq_n;
    int32_t seats;        /* running seats (a sequence that will fork holds its group's) */
    int32_t beam_reserved;
    struct due *due;      /* requests due at a known time: a min-heap on (t, req) */
    int64_t due_n;
    size_t due_cap;
    int64_t *fin;         /* finished requests not taken yet (keep_outputs), FIFO from fin_head */
    int64_t fin_head, fin_n;
    size_t fin_cap;

    /* per step */
    int64_t *sched;       /* scheduled slots, batch order */
    int32_t sched_n;
    size_t sched_cap;
    int64_t *admitted;    /* slots that joined the running queue this step */
    int32_t admitted_n;
    size_t admitted_cap;
    int64_t *lpm_order;
    kvp_exec_seq *xs;
    size_t xs_cap;
    int32_t *tokbuf;      /* token ids of recompute chunks that cross a prompt's end */
    size_t tokbuf_cap;
    int32_t step_preempted;
    int32_t step_running; /* running sequences at the start of the step (speculation's batch limit) */
    int32_t step_finished;
    /* flat batch (kvp_exec_flat) */
    int32_t *f_tokens, *f_pos, *f_qo, *f_kvi, *f_kvx, *f_last;
    int64_t *f_slots;
    uint8_t *f_every;
    size_t c_tokens, c_pos, c_qo, c_kvi, c_kvx, c_last, c_slots, c_every;
    /* output stage (output.c) */
    const float *logits;  /* this step's rows */
    int32_t vocab;
    struct out_ws *ows;

    double now, t0_wall;

    /* counters */
    int64_t steps, finished, rejected, clamped, aborted, preemptions, swap_outs, swap_ins, recomputes;
    int64_t readmit_hit_tokens, admitted_reqs, aborted_unadmitted;
    int64_t host_hit_tokens_first, host_loaded_blocks, host_stored_blocks;
    int64_t prompt_tokens_first, hit_tokens_first, computed_tokens, batch_tokens_sum, max_running;
    int64_t attended, cow_copies, spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    int64_t peak_used_blocks, peak_token_states, peak_logical_tokens, peak_shared_savings;
    double util_sum, shared_sum, logical_sum;
    int64_t util_n;
    double last_finish_s;
    /* time integrals */
    double t_total, t_running;
    double a_token, a_reserved, a_internal, a_external, a_cached, a_free, a_shared, a_in_use, a_cap;
};

/* ---- records (engine.c) */
static inline req_t *R_(const kvp_engine *e, int64_t a) { return &e->reqs[a - e->req_base]; }
static inline seq_t *S_(const kvp_engine *e, int64_t slot) { return &e->seqs[slot]; }
static inline req_t *RQ_(const kvp_engine *e, const seq_t *s) { return R_(e, s->req); }
static inline int32_t total_known(const kvp_engine *e, const seq_t *s) { return RQ_(e, s)->prompt_len + s->num_generated; }
static inline bool paged(const kvp_engine *e) { return e->cfg.alloc == KVP_ALLOC_PAGED; }
/* Seats a running sequence holds: its request's group while it has yet to fork. */
static inline int32_t seats_of(const kvp_engine *e, const seq_t *s) { return s->fork_pending ? RQ_(e, s)->group : 1; }
kvp_status eng_new_seq(kvp_engine *e, int64_t req, int32_t sample, int64_t *slot);
void eng_free_seq(kvp_engine *e, int64_t slot);

/* ---- scheduler.c */
bool sch_rank_less(const kvp_engine *e, int64_t a, int64_t b);
void sch_waiting_insert(kvp_engine *e, int64_t slot);
void sch_running_insert(kvp_engine *e, int64_t slot);
kvp_status sch_arrivals(kvp_engine *e);
double sch_next_arrival_time(const kvp_engine *e);
kvp_status sch_due_push(kvp_engine *e, int64_t req, double t);
kvp_status sch_release_children(kvp_engine *e, int64_t req, bool prompt_only);
kvp_status sch_schedule(kvp_engine *e);
void sch_remove_waiting(kvp_engine *e, int64_t slot);
void sch_remove_swapped(kvp_engine *e, int64_t slot);
void sch_compact_running(kvp_engine *e);

/* ---- kv_manager.c */
kvp_status kvm_create(kvp_engine *e);
void kvm_destroy(kvp_engine *e);
int32_t kvm_free_blocks(const kvp_engine *e);
/* The first n known tokens of s (prompt, generated), contiguous (the prompt itself or e->seqbuf). */
kvp_status kvm_known_tokens(kvp_engine *e, const seq_t *s, int32_t n, const int32_t **out);
/* Prefix-cache match of s's first n known tokens (lock: for an admission) and the host-tier blocks after
 * it: *n_hit blocks in e->hit_scratch, *n_load tier slots in e->hslots (marked as read by this step). */
kvp_status kvm_match(kvp_engine *e, const seq_t *s, int32_t n, bool lock, int32_t *n_hit, int32_t *n_load);
void kvm_unmatch(kvp_engine *e, int32_t n_hit); /* unlocks the scratch hits of a failed admission */
/* Evicts cached blocks until need are free or none is evictable (write-back stores them). */
kvp_status kvm_make_room(kvp_engine *e, int32_t need);
/* Allocates s's table: the scratch hits, then n_load tier blocks (loaded this step), then fresh blocks up
 * to n_tokens; the hits stay locked for s. Contiguous: the reservation plus n_tokens used. */
kvp_status kvm_admit(kvp_engine *e, seq_t *s, int32_t n_hit, int32_t n_load, int32_t n_tokens, bool readmission);
/* The step's clock for the ledger (start of a step) and its KV events (end of a step). */
void kvm_step_begin(kvp_engine *e);
kvp_status kvm_step_end(kvp_engine *e);
void kvm_ledger_stats(const kvp_engine *e, kvp_ledger_stats *out);
bool kvm_can_reserve(const kvp_engine *e, const seq_t *s);
kvp_status kvm_append_needed(const kvp_engine *e, const seq_t *s, int32_t k, int32_t *need);
kvp_status kvm_append(kvp_engine *e, seq_t *s, int32_t k);
/* Caches the full blocks of s's computed tokens (prompt and generated), and offers them to the host tier. */
kvp_status kvm_cache_computed(kvp_engine *e, seq_t *s);
/* Unlocks s's hits and frees its blocks (finish, recompute). */
kvp_status kvm_release(kvp_engine *e, seq_t *s);
/* Swap s out: KVP_ENOBLOCKS (nothing changed) when the host pool is short or there is none. */
kvp_status kvm_swap_out(kvp_engine *e, seq_t *s);
kvp_status kvm_swap_in_needed(const kvp_engine *e, const seq_t *s, int32_t *need);
kvp_status kvm_swap_in(kvp_engine *e, seq_t *s);
kvp_status kvm_fork(kvp_engine *e, const seq_t *parent, const seq_t *child);
kvp_status kvm_truncate(kvp_engine *e, seq_t *s, int32_t n_tokens);
kvp_status kvm_table(const kvp_engine *e, const seq_t *s, kvp_bm_table_view *v);
void kvm_batch_moves(kvp_engine *e, kvp_exec_batch *b);
void kvm_step_done(kvp_engine *e);
void kvm_account(const kvp_engine *e, kvp_kv_accounting *a);
kvp_status kvm_check(const kvp_engine *e);
kvp_status kvm_check_seq(const kvp_engine *e, const seq_t *s, bool holds, int64_t *logical);
kvp_status kvm_check_empty(kvp_engine *e);
kvp_status kvm_reset_prefix_cache(kvp_engine *e, int64_t *evicted);
int64_t kvm_evicted_blocks(const kvp_engine *e);
int64_t kvm_capacity_slots(const kvp_engine *e);
/* Blocks a request of len tokens needs for one sequence (paged), for admission checks. */
int64_t kvm_blocks_for(const kvp_engine *e, int64_t len);

/* ---- output.c */
kvp_status out_create(kvp_engine *e);
void out_destroy(kvp_engine *e);
/* After the forward pass: prompt logprobs, computed counts, prompt caching, then samples, forks, beams and
 * drafts of every scheduled sequence; finished requests are finished. */
kvp_status out_step(kvp_engine *e, const kvp_exec_result *res);
/* Ends sequence slot for why (its blocks freed; the request finishes with its last sequence). */
kvp_status out_finish_seq(kvp_engine *e, int64_t slot, kvp_finish_reason why);
/* Request a finished (its last sequence ended, or it is aborted before any ran). */
kvp_status out_finish_req(kvp_engine *e, int64_t a);
void lp_acc_free(lp_acc *x);

#endif
