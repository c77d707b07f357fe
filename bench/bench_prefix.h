/* bench/bench_prefix.h — replay of a workload through a prefix cache (the engine of `kvpage bench prefix`).
 *
 * Replay, request by request in workload order, over a block pool of `capacity` blocks (0 = unbounded: every
 * block of every prompt fits):
 *   1. match the prompt (lock) and count the hit; the request takes its own references on the hit blocks;
 *   2. allocate blocks for the rest of what it computes (ceil(len / block_size) - hit, the partial last
 *      block included; len = the prompt, plus a known answer but its last token, a chat turn's
 *      kvp_request.output_tokens, as the engine computes it), evicting by the policy when the pool is
 *      short; a request larger than what can be freed gets what there is (counted in short_requests) and
 *      caches only those blocks;
 *   3. insert the full blocks; 4. unlock and drop the request's references (the request is over).
 * With a host tier (host_capacity > 0 blocks, prefix_cache/host_cache.h): the blocks after the device hit
 * are matched there too (host hits: loaded, not computed; they take device blocks as computed ones do), and
 * every full block inserted in step 3 is stored there too (write_through), or every block the device cache
 * evicts in step 2 (write_back).
 * Workload pins (e.g. a system prompt) are inserted first with their priority.
 * belady gets, for every block of every access, the index of the next request whose matchable prefix holds
 * it (kvp_pc_next_use over pins + requests).
 *
 * Every replay follows its cache with a miss ledger (prefix_cache/ledger.h): each request's missed prompt tokens
 * in exactly one class (cold, evicted, last_token, partial, host; preempted is 0: a replay preempts nothing), so
 * that hit_tokens + host_hit_tokens + the classes = prompt_tokens, and the health histograms, on a clock that is
 * the replay position (access a, pins included, happens at time a: ages are in requests). With kv_events, the
 * cache's events go to that file (kvp_prefix_replay_ex) in vLLM's schema (prefix_cache/kv_events.h), one batch per access at ts = a.
 *
 * kvp_prefix_curve feeds the same accesses to a one-pass LRU curve (prefix_cache/lru_curve.h): its hit tokens at
 * capacity C equal kvp_prefix_replay's with lru, radix or hash, no host tier, at every C (see there why).
 */
#ifndef KVP_BENCH_BENCH_PREFIX_H
#define KVP_BENCH_BENCH_PREFIX_H

#include <stdint.h>

#include "common/status.h"
#include "prefix_cache/host_cache.h"
#include "prefix_cache/ledger.h"
#include "prefix_cache/lru_curve.h"
#include "prefix_cache/prefix_cache.h"
#include "runtime/workload/workload.h"

typedef struct {
    kvp_pc_kind kind;
    kvp_evict_policy policy;
    int32_t block_size;
    int64_t capacity; /* blocks; 0 = unbounded */
    int64_t host_capacity; /* blocks of the host tier; 0 = none */
    kvp_hc_write_policy host_policy;
} kvp_prefix_replay_cfg;

/* What a replay writes besides its result (kvp_prefix_replay_ex). */
typedef struct {
    const char *kv_events; /* the cache's KV events (JSON lines) to this file; NULL: none */
} kvp_prefix_replay_out;

typedef struct {
    int64_t requests, prompt_tokens, hit_tokens;
    int64_t hit_blocks, prompt_blocks; /* prompt_blocks = sum of ceil(prompt_len / block_size) */
    int64_t inserted_blocks, evicted_blocks, peak_cached_blocks;
    int64_t short_requests; /* requests that could not get all their blocks */
    int64_t pool_blocks;
    int64_t host_hit_tokens;     /* prompt tokens loaded from the host tier */
    int64_t host_stored_blocks;  /* blocks copied to the host tier */
    double hit_rate;        /* hit_tokens / prompt_tokens (the device cache) */
    double host_hit_rate;   /* host_hit_tokens / prompt_tokens */
    double total_hit_rate;  /* hit_rate + host_hit_rate: prompt tokens not computed */
    double block_hit_rate;  /* hit_blocks / prompt_blocks */
    double wall_s;          /* whole replay (next-use precomputation included) */
    double cache_s;         /* wall time inside kvp_pc_match + kvp_pc_insert only */
    double cache_cpu_s;     /* thread CPU time inside them (robust on a shared machine) */
    kvp_ledger_stats miss;  /* the miss classes and health histograms (times in replay positions) */
} kvp_prefix_replay_result;

/* KVP_EINVAL for a bad configuration (capacity < 0, a pool that would exceed INT32_MAX - 1 blocks); the
 * cache's own errors otherwise. The workload is borrowed. */
kvp_status kvp_prefix_replay(const kvp_workload *w, const kvp_prefix_replay_cfg *cfg, kvp_prefix_replay_result *out);
/* The same, writing what `files` asks for (may be NULL); KVP_EIO naming a file that cannot be written. */
kvp_status kvp_prefix_replay_ex(const kvp_workload *w, const kvp_prefix_replay_cfg *cfg, const kvp_prefix_replay_out *files,
                                kvp_prefix_replay_result *out);

/* The one-pass LRU curve of the replay's accesses at this block size (finished; *out owned by the caller,
 * kvp_lruc_destroy). KVP_EINVAL, KVP_ENOMEM. */
kvp_status kvp_prefix_curve(const kvp_workload *w, int32_t block_size, kvp_lru_curve **out);

/* The command itself, kvp_bench_prefix, is declared in bench/bench.h. */

#endif
