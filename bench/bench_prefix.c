/* bench/bench_prefix.c — `kvpage bench prefix`: replay a workload through radix / hash / none prefix caches
 * with an eviction policy and a capacity, one run or a sweep (CSV + plot under bench/results/).
 * The replay is described in bench/bench_prefix.h. */
#include "bench/bench_prefix.h"

#include <errno.h>
#include <math.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/plot.h"
#include "blockmgr/block_pool.h"
#include "common/alloc.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/report.h"
#include "common/timer.h"
#include "prefix_cache/host_cache.h"
#include "prefix_cache/kv_events.h"
#include "prefix_cache/ledger.h"
#include "prefix_cache/lru_curve.h"

/* ---- replay ---------------------------------------------------------------------------------------- */

/* CPU time of this thread: on a shared machine it measures the cache's work without the time the thread
 * spent descheduled. */
static int64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* write_back: every block the device cache evicts goes to the host tier (unless held there). */
typedef struct {
    kvp_host_cache *hc;
    kvp_ledger *lg;
    int64_t stored;
} write_back_ctx;

static void write_back(void *ctx, uint64_t hash, int32_t block)
{
    (void)block;
    write_back_ctx *wb = ctx;
    int32_t slot;
    wb->stored += kvp_hc_store(wb->hc, &hash, 1, &slot);
    kvp_ledger_host_stored(wb->lg, &hash, 1);
}

/* The accesses of a replay: access a caches tokens[a][0..lens[a]) (its prompt, and a known answer but its last
 * token, as the engine computes them) and matches its prompt (pins: nothing). toks[a] points into the workload or
 * into *cat, which the caller frees. */
typedef struct {
    const int32_t **toks;
    int32_t *lens, *cat;
    int64_t n, total_blocks, full_blocks, max_blocks;
} accesses;

static void accesses_free(accesses *x)
{
    kvp_free(x->toks);
    kvp_free(x->lens);
    kvp_free(x->cat);
    memset(x, 0, sizeof *x);
}

static const kvp_request *access_req(const kvp_workload *w, int64_t a)
{
    return a < w->n_pins ? &w->pins[a] : &w->reqs[a - w->n_pins];
}

static kvp_status accesses_build(const kvp_workload *w, int32_t bs, accesses *x)
{
    memset(x, 0, sizeof *x);
    const int64_t na = w->n_pins + w->n;
    x->n = na;
    x->max_blocks = 1;
    x->toks = kvp_malloc((size_t)(na ? na : 1) * sizeof *x->toks);
    x->lens = kvp_malloc((size_t)(na ? na : 1) * sizeof *x->lens);
    if (x->toks == NULL || x->lens == NULL) {
        accesses_free(x);
        return KVP_ERR(KVP_ENOMEM, "out of memory for the replay");
    }
    int64_t cat_n = 0;
    for (int64_t a = 0; a < na; a++) {
        const kvp_request *r = access_req(w, a);
        x->lens[a] = r->prompt_len + (r->output_tokens && r->output_len > 1 ? r->output_len - 1 : 0);
        if (x->lens[a] > r->prompt_len) cat_n += x->lens[a];
        int64_t nb = ((int64_t)x->lens[a] + bs - 1) / bs;
        x->total_blocks += nb;
        x->full_blocks += x->lens[a] / bs;
        if (nb > x->max_blocks) x->max_blocks = nb;
    }
    if (cat_n > 0 && (x->cat = kvp_malloc((size_t)cat_n * sizeof *x->cat)) == NULL) {
        accesses_free(x);
        return KVP_ERR(KVP_ENOMEM, "out of memory for the replay's answers");
    }
    for (int64_t a = 0, off = 0; a < na; a++) {
        const kvp_request *r = access_req(w, a);
        x->toks[a] = r->tokens;
        if (x->lens[a] == r->prompt_len) continue;
        memcpy(x->cat + off, r->tokens, (size_t)r->prompt_len * sizeof *x->cat);
        memcpy(x->cat + off + r->prompt_len, r->output_tokens, (size_t)(x->lens[a] - r->prompt_len) * sizeof *x->cat);
        x->toks[a] = x->cat + off;
        off += x->lens[a];
    }
    return KVP_OK;
}

kvp_status kvp_prefix_curve(const kvp_workload *w, int32_t block_size, kvp_lru_curve **out)
{
    if (w == NULL || out == NULL || block_size < 1) return KVP_ERR(KVP_EINVAL, "kvp_prefix_curve: bad arguments");
    accesses x;
    KVP_TRY(accesses_build(w, block_size, &x));
    kvp_lru_curve *c = NULL;
    kvp_status st = kvp_lruc_create(block_size, &c);
    for (int64_t a = 0; st == KVP_OK && a < x.n; a++)
        st = kvp_lruc_access(c, x.toks[a], x.lens[a], a < w->n_pins ? 0 : access_req(w, a)->prompt_len, 0);
    if (st == KVP_OK) st = kvp_lruc_finish(c);
    accesses_free(&x);
    if (st != KVP_OK) {
        kvp_lruc_destroy(c);
        return st;
    }
    *out = c;
    return KVP_OK;
}

kvp_status kvp_prefix_replay(const kvp_workload *w, const kvp_prefix_replay_cfg *cfg, kvp_prefix_replay_result *out)
{
    return kvp_prefix_replay_ex(w, cfg, NULL, out);
}

