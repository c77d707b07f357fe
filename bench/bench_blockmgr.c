/* `kvpage bench blockmgr` — nanoseconds per block-manager operation.
 *
 * Cases (each timed over a batch of operations, repeated --reps times; the median batch is reported):
 *   alloc_free_1     kvp_pool_alloc of one block + kvp_pool_decref of it
 *   append_1         kvp_bm_append_ref of one token, amortized: includes the block allocation every block_size
 *                    tokens and the geometric growth of the table; one kvp_bm_seq_ref per sequence, taken at
 *                    admission and kept (as a scheduler keeps one per running sequence)
 *   append_1_by_id   the same with kvp_bm_append (id-map lookup on every append)
 *   fork_128         kvp_bm_fork of a 128-block sequence (refcount++ on 128 blocks, a new table)
 *   free_128_shared  kvp_bm_free of such a forked child (refcount-- on 128 blocks, none goes free)
 *   allocate_128     kvp_bm_allocate of a 128-block prompt
 *   free_128         kvp_bm_free of an unshared 128-block sequence (128 blocks back to the free list)
 *   mixed            a decode-like workload: each op is one of append 1 token (most), admit a new prompt,
 *                    fork, truncate, finish (free); ns per op over a pre-generated random op list
 * Before timing, each case's state is validated with the invariant walkers (kvp_pool_check / kvp_bm_check)
 * and the "validated" column says whether that passed. Data to stdout, progress to stderr.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "blockmgr/block_mgr.h"
#include "common/alloc.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/report.h"
#include "common/timer.h"

typedef struct {
    int32_t bs;
    int reps;
    uint64_t seed;
    int shift; /* --quick: every batch 16x smaller (shift 4) */
} opts_t;

typedef struct {
    const char *name;
    double target_ns; /* 0: none */
    double *samples;  /* ns per op, one per rep */
    int n;
    int64_t ops_per_rep;
    bool validated;
} result_t;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Prevents the compiler from dropping results. */
static volatile int64_t sink;

static kvp_status bench_alloc_free(const opts_t *o, result_t *r)
{
    const int N = (1 << 16) >> o->shift; /* ~0.6 ms batches: shorter than a scheduler time slice on a loaded machine */
    kvp_block_pool *p;
    KVP_TRY(kvp_pool_create(4096, o->bs, &p));
    int32_t id;
    int64_t acc = 0;
    for (int i = 0; i < 1000; i++) { /* warm up */
        kvp_pool_alloc(p, 1, &id);
        kvp_pool_decref(p, id);
    }
    r->validated = kvp_pool_check(p) == KVP_OK && kvp_pool_num_free(p) == 4096;
    for (int rep = 0; rep < r->n; rep++) {
        int64_t t0 = kvp_now_ns();
        for (int i = 0; i < N; i++) {
            kvp_pool_alloc(p, 1, &id);
            acc += id;
            kvp_pool_decref(p, id);
        }
        r->samples[rep] = (double)(kvp_now_ns() - t0) / N;
    }
    r->validated = r->validated && kvp_pool_check(p) == KVP_OK && kvp_pool_num_free(p) == 4096;
    r->ops_per_rep = N;
    sink = acc;
    kvp_pool_destroy(p);
    return KVP_OK;
}

static kvp_status make_bm(const opts_t *o, int32_t nblocks, kvp_block_mgr **bm)
{
    kvp_bm_config cfg = {.num_blocks = nblocks, .block_size = o->bs, .num_host_blocks = 0, .max_seq_len = 0,
                         .watermark_blocks = 0};
    return kvp_bm_create(&cfg, bm);
}

/* by_ref: kvp_bm_append_ref through one kvp_bm_seq_ref per sequence, taken at admission and kept across
 * steps (as a scheduler keeps one per running sequence); otherwise kvp_bm_append by id (id-map lookup). */
