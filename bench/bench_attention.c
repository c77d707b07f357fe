/* bench/bench_attention.c — `kvpage bench attention`: paged vs contiguous CPU attention, next to the
 * machine's measured copy bandwidth.
 *
 * For each configuration (kernel, dtype, batch, context, heads, head_dim) it builds the same K/V in
 *   - paged pools, one per block size, pages in a random order (what a block manager produces),
 *   - a contiguous pool: one block per sequence (block_size = context), identity page table,
 * all of them at once (the target configuration holds 10 pools of 512 MiB: ~5 GiB), runs each layout once
 * untimed and validates it (paged output == contiguous output up to 1e-5 relative, the contiguous output
 * against the dense float64 reference on the first sequences), then times the layouts INTERLEAVED: round r
 * runs every layout once, then measures the copy bandwidth once. Each layout reports the MINIMUM time over
 * the rounds (wall time_ms and process cpu_ms separately), and paged_over_contig is the ratio of those
 * minima: on a shared machine a load swing then hits every layout alike instead of whichever layout was
 * being timed. The dense reference is timed too for decode (one run).
 * Bandwidth = bytes of K/V read once / time; copy bandwidth = a large memcpy's bytes read + written / time,
 * on all threads: measured at the start (the memcpy row) and once per round; a row's copy_gbps (and its
 * pct_copy_bw) is the best of the rounds of its configuration, i.e. taken under the same load as its kernel.
 * Decode rows also carry the layout's plain read (read_pass: the same bytes read whole block by block in
 * page order, prefetched ahead, no arithmetic, timed in the same rounds, minimum): read_gbps, and
 * pct_read_bw = kv_gbps / read_gbps. The plain reads of two layouts show how much of their time ratio the
 * memory alone imposes: block size 1 scatters 2 KiB runs at random places, served slower than one long run. A
 * memcpy counts bytes read + written, so even a pure read stream reaches only part of copy_gbps: the
 * memread row (a sequential read of the copy source on all threads, timed interleaved with the first
 * copies) gives that part for this machine.
 */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "attention/attention.h"
#include "bench/bench.h"
#include "common/alloc.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/report.h"
#include "common/timer.h"

static const char *const k_fields[] = {"kernel",  "layout",   "dtype",     "block_size", "batch",  "ctx",
                                       "new_tokens", "q_heads", "kv_heads", "head_dim", "threads", "score_lanes", "value_lanes", "reps",
                                       "time_ms", "cpu_ms", "kv_bytes", "kv_gbps",   "copy_gbps",  "pct_copy_bw", "read_gbps", "pct_read_bw", "gflops",
                                       "paged_over_contig", "paged_over_contig_cpu", "validated"};
#define NFIELDS ((int)(sizeof k_fields / sizeof k_fields[0]))
/* the default table's columns (--wide: all) */
static const char *const k_brief[] = {"kernel", "layout", "dtype", "block_size", "batch", "ctx", "time_ms", "kv_gbps", "paged_over_contig", "validated"};


typedef struct {
    const char *kernel; /* "decode" | "prefill" */
    kvp_dtype dtype;
    int32_t batch, ctx, new_tokens, hq, hkv, D;
    const int32_t *block_sizes; /* 0-terminated */
    int time_ref;
} bcfg;

typedef struct {
    int threads, reps, quick;
    int lanes[3], nlanes; /* lane settings compared (0: automatic), each layout timed with each */
    double copy_gbps; /* the memcpy row (start of the run) */
    char *ca, *cb;    /* copy buffers, cn bytes each, kept for the copy measured beside every row */
    size_t cn;
    kvp_report *rep;
} bopts;

/* x rounded to 4 significant digits (tables stay readable, tiny values stay non-zero). */
static double sig4(double x)
{
    if (x == 0 || !isfinite(x)) return x;
    double p = pow(10, 3 - (int)floor(log10(fabs(x))));
    return round(x * p) / p;
}

static uint64_t g_rng = 88172645463325252ull;
static float rndf(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) % 2000001) / 1000000.0f - 1.0f;
}

/* The calling OpenMP thread's share [*lo, *hi) of n items (the last thread takes the remainder). */
static void thread_share(size_t n, size_t *lo, size_t *hi)
{
    const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
    *lo = n / nt * t;
    *hi = t == nt - 1 ? n : n / nt * (t + 1);
}

/* Copy bandwidth: every thread memcpy's its share of the n-byte buffer; best of reps; bytes read + written. */
static double copy_gbps(const bopts *o, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = kvp_now_s();
#pragma omp parallel num_threads(o->threads)
        {
            size_t lo, hi;
            thread_share(o->cn, &lo, &hi);
            memcpy(o->cb + lo, o->ca + lo, hi - lo);
        }
        double dt = kvp_now_s() - t0;
        best = dt < best ? dt : best;
    }
    return 2.0 * (double)o->cn / best / 1e9;
}