kvp_status kvp_prefix_replay_ex(const kvp_workload *w, const kvp_prefix_replay_cfg *cfg, const kvp_prefix_replay_out *files,
                                kvp_prefix_replay_result *out)
{
    if (w == NULL || cfg == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_prefix_replay: NULL argument");
    if (cfg->block_size < 1) return KVP_ERR(KVP_EINVAL, "block size %d < 1", cfg->block_size);
    if (cfg->capacity < 0) return KVP_ERR(KVP_EINVAL, "capacity %lld < 0", (long long)cfg->capacity);
    if (cfg->host_capacity < 0 || cfg->host_capacity > INT32_MAX)
        return KVP_ERR(KVP_EINVAL, "host capacity %lld blocks is out of [0, %d]", (long long)cfg->host_capacity, INT32_MAX);
    if ((unsigned)cfg->host_policy >= KVP_HC_WRITE_POLICIES) return KVP_ERR(KVP_EINVAL, "unknown host-tier write policy");
    const int32_t bs = cfg->block_size;
    double t0 = kvp_now_s();
    accesses x;
    KVP_TRY(accesses_build(w, bs, &x));
    const int64_t na = x.n, max_blocks = x.max_blocks, full_blocks = x.full_blocks;
    const int32_t **toks = x.toks, *lens = x.lens;
    kvp_status st = KVP_OK;
    int64_t pool_blocks = cfg->capacity > 0 ? cfg->capacity : x.total_blocks + 1;
    if (st == KVP_OK && pool_blocks > INT32_MAX - 1)
        st = KVP_ERR(KVP_EINVAL, "a pool of %lld blocks is too large (block size %d): raise the block size or set --capacity",
                     (long long)pool_blocks, bs);

    kvp_block_pool *pool = NULL;
    kvp_prefix_cache *pc = NULL;
    kvp_host_cache *hc = NULL;
    kvp_ledger *lg = NULL;
    kvp_kv_events *kve = NULL;
    int32_t *blocks = kvp_malloc((size_t)max_blocks * sizeof *blocks);
    int32_t *hit = kvp_malloc((size_t)max_blocks * sizeof *hit);
    int32_t *slots = cfg->host_capacity > 0 ? kvp_malloc((size_t)max_blocks * sizeof *slots) : NULL;
    uint64_t *hashes = cfg->host_capacity > 0 ? kvp_malloc((size_t)max_blocks * sizeof *hashes) : NULL;
    if (st == KVP_OK && cfg->host_capacity > 0 && !(slots && hashes)) st = KVP_ERR(KVP_ENOMEM, "out of memory for the replay");
    if (st == KVP_OK && cfg->host_capacity > 0) st = kvp_hc_create((int32_t)cfg->host_capacity, &hc);
    int64_t *nu_flat = NULL, **nu = NULL;
    int32_t *mlens = NULL;
    if (st == KVP_OK && !(blocks && hit)) st = KVP_ERR(KVP_ENOMEM, "out of memory for the replay");
    if (st == KVP_OK) st = kvp_pool_create((int32_t)pool_blocks, bs, &pool);
    if (st == KVP_OK) st = kvp_pc_create(cfg->kind, cfg->policy, pool, bs, &pc);
    if (st == KVP_OK) st = kvp_ledger_create(bs, 0, &lg);
    if (st == KVP_OK) st = kvp_ledger_attach(lg, pc);
    if (st == KVP_OK && files && files->kv_events) st = kvp_kve_open(files->kv_events, bs, &kve);
    if (st == KVP_OK && kve) st = kvp_kve_attach(kve, pc);
    write_back_ctx wb = {hc, lg, 0};
    if (st == KVP_OK && hc && cfg->host_policy == KVP_HC_WRITE_BACK) kvp_pc_set_evict_hook(pc, write_back, &wb);
    if (st == KVP_OK && cfg->policy == KVP_EVICT_BELADY) {
        nu_flat = kvp_malloc((size_t)(full_blocks ? full_blocks : 1) * sizeof *nu_flat);
        nu = kvp_malloc((size_t)(na ? na : 1) * sizeof *nu);
        mlens = kvp_malloc((size_t)(na ? na : 1) * sizeof *mlens);
        if (!nu_flat || !nu || !mlens) st = KVP_ERR(KVP_ENOMEM, "out of memory for belady's next uses");
        int64_t off = 0;
        for (int64_t a = 0; st == KVP_OK && a < na; a++) {
            mlens[a] = a < w->n_pins ? w->pins[a].prompt_len : w->reqs[a - w->n_pins].prompt_len;
            nu[a] = nu_flat + off;
            off += lens[a] / bs;
        }
        if (st == KVP_OK) st = kvp_pc_next_use(toks, lens, mlens, NULL, na, bs, nu);
    }
    memset(out, 0, sizeof *out);
    out->pool_blocks = pool_blocks;
    int64_t cache_ns = 0, cache_cpu = 0;
    for (int64_t a = 0; st == KVP_OK && a < na; a++) {
        int is_pin = a < w->n_pins;
        const kvp_request *r = access_req(w, a);
        kvp_pc_hint hint = {.priority = r->priority, .next_use = nu ? nu[a] : NULL};
        kvp_ledger_set_time(lg, (double)a); /* the clock of the health histograms: the replay position */
        const int32_t n = r->prompt_len, len = lens[a];
        int32_t nb = (int32_t)(((int64_t)len + bs - 1) / bs), nfull = len / bs, nh = 0;
        int64_t c0 = kvp_now_ns(), u0 = cpu_ns();
        if (!is_pin) st = kvp_pc_match(pc, toks[a], n, &hint, 1, hit, nb, &nh);
        cache_ns += kvp_now_ns() - c0;
        cache_cpu += cpu_ns() - u0;
        if (st != KVP_OK) break;
        int32_t nload = 0; /* blocks after the device hit found in the host tier */
        if (hc) {
            kvp_pc_chain_hashes(toks[a], nfull, bs, 0, hashes);
            if (!is_pin) nload = kvp_hc_match(hc, hashes + nh, (n - 1) / bs - nh, slots);
        }
        for (int32_t i = 0; i < nh; i++) kvp_pool_incref(pool, hit[i]);
        memcpy(blocks, hit, (size_t)nh * sizeof *blocks);
        int32_t need = nb - nh, fr = kvp_pool_num_free(pool);
        /* The blocks it will get: every eviction frees a block (nothing but this request's locked hits holds a
         * cached block), so they are known before evicting, and the misses are told to the ledger as the match
         * left the cache (a cached last block, which this request cannot match, may be evicted by it). */
        const int64_t can_get = fr + kvp_pc_num_evictable(pc);
        const int32_t got_pred = need < can_get ? need : (int32_t)can_get;
        if (nload > got_pred) nload = got_pred;
        if (!is_pin) st = kvp_ledger_lookup(lg, toks[a], n, 0, nh, nload, 0, NULL);
        if (fr < need) {
            int64_t ev = need - fr, can = kvp_pc_num_evictable(pc);
            if (ev > can) ev = can;
            if (ev > 0) st = kvp_pc_evict(pc, (int32_t)ev, NULL);
            fr = kvp_pool_num_free(pool);
        }
        int32_t got = need < fr ? need : fr;
        if (st == KVP_OK && got != got_pred)
            st = KVP_ERR(KVP_ESTATE, "replay: request %lld got %d blocks, %d expected", (long long)a, got, got_pred);
        if (st == KVP_OK) st = kvp_pool_alloc(pool, got, blocks + nh);
        if (st != KVP_OK) break;
        if (got < need && !is_pin) out->short_requests++;
        if (nload > got) nload = got;
        int32_t ncache = nh + got < nfull ? nh + got : nfull;
        const int32_t nstore = hc ? kvp_hc_blocks_to_store(cfg->host_policy, ncache, nh) : 0;
        if (nstore > 0) out->host_stored_blocks += kvp_hc_store(hc, hashes, nstore, slots);
        c0 = kvp_now_ns();
        u0 = cpu_ns();
        st = kvp_pc_insert(pc, toks[a], len, blocks, ncache, &hint, 0, NULL);
        cache_ns += kvp_now_ns() - c0;
        cache_cpu += cpu_ns() - u0;
        if (st == KVP_OK) st = kvp_ledger_computed(lg, toks[a], len, 0);
        if (nstore > 0) kvp_ledger_host_stored(lg, hashes, nstore);
        if (st == KVP_OK && kve) st = kvp_kve_flush(kve, (double)a);
        kvp_status s2 = kvp_pc_unlock(pc, hit, nh);
        kvp_status s3 = kvp_pool_release(pool, blocks, nh + got);
        if (st == KVP_OK) st = s2 != KVP_OK ? s2 : s3;
        if (!is_pin) {
            out->requests++;
            out->prompt_tokens += n;
            out->hit_blocks += nh;
            out->host_hit_tokens += (int64_t)nload * bs;
            out->prompt_blocks += (n + bs - 1) / bs;
        }
    }
    if (st == KVP_OK) {
        kvp_pc_stats ps;
        kvp_pc_get_stats(pc, &ps);
        out->hit_tokens = ps.hit_tokens;
        out->inserted_blocks = ps.inserted_blocks;
        out->evicted_blocks = ps.evicted_blocks;
        out->peak_cached_blocks = ps.peak_cached_blocks;
        out->host_stored_blocks += wb.stored;
        out->hit_rate = out->prompt_tokens ? (double)out->hit_tokens / (double)out->prompt_tokens : 0;
        out->host_hit_rate = out->prompt_tokens ? (double)out->host_hit_tokens / (double)out->prompt_tokens : 0;
        out->total_hit_rate = out->hit_rate + out->host_hit_rate;
        out->block_hit_rate = out->prompt_blocks ? (double)out->hit_blocks / (double)out->prompt_blocks : 0;
        kvp_ledger_get_stats(lg, &out->miss);
        out->cache_s = (double)cache_ns * 1e-9;
        out->cache_cpu_s = (double)cache_cpu * 1e-9;
        out->wall_s = kvp_now_s() - t0;
    }
    kvp_status sc = kvp_kve_close(kve);
    if (st == KVP_OK) st = sc;
    kvp_ledger_destroy(lg);
    kvp_pc_destroy(pc);
    kvp_hc_destroy(hc);
    kvp_pool_destroy(pool);
    kvp_free(slots);
    kvp_free(hashes);
    kvp_free(blocks);
    kvp_free(hit);
    kvp_free(nu_flat);
    kvp_free(nu);
    kvp_free(mlens);
    accesses_free(&x);
    return st;
}

/* ---- command --------------------------------------------------------------------------------------- */

static const char *const FIELDS[] = {"workload",      "cache",          "evict",           "block_size",  "capacity",
                                     "capacity_eff",  "capacity_tokens", "series",         "requests",        "prompt_tokens", "hit_tokens",
                                     "hit_rate",      "block_hit_rate", "host_capacity", "host_hit_tokens",
                                     "host_write_policy", "host_hit_rate", "total_hit_rate", "host_stored_blocks", "inserted_blocks", "evicted_blocks",
                                     "peak_cached_blocks", "short_requests", "wall_s",     "cache_mtok_per_s",
                                     "cache_cpu_mtok_per_s",
                                     "miss_cold_tokens", "miss_evicted_tokens", "miss_last_token_tokens", "miss_partial_tokens",
                                     "miss_preempted_tokens", "miss_host_tokens", "miss_evicted_age_p50", "lifetime_p50",
                                     "idle_before_evict_p50", "reuse_gap_p50", "belady_hit_rate", "unbounded_hit_rate",
                                     "regret_belady", "regret_unbounded"};
#define NFIELDS ((int)(sizeof FIELDS / sizeof FIELDS[0]))
/* the default table's columns (--wide: all) */
static const char *const BRIEF[] = {"cache", "evict", "block_size", "capacity", "hit_rate", "total_hit_rate", "belady_hit_rate", "evicted_blocks"};


/* The one-pass curve's rows (--curve). */
static const char *const CURVE_FIELDS[] = {"workload", "cache", "evict", "block_size", "capacity", "capacity_tokens", "series",
                                           "requests", "prompt_tokens", "hit_tokens", "hit_rate", "stack_hit_rate",
                                           "distinct_blocks", "max_request_blocks", "exact", "wall_s"};
#define NCURVE ((int)(sizeof CURVE_FIELDS / sizeof CURVE_FIELDS[0]))

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage bench prefix (--trace mooncake:PATH | --workload SPEC) [options]\n"
            "\n"
            "Replays a workload request by request through a prefix cache over a pool of --capacity blocks:\n"
            "match (count the hit), allocate the rest (evicting by the policy), insert the full blocks, release.\n"
            "Every missed prompt token is put in one class (the miss_* fields), block lifetimes are measured, and\n"
            "every row gives its gap to Belady and to the unbounded cache at the same capacity.\n"
            "\n"
            "  --trace mooncake:PATH   Mooncake JSONL trace (a bare PATH is read as Mooncake too)\n"
            "  --workload SPEC         synthetic: system|chat|fewshot|branch[:key=value,...] (runtime/workload/workload.h)\n"
            "  --skip-bad              count and skip malformed trace lines instead of failing\n"
            "  --cache LIST            radix | hash | none (comma list; default radix)\n"
            "  --evict LIST            eviction policies (comma list; default lru; all = every one):\n");
    for (int p = 0; p < KVP_EVICT_POLICIES; p++)
        fprintf(f, "                            %-8s %s\n", kvp_evict_policy_name((kvp_evict_policy)p),
                kvp_evict_policy_summary((kvp_evict_policy)p));
    fprintf(f,
            "  --block-size LIST       tokens per block (comma list; default 16)\n"
            "  --capacity LIST         pool size in blocks, 0 = unbounded (comma list; default 0; in a sweep\n"
            "                          without it: 0 and 5, 10, 20, 40, 70 %% of the unbounded peak)\n"
            "  --capacity-tokens LIST  pool size in tokens, converted per block size (ceil(tokens / block size)\n"
            "                          blocks), to compare block sizes at equal memory; 0 = unbounded\n"
            "  --host-capacity LIST    a second tier in host memory of that many blocks (tokens with\n"
            "                          --capacity-tokens), LRU, filled write-through with every cached block;\n"
            "                          the blocks after a device hit are looked up there (comma list; 0 = none,\n"
            "                          the default)\n"
            "  --host-write-policy LIST  when blocks go to the host tier (SGLang's --hicache-write-policy):\n"
            "                          write_through (every cached block, at once; the default), write_back\n"
            "                          (each block the device cache evicts) or write_through_selective (a block\n"
            "                          once a request found it in the device cache) (comma list)\n"
            "  --curve                 the LRU hit rate at every capacity from 1 block to unbounded, per block\n"
            "                          size, in one pass (prefix_cache/lru_curve.h; equal to an lru replay of radix\n"
            "                          or hash without a host tier at every capacity): stdout carries the curve's\n"
            "                          rows instead of the replay's; a sweep writes OUT/NAME_curve.csv beside\n"
            "                          OUT/NAME.csv and draws it on the plot\n"
            "                          (--curve without --capacity, --sweep, --kv-events or --health replays nothing)\n"
            "  --curve-points N        rows of the curve: N log-spaced capacities plus the swept ones (default 200);\n"
            "                          0: every capacity where the hit rate changes (lossless)\n"
            "  --kv-events FILE        the cache's KV events in vLLM's schema, one JSON batch a line per request\n"
            "                          (prefix_cache/kv_events.h); one configuration only\n"
            "  --no-regret             skip the belady and unbounded replays of the regret columns (left empty)\n"
            "  --health FILE           the block lifetime, idle-before-evict, reuse-gap and evicted-miss-age\n"
            "                          histograms of every row, as JSON (times in replay positions)\n"
            "  --sweep                 write OUT/NAME.csv and OUT/NAME.png (total hit rate against capacity, one line\n"
            "                          per cache/policy, the gap to Belady shaded); implied by more than one combination\n"
            "  --out DIR               output folder of a sweep (default: results/ beside the program, build/results)\n"
            "  --name NAME             file stem of a sweep (default prefix_<workload>)\n"
            "  --format table|csv|json data on stdout (default table, 100 columns wide)   --json  same as --format json\n"
            "  --wide                  a table with every column (same as --format wide)\n"
            "  --no-plot               skip the PNG\n"
            "  -h, --help              this help\n"
            "\n"
            "Fields: workload cache evict block_size capacity capacity_eff (capacity, or the peak when unbounded)\n"
            "capacity_tokens (capacity_eff x block_size) series requests prompt_tokens hit_tokens hit_rate\n"
            "block_hit_rate host_capacity host_hit_tokens host_write_policy host_hit_rate total_hit_rate (hit_rate +\n"
            "host_hit_rate) host_stored_blocks inserted_blocks evicted_blocks peak_cached_blocks short_requests wall_s\n"
            "cache_mtok_per_s (prompt tokens per second of wall time inside match + insert)\n"
            "cache_cpu_mtok_per_s (the same per second of thread CPU time)\n"
            "miss_cold_tokens miss_evicted_tokens miss_last_token_tokens miss_partial_tokens miss_preempted_tokens\n"
            "miss_host_tokens (prefix_cache/ledger.h: hit_tokens + host_hit_tokens + these = prompt_tokens)\n"
            "miss_evicted_age_p50 (idle time at eviction of the evicted blocks that missed) lifetime_p50\n"
            "idle_before_evict_p50 reuse_gap_p50 (medians, in requests: the replay position is the clock)\n"
            "belady_hit_rate unbounded_hit_rate (total hit rates of belady at the same capacity and host tier, and of\n"
            "an unbounded cache) regret_belady regret_unbounded (their gaps to this row's total_hit_rate) machine commit.\n"
            "Curve fields: workload cache evict block_size capacity (blocks; 0 = unbounded) capacity_tokens series\n"
            "requests prompt_tokens hit_tokens hit_rate stack_hit_rate (the plain stack-distance curve, an upper\n"
            "bound) distinct_blocks max_request_blocks exact (1: equals the replay) wall_s machine commit.\n"
            "Example: kvpage bench prefix --trace mooncake:../shared/data/traces/mooncake/synthetic_trace.jsonl \\\n"
            "           --block-size 512 --evict all --capacity 0,2000,5000,10000,20000 --curve\n");
}