static kvp_status bench_append(const opts_t *o, result_t *r, bool by_ref)
{
    /* 16 sequences grow together (round robin) so the lookups do not hit one hot entry only */
    enum { SEQS = 16 };
    const int32_t nblk = 256 >> o->shift, per_seq = nblk * o->bs; /* 256 blocks each */
    kvp_block_mgr *bm;
    KVP_TRY(make_bm(o, SEQS * nblk + 8, &bm));
    kvp_status st = KVP_OK;
    bool ok = true;
    for (int rep = 0; rep < r->n && st == KVP_OK; rep++) {
        kvp_bm_seq_ref ref[SEQS];
        for (int s = 0; s < SEQS && st == KVP_OK; s++) {
            st = kvp_bm_allocate(bm, s, 1);
            if (st == KVP_OK) st = kvp_bm_seq_ref_get(bm, s, &ref[s]);
        }
        int32_t slot;
        int64_t acc = 0;
        int64_t t0 = kvp_now_ns();
        if (by_ref)
            for (int32_t t = 1; t < per_seq && st == KVP_OK; t++)
                for (int s = 0; s < SEQS; s++) {
                    const kvp_status e = kvp_bm_append_ref(bm, &ref[s], 1, &slot);
                    if (__builtin_expect(e != KVP_OK, 0)) st = e;
                    acc += slot;
                }
        else
            for (int32_t t = 1; t < per_seq && st == KVP_OK; t++)
                for (int s = 0; s < SEQS; s++) {
                    const kvp_status e = kvp_bm_append(bm, s, 1, &slot);
                    if (__builtin_expect(e != KVP_OK, 0)) st = e;
                    acc += slot;
                }
        r->samples[rep] = (double)(kvp_now_ns() - t0) / ((double)(per_seq - 1) * SEQS);
        sink = acc;
        if (rep == 0) ok = kvp_bm_check(bm) == KVP_OK;
        for (int s = 0; s < SEQS && st == KVP_OK; s++) st = kvp_bm_free(bm, s);
    }
    r->validated = ok && st == KVP_OK && kvp_bm_check(bm) == KVP_OK && kvp_bm_num_free(bm) == SEQS * nblk + 8;
    r->ops_per_rep = (int64_t)(per_seq - 1) * SEQS;
    kvp_bm_destroy(bm);
    return st;
}

/* fork_128, free_128_shared, allocate_128, free_128 in one setup. */
static kvp_status bench_tables(const opts_t *o, result_t *fork_r, result_t *frees_r, result_t *alloc_r, result_t *free_r)
{
    const int N = 2048 >> o->shift;
    const int32_t ntok = 128 * o->bs;
    kvp_block_mgr *bm;
    KVP_TRY(make_bm(o, 128 * N + 256, &bm));
    kvp_status st = kvp_bm_allocate(bm, -1, ntok);
    bool ok = st == KVP_OK;
    for (int rep = 0; rep < fork_r->n && st == KVP_OK; rep++) {
        int64_t t0 = kvp_now_ns();
        for (int i = 0; i < N && st == KVP_OK; i++) st = kvp_bm_fork(bm, -1, i);
        int64_t t1 = kvp_now_ns();
        if (rep == 0) ok = ok && st == KVP_OK && kvp_bm_check(bm) == KVP_OK && kvp_bm_num_seqs(bm) == N + 1;
        for (int i = 0; i < N && st == KVP_OK; i++) st = kvp_bm_free(bm, i);
        int64_t t2 = kvp_now_ns();
        for (int i = 0; i < N && st == KVP_OK; i++) st = kvp_bm_allocate(bm, i, ntok);
        int64_t t3 = kvp_now_ns();
        if (rep == 0) ok = ok && st == KVP_OK && kvp_bm_check(bm) == KVP_OK && kvp_bm_num_free(bm) == 256 - 128;
        for (int i = 0; i < N && st == KVP_OK; i++) st = kvp_bm_free(bm, i);
        int64_t t4 = kvp_now_ns();
        fork_r->samples[rep] = (double)(t1 - t0) / N;
        frees_r->samples[rep] = (double)(t2 - t1) / N;
        alloc_r->samples[rep] = (double)(t3 - t2) / N;
        free_r->samples[rep] = (double)(t4 - t3) / N;
    }
    ok = ok && st == KVP_OK && kvp_bm_free(bm, -1) == KVP_OK && kvp_bm_check(bm) == KVP_OK &&
         kvp_bm_num_free(bm) == 128 * N + 256;
    fork_r->validated = frees_r->validated = alloc_r->validated = free_r->validated = ok;
    fork_r->ops_per_rep = frees_r->ops_per_rep = alloc_r->ops_per_rep = free_r->ops_per_rep = N;
    kvp_bm_destroy(bm);
    return st;
}

