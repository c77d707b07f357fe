/* prefix_cache/ledger.h — why each prompt token missed the prefix cache, and how long blocks live there.
 *
 * The ledger keeps the history of every block content ever computed, keyed by chain hash, and follows one
 * prefix cache as a listener (kvp_pc_add_listener: blocks stored, evicted, flushed). The caller tells it what
 * each request found and what it computed; the ledger puts every prompt token that was not a hit in exactly
 * one class, and measures cache health:
 *
 *   admission:  kvp_pc_match -> (host tier match) -> kvp_ledger_lookup(tokens, n_hit, n_host, readmission)
 *   computed:   kvp_ledger_computed(the tokens whose KV now exists: prompt, and answer when known)
 *   host tier:  kvp_ledger_host_stored(hashes of blocks copied there)
 *   cache:      stores, evictions, flushes arrive through the listener (kvp_ledger_attach)
 *   clock:      kvp_ledger_set_time(now) before each step (any unit: a replay position, seconds)
 *
 * Classes of a first admission's missed tokens, decided block by block after the hit (and the host-tier hit):
 *   cold        never computed before: the tokens after the longest prefix any earlier computation had (an
 *               exact token count: a cache with 1-token blocks and no capacity limit would miss exactly these)
 *   evicted     the block was computed and cached before but is not reachable now: it was evicted (by the
 *               policy, or by a flush: evicted_flush_tokens), a block before it in its chain was (hash cache:
 *               the block itself may still be cached, unreachable), or it was computed when the pool was too
 *               full to cache it (evicted_uncached_tokens)
 *   last_token  the prompt ends with a full block that is cached, after a hit on every earlier block: only the
 *               rule that the last prompt token is always computed (vLLM's, SGLang's) kept it from hitting
 *   partial     computed before, but never as a full block this prompt could match: the earlier computation
 *               ended inside the block (its block was not full when cached, so it was never cached), diverged
 *               inside it, or this prompt ends inside it (a partial block is never matched)
 *   host        evicted from the device cache after it had been stored in the host tier, and not found there
 *               (gone from the tier too, or behind a block missing from it)
 *   preempted   a readmission after preemption (readmission = 1): every token it computes again
 * So for first admissions: hit + host hit + cold + evicted + last_token + partial + host = prompt tokens; and
 * for readmissions: readmitted hits + preempted = readmitted tokens. cold and partial do not depend on the
 * cache's capacity or policy, only on what was computed; an unbounded cache has no evicted or host misses.
 *
 * Health, in the caller's time unit, as histograms (vLLM's kv_block_lifetime_seconds,
 * kv_block_idle_before_evict_seconds, kv_block_reuse_gap_seconds; the engine's clock is seconds):
 *   lifetime           per evicted block: cached -> evicted (a flush included)
 *   idle_before_evict  per evicted block: its last access (hit or store) -> evicted
 *   reuse_gap          per hit on a cached block: its previous access -> this hit (every gap as it happens;
 *                      vLLM samples blocks and reports their last gaps at eviction)
 *   miss_evicted_age   per missed block of class evicted or host that had been evicted: its idle time when it
 *                      was evicted ("age at eviction", as sglang#38559 defines it). A curve left of
 *                      reuse_gap's means blocks leave shortly before they would be reused.
 *
 * Memory: one record per distinct block content ever computed (and per distinct partial tail), with its tokens
 * (a full block's bs tokens: the history is a trie of everything computed). max_records > 0 caps it: on reaching
 * the cap the ledger forgets the history of every block not cached now (stats.forgets counts it; what it forgot
 * then counts as cold). Not thread-safe: one owner, with its cache.
 *
 * Errors: KVP_EINVAL for bad arguments, KVP_ENOMEM with the ledger unchanged. A failure inside the listener
 * (out of memory recording a stored block) cannot be returned there: it is kept and returned by the next
 * kvp_ledger_lookup / kvp_ledger_computed; the ledger is then incomplete.
 */
#ifndef KVP_PREFIX_CACHE_LEDGER_H
#define KVP_PREFIX_CACHE_LEDGER_H

#include <stdint.h>

#include "common/status.h"
#include "prefix_cache/prefix_cache.h"

typedef enum {
    KVP_MISS_COLD = 0,
    KVP_MISS_EVICTED,
    KVP_MISS_LAST_TOKEN,
    KVP_MISS_PARTIAL,
    KVP_MISS_PREEMPTED,
    KVP_MISS_HOST,
    KVP_MISS_CLASSES
} kvp_miss_class;

/* "cold", "evicted", "last_token", "partial", "preempted", "host"; "?" otherwise. The JSON field of class c is
 * "miss_<name>_tokens". */