#define MAXL 16

typedef struct {
    char *items[MAXL];
    int n;
    char buf[512];
} strlist;

static kvp_status parse_cache(const char *s, void *out) { return kvp_pc_kind_parse(s, out); }
static kvp_status parse_host_policy(const char *s, void *out) { return kvp_hc_write_policy_parse(s, out); }
static kvp_status parse_cap_blocks(const char *s, void *out) { return kvp_parse_i64(s, 0, INT32_MAX - 1, out); }
static kvp_status parse_cap_tokens(const char *s, void *out) { return kvp_parse_i64(s, 0, INT64_MAX / 2, out); }

static int split_list(const char *s, strlist *l)
{
    const size_t n = strlen(s);
    if (n >= sizeof l->buf || n == 0 || s[0] == ',' || s[n - 1] == ',' || strstr(s, ",,")) return -1; /* empty items */
    strcpy(l->buf, s);
    l->n = 0;
    char *save = NULL;
    for (char *t = strtok_r(l->buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (l->n == MAXL) return -1;
        l->items[l->n++] = t;
    }
    return l->n > 0 ? 0 : -1;
}

/* The sweep's plot (bench/plot.py prefix): total hit rate against capacity per series, in blocks or in tokens
 * as the capacities were given, unbounded rows as labelled horizontal lines, the gap to belady shaded, and the
 * one-pass curve when there is one. */
static int run_plot(const char *csv, const char *curve_csv, const char *png, const char *title, int tokens)
{
    const char *args[16];
    int n = 0;
    args[n++] = "prefix";
    args[n++] = csv;
    args[n++] = png;
    args[n++] = "--title";
    args[n++] = title;
    if (tokens) args[n++] = "--tokens";
    if (curve_csv) {
        args[n++] = "--curve";
        args[n++] = curve_csv;
    }
    args[n] = NULL;
    if (kvp_bench_plot(args) != KVP_OK) {
        KVP_LOG_W("bench prefix: no plot (%s); the CSV is written", kvp_error_message());
        return -1;
    }
    return 0;
}

/* Replays already made, by configuration: the rows, and the belady and unbounded replays their regret needs,
 * are each run once. */
typedef struct {
    kvp_prefix_replay_cfg cfg;
    kvp_prefix_replay_result r;
} memo_item;

typedef struct {
    memo_item *v;
    size_t n, cap;
} memo;

static int same_cfg(const kvp_prefix_replay_cfg *a, const kvp_prefix_replay_cfg *b)
{
    return a->kind == b->kind && a->policy == b->policy && a->block_size == b->block_size && a->capacity == b->capacity &&
           a->host_capacity == b->host_capacity && (a->host_capacity == 0 || a->host_policy == b->host_policy);
}

static kvp_status replay_memo(memo *m, const kvp_workload *w, const kvp_prefix_replay_cfg *cfg, const char *kv_events,
                              kvp_prefix_replay_result *out)
{
    for (size_t i = 0; kv_events == NULL && i < m->n; i++)
        if (same_cfg(&m->v[i].cfg, cfg)) return *out = m->v[i].r, KVP_OK;
    KVP_LOG_I("bench prefix: %s/%s bs %d capacity %lld host %lld %s", kvp_pc_kind_name(cfg->kind),
              kvp_evict_policy_name(cfg->policy), cfg->block_size, (long long)cfg->capacity, (long long)cfg->host_capacity,
              cfg->host_capacity > 0 ? kvp_hc_write_policy_name(cfg->host_policy) : "");
    kvp_prefix_replay_out files = {.kv_events = kv_events};
    KVP_TRY(kvp_prefix_replay_ex(w, cfg, &files, out));
    KVP_TRY(kvp_grow((void **)&m->v, &m->cap, m->n + 1, sizeof *m->v));
    m->v[m->n++] = (memo_item){*cfg, *out};
    return KVP_OK;
}

/* The total hit rates of belady at the row's capacity (with its host tier) and of an unbounded cache. */
static kvp_status regret_refs(memo *m, const kvp_workload *w, const kvp_prefix_replay_cfg *c, double *belady, double *unbounded)
{
    *belady = *unbounded = 0;
    if (c->kind == KVP_PC_NONE) return KVP_OK;
    kvp_prefix_replay_result r;
    kvp_prefix_replay_cfg u = {c->kind, KVP_EVICT_LRU, c->block_size, 0, 0, KVP_HC_WRITE_THROUGH};
    KVP_TRY(replay_memo(m, w, &u, NULL, &r));
    *unbounded = r.total_hit_rate;
    if (c->capacity == 0) { /* nothing is evicted: every policy is belady */
        *belady = *unbounded;
        return KVP_OK;
    }
    kvp_prefix_replay_cfg b = *c;
    b.policy = KVP_EVICT_BELADY;
    KVP_TRY(replay_memo(m, w, &b, NULL, &r));
    *belady = r.total_hit_rate;
    return KVP_OK;
}

static int add_row(kvp_report *rep, const kvp_workload *w, const kvp_prefix_replay_cfg *c, const kvp_prefix_replay_result *r,
                   int multi_bs, int multi_host, int multi_policy, double belady, double unbounded)
{
    cJSON *row;
    if (kvp_report_row(rep, &row) != KVP_OK) return -1;
    char series[160], bs_part[24] = "", host_part[40] = "", pol_part[40] = "";
    if (multi_bs) snprintf(bs_part, sizeof bs_part, "/bs%d", c->block_size);
    if (multi_host) snprintf(host_part, sizeof host_part, "/host%lld", (long long)c->host_capacity);
    if (multi_policy && c->host_capacity > 0) snprintf(pol_part, sizeof pol_part, "/%s", kvp_hc_write_policy_name(c->host_policy));
    snprintf(series, sizeof series, "%s/%s%s%s%s", kvp_pc_kind_name(c->kind), kvp_evict_policy_name(c->policy), bs_part,
             host_part, pol_part);
    cJSON_AddStringToObject(row, "workload", w->name);
    cJSON_AddStringToObject(row, "cache", kvp_pc_kind_name(c->kind));
    cJSON_AddStringToObject(row, "evict", kvp_evict_policy_name(c->policy));
    cJSON_AddNumberToObject(row, "block_size", c->block_size);
    cJSON_AddNumberToObject(row, "capacity", (double)c->capacity);
    int64_t eff = c->capacity > 0 ? c->capacity : r->peak_cached_blocks;
    cJSON_AddNumberToObject(row, "capacity_eff", (double)eff);
    cJSON_AddNumberToObject(row, "capacity_tokens", (double)eff * c->block_size);
    cJSON_AddStringToObject(row, "series", series);
    cJSON_AddNumberToObject(row, "requests", (double)r->requests);
    cJSON_AddNumberToObject(row, "prompt_tokens", (double)r->prompt_tokens);
    cJSON_AddNumberToObject(row, "hit_tokens", (double)r->hit_tokens);
    cJSON_AddNumberToObject(row, "hit_rate", r->hit_rate);
    cJSON_AddNumberToObject(row, "block_hit_rate", r->block_hit_rate);
    cJSON_AddNumberToObject(row, "host_capacity", (double)c->host_capacity);
    cJSON_AddNumberToObject(row, "host_hit_tokens", (double)r->host_hit_tokens);
    cJSON_AddStringToObject(row, "host_write_policy", c->host_capacity > 0 ? kvp_hc_write_policy_name(c->host_policy) : "");
    cJSON_AddNumberToObject(row, "host_hit_rate", r->host_hit_rate);
    cJSON_AddNumberToObject(row, "total_hit_rate", r->total_hit_rate);
    cJSON_AddNumberToObject(row, "host_stored_blocks", (double)r->host_stored_blocks);
    cJSON_AddNumberToObject(row, "inserted_blocks", (double)r->inserted_blocks);
    cJSON_AddNumberToObject(row, "evicted_blocks", (double)r->evicted_blocks);
    cJSON_AddNumberToObject(row, "peak_cached_blocks", (double)r->peak_cached_blocks);
    cJSON_AddNumberToObject(row, "short_requests", (double)r->short_requests);
    cJSON_AddNumberToObject(row, "wall_s", r->wall_s);
    cJSON_AddNumberToObject(row, "cache_mtok_per_s", r->cache_s > 0 ? (double)r->prompt_tokens / r->cache_s * 1e-6 : 0);
    cJSON_AddNumberToObject(row, "cache_cpu_mtok_per_s",
                            r->cache_cpu_s > 0 ? (double)r->prompt_tokens / r->cache_cpu_s * 1e-6 : 0);
    for (int k = 0; k < KVP_MISS_CLASSES; k++) {
        char key[48];
        snprintf(key, sizeof key, "miss_%s_tokens", kvp_miss_class_name((kvp_miss_class)k));
        cJSON_AddNumberToObject(row, key, (double)r->miss.miss_tokens[k]);
    }
    cJSON_AddNumberToObject(row, "miss_evicted_age_p50", kvp_hist_quantile(&r->miss.miss_evicted_age, 0.5));
    cJSON_AddNumberToObject(row, "lifetime_p50", kvp_hist_quantile(&r->miss.lifetime, 0.5));
    cJSON_AddNumberToObject(row, "idle_before_evict_p50", kvp_hist_quantile(&r->miss.idle_before_evict, 0.5));
    cJSON_AddNumberToObject(row, "reuse_gap_p50", kvp_hist_quantile(&r->miss.reuse_gap, 0.5));
    if (isnan(belady)) { /* --no-regret */
        cJSON_AddNullToObject(row, "belady_hit_rate");
        cJSON_AddNullToObject(row, "unbounded_hit_rate");
        cJSON_AddNullToObject(row, "regret_belady");
        cJSON_AddNullToObject(row, "regret_unbounded");
    } else {
        cJSON_AddNumberToObject(row, "belady_hit_rate", belady);
        cJSON_AddNumberToObject(row, "unbounded_hit_rate", unbounded);
        cJSON_AddNumberToObject(row, "regret_belady", c->kind == KVP_PC_NONE ? 0 : belady - r->total_hit_rate);
        cJSON_AddNumberToObject(row, "regret_unbounded", c->kind == KVP_PC_NONE ? 0 : unbounded - r->total_hit_rate);
    }
    return 0;
}

/* --health: one object per row with its histograms (bucket upper bounds, non-cumulative counts, sum). */
static cJSON *hist_json(const kvp_hist *h)
{
    cJSON *o = cJSON_CreateObject(), *le = cJSON_AddArrayToObject(o, "le"), *cnt = cJSON_AddArrayToObject(o, "counts");
    for (int i = 0; i < KVP_HIST_BUCKETS; i++) {
        cJSON_AddItemToArray(le, i + 1 < KVP_HIST_BUCKETS ? cJSON_CreateNumber(kvp_hist_bound(i)) : cJSON_CreateString("+Inf"));
        cJSON_AddItemToArray(cnt, cJSON_CreateNumber((double)h->counts[i]));
    }
    cJSON_AddNumberToObject(o, "count", (double)h->n);
    cJSON_AddNumberToObject(o, "sum", h->sum);
    cJSON_AddNumberToObject(o, "p50", kvp_hist_quantile(h, 0.5));
    cJSON_AddNumberToObject(o, "p90", kvp_hist_quantile(h, 0.9));
    return o;
}

static void add_health(cJSON *arr, const kvp_workload *w, const kvp_prefix_replay_cfg *c, const kvp_prefix_replay_result *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "workload", w->name);
    cJSON_AddStringToObject(o, "cache", kvp_pc_kind_name(c->kind));
    cJSON_AddStringToObject(o, "evict", kvp_evict_policy_name(c->policy));
    cJSON_AddNumberToObject(o, "block_size", c->block_size);
    cJSON_AddNumberToObject(o, "capacity", (double)c->capacity);
    cJSON_AddNumberToObject(o, "host_capacity", (double)c->host_capacity);
    cJSON_AddStringToObject(o, "unit", "requests");
    /* vLLM's histogram names, without the _seconds its engine clock gives them */
    cJSON_AddItemToObject(o, "kv_block_lifetime", hist_json(&r->miss.lifetime));
    cJSON_AddItemToObject(o, "kv_block_idle_before_evict", hist_json(&r->miss.idle_before_evict));
    cJSON_AddItemToObject(o, "kv_block_reuse_gap", hist_json(&r->miss.reuse_gap));
    cJSON_AddItemToObject(o, "miss_evicted_age", hist_json(&r->miss.miss_evicted_age));
    cJSON_AddNumberToObject(o, "evicted_flush_tokens", (double)r->miss.evicted_flush_tokens);
    cJSON_AddNumberToObject(o, "evicted_uncached_tokens", (double)r->miss.evicted_uncached_tokens);
    cJSON_AddItemToArray(arr, o);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* A curve of one block size and the capacities of its rows: `points` log-spaced capacities and the swept ones
 * (or every capacity where the hit rate changes, when points == 0), then unbounded (capacity 0). */
typedef struct {
    kvp_lru_curve *c;
    int32_t bs;
    double wall_s;
    int64_t *caps;
    size_t ncap;
} curve_item;

static kvp_status curve_caps(curve_item *it, int points, const int64_t *swept, int nswept)
{
    const kvp_lru_curve *c = it->c;
    const int64_t nb = kvp_lruc_blocks(c);
    size_t cap = 0;
    kvp_status st = KVP_OK;
    if (points == 0) {
        for (int64_t C = 1; st == KVP_OK && C <= nb; C++)
            if (C == 1 || kvp_lruc_hit_tokens(c, C) != kvp_lruc_hit_tokens(c, C - 1))
                if ((st = kvp_grow((void **)&it->caps, &cap, it->ncap + 1, sizeof *it->caps)) == KVP_OK) it->caps[it->ncap++] = C;
        return st;
    }
    KVP_TRY(kvp_grow((void **)&it->caps, &cap, (size_t)points + (size_t)nswept + 1, sizeof *it->caps));
    for (int i = 0; i < points && nb > 0; i++) {
        double f = points > 1 ? (double)i / (points - 1) : 1.0;
        int64_t C = (int64_t)llround(exp(f * log((double)nb)));
        it->caps[it->ncap++] = C < 1 ? 1 : C > nb ? nb : C;
    }
    for (int i = 0; i < nswept; i++)
        if (swept[i] > 0 && swept[i] <= nb) it->caps[it->ncap++] = swept[i];
    if (it->ncap) qsort(it->caps, it->ncap, sizeof *it->caps, cmp_i64);
    size_t u = 0;
    for (size_t i = 0; i < it->ncap; i++)
        if (u == 0 || it->caps[i] != it->caps[u - 1]) it->caps[u++] = it->caps[i];
    it->ncap = u;
    return KVP_OK;
}

/* The curve's rows, streamed (a lossless curve has a row per step: hundreds of thousands of them) in the format
 * of common/report.h: CURVE_FIELDS then machine and commit; a table ends with a "# machine" line. */
static void csv_str(FILE *f, const char *v)
{
    if (strpbrk(v, ",\"\n") == NULL) {
        fputs(v, f);
        return;
    }
    fputc('"', f);
    for (const char *p = v; *p; p++) fputs(*p == '"' ? "\"\"" : (char[2]){*p, 0}, f);
    fputc('"', f);
}

static void json_str(FILE *f, const char *v)
{
    fputc('"', f);
    for (const char *p = v; *p; p++)
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if ((unsigned char)*p < 0x20) fprintf(f, "\\u%04x", (unsigned char)*p);
        else fputc(*p, f);
    fputc('"', f);
}

/* Width of curve column k in a default table: its header, at least 10. */
static int curve_width(int k)
{
    const int n = (int)strlen(CURVE_FIELDS[k]);
    return n > 10 ? n : 10;
}

static kvp_status write_curves(FILE *f, kvp_format fmt, const kvp_workload *w, const curve_item *items, int n, int multi_bs,
                               const char *path)
{
    const char *machine = kvp_machine_string(), *commit = kvp_git_commit();
    /* A table shows the curve's own columns in 100 characters (wide: every column, as wide as its header) */
    static const int brief[NCURVE] = {[3] = 1, [4] = 1, [5] = 1, [9] = 1, [10] = 1, [11] = 1, [14] = 1};
    const int wide = fmt == KVP_FMT_WIDE, nbrief = 7;
    if (wide) fmt = KVP_FMT_TABLE;
    if (fmt == KVP_FMT_JSON) fputs("[", f);
    else {
        for (int k = 0; k < NCURVE; k++) {
            if (fmt == KVP_FMT_CSV) fprintf(f, "%s,", CURVE_FIELDS[k]);
            else if (wide || brief[k]) fprintf(f, "%*s  ", wide ? 0 : curve_width(k), CURVE_FIELDS[k]);
        }
        fputs(fmt == KVP_FMT_CSV ? "machine,commit\n" : "\n", f);
    }
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        const curve_item *it = &items[i];
        const kvp_lru_curve *c = it->c;
        const int64_t nb = kvp_lruc_blocks(c), look = kvp_lruc_lookup_tokens(c);
        char series[64] = "lru curve";
        if (multi_bs) snprintf(series, sizeof series, "lru curve/bs%d", it->bs);
        for (size_t j = 0; j <= it->ncap; j++) {
            const int64_t C = j < it->ncap ? it->caps[j] : 0, hit = kvp_lruc_hit_tokens(c, C);
            const double hr = look ? (double)hit / (double)look : 0;
            const double sr = look ? (double)kvp_lruc_stack_hit_tokens(c, C) / (double)look : 0;
            const long long cap_tok = (long long)(C > 0 ? C : nb) * it->bs;
            if (fmt == KVP_FMT_JSON) {
                fprintf(f, "%s\n  {\"workload\": ", rows ? "," : "");
                json_str(f, w->name);
                fprintf(f, ", \"cache\": \"radix|hash\", \"evict\": \"lru\", \"block_size\": %d, \"capacity\": %lld, "
                           "\"capacity_tokens\": %lld, \"series\": \"%s\", \"requests\": %lld, \"prompt_tokens\": %lld, "
                           "\"hit_tokens\": %lld, \"hit_rate\": %.17g, \"stack_hit_rate\": %.17g, \"distinct_blocks\": %lld, "
                           "\"max_request_blocks\": %lld, \"exact\": %d, \"wall_s\": %.6g, \"machine\": ",
                        it->bs, (long long)C, cap_tok, series, (long long)w->n, (long long)look, (long long)hit, hr, sr,
                        (long long)nb, (long long)kvp_lruc_max_access_blocks(c), kvp_lruc_exact(c), it->wall_s);
                json_str(f, machine);
                fprintf(f, ", \"commit\": \"%s\"}", commit);
            } else { /* one value string per field, then CSV (quoted where needed) or padded table columns */
                char v[NCURVE + 2][96];
                snprintf(v[0], sizeof v[0], "%s", w->name);
                snprintf(v[1], sizeof v[1], "radix|hash");
                snprintf(v[2], sizeof v[2], "lru");
                snprintf(v[3], sizeof v[3], "%d", it->bs);
                snprintf(v[4], sizeof v[4], "%lld", (long long)C);
                snprintf(v[5], sizeof v[5], "%lld", cap_tok);
                snprintf(v[6], sizeof v[6], "%s", series);
                snprintf(v[7], sizeof v[7], "%lld", (long long)w->n);
                snprintf(v[8], sizeof v[8], "%lld", (long long)look);
                snprintf(v[9], sizeof v[9], "%lld", (long long)hit);
                snprintf(v[10], sizeof v[10], "%.6g", hr);
                snprintf(v[11], sizeof v[11], "%.6g", sr);
                snprintf(v[12], sizeof v[12], "%lld", (long long)nb);
                snprintf(v[13], sizeof v[13], "%lld", (long long)kvp_lruc_max_access_blocks(c));
                snprintf(v[14], sizeof v[14], "%d", kvp_lruc_exact(c));
                snprintf(v[15], sizeof v[15], "%.6g", it->wall_s);
                snprintf(v[16], sizeof v[16], "%s", machine);
                snprintf(v[17], sizeof v[17], "%s", commit);
                for (int k = 0; k < (fmt == KVP_FMT_CSV ? NCURVE + 2 : NCURVE); k++) {
                    if (fmt == KVP_FMT_CSV) {
                        if (k) fputc(',', f);
                        csv_str(f, v[k]);
                    } else if (wide || brief[k]) {
                        fprintf(f, "%*s  ", wide ? (int)strlen(CURVE_FIELDS[k]) : curve_width(k), v[k]);
                    }
                }
                fputc('\n', f);
            }
            rows++;
        }
    }
    if (fmt == KVP_FMT_JSON) fputs("\n]\n", f);
    if (fmt == KVP_FMT_TABLE && !wide)
        fprintf(f, "# %d of %d columns shown; all of them: --wide, or --format csv|json\n", nbrief, NCURVE);
    if (fmt == KVP_FMT_TABLE) fprintf(f, "# machine: %s; commit %s\n", machine, commit);
    if (fflush(f) != 0 || ferror(f)) return KVP_ERR(KVP_EIO, "writing the curve to %s failed: %s", path, strerror(errno));
    return KVP_OK;
}