/* Sequential read bandwidth: every thread sums its share of the copy source with 8 independent vector
 * accumulators (no arithmetic to wait on); best of reps; bytes read. What a kernel that only reads could
 * reach, as a share of the copy figure. */
static double read_gbps_seq(const bopts *o, int reps, double *sink)
{
    typedef uint64_t u64x4 __attribute__((vector_size(32)));
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = kvp_now_s();
        uint64_t total = 0;
#pragma omp parallel num_threads(o->threads) reduction(+ : total)
        {
            size_t lo, hi;
            thread_share(o->cn / sizeof(u64x4), &lo, &hi);
            const u64x4 *p = (const u64x4 *)(const void *)o->ca;
            u64x4 a[8] = {{0}};
            size_t i = lo;
            for (; i + 8 <= hi; i += 8)
                for (int k = 0; k < 8; k++) a[k] += p[i + k];
            for (; i < hi; i++) a[0] += p[i];
            for (int k = 0; k < 8; k++) total += a[k][0] + a[k][1] + a[k][2] + a[k][3];
        }
        double dt = kvp_now_s() - t0;
        best = dt < best ? dt : best;
        *sink += (double)total;
    }
    return (double)o->cn / best / 1e9;
}

/* A cache of batch sequences of ctx tokens: pages in random order (paged) or one block per sequence. */
typedef struct {
    kvp_paged_kv kv;
    int32_t *indptr, *indices, *last;
} bcache;

static void cache_free(bcache *c)
{
    kvp_paged_kv_free_pools(&c->kv);
    kvp_free(c->indptr), kvp_free(c->indices), kvp_free(c->last);
    memset(c, 0, sizeof *c);
}

static kvp_status cache_build(const bcfg *c, int32_t bs, const float *ksrc, const float *vsrc, bcache *out)
{
    memset(out, 0, sizeof *out);
    int32_t pages = (c->ctx + bs - 1) / bs, nblocks = pages * c->batch;
    KVP_TRY(kvp_paged_kv_init(&out->kv, c->dtype, nblocks, c->hkv, bs, c->D));
    if (c->dtype == KVP_DTYPE_FP8_E4M3) out->kv.k_scale = out->kv.v_scale = 1.0f / 64;
    out->indptr = kvp_malloc(sizeof(int32_t) * ((size_t)c->batch + 1));
    out->indices = kvp_malloc(sizeof(int32_t) * (size_t)nblocks);
    out->last = kvp_malloc(sizeof(int32_t) * (size_t)c->batch);
    int64_t *slots = kvp_malloc(sizeof(int64_t) * (size_t)c->ctx);
    kvp_status st = KVP_OK;
    if (!out->indptr || !out->indices || !out->last || !slots) st = KVP_ERR(KVP_ENOMEM, "out of memory (page table)");
    if (st == KVP_OK) st = kvp_paged_kv_alloc_pools(&out->kv);
    if (st != KVP_OK) {
        kvp_free(slots);
        cache_free(out);
        return st;
    }
    for (int32_t i = 0; i < nblocks; i++) out->indices[i] = i;
    if (bs < c->ctx) /* paged: a random permutation, as after many allocations and frees */
        for (int32_t i = nblocks - 1; i > 0; i--) {
            g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
            int32_t j = (int32_t)(g_rng % (uint64_t)(i + 1)), x = out->indices[i];
            out->indices[i] = out->indices[j], out->indices[j] = x;
        }
    for (int32_t s = 0; s <= c->batch; s++) out->indptr[s] = s * pages;
    for (int32_t s = 0; s < c->batch; s++) out->last[s] = c->ctx - (pages - 1) * bs;
    kvp_paged_kv_set_pages(&out->kv, c->batch, out->indptr, out->indices, out->last);
    /* every sequence holds the same source tokens, shifted per sequence so they differ */
    for (int32_t s = 0; s < c->batch && st == KVP_OK; s++) {
        for (int32_t j = 0; j < c->ctx; j++)
            slots[j] = (int64_t)out->indices[out->indptr[s] + j / bs] * bs + j % bs;
        size_t shift = (size_t)(s % 7) * c->hkv * c->D;
        st = kvp_attn_append_kv_cpu(&out->kv, ksrc + shift, vsrc + shift, slots, c->ctx);
    }
    kvp_free(slots);
    if (st != KVP_OK) cache_free(out);
    return st;
}

typedef struct {
    double ms;
    float *out;
} timing;