const char *kvp_miss_class_name(kvp_miss_class c);

/* A histogram with fixed bucket bounds: 1-2-5 steps from 0.001 to 1e7, then +inf (Prometheus "le" buckets). */
#define KVP_HIST_BUCKETS 32
typedef struct {
    int64_t counts[KVP_HIST_BUCKETS]; /* counts[i]: samples in (bound(i-1), bound(i)] (not cumulative) */
    int64_t n;                        /* samples */
    double sum;                       /* of the samples */
} kvp_hist;
double kvp_hist_bound(int i);                      /* upper bound of bucket i; INFINITY for the last */
void kvp_hist_add(kvp_hist *h, double x);          /* x < 0 counts as 0 */
double kvp_hist_quantile(const kvp_hist *h, double q); /* q in [0, 1], linear within a bucket (as Prometheus's
                                                          histogram_quantile); 0 for an empty histogram */

typedef struct {
    int64_t lookups;         /* first admissions (kvp_ledger_lookup with readmission = 0) */
    int64_t prompt_tokens;   /* their prompt tokens */
    int64_t hit_tokens;      /* of those, found in the device cache */
    int64_t host_hit_tokens; /* loaded from the host tier */
    int64_t miss_tokens[KVP_MISS_CLASSES];
    int64_t evicted_flush_tokens;    /* part of miss_tokens[EVICTED]: the block left in a flush */
    int64_t evicted_uncached_tokens; /* part of miss_tokens[EVICTED]: computed but never cached */
    int64_t readmissions, readmitted_tokens, readmit_hit_tokens; /* readmit hits include host-tier loads */
    kvp_hist lifetime, idle_before_evict, reuse_gap, miss_evicted_age;
    int64_t records;        /* blocks and partial tails in the history */
    int64_t history_tokens; /* tokens stored with them */
    int64_t forgets;        /* times max_records made the ledger forget */
} kvp_ledger_stats;

typedef struct kvp_ledger kvp_ledger;

/* block_size >= 1; max_records 0 for no cap (else >= 1). *out owned by the caller (kvp_ledger_destroy). */
kvp_status kvp_ledger_create(int32_t block_size, int64_t max_records, kvp_ledger **out);
/* Detaches and frees. NULL: no-op. */
void kvp_ledger_destroy(kvp_ledger *lg);

/* Follows pc's stores and removals (one cache at a time; its block size must be the ledger's: KVP_EINVAL). The
 * cache is borrowed until kvp_ledger_detach (destroy detaches: destroy the ledger first, or detach). */
kvp_status kvp_ledger_attach(kvp_ledger *lg, kvp_prefix_cache *pc);
void kvp_ledger_detach(kvp_ledger *lg);

/* The time of what follows (the unit is the caller's). */
void kvp_ledger_set_time(kvp_ledger *lg, double now);

/* One admission: tokens[0..n_tokens) is what it looked up (a prompt, or for a readmission every known token),
 * n_hit the blocks kvp_pc_match returned, n_host the blocks after them loaded from the host tier. Call it after
 * the match and before this request's blocks are inserted. Classifies the missed tokens (added to the stats, and
 * to miss_out[class] when miss_out is not NULL; miss_out is not cleared) and records the hits' accesses (reuse
 * gaps). KVP_EINVAL when (n_hit + n_host) blocks exceed what a match can return ((n_tokens - 1) / block_size).
 * O(blocks of the prompt). */
kvp_status kvp_ledger_lookup(kvp_ledger *lg, const int32_t *tokens, int32_t n_tokens, uint64_t extra_key, int32_t n_hit,
                             int32_t n_host, int readmission, int64_t miss_out[KVP_MISS_CLASSES]);

/* tokens[0..n_tokens) of a sequence now exist as KV (its prompt once computed, then its known answer): the full
 * blocks and the partial tail join the history. O(blocks). */
kvp_status kvp_ledger_computed(kvp_ledger *lg, const int32_t *tokens, int32_t n_tokens, uint64_t extra_key);

/* Blocks with these chain hashes were copied to the host tier (write-through, write-back, selective). Hashes the
 * ledger has no record of are ignored. */
void kvp_ledger_host_stored(kvp_ledger *lg, const uint64_t *hashes, int32_t n);

void kvp_ledger_get_stats(const kvp_ledger *lg, kvp_ledger_stats *out);

/* Invariant walker (tests): the maps index every record exactly once, tokens lie in the arena, the sums above
 * hold, the histograms count their samples. KVP_OK or KVP_ESTATE naming the first violation. O(records). */
kvp_status kvp_ledger_check(const kvp_ledger *lg);

#endif
