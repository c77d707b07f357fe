/* bench/bench_prefix.c — `kvpage bench prefix`: replay a workload through radix / hash / none prefix caches
 * with an eviction policy and a capacity, one run or a sweep (CSV + plot under bench/results/).
 * The replay is described in bench/bench_prefix.h. */
#include "bench/bench_prefix.h"

#include <errno.h>
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
    int64_t stored;
} write_back_ctx;

static void write_back(void *ctx, uint64_t hash, int32_t block)
{
    (void)block;
    write_back_ctx *wb = ctx;
    int32_t slot;
    wb->stored += kvp_hc_store(wb->hc, &hash, 1, &slot);
}

kvp_status kvp_prefix_replay(const kvp_workload *w, const kvp_prefix_replay_cfg *cfg, kvp_prefix_replay_result *out)
{
    if (w == NULL || cfg == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_prefix_replay: NULL argument");
    if (cfg->block_size < 1) return KVP_ERR(KVP_EINVAL, "block size %d < 1", cfg->block_size);
    if (cfg->capacity < 0) return KVP_ERR(KVP_EINVAL, "capacity %lld < 0", (long long)cfg->capacity);
    if (cfg->host_capacity < 0 || cfg->host_capacity > INT32_MAX)
        return KVP_ERR(KVP_EINVAL, "host capacity %lld blocks is out of [0, %d]", (long long)cfg->host_capacity, INT32_MAX);
    if ((unsigned)cfg->host_policy >= KVP_HC_WRITE_POLICIES) return KVP_ERR(KVP_EINVAL, "unknown host-tier write policy");
    const int32_t bs = cfg->block_size;
    double t0 = kvp_now_s();
    int64_t na = w->n_pins + w->n, total_blocks = 0, max_blocks = 1, full_blocks = 0;
    /* What access a caches: its prompt, and a known answer but its last token (as the engine computes
     * them), tokens[a][0..lens[a]); it matches its prompt only. */
    const int32_t **toks = kvp_malloc((size_t)(na ? na : 1) * sizeof *toks);
    int32_t *lens = kvp_malloc((size_t)(na ? na : 1) * sizeof *lens), *cat = NULL;
    kvp_status st = toks && lens ? KVP_OK : KVP_ERR(KVP_ENOMEM, "out of memory for the replay");
    int64_t cat_n = 0;
    for (int64_t a = 0; st == KVP_OK && a < na; a++) {
        const kvp_request *r = a < w->n_pins ? &w->pins[a] : &w->reqs[a - w->n_pins];
        lens[a] = r->prompt_len + (r->output_tokens && r->output_len > 1 ? r->output_len - 1 : 0);
        if (lens[a] > r->prompt_len) cat_n += lens[a];
        int64_t nb = ((int64_t)lens[a] + bs - 1) / bs;
        total_blocks += nb;
        full_blocks += lens[a] / bs;
        if (nb > max_blocks) max_blocks = nb;
    }
    if (st == KVP_OK && cat_n > 0 && (cat = kvp_malloc((size_t)cat_n * sizeof *cat)) == NULL)
        st = KVP_ERR(KVP_ENOMEM, "out of memory for the replay's answers");
    for (int64_t a = 0, off = 0; st == KVP_OK && a < na; a++) {
        const kvp_request *r = a < w->n_pins ? &w->pins[a] : &w->reqs[a - w->n_pins];
        toks[a] = r->tokens;
        if (lens[a] == r->prompt_len) continue;
        memcpy(cat + off, r->tokens, (size_t)r->prompt_len * sizeof *cat);
        memcpy(cat + off + r->prompt_len, r->output_tokens, (size_t)(lens[a] - r->prompt_len) * sizeof *cat);
        toks[a] = cat + off;
        off += lens[a];
    }
    int64_t pool_blocks = cfg->capacity > 0 ? cfg->capacity : total_blocks + 1;
    if (st == KVP_OK && pool_blocks > INT32_MAX - 1)
        st = KVP_ERR(KVP_EINVAL, "a pool of %lld blocks is too large (block size %d): raise the block size or set --capacity",
                     (long long)pool_blocks, bs);

    kvp_block_pool *pool = NULL;
    kvp_prefix_cache *pc = NULL;
    kvp_host_cache *hc = NULL;
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
    write_back_ctx wb = {hc, 0};
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
        const kvp_request *r = is_pin ? &w->pins[a] : &w->reqs[a - w->n_pins];
        kvp_pc_hint hint = {.priority = r->priority, .next_use = nu ? nu[a] : NULL};
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
        if (fr < need) {
            int64_t ev = need - fr, can = kvp_pc_num_evictable(pc);
            if (ev > can) ev = can;
            if (ev > 0) st = kvp_pc_evict(pc, (int32_t)ev, NULL);
            fr = kvp_pool_num_free(pool);
        }
        int32_t got = need < fr ? need : fr;
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
        out->cache_s = (double)cache_ns * 1e-9;
        out->cache_cpu_s = (double)cache_cpu * 1e-9;
        out->wall_s = kvp_now_s() - t0;
    }
    kvp_pc_destroy(pc);
    kvp_hc_destroy(hc);
    kvp_pool_destroy(pool);
    kvp_free(slots);
    kvp_free(hashes);
    kvp_free(blocks);
    kvp_free(hit);
    kvp_free(nu_flat);
    kvp_free(nu);
    kvp_free(toks);
    kvp_free(lens);
    kvp_free(mlens);
    kvp_free(cat);
    return st;
}