static kvp_status run_kernel(const bcfg *c, const kvp_paged_kv *kv, const float *q, const int32_t *qo, float *out,
                             const kvp_attn_params *p)
{
    if (strcmp(c->kernel, "decode") == 0) return kvp_attn_decode_cpu(kv, q, out, p);
    return kvp_attn_prefill_cpu(kv, q, qo, out, p);
}

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Plain read of this layout: every K and V byte a decode needs, read in the most sequential order the
 * layout allows (per sequence, page by page, each block's K rows of all heads then its V rows: whole
 * contiguous runs), summed as 64-bit words with no other work, with the line PF_AHEAD bytes further along
 * that order prefetched at each line, on the kernel's threads. It shows what memory gives the layout
 * without any arithmetic: small blocks are short runs at random places, which memory serves more slowly
 * than long sequential runs (the kernel, whose prefetches run several streams at once, can beat it by a
 * little). A partly filled last block is read whole. */
enum { PF_AHEAD = 8192 };

static double read_pass(const bopts *o, const kvp_paged_kv *kv)
{
    const int64_t es = (int64_t)kvp_dtype_size(kv->dtype);
    /* bytes of a block's rows of every head: one contiguous run per pool */
    const int64_t run = ((int64_t)(kv->num_kv_heads - 1) * kv->stride_head +
                         (int64_t)(kv->block_size - 1) * kv->stride_token + kv->head_dim) * es;
    uint64_t total = 0;
#pragma omp parallel for num_threads(o->threads) schedule(dynamic, 1) reduction(+ : total)
    for (int32_t s = 0; s < kv->num_seqs; s++) {
        const int32_t *pages = kv->kv_indices + kv->kv_indptr[s];
        const int64_t nruns = 2 * (int64_t)kvp_paged_kv_num_pages(kv, s); /* run i: page i / 2, pool i % 2 */
#define RUN_BASE(i) ((const char *)((i) % 2 ? kv->v : kv->k) + (int64_t)pages[(i) / 2] * kv->stride_block * es)
        int64_t pi = PF_AHEAD / run, po = PF_AHEAD % run & ~(int64_t)63; /* prefetch cursor */
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (int64_t i = 0; i < nruns; i++) {
            const char *w = RUN_BASE(i);
            for (int64_t l = 0; l < run; l += 64) {
                if (pi < nruns) __builtin_prefetch(RUN_BASE(pi) + po);
                if ((po += 64) >= run) po = 0, pi++;
                uint64_t x[8] = {0};
                memcpy(x, w + l, (size_t)(run - l < 64 ? run - l : 64) & ~(size_t)7);
                a0 += x[0] + x[4], a1 += x[1] + x[5], a2 += x[2] + x[6], a3 += x[3] + x[7];
            }
        }
#undef RUN_BASE
        total += a0 + a1 + a2 + a3;
    }
    return (double)total;
}

static kvp_status add_row(bopts *o, const bcfg *c, const char *layout, int32_t bs, const int *lanes, int reps, double ms,
                          double cpu_ms, double contig_ms, double contig_cpu_ms, double copy_now, double read_ms,
                          int validated)
{
    cJSON *row;
    KVP_TRY(kvp_report_row(o->rep, &row));
    double kv_bytes = 2.0 * c->batch * (double)c->ctx * c->hkv * c->D * (double)kvp_dtype_size(c->dtype);
    /* q.k and p.v: 4 flops per (query row, key, dim); causal prefill sees on average half the new tokens */
    double keys = c->new_tokens == 1 ? c->ctx : (double)c->ctx - c->new_tokens + (c->new_tokens + 1) / 2.0;
    double flops = 4.0 * c->batch * (double)c->new_tokens * c->hq * keys * c->D;
    double gbps = kv_bytes / (ms * 1e-3) / 1e9;
    cJSON_AddStringToObject(row, "kernel", c->kernel);
    cJSON_AddStringToObject(row, "layout", layout);
    cJSON_AddStringToObject(row, "dtype", kvp_dtype_name(c->dtype));
    cJSON_AddNumberToObject(row, "block_size", bs);
    cJSON_AddNumberToObject(row, "batch", c->batch);
    cJSON_AddNumberToObject(row, "ctx", c->ctx);
    cJSON_AddNumberToObject(row, "new_tokens", c->new_tokens);
    cJSON_AddNumberToObject(row, "q_heads", c->hq);
    cJSON_AddNumberToObject(row, "kv_heads", c->hkv);
    cJSON_AddNumberToObject(row, "head_dim", c->D);
    cJSON_AddNumberToObject(row, "threads", strcmp(layout, "dense_ref") == 0 ? 1 : o->threads);
    if (lanes != NULL) { /* of the score and value passes */
        cJSON_AddNumberToObject(row, "score_lanes", lanes[0]);
        cJSON_AddNumberToObject(row, "value_lanes", lanes[1]);
    }
    cJSON_AddNumberToObject(row, "reps", reps);
    cJSON_AddNumberToObject(row, "time_ms", sig4(ms));
    cJSON_AddNumberToObject(row, "cpu_ms", sig4(cpu_ms));
    cJSON_AddNumberToObject(row, "kv_bytes", kv_bytes);
    cJSON_AddNumberToObject(row, "kv_gbps", sig4(gbps));
    cJSON_AddNumberToObject(row, "copy_gbps", sig4(copy_now));
    cJSON_AddNumberToObject(row, "pct_copy_bw", sig4(100 * gbps / copy_now));
    if (read_ms > 0) {
        cJSON_AddNumberToObject(row, "read_gbps", sig4(kv_bytes / (read_ms * 1e-3) / 1e9));
        cJSON_AddNumberToObject(row, "pct_read_bw", sig4(100 * read_ms / ms));
    }
    cJSON_AddNumberToObject(row, "gflops", sig4(flops / (ms * 1e-3) / 1e9));
    if (contig_ms > 0) cJSON_AddNumberToObject(row, "paged_over_contig", sig4(ms / contig_ms));
    if (contig_cpu_ms > 0) cJSON_AddNumberToObject(row, "paged_over_contig_cpu", sig4(cpu_ms / contig_cpu_ms));
    cJSON_AddBoolToObject(row, "validated", validated);
    KVP_LOG_I("%s %s %s bs=%d batch=%d ctx=%d: %.3f ms, %.2f GB/s", c->kernel, layout, kvp_dtype_name(c->dtype), bs,
              c->batch, c->ctx, ms, gbps);
    return KVP_OK;
}