/* Mixed workload: op codes pre-generated; live sequences kept in an array. */
enum { MX_APPEND = 0, MX_ADMIT, MX_FORK, MX_TRUNC, MX_FINISH };

static kvp_status run_mixed(kvp_block_mgr *bm, const uint8_t *ops, const uint32_t *arg, int64_t nops, int64_t *live,
                            int32_t *nlive, int32_t maxlive, int64_t *next_id, int64_t *done)
{
    int32_t slot;
    int64_t ok = 0;
    for (int64_t i = 0; i < nops; i++) {
        const uint32_t a = arg[i];
        kvp_status st;
        int32_t n = *nlive;
        switch (ops[i]) {
        case MX_APPEND:
            if (n == 0) continue;
            st = kvp_bm_append(bm, live[a % (uint32_t)n], 1, &slot);
            break;
        case MX_ADMIT:
            if (n == maxlive) continue;
            st = kvp_bm_allocate(bm, *next_id, (int32_t)(1 + a % 1024));
            if (st == KVP_OK) live[(*nlive)++] = (*next_id)++;
            break;
        case MX_FORK:
            if (n == 0 || n == maxlive) continue;
            st = kvp_bm_fork(bm, live[a % (uint32_t)n], *next_id);
            if (st == KVP_OK) live[(*nlive)++] = (*next_id)++;
            break;
        case MX_TRUNC: {
            if (n == 0) continue;
            kvp_bm_table_view t;
            kvp_bm_table(bm, live[a % (uint32_t)n], &t);
            const int32_t drop = (int32_t)((a >> 16) % 8); /* beam search drops a few tokens */
            st = kvp_bm_truncate(bm, live[a % (uint32_t)n], t.num_tokens > drop ? t.num_tokens - drop : 0);
            break;
        }
        default:
            if (n == 0) continue;
            st = kvp_bm_free(bm, live[a % (uint32_t)n]);
            live[a % (uint32_t)n] = live[--(*nlive)];
            break;
        }
        if (st == KVP_OK) ok++;
        else if (st != KVP_ENOBLOCKS) return st;
        kvp_bm_step_ops_clear(bm);
    }
    *done = ok;
    return KVP_OK;
}