/* ---- command --------------------------------------------------------------------------------------- */

static const char *const FIELDS[] = {"workload",      "cache",          "evict",           "block_size",  "capacity",
                                     "capacity_eff",  "capacity_tokens", "series",         "requests",        "prompt_tokens", "hit_tokens",
                                     "hit_rate",      "block_hit_rate", "host_capacity", "host_hit_tokens",
                                     "host_write_policy", "host_hit_rate", "total_hit_rate", "host_stored_blocks", "inserted_blocks", "evicted_blocks",
                                     "peak_cached_blocks", "short_requests", "wall_s",     "cache_mtok_per_s",
                                     "cache_cpu_mtok_per_s"};
#define NFIELDS ((int)(sizeof FIELDS / sizeof FIELDS[0]))

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage bench prefix (--trace mooncake:PATH | --workload SPEC) [options]\n"
            "\n"
            "Replays a workload request by request through a prefix cache over a pool of --capacity blocks:\n"
            "match (count the hit), allocate the rest (evicting by the policy), insert the full blocks, release.\n"
            "\n"
            "  --trace mooncake:PATH   Mooncake JSONL trace (a bare PATH is read as Mooncake too)\n"
            "  --workload SPEC         synthetic: system|chat|fewshot|branch[:key=value,...] (runtime/workload/workload.h)\n"
            "  --skip-bad              count and skip malformed trace lines instead of failing\n"
            "  --cache LIST            radix | hash | none (comma list; default radix)\n"
            "  --evict LIST            lru | lfu | fifo | priority | belady | all (comma list; default lru)\n"
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
            "  --sweep                 write OUT/NAME.csv and OUT/NAME.png (total hit rate against capacity, one line\n"
            "                          per cache/policy); implied by more than one combination\n"
            "  --out DIR               output folder of a sweep (default bench/results)\n"
            "  --name NAME             file stem of a sweep (default prefix_<workload>)\n"
            "  --format table|csv|json data on stdout (default table)   --json  same as --format json\n"
            "  --no-plot               skip the PNG\n"
            "  -h, --help              this help\n"
            "\n"
            "Fields: workload cache evict block_size capacity capacity_eff (capacity, or the peak when unbounded)\n"
            "capacity_tokens (capacity_eff x block_size) series requests prompt_tokens hit_tokens hit_rate\n"
            "block_hit_rate host_capacity host_hit_tokens host_write_policy host_hit_rate total_hit_rate (hit_rate +\n"
            "host_hit_rate) host_stored_blocks inserted_blocks evicted_blocks peak_cached_blocks short_requests wall_s\n"
            "cache_mtok_per_s (prompt tokens per second of wall time inside match + insert)\n"
            "cache_cpu_mtok_per_s (the same per second of thread CPU time) machine commit.\n"
            "Example: kvpage bench prefix --trace mooncake:../shared/data/traces/mooncake/synthetic_trace.jsonl \\\n"
            "           --block-size 512 --evict all --capacity 0,2000,5000,10000,20000\n");
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