/* Output of the first nseq sequences of the contiguous cache against the dense float64 reference. */
static kvp_status check_ref(const bcfg *c, const bcache *contig, const float *q, const int32_t *qo, const float *out,
                            const kvp_attn_params *p, int nseq, int *ok)
{
    kvp_paged_kv kv = contig->kv;
    kv.num_seqs = nseq;
    size_t tok = (size_t)nseq * c->ctx * c->hkv * c->D;
    size_t nout = (size_t)nseq * c->new_tokens * c->hq * c->D;
    float *k = kvp_malloc(sizeof(float) * tok), *v = kvp_malloc(sizeof(float) * tok);
    float *ref = kvp_malloc(sizeof(float) * nout);
    int32_t *ind = kvp_malloc(sizeof(int32_t) * ((size_t)nseq + 1));
    kvp_status st = (k && v && ref && ind) ? KVP_OK : KVP_ERR(KVP_ENOMEM, "out of memory (reference check)");
    if (st == KVP_OK) {
        for (int s = 0; s <= nseq; s++) ind[s] = s * c->ctx;
        st = kvp_paged_kv_gather(&kv, k, v);
    }
    if (st == KVP_OK) st = kvp_attn_prefill_ref(k, v, ind, nseq, c->hkv, c->D, q, qo, ref, p);
    if (st == KVP_OK) {
        double num = 0, den = 0;
        for (size_t i = 0; i < nout; i++) {
            double d = fabs((double)out[i] - ref[i]);
            num = d > num || d != d ? d : num;
            den = fabs((double)ref[i]) > den ? fabs((double)ref[i]) : den;
        }
        *ok = num / den < 1e-5;
        if (!*ok) KVP_LOG_W("%s %s: output differs from the reference (relative error %g)", c->kernel,
                            kvp_dtype_name(c->dtype), num / den);
    }
    kvp_free(k), kvp_free(v), kvp_free(ref), kvp_free(ind);
    return st;
}