static kvp_status bench_mixed(const opts_t *o, result_t *r)
{
    const int64_t N = (1 << 20) >> o->shift;
    const int32_t maxlive = 512, nblocks = 512 * (1024 / o->bs + 64) + 1024;
    uint8_t *ops = kvp_malloc((size_t)N);
    uint32_t *arg = kvp_malloc((size_t)N * sizeof(uint32_t));
    int64_t *live = kvp_malloc(sizeof(int64_t) * (size_t)maxlive);
    if (!ops || !arg || !live) {
        kvp_free(ops);
        kvp_free(arg);
        kvp_free(live);
        return KVP_ERR(KVP_ENOMEM, "bench mixed: out of memory");
    }
    uint64_t s = o->seed;
    for (int64_t i = 0; i < N; i++) {
        uint32_t x = (uint32_t)(rng(&s) % 1000);
        ops[i] = x < 900 ? MX_APPEND : x < 940 ? MX_ADMIT : x < 955 ? MX_FORK : x < 965 ? MX_TRUNC : MX_FINISH;
        arg[i] = (uint32_t)rng(&s);
    }
    kvp_block_mgr *bm;
    kvp_status st = make_bm(o, nblocks, &bm);
    bool ok = st == KVP_OK;
    int64_t done = 0;
    for (int rep = 0; rep < r->n && st == KVP_OK; rep++) {
        int32_t nlive = 0;
        int64_t next_id = 0;
        int64_t t0 = kvp_now_ns();
        st = run_mixed(bm, ops, arg, N, live, &nlive, maxlive, &next_id, &done);
        r->samples[rep] = (double)(kvp_now_ns() - t0) / (double)N;
        if (rep == 0) ok = ok && st == KVP_OK && kvp_bm_check(bm) == KVP_OK;
        for (int32_t i = 0; i < nlive && st == KVP_OK; i++) st = kvp_bm_free(bm, live[i]);
    }
    ok = ok && st == KVP_OK && kvp_bm_check(bm) == KVP_OK && kvp_bm_num_free(bm) == nblocks && done > N / 2;
    r->validated = ok;
    r->ops_per_rep = N;
    kvp_bm_destroy(bm);
    kvp_free(ops);
    kvp_free(arg);
    kvp_free(live);
    return st;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage bench blockmgr [options]\n\n"
            "Nanoseconds per block-manager operation (median of --reps batches): alloc+free of one block,\n"
            "append of one token (amortized), fork/free/allocate of a 128-block table, a mixed workload.\n\n"
            "options:\n"
            "  --block-size N   tokens per block (default 16)\n"
            "  --reps N         timed batches per case, median reported (default 11)\n"
            "  --seed N         seed of the mixed workload (default 1)\n"
            "  --quick          16x smaller batches (smoke tests; figures are less stable)\n"
            "  --format F       table | csv | json (default table)\n"
            "  --json           same as --format json\n"
            "  --wide           a table with every column (same as --format wide)\n"
            "  -h, --help       this help\n");
}