static int run_plot(const char *csv, const char *png, const char *title)
{
    const char *args[] = {"lines", csv, png, "--x", "capacity_tokens", "--y", "total_hit_rate", "--series", "series", "--logx",
                          "--title", title, "--xlabel", "cache capacity (tokens)", "--ylabel", "prefix hit rate (tokens)",
                          NULL};
    if (kvp_bench_plot(args) != KVP_OK) {
        KVP_LOG_W("bench prefix: no plot (%s); the CSV is written", kvp_error_message());
        return -1;
    }
    return 0;
}

static int add_row(kvp_report *rep, const kvp_workload *w, const kvp_prefix_replay_cfg *c, const kvp_prefix_replay_result *r,
                   int multi_bs, int multi_host, int multi_policy)
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
    return 0;
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
        {NULL, 0, NULL, 0},
    };
    const char *trace = NULL, *spec = NULL, *cache_s = "radix", *evict_s = "lru", *bs_s = "16", *cap_s = NULL, *host_s = "0",
               *hpol_s = "write_through";
    const char *outdir = "bench/results", *name = NULL;
    int skip_bad = 0, sweep = 0, plot = 1, cap_tokens = 0, c;
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
        case 'P': plot = 0; break;
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
            for (int p = KVP_EVICT_LRU; p <= KVP_EVICT_BELADY && np < MAXL; p++) pols[np++] = (kvp_evict_policy)p;
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
    if (nk * np * nbs * ncap * nhost * nhp > 1) sweep = 1;
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
    if ((st = kvp_report_create(FIELDS, NFIELDS, &rep)) != KVP_OK) {
        kvp_workload_destroy(w);
        return kvp_cli_fail("bench prefix", st);
    }
    for (int ib = 0; ib < nbs && st == KVP_OK; ib++) {
        int64_t cl[MAXL];
        int ncl = ncap;
        if (ncap < 0) {
            kvp_prefix_replay_cfg c0 = {KVP_PC_RADIX, KVP_EVICT_LRU, bss[ib], 0, 0, KVP_HC_WRITE_THROUGH};
            kvp_prefix_replay_result r0;
            if ((st = kvp_prefix_replay(w, &c0, &r0)) != KVP_OK) break;
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
                            KVP_LOG_I("bench prefix: %s/%s bs %d capacity %lld host %lld %s", kvp_pc_kind_name(cfg.kind),
                                      kvp_evict_policy_name(cfg.policy), cfg.block_size, (long long)cfg.capacity,
                                      (long long)host, host > 0 ? kvp_hc_write_policy_name(cfg.host_policy) : "");
                            if ((st = kvp_prefix_replay(w, &cfg, &r)) != KVP_OK) break;
                            if (add_row(rep, w, &cfg, &r, nbs > 1, nhost > 1, nhp > 1) != 0)
                                st = KVP_ERR(KVP_ENOMEM, "out of memory for the report");
                        }
    }
    int rc = KVP_EXIT_OK;
    if (st != KVP_OK) rc = kvp_cli_fail("bench prefix", st);
    if (rc == KVP_EXIT_OK && (st = kvp_report_print(rep, stdout, fmt)) != KVP_OK) rc = kvp_cli_fail("bench prefix", st);
    if (rc == KVP_EXIT_OK && sweep) {
        char stem[256], csv[1024], png[1024];
        if (name) snprintf(stem, sizeof stem, "%s", name);
        else {
            snprintf(stem, sizeof stem, "prefix_%s", w->name);
            for (char *p = stem; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
                    *p = '_';
        }
        snprintf(csv, sizeof csv, "%s/%s.csv", outdir, stem);
        snprintf(png, sizeof png, "%s/%s.png", outdir, stem);
        if ((st = kvp_report_write_csv(rep, csv)) != KVP_OK) rc = kvp_cli_fail("bench prefix", st);
        else {
            fprintf(stderr, "bench prefix: wrote %s\n", csv);
            if (plot && run_plot(csv, png, w->name) == 0) fprintf(stderr, "bench prefix: wrote %s\n", png);
        }
    }
    kvp_report_destroy(rep);
    kvp_workload_destroy(w);
    return rc;
}