static kvp_status run_config(bopts *o, const bcfg *c)
{
    const size_t row = (size_t)c->hkv * c->D;
    size_t nsrc = (size_t)(c->ctx + 8) * row;
    int32_t nq_total = c->batch * c->new_tokens;
    size_t nout = (size_t)nq_total * c->hq * c->D;
    int nl = 1; /* layouts: contiguous, then one per block size */
    while (c->block_sizes[nl - 1]) nl++;
    const int nk = nl * o->nlanes; /* runs per round: run k = layout k / nlanes with lane setting k % nlanes */
    float *ks = kvp_malloc(sizeof(float) * nsrc), *vs = kvp_malloc(sizeof(float) * nsrc);
    float *q = kvp_malloc(sizeof(float) * nout), *out = kvp_malloc(sizeof(float) * nout);
    float *cout = kvp_malloc(sizeof(float) * nout);
    int32_t *qo = kvp_malloc(sizeof(int32_t) * ((size_t)c->batch + 1));
    bcache *caches = kvp_calloc((size_t)nl, sizeof *caches);
    double *ms = kvp_malloc(sizeof(double) * (size_t)nk * 3), *cms = ms ? ms + nk : NULL, *rms = ms ? ms + 2 * nk : NULL;
    const int rfloor = strcmp(c->kernel, "decode") == 0; /* the plain read: decode reads each row once */
    double sink = 0;
    int *same = kvp_calloc((size_t)nk, sizeof *same);
    kvp_status st = (ks && vs && q && out && cout && qo && caches && ms && same)
                        ? KVP_OK
                        : KVP_ERR(KVP_ENOMEM, "out of memory (bench buffers)");
    if (st != KVP_OK) goto done;
    for (size_t i = 0; i < nsrc; i++) ks[i] = rndf(), vs[i] = rndf();
    for (size_t i = 0; i < nout; i++) q[i] = rndf();
    for (int32_t s = 0; s <= c->batch; s++) qo[s] = s * c->new_tokens;
    kvp_attn_params p = kvp_attn_default_params(c->hq);
    int reps = strcmp(c->kernel, "prefill") == 0 && o->reps > 3 ? 3 : o->reps; /* prefill runs take seconds */

    /* Every layout's cache is built first (layout 0: contiguous, the baseline of every paged row), then
     * each is run once untimed (warm-up, and its output validated), then the timed repetitions are
     * interleaved: round r runs every layout once, followed by one copy-bandwidth measurement. A load swing
     * on the shared machine thus hits every layout alike; each layout reports its minimum over the rounds. */
    for (int l = 0; l < nl && st == KVP_OK; l++) st = cache_build(c, l == 0 ? c->ctx : c->block_sizes[l - 1], ks, vs, &caches[l]);
    if (st != KVP_OK) goto done;
    int ref_ok = 0;
    for (int k = 0; k < nk && st == KVP_OK; k++) {
        const int l = k / o->nlanes;
        kvp_attn_set_lanes(o->lanes[k % o->nlanes]);
        st = run_kernel(c, &caches[l].kv, q, qo, k == 0 ? cout : out, &p);
        if (st != KVP_OK) break;
        if (k == 0) {
            /* reference on the first sequences (one for prefill: the float64 reference is slow) */
            int nref = strcmp(c->kernel, "decode") == 0 ? 2 : 1;
            st = check_ref(c, &caches[0], q, qo, cout, &p, c->batch < nref ? c->batch : nref, &ref_ok);
            same[0] = 1;
            continue;
        }
        /* equal up to rounding: small blocks change the work split (and the split-KV chunks), lane counts
         * the order of the sums */
        double num = 0, den = 0;
        for (size_t e = 0; e < nout; e++) {
            double d = fabs((double)out[e] - cout[e]);
            num = d > num || d != d ? d : num;
            den = fabs((double)cout[e]) > den ? fabs((double)cout[e]) : den;
        }
        same[k] = num <= 1e-5 * den;
        if (!same[k])
            KVP_LOG_W("%s bs=%d lanes=%d: output differs from the contiguous one (relative error %g)", c->kernel,
                      l ? c->block_sizes[l - 1] : c->ctx, o->lanes[k % o->nlanes], num / den);
    }
    if (st != KVP_OK) goto done;
    for (int k = 0; k < nk; k++) ms[k] = cms[k] = rms[k] = 1e30;
    double copy_now = 0;
    for (int r = 0; r < reps && st == KVP_OK; r++) {
        for (int k = 0; k < nk && st == KVP_OK; k++) {
            const int l = k / o->nlanes;
            kvp_attn_set_lanes(o->lanes[k % o->nlanes]);
            double c0 = cpu_s(), t0 = kvp_now_s();
            st = run_kernel(c, &caches[l].kv, q, qo, out, &p);
            double dt = (kvp_now_s() - t0) * 1e3, dc = (cpu_s() - c0) * 1e3;
            ms[k] = dt < ms[k] ? dt : ms[k];
            cms[k] = dc < cms[k] ? dc : cms[k];
            if (rfloor && k % o->nlanes == 0) { /* the plain read, once per layout */
                t0 = kvp_now_s();
                sink += read_pass(o, &caches[l].kv);
                dt = (kvp_now_s() - t0) * 1e3;
                rms[l] = dt < rms[l] ? dt : rms[l];
            }
        }
        double cg = copy_gbps(o, 1); /* the best copy of the rounds: the same load as the kernels saw */
        copy_now = cg > copy_now ? cg : copy_now;
    }
    for (int k = 0; k < nk && st == KVP_OK; k++) {
        const int l = k / o->nlanes, li = k % o->nlanes;
        const int32_t bs = l == 0 ? c->ctx : c->block_sizes[l - 1];
        kvp_attn_set_lanes(o->lanes[li]);
        const kvp_paged_kv shape = {.dtype = c->dtype, .head_dim = c->D, .block_size = bs};
        int lanes[2];
        kvp_attn_lanes_for(&shape, rfloor, &lanes[0], &lanes[1]);
        st = add_row(o, c, l == 0 ? "contiguous" : "paged", bs, lanes, reps, ms[k], cms[k],
                     ms[li], cms[li], copy_now, rfloor ? rms[l] : 0, same[k] && ref_ok);
    }
    if (rfloor) KVP_LOG_D("plain read checksum %g", sink);
    if (st == KVP_OK && c->time_ref) {
        /* the dense float64 reference, one thread, on the gathered f32 K/V (one timed run) */
        size_t tok = (size_t)c->batch * c->ctx * row;
        float *k = kvp_malloc(sizeof(float) * tok), *v = kvp_malloc(sizeof(float) * tok);
        int32_t *ind = kvp_malloc(sizeof(int32_t) * ((size_t)c->batch + 1));
        if (!k || !v || !ind) st = KVP_ERR(KVP_ENOMEM, "out of memory (dense reference)");
        if (st == KVP_OK) {
            for (int32_t s = 0; s <= c->batch; s++) ind[s] = s * c->ctx;
            st = kvp_paged_kv_gather(&caches[0].kv, k, v);
        }
        double t0 = kvp_now_s(), c0 = cpu_s();
        if (st == KVP_OK) st = kvp_attn_prefill_ref(k, v, ind, c->batch, c->hkv, c->D, q, qo, out, &p);
        double tref = (kvp_now_s() - t0) * 1e3, rcms = (cpu_s() - c0) * 1e3;
        kvp_free(k), kvp_free(v), kvp_free(ind);
        if (st == KVP_OK) st = add_row(o, c, "dense_ref", 0, NULL, 1, tref, rcms, ms[0], cms[0], copy_gbps(o, 2), 0, 1);
    }
done:
    for (int l = 0; caches && l < nl; l++) cache_free(&caches[l]);
    kvp_free(caches), kvp_free(ms), kvp_free(same);
    kvp_free(ks), kvp_free(vs), kvp_free(q), kvp_free(out), kvp_free(cout), kvp_free(qo);
    return st;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage bench attention [options]\n\n"
            "Times the CPU paged attention kernels (decode, prefill) over paged pools (block sizes 1..256,\n"
            "random page order) and a contiguous pool (one block per sequence), for f32/f16/bf16/fp8 K/V, with\n"
            "batch and context sweeps, next to the machine's measured copy bandwidth. Each row is validated\n"
            "(paged == contiguous to 1e-5, contiguous vs the float64 reference) before it is timed. The layouts\n"
            "of a configuration are timed interleaved (round r runs each layout once, then a copy) and each\n"
            "reports its minimum over the rounds; paged_over_contig = min paged / min contiguous. Decode\n"
            "rows also give read_gbps, the layout's plain read (its K/V bytes read whole block by block in\n"
            "page order, prefetched ahead, no arithmetic), and pct_read_bw = kv_gbps / read_gbps. The memread\n"
            "row is a sequential read on all threads: the part of the copy figure a read-only kernel could\n"
            "reach.\n\n"
            "options:\n"
            "  --quick            a small sweep (seconds; for smoke tests)\n"
            "  --threads N        threads for the kernels and the copy (default: all CPUs)\n"
            "  --lanes LIST       vector lanes of the score and value passes: auto, 8,\n"
            "                     or 16 (AVX-512), or a list (8,16): every layout is then timed with\n"
            "                     each, interleaved on the same pools, paged_over_contig against the\n"
            "                     contiguous run with the same setting (default auto: prefill 16 where\n"
            "                     the CPU has them; decode scores 8, values 16, f32 decode 8, head_dim 8\n"
            "                     and fp8 decode 16); columns\n"
            "                     score_lanes, value_lanes: what each row used\n"
            "  --reps N           interleaved rounds (timed runs per layout), minimum taken (default 5;\n"
            "                     prefill at most 3)\n"
            "  --case N           run only the N-th configuration of the sweep (1-based)\n"
            "  --format FMT       table | csv | json on stdout (default table, 100 columns wide)\n"
            "  --wide             a table with every column (same as --format wide)\n"
            "  --json             same as --format json\n"
            "  --out-dir DIR      also write DIR/attention.csv and DIR/attention.json (default: results/\n"
            "                     beside the program, build/results; --out is the same option)\n"
            "  --no-write         do not write result files\n"
            "  -h, --help         this help\n");
}