int kvp_bench_blockmgr(int argc, char **argv)
{
    static const struct option lo[] = {{"block-size", required_argument, NULL, 'b'}, {"reps", required_argument, NULL, 'r'},
                                       {"seed", required_argument, NULL, 's'},       {"format", required_argument, NULL, 'f'},
                                       {"json", no_argument, NULL, 'j'},             {"help", no_argument, NULL, 'h'},
                                       {"quick", no_argument, NULL, 'q'},             {"wide", no_argument, NULL, 'W'},
                                       {NULL, 0, NULL, 0}};
    const char *cmd = "bench blockmgr";
    opts_t o = {.bs = 16, .reps = 11, .seed = 1};
    kvp_format fmt = KVP_FMT_TABLE;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
        int64_t v;
        switch (c) {
        case 'b':
            if (kvp_parse_i64(optarg, 1, 256, &v) != KVP_OK) return kvp_cli_usage_error(cmd, "--block-size: %s", kvp_error_message());
            o.bs = (int32_t)v;
            break;
        case 'r':
            if (kvp_parse_i64(optarg, 1, 1000, &v) != KVP_OK) return kvp_cli_usage_error(cmd, "--reps: %s", kvp_error_message());
            o.reps = (int)v;
            break;
        case 's':
            if (kvp_parse_i64(optarg, 0, INT64_MAX, &v) != KVP_OK) return kvp_cli_usage_error(cmd, "--seed: %s", kvp_error_message());
            o.seed = (uint64_t)v;
            break;
        case 'f':
            if (kvp_format_parse(optarg, &fmt) != KVP_OK) return kvp_cli_usage_error(cmd, "--format: %s", kvp_error_message());
            break;
        case 'j': fmt = KVP_FMT_JSON; break;
        case 'W': fmt = KVP_FMT_WIDE; break;
        case 'q': o.shift = 4; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error(cmd, c, argv);
        }
    }
    if (optind < argc) return kvp_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);

    enum { NCASE = 8 };
    result_t res[NCASE] = {
        {"alloc_free_1", 20, NULL, 0, 0, false}, {"append_1", 10, NULL, 0, 0, false},
        {"append_1_by_id", 0, NULL, 0, 0, false},
        {"fork_128", 1000, NULL, 0, 0, false},   {"free_128_shared", 0, NULL, 0, 0, false},
        {"allocate_128", 0, NULL, 0, 0, false},  {"free_128", 0, NULL, 0, 0, false},
        {"mixed", 0, NULL, 0, 0, false},
    };
    double *buf = kvp_calloc((size_t)NCASE * (size_t)o.reps, sizeof(double));
    if (buf == NULL) return kvp_cli_fail(cmd, KVP_ERR(KVP_ENOMEM, "out of memory"));
    for (int i = 0; i < NCASE; i++) {
        res[i].samples = buf + (size_t)i * (size_t)o.reps;
        res[i].n = o.reps;
    }
    kvp_status st;
    KVP_LOG_I("bench blockmgr: block_size %d, %d reps", o.bs, o.reps);
    fprintf(stderr, "bench blockmgr: alloc_free_1 ...\n");
    st = bench_alloc_free(&o, &res[0]);
    if (st == KVP_OK) {
        fprintf(stderr, "bench blockmgr: append_1 ...\n");
        st = bench_append(&o, &res[1], true);
    }
    if (st == KVP_OK) {
        fprintf(stderr, "bench blockmgr: append_1_by_id ...\n");
        st = bench_append(&o, &res[2], false);
    }
    if (st == KVP_OK) {
        fprintf(stderr, "bench blockmgr: fork/free/allocate 128 blocks ...\n");
        st = bench_tables(&o, &res[3], &res[4], &res[5], &res[6]);
    }
    if (st == KVP_OK) {
        fprintf(stderr, "bench blockmgr: mixed ...\n");
        st = bench_mixed(&o, &res[7]);
    }
    if (st != KVP_OK) {
        kvp_free(buf);
        return kvp_cli_fail(cmd, st);
    }
    static const char *const fields[] = {"case", "block_size", "reps", "ops_per_rep", "median_ns", "min_ns", "max_ns",
                                         "ops_per_s", "target_ns", "meets_target", "validated"};
    kvp_report *rep;
    static const char *const brief[] = {"case", "median_ns", "min_ns", "max_ns", "ops_per_s", "target_ns", "meets_target",
                                        "validated"};
    st = kvp_report_create(fields, (int)(sizeof fields / sizeof *fields), &rep);
    if (st == KVP_OK) st = kvp_report_set_brief(rep, brief, (int)(sizeof brief / sizeof *brief));
    for (int i = 0; i < NCASE && st == KVP_OK; i++) {
        cJSON *row;
        st = kvp_report_row(rep, &row);
        if (st != KVP_OK) break;
        double *v = res[i].samples;
        double med = median(v, res[i].n); /* sorts v */
        cJSON_AddStringToObject(row, "case", res[i].name);
        cJSON_AddNumberToObject(row, "block_size", o.bs);
        cJSON_AddNumberToObject(row, "reps", res[i].n);
        cJSON_AddNumberToObject(row, "ops_per_rep", (double)res[i].ops_per_rep);
        cJSON_AddNumberToObject(row, "median_ns", (double)(int64_t)(med * 100 + 0.5) / 100);
        cJSON_AddNumberToObject(row, "min_ns", (double)(int64_t)(v[0] * 100 + 0.5) / 100);
        cJSON_AddNumberToObject(row, "max_ns", (double)(int64_t)(v[res[i].n - 1] * 100 + 0.5) / 100);
        cJSON_AddNumberToObject(row, "ops_per_s", med > 0 ? (double)(int64_t)(1e9 / med) : 0);
        if (res[i].target_ns > 0) {
            cJSON_AddNumberToObject(row, "target_ns", res[i].target_ns);
            cJSON_AddBoolToObject(row, "meets_target", med <= res[i].target_ns);
        } else {
            cJSON_AddNullToObject(row, "target_ns");
            cJSON_AddNullToObject(row, "meets_target");
        }
        cJSON_AddBoolToObject(row, "validated", res[i].validated);
    }
    if (st == KVP_OK) st = kvp_report_print(rep, stdout, fmt);
    kvp_report_destroy(rep);
    kvp_free(buf);
    if (st != KVP_OK) return kvp_cli_fail(cmd, st);
    for (int i = 0; i < NCASE; i++)
        if (!res[i].validated) return kvp_cli_fail(cmd, KVP_ERR(KVP_ESTATE, "case %s failed validation", res[i].name));
    return KVP_EXIT_OK;
}