int kvp_bench_prefix(int argc, char **argv)
{
    static const struct option opts[] = {
        {"trace", required_argument, NULL, 't'},  {"workload", required_argument, NULL, 'w'},
        {"skip-bad", no_argument, NULL, 'S'},     {"cache", required_argument, NULL, 'c'},
        {"evict", required_argument, NULL, 'e'},  {"block-size", required_argument, NULL, 'b'},
        {"capacity", required_argument, NULL, 'C'}, {"capacity-tokens", required_argument, NULL, 'T'},
        {"host-capacity", required_argument, NULL, 'H'}, {"host-write-policy", required_argument, NULL, 'W'},
        {"sweep", no_argument, NULL, 's'},
        {"out", required_argument, NULL, 'o'},    {"name", required_argument, NULL, 'n'},
        {"format", required_argument, NULL, 'f'}, {"json", no_argument, NULL, 'j'},
        {"no-plot", no_argument, NULL, 'P'},      {"help", no_argument, NULL, 'h'},
        {"curve", no_argument, NULL, 'K'},        {"curve-points", required_argument, NULL, 'k'},
        {"kv-events", required_argument, NULL, 'E'}, {"health", required_argument, NULL, 'Y'},
        {"no-regret", no_argument, NULL, 'R'}, {"wide", no_argument, NULL, 'X'},
        {NULL, 0, NULL, 0},
    };
    const char *trace = NULL, *spec = NULL, *cache_s = "radix", *evict_s = "lru", *bs_s = "16", *cap_s = NULL, *host_s = "0",
               *hpol_s = "write_through", *kv_events = NULL, *health = NULL;
    const char *outdir = kvp_bench_default_out(), *name = NULL;
    int skip_bad = 0, sweep = 0, plot = 1, cap_tokens = 0, curve = 0, regret = 1, c;
    int64_t curve_points = 200;
    kvp_format fmt = KVP_FMT_TABLE;
    optind = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) switch (c) {
        case 't': trace = optarg; break;
        case 'w': spec = optarg; break;
        case 'S': skip_bad = 1; break;
        case 'c': cache_s = optarg; break;
        case 'e': evict_s = optarg; break;
        case 'b': bs_s = optarg; break;
        case 'C':
        case 'T':
            if (cap_s && cap_tokens != (c == 'T'))
                return kvp_cli_usage_error("bench prefix", "give --capacity or --capacity-tokens, not both");
            cap_s = optarg;
            cap_tokens = c == 'T';
            break;
        case 'H': host_s = optarg; break;
        case 'W': hpol_s = optarg; break;
        case 's': sweep = 1; break;
        case 'o': outdir = optarg; break;
        case 'n': name = optarg; break;
        case 'j': fmt = KVP_FMT_JSON; break;
        case 'X': fmt = KVP_FMT_WIDE; break;
        case 'P': plot = 0; break;
        case 'K': curve = 1; break;
        case 'k':
            if (kvp_parse_i64(optarg, 0, 1000000, &curve_points) != KVP_OK)
                return kvp_cli_usage_error("bench prefix", "--curve-points: %s", kvp_error_message());
            break;
        case 'E': kv_events = optarg; break;
        case 'Y': health = optarg; break;
        case 'R': regret = 0; break;
        case 'f':
            if (kvp_format_parse(optarg, &fmt) != KVP_OK) return kvp_cli_usage_error("bench prefix", "%s", kvp_error_message());
            break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error("bench prefix", c, argv);
        }
    if (optind < argc) return kvp_cli_usage_error("bench prefix", "unexpected argument '%s'", argv[optind]);
    if ((trace == NULL) == (spec == NULL)) return kvp_cli_usage_error("bench prefix", "give exactly one of --trace and --workload");

    /* parse the lists */
    strlist le;
    kvp_pc_kind kinds[MAXL];
    kvp_evict_policy pols[MAXL];
    int32_t bss[MAXL];
    int64_t caps[MAXL], hosts[MAXL];
    kvp_hc_write_policy hpols[MAXL];
    int nk = 0, np = 0, nbs = 0, ncap = 0, nhost = 0, nhp = 0;
    if (kvp_parse_list(cache_s, parse_cache, kinds, sizeof kinds[0], MAXL, &nk) != KVP_OK)
        return kvp_cli_usage_error("bench prefix", "--cache: %s", kvp_error_message());
    if (split_list(evict_s, &le) != 0) return kvp_cli_usage_error("bench prefix", "bad --evict list '%s'", evict_s);
    for (int i = 0; i < le.n; i++) {
        if (strcmp(le.items[i], "all") == 0) {
            for (int p = 0; p < KVP_EVICT_POLICIES && np < MAXL; p++) pols[np++] = (kvp_evict_policy)p;
            continue;
        }
        if (np == MAXL || kvp_evict_policy_parse(le.items[i], &pols[np++]) != KVP_OK)
            return kvp_cli_usage_error("bench prefix", "%s", kvp_error_message());
    }
    if (kvp_parse_i32_list(bs_s, 1, 65536, bss, MAXL, &nbs) != KVP_OK)
        return kvp_cli_usage_error("bench prefix", "--block-size: %s", kvp_error_message());
    int auto_caps = cap_s == NULL;
    if (cap_s) {
        kvp_status (*parse_cap)(const char *, void *) = cap_tokens ? parse_cap_tokens : parse_cap_blocks;
        if (kvp_parse_list(cap_s, parse_cap, caps, sizeof caps[0], MAXL, &ncap) != KVP_OK)
            return kvp_cli_usage_error("bench prefix", "--%s: %s", cap_tokens ? "capacity-tokens" : "capacity",
                                       kvp_error_message());
    } else {
        caps[ncap++] = 0;
    }
    if (kvp_parse_list(host_s, cap_tokens ? parse_cap_tokens : parse_cap_blocks, hosts, sizeof hosts[0], MAXL, &nhost) != KVP_OK)
        return kvp_cli_usage_error("bench prefix", "--host-capacity: %s", kvp_error_message());
    if (kvp_parse_list(hpol_s, parse_host_policy, hpols, sizeof hpols[0], MAXL, &nhp) != KVP_OK)
        return kvp_cli_usage_error("bench prefix", "--host-write-policy: %s", kvp_error_message());
    /* --curve alone (no capacities, no --sweep) replays nothing: the curve covers every capacity */
    const int curve_only = curve && cap_s == NULL && !sweep && kv_events == NULL && health == NULL;
    const int combos = nk * np * nbs * ncap * nhost * nhp;
    if (combos > 1 && !curve_only) sweep = 1;
    if (kv_events && combos > 1)
        return kvp_cli_usage_error("bench prefix", "--kv-events follows one cache: give one cache, policy, block size, "
                                                   "capacity and host tier (%d combinations given)", combos);
    if (kv_events && sweep) return kvp_cli_usage_error("bench prefix", "--kv-events and --sweep: one run only");
    if (sweep && name && (name[0] == '\0' || strchr(name, '/')))
        return kvp_cli_usage_error("bench prefix", "--name: '%s' is not a file name (no '/', not empty)", name);
    if (sweep && kvp_bench_out_dir("--out", outdir) != KVP_OK)
        return kvp_cli_usage_error("bench prefix", "%s", kvp_error_message());
    if (sweep && auto_caps && ncap == 1) ncap = -1; /* filled per block size from the unbounded peak */

    kvp_workload *w = NULL;
    kvp_status st;
    if (trace) {
        const char *path = strncmp(trace, "mooncake:", 9) == 0 ? trace + 9 : trace;
        kvp_mooncake_opts mo = {.skip_bad = skip_bad};
        st = kvp_workload_read_mooncake(path, &mo, &w);
    } else {
        st = kvp_workload_generate(spec, &w);
    }
    if (st == KVP_OK && w->n == 0) { /* as simulate: nothing to measure is an error, not a row of zeros */
        st = KVP_ERR(KVP_EINVAL, "%s: no requests%s", trace ? trace : spec,
                     w->skipped_lines ? " (every line skipped)" : "");
        kvp_workload_destroy(w);
    }
    if (st != KVP_OK) return kvp_cli_fail("bench prefix", st);
    if (w->skipped_lines) KVP_LOG_W("bench prefix: skipped %lld malformed lines", (long long)w->skipped_lines);
    KVP_LOG_I("bench prefix: %s: %lld requests, %lld prompt tokens", w->name, (long long)w->n, (long long)w->total_prompt_tokens);

    kvp_report *rep = NULL;
    curve_item curves[MAXL];
    int ncurves = 0;
    memo mm = {0};
    cJSON *hj = health ? cJSON_CreateArray() : NULL;
    st = kvp_report_create(FIELDS, NFIELDS, &rep);
    if (st == KVP_OK) st = kvp_report_set_brief(rep, BRIEF, (int)(sizeof BRIEF / sizeof BRIEF[0]));
    if (st == KVP_OK && health && hj == NULL) st = KVP_ERR(KVP_ENOMEM, "out of memory for --health");
    for (int ib = 0; ib < nbs && st == KVP_OK; ib++) {
        int64_t cl[MAXL];
        int ncl = curve_only ? 0 : ncap;
        if (ncap < 0 && !curve_only) {
            kvp_prefix_replay_cfg c0 = {KVP_PC_RADIX, KVP_EVICT_LRU, bss[ib], 0, 0, KVP_HC_WRITE_THROUGH};
            kvp_prefix_replay_result r0;
            if ((st = replay_memo(&mm, w, &c0, NULL, &r0)) != KVP_OK) break;
            static const double frac[] = {0.05, 0.1, 0.2, 0.4, 0.7};
            ncl = 0;
            cl[ncl++] = 0;
            for (int i = 0; i < 5; i++) {
                int64_t v = (int64_t)((double)r0.peak_cached_blocks * frac[i]);
                cl[ncl++] = v < 1 ? 1 : v;
            }
        } else {
            for (int i = 0; i < ncap; i++) cl[i] = cap_tokens ? (caps[i] + bss[ib] - 1) / bss[ib] : caps[i];
        }
        for (int ik = 0; ik < nk && st == KVP_OK; ik++)
            for (int ip = 0; ip < np && st == KVP_OK; ip++)
                for (int ih = 0; ih < nhost && st == KVP_OK; ih++)
                    for (int iw = 0; iw < (hosts[ih] > 0 ? nhp : 1) && st == KVP_OK; iw++) /* no tier: no policy */
                        for (int ic = 0; ic < ncl && st == KVP_OK; ic++) {
                            int64_t host = cap_tokens ? (hosts[ih] + bss[ib] - 1) / bss[ib] : hosts[ih];
                            kvp_prefix_replay_cfg cfg = {kinds[ik], pols[ip], bss[ib], cl[ic], host, hpols[iw]};
                            kvp_prefix_replay_result r;
                            double belady, unbounded;
                            if ((st = replay_memo(&mm, w, &cfg, kv_events, &r)) != KVP_OK) break;
                            belady = unbounded = NAN;
                            if (regret && (st = regret_refs(&mm, w, &cfg, &belady, &unbounded)) != KVP_OK) break;
                            if (add_row(rep, w, &cfg, &r, nbs > 1, nhost > 1, nhp > 1, belady, unbounded) != 0)
                                st = KVP_ERR(KVP_ENOMEM, "out of memory for the report");
                            if (hj) add_health(hj, w, &cfg, &r);
                        }
        if (st == KVP_OK && curve) {
            kvp_lru_curve *lc = NULL;
            const double t0 = kvp_now_s();
            st = kvp_prefix_curve(w, bss[ib], &lc);
            const double dt = kvp_now_s() - t0;
            if (st == KVP_OK) {
                KVP_LOG_I("bench prefix: lru curve, bs %d: %lld distinct blocks in %.3f s", bss[ib], (long long)kvp_lruc_blocks(lc), dt);
                curves[ncurves] = (curve_item){lc, bss[ib], dt, NULL, 0};
                st = curve_caps(&curves[ncurves++], (int)curve_points, cl, ncl);
            }
        }
    }
    int rc = KVP_EXIT_OK;
    if (st != KVP_OK) rc = kvp_cli_fail("bench prefix", st);
    if (rc == KVP_EXIT_OK) st = curve ? write_curves(stdout, fmt, w, curves, ncurves, nbs > 1, "stdout") : kvp_report_print(rep, stdout, fmt);
    if (rc == KVP_EXIT_OK && st != KVP_OK) rc = kvp_cli_fail("bench prefix", st);
    if (rc == KVP_EXIT_OK && kv_events) fprintf(stderr, "bench prefix: wrote %s\n", kv_events);
    if (rc == KVP_EXIT_OK && hj) {
        char *text = cJSON_Print(hj);
        FILE *f = text ? fopen(health, "w") : NULL;
        if (f == NULL || fputs(text, f) < 0 || fputc('\n', f) < 0) {
            rc = kvp_cli_fail("bench prefix", KVP_ERR(KVP_EIO, "--health: cannot write '%s': %s", health, strerror(errno)));
        } else {
            fprintf(stderr, "bench prefix: wrote %s\n", health);
        }
        if (f && fclose(f) != 0 && rc == KVP_EXIT_OK)
            rc = kvp_cli_fail("bench prefix", KVP_ERR(KVP_EIO, "--health: cannot write '%s': %s", health, strerror(errno)));
        cJSON_free(text);
    }
    if (rc == KVP_EXIT_OK && sweep) {
        char stem[256], csv[1024], ccsv[1100], png[1024];
        if (name) snprintf(stem, sizeof stem, "%s", name);
        else {
            snprintf(stem, sizeof stem, "prefix_%s", w->name);
            for (char *p = stem; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
                    *p = '_';
        }
        snprintf(csv, sizeof csv, "%s/%s.csv", outdir, stem);
        snprintf(ccsv, sizeof ccsv, "%s/%s_curve.csv", outdir, stem);
        snprintf(png, sizeof png, "%s/%s.png", outdir, stem);
        if ((st = kvp_report_write_csv(rep, csv)) != KVP_OK) rc = kvp_cli_fail("bench prefix", st);
        else if (curve) {
            FILE *cf = fopen(ccsv, "w");
            st = cf ? write_curves(cf, KVP_FMT_CSV, w, curves, ncurves, nbs > 1, ccsv)
                    : KVP_ERR(KVP_EIO, "cannot write '%s': %s", ccsv, strerror(errno));
            if (cf && fclose(cf) != 0 && st == KVP_OK) st = KVP_ERR(KVP_EIO, "cannot write '%s': %s", ccsv, strerror(errno));
            if (st != KVP_OK) rc = kvp_cli_fail("bench prefix", st);
        }
        if (rc == KVP_EXIT_OK) {
            fprintf(stderr, "bench prefix: wrote %s\n", csv);
            if (curve) fprintf(stderr, "bench prefix: wrote %s\n", ccsv);
            if (plot && run_plot(csv, curve ? ccsv : NULL, png, w->name, cap_tokens) == 0) fprintf(stderr, "bench prefix: wrote %s\n", png);
        }
    }
    cJSON_Delete(hj);
    kvp_free(mm.v);
    kvp_report_destroy(rep);
    for (int i = 0; i < ncurves; i++) {
        kvp_lruc_destroy(curves[i].c);
        kvp_free(curves[i].caps);
    }
    kvp_workload_destroy(w);
    return rc;
}