int kvp_bench_attention(int argc, char **argv)
{
    static const struct option opts[] = {{"quick", no_argument, NULL, 'q'},   {"threads", required_argument, NULL, 't'},
                                         {"reps", required_argument, NULL, 'r'}, {"format", required_argument, NULL, 'f'},
                                         {"json", no_argument, NULL, 'j'},      {"out-dir", required_argument, NULL, 'o'},
                                         {"no-write", no_argument, NULL, 'n'},  {"help", no_argument, NULL, 'h'},
                                         {"case", required_argument, NULL, 'c'}, {"lanes", required_argument, NULL, 'l'},
                                         {"wide", no_argument, NULL, 'W'},     {"out", required_argument, NULL, 'o'},
                                         {NULL, 0, NULL, 0}};
    const char *cmd = "bench attention", *out_dir = kvp_bench_default_out();
    bopts o = {.threads = 0, .reps = 5, .lanes = {0}, .nlanes = 1};
    kvp_format fmt = KVP_FMT_TABLE;
    int write = 1, c, only = 0;
    int32_t v32;
    optind = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) switch (c) {
        case 'q': o.quick = 1; break;
        case 't':
            if (kvp_parse_i32(optarg, 1, 1024, &v32) != KVP_OK) return kvp_cli_usage_error(cmd, "--threads: %s", kvp_error_message());
            o.threads = v32;
            break;
        case 'r':
            if (kvp_parse_i32(optarg, 1, 1000, &v32) != KVP_OK) return kvp_cli_usage_error(cmd, "--reps: %s", kvp_error_message());
            o.reps = v32;
            break;
        case 'f':
            if (kvp_format_parse(optarg, &fmt) != KVP_OK) return kvp_cli_usage_error(cmd, "--format: %s", kvp_error_message());
            break;
        case 'j': fmt = KVP_FMT_JSON; break;
        case 'W': fmt = KVP_FMT_WIDE; break;
        case 'c':
            if (kvp_parse_i32(optarg, 1, 1000, &v32) != KVP_OK) return kvp_cli_usage_error(cmd, "--case: %s", kvp_error_message());
            only = v32;
            break;
        case 'l': {
            char buf[64], *save = NULL;
            snprintf(buf, sizeof buf, "%s", optarg);
            o.nlanes = 0;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o.nlanes == 3) return kvp_cli_usage_error(cmd, "--lanes: at most 3 settings");
                if (kvp_attn_lanes_parse(t, &o.lanes[o.nlanes]) != KVP_OK ||
                    kvp_attn_set_lanes(o.lanes[o.nlanes]) != KVP_OK)
                    return kvp_cli_usage_error(cmd, "--lanes: %s", kvp_error_message());
                o.nlanes++;
            }
            if (o.nlanes == 0) return kvp_cli_usage_error(cmd, "--lanes: empty list");
            break;
        }
        case 'o': out_dir = optarg; break;
        case 'n': write = 0; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error(cmd, c, argv);
        }
    if (optind < argc) return kvp_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (write) {
        if (kvp_bench_out_dir("--out-dir", out_dir) != KVP_OK) return kvp_cli_usage_error(cmd, "%s", kvp_error_message());
    }
    kvp_attn_set_threads(o.threads);
    o.threads = kvp_attn_get_threads();
    if (o.quick && o.reps > 2) o.reps = 2;

    kvp_status st = kvp_report_create(k_fields, NFIELDS, &o.rep);
    if (st == KVP_OK) st = kvp_report_set_brief(o.rep, k_brief, (int)(sizeof k_brief / sizeof k_brief[0]));
    if (st != KVP_OK) return kvp_cli_fail(cmd, st);
    const size_t copy_bytes = (size_t)(o.quick ? 64 : 512) << 20;
    o.cn = copy_bytes;
    o.ca = kvp_aligned_alloc(64, copy_bytes);
    o.cb = kvp_aligned_alloc(64, copy_bytes);
    if (!o.ca || !o.cb) st = KVP_ERR(KVP_ENOMEM, "out of memory for the copy-bandwidth buffers (2 x %zu MiB)", copy_bytes >> 20);
    double seq_read = 0, sink = 0;
    if (st == KVP_OK) {
        memset(o.ca, 1, copy_bytes), memset(o.cb, 2, copy_bytes); /* first touch outside the timing */
        for (int r = 0; r < (o.quick ? 1 : 3); r++) { /* interleaved, best of each */
            double c = copy_gbps(&o, 1), rd = read_gbps_seq(&o, 1, &sink);
            o.copy_gbps = c > o.copy_gbps ? c : o.copy_gbps;
            seq_read = rd > seq_read ? rd : seq_read;
        }
        KVP_LOG_D("sequential read checksum %g", sink);
    }
    /* the memcpy row (bytes read + written), then the sequential read row (bytes read) */
    for (int k = 0; k < 2 && st == KVP_OK; k++) {
        cJSON *row;
        st = kvp_report_row(o.rep, &row);
        if (st == KVP_OK) {
            const double bytes = (k ? 1.0 : 2.0) * (double)copy_bytes, gbps = k ? seq_read : o.copy_gbps;
            cJSON_AddStringToObject(row, "kernel", k ? "memread" : "memcpy");
            cJSON_AddStringToObject(row, "layout", o.quick ? "64MiB" : "512MiB");
            cJSON_AddNumberToObject(row, "threads", o.threads);
            cJSON_AddNumberToObject(row, "kv_bytes", bytes);
            cJSON_AddNumberToObject(row, "time_ms", sig4(bytes / gbps / 1e6));
            cJSON_AddNumberToObject(row, "kv_gbps", sig4(gbps));
            cJSON_AddNumberToObject(row, "copy_gbps", sig4(o.copy_gbps));
            cJSON_AddNumberToObject(row, "pct_copy_bw", sig4(100 * gbps / o.copy_gbps));
            cJSON_AddBoolToObject(row, "validated", 1);
        }
    }
    static const int32_t all_bs[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 0};
    static const int32_t main_bs[] = {1, 16, 0};
    static const int32_t bs16[] = {16, 0};
    const bcfg quick[] = {
        {"decode", KVP_DTYPE_F16, 4, 512, 1, 8, 2, 64, main_bs, 1},
        {"prefill", KVP_DTYPE_F16, 2, 256, 64, 8, 2, 64, main_bs, 0},
    };
    const bcfg full[] = {
        /* the target configuration: 32 x 4096, 32/8 heads, head_dim 128, f16, every block size */
        {"decode", KVP_DTYPE_F16, 32, 4096, 1, 32, 8, 128, all_bs, 1},
        {"decode", KVP_DTYPE_BF16, 32, 4096, 1, 32, 8, 128, main_bs, 0},
        {"decode", KVP_DTYPE_F32, 32, 4096, 1, 32, 8, 128, main_bs, 0},
        {"decode", KVP_DTYPE_FP8_E4M3, 32, 4096, 1, 32, 8, 128, main_bs, 0},
        /* batch sweep and context sweep (f16, block 16) */
        {"decode", KVP_DTYPE_F16, 1, 4096, 1, 32, 8, 128, main_bs, 0},
        {"decode", KVP_DTYPE_F16, 8, 4096, 1, 32, 8, 128, main_bs, 0},
        {"decode", KVP_DTYPE_F16, 128, 1024, 1, 32, 8, 128, bs16, 0},
        {"decode", KVP_DTYPE_F16, 32, 512, 1, 32, 8, 128, bs16, 0},
        {"decode", KVP_DTYPE_F16, 4, 32768, 1, 32, 8, 128, main_bs, 0},
        {"decode", KVP_DTYPE_F16, 1, 65536, 1, 32, 8, 128, main_bs, 0},
        /* stories260K's shape (head_dim 8, 8/4 heads, f32): the attention of the batched decode of issue #7 */
        {"decode", KVP_DTYPE_F32, 64, 256, 1, 8, 4, 8, main_bs, 0},
        /* prefill: whole prompts, and a chunk after a cached prefix (chunked prefill) */
        {"prefill", KVP_DTYPE_F16, 4, 1024, 1024, 32, 8, 128, main_bs, 0},
        {"prefill", KVP_DTYPE_F16, 4, 2560, 512, 32, 8, 128, main_bs, 0},
        {"prefill", KVP_DTYPE_BF16, 4, 1024, 1024, 32, 8, 128, bs16, 0},
        {"prefill", KVP_DTYPE_F32, 4, 1024, 1024, 32, 8, 128, bs16, 0},
    };
    const bcfg *cfgs = o.quick ? quick : full;
    int ncfg = o.quick ? (int)(sizeof quick / sizeof quick[0]) : (int)(sizeof full / sizeof full[0]);
    if (only > ncfg) {
        kvp_report_destroy(o.rep);
        return kvp_cli_usage_error(cmd, "--case %d: this sweep has %d configurations", only, ncfg);
    }
    for (int i = 0; i < ncfg && st == KVP_OK; i++) {
        if (only && i + 1 != only) continue;
        fprintf(stderr, "bench attention: %d/%d %s %s batch %d ctx %d\n", i + 1, ncfg, cfgs[i].kernel,
                kvp_dtype_name(cfgs[i].dtype), cfgs[i].batch, cfgs[i].ctx);
        st = run_config(&o, &cfgs[i]);
    }
    if (st == KVP_OK) st = kvp_report_print(o.rep, stdout, fmt);
    if (st == KVP_OK && write) {
        char path[4096];
        snprintf(path, sizeof path, "%s/attention.csv", out_dir);
        st = kvp_report_write_csv(o.rep, path);
        snprintf(path, sizeof path, "%s/attention.json", out_dir);
        if (st == KVP_OK) st = kvp_report_write_json(o.rep, path);
        if (st == KVP_OK) fprintf(stderr, "bench attention: wrote %s/attention.csv and .json\n", out_dir);
    }
    kvp_report_destroy(o.rep);
    kvp_free(o.ca), kvp_free(o.cb);
    return st == KVP_OK ? KVP_EXIT_OK : kvp_cli_fail(cmd, st);
}
