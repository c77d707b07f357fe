/* Paged attention kernels (CPU) against the dense float64 references.
 *
 * Every case builds a random, non-identity page table over a pool with spare blocks, pours NaN into every
 * slot of both pools first, then writes the sequences' K/V through append_kv (with -1 padding tokens that
 * must be skipped). A kernel that reads any slot it should not (spare block, tail of a partly filled last
 * block, another head) produces NaN and fails the comparison.
 *
 * Error measure: err = max|out - ref| / max|ref| over the whole output tensor. Two different questions:
 *  - kernel correctness: against the float64 reference on the values the pool actually holds, read back
 *    with kvp_paged_kv_gather (dequantized, scales applied: the reference sees exactly what the kernel
 *    sees): err < KERNEL_BOUND = 1e-5 for every dtype, fp8-e4m3 included (issue #6 asks < 1e-2 for fp8;
 *    the kernels compute in f32 on exactly those values, so only f32 rounding remains);
 *  - end-to-end quantization error (a property of the storage format, not of the kernel): against the
 *    reference on the original f32 inputs, err < 1e-2 for f16/bf16 and < 6e-2 for fp8-e4m3 (3 mantissa
 *    bits: half an ulp is 6.25 % of an element before averaging). Checked by its own test.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention/attention.h"
#include "common/alloc.h"

typedef struct {
    uint64_t s;
} rng_t;

static uint32_t rnd(rng_t *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint32_t)(r->s >> 11);
}
static float rndf(rng_t *r) { return (float)(rnd(r) % 2000001) / 1000000.0f - 1.0f; } /* [-1, 1] */

typedef struct {
    kvp_paged_kv kv;
    int32_t num_seqs, hkv, D, bs, total;
    int32_t *indptr, *indices, *last, *seq_indptr; /* page table; dense token offsets per sequence */
    float *kd, *vd;                                /* (total, hkv, D) values the pool holds (gathered) */
    float *kq, *vq;                                /* (total, hkv, D) the test's own dequantization */
    float *kraw, *vraw;                            /* (total, hkv, D) original inputs */
} kcase;

static float dequant(float x, kvp_dtype t, float scale)
{
    switch (t) {
    case KVP_DTYPE_F16: return kvp_f16_to_f32(kvp_f32_to_f16(x));
    case KVP_DTYPE_BF16: return kvp_bf16_to_f32(kvp_f32_to_bf16(x));
    case KVP_DTYPE_FP8_E4M3: return kvp_fp8e4m3_to_f32(kvp_f32_to_fp8e4m3(x / scale)) * scale;
    default: return x;
    }
}

/* Builds sequences of the given lengths; spare blocks and unused slots hold NaN. */
static void case_build(kcase *c, kvp_dtype t, int32_t D, int32_t hkv, int32_t bs, int32_t num_seqs,
                       const int32_t *lens, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    rng_t r = {seed * 2654435761u + 1};
    c->num_seqs = num_seqs, c->hkv = hkv, c->D = D, c->bs = bs;
    c->indptr = kvp_calloc((size_t)num_seqs + 1, sizeof(int32_t));
    c->seq_indptr = kvp_calloc((size_t)num_seqs + 1, sizeof(int32_t));
    c->last = kvp_calloc((size_t)num_seqs + 1, sizeof(int32_t));
    for (int32_t s = 0; s < num_seqs; s++) {
        int32_t pages = (lens[s] + bs - 1) / bs;
        c->indptr[s + 1] = c->indptr[s] + pages;
        c->seq_indptr[s + 1] = c->seq_indptr[s] + lens[s];
        c->last[s] = pages ? lens[s] - (pages - 1) * bs : 0;
    }
    c->total = c->seq_indptr[num_seqs];
    int32_t npages = c->indptr[num_seqs], nblocks = npages + 5;
    int32_t *perm = kvp_malloc(sizeof(int32_t) * (size_t)nblocks);
    for (int32_t i = 0; i < nblocks; i++) perm[i] = i;
    for (int32_t i = nblocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(rnd(&r) % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    if (perm[0] == 0) perm[0] = perm[nblocks - 1], perm[nblocks - 1] = 0; /* never the identity */
    c->indices = perm;
    cr_assert_eq(kvp_paged_kv_init(&c->kv, t, nblocks, hkv, bs, D), KVP_OK, "%s", kvp_error_detail());
    if (t == KVP_DTYPE_FP8_E4M3) c->kv.k_scale = 0.01f, c->kv.v_scale = 0.004f;
    cr_assert_eq(kvp_paged_kv_alloc_pools(&c->kv), KVP_OK);
    kvp_paged_kv_set_pages(&c->kv, num_seqs, c->indptr, c->indices, c->last);
    kvp_paged_kv_fill_nan(&c->kv);

    /* tokens in a shuffled order, with -1 padding tokens of garbage between them */
    size_t row = (size_t)hkv * D;
    int32_t ntok = c->total + c->total / 4 + 1;
    float *k = kvp_malloc(sizeof(float) * row * (size_t)ntok), *v = kvp_malloc(sizeof(float) * row * (size_t)ntok);
    int64_t *slots = kvp_malloc(sizeof(int64_t) * (size_t)ntok);
    c->kd = kvp_malloc(sizeof(float) * row * (size_t)(c->total + 1));
    c->vd = kvp_malloc(sizeof(float) * row * (size_t)(c->total + 1));
    c->kq = kvp_malloc(sizeof(float) * row * (size_t)(c->total + 1));
    c->vq = kvp_malloc(sizeof(float) * row * (size_t)(c->total + 1));
    c->kraw = kvp_malloc(sizeof(float) * row * (size_t)(c->total + 1));
    c->vraw = kvp_malloc(sizeof(float) * row * (size_t)(c->total + 1));
    for (int32_t i = 0; i < ntok; i++) {
        slots[i] = -1;
        for (size_t e = 0; e < row; e++) k[i * row + e] = v[i * row + e] = 1e30f;
    }
    int32_t next = 0;
    for (int32_t s = 0; s < num_seqs; s++)
        for (int32_t j = 0; j < lens[s]; j++, next++) {
            int32_t tok = c->seq_indptr[s] + j, at = next + next / 4; /* every 5th input row is padding */
            slots[at] = (int64_t)c->indices[c->indptr[s] + j / bs] * bs + j % bs;
            for (size_t e = 0; e < row; e++) {
                float kx = rndf(&r), vx = rndf(&r);
                k[at * row + e] = c->kraw[tok * row + e] = kx;
                v[at * row + e] = c->vraw[tok * row + e] = vx;
                c->kq[tok * row + e] = dequant(kx, t, c->kv.k_scale);
                c->vq[tok * row + e] = dequant(vx, t, c->kv.v_scale);
            }
        }
    cr_assert_eq(kvp_attn_append_kv_cpu(&c->kv, k, v, slots, ntok), KVP_OK, "%s", kvp_error_detail());
    /* the references read what the pool holds, as the kernel does */
    cr_assert_eq(kvp_paged_kv_gather(&c->kv, c->kd, c->vd), KVP_OK, "%s", kvp_error_detail());
    kvp_free(k);
    kvp_free(v);
    kvp_free(slots);
}

static void case_free(kcase *c)
{
    kvp_paged_kv_free_pools(&c->kv);
    kvp_free(c->indptr);
    kvp_free(c->indices);
    kvp_free(c->last);
    kvp_free(c->seq_indptr);
    kvp_free(c->kd);
    kvp_free(c->vd);
    kvp_free(c->kq);
    kvp_free(c->vq);
    kvp_free(c->kraw);
    kvp_free(c->vraw);
}

static float *randv(size_t n, uint64_t seed)
{
    rng_t r = {seed * 7919u + 3};
    float *x = kvp_malloc(sizeof(float) * (n + 1));
    for (size_t i = 0; i < n; i++) x[i] = rndf(&r) * 2.0f;
    return x;
}

static double rel_err(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)ref[i]);
        if (!(d <= num)) num = d; /* NaN propagates */
        if (fabs((double)ref[i]) > den) den = fabs((double)ref[i]);
    }
    return den > 0 ? num / den : num;
}

static const kvp_dtype k_dtypes[] = {KVP_DTYPE_F32, KVP_DTYPE_F16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3};
static const int32_t k_dims[] = {8, 16, 32, 64, 80, 96, 128, 256};
static const int32_t k_groups[] = {1, 2, 4, 8};
static const int32_t k_block_sizes[] = {1, 5, 16, 32};

/* Kernel vs the float64 reference on the stored (dequantized) values, every dtype. Issue #6 asks < 1e-2
 * for fp8-e4m3; the kernels reach f32 rounding on those values, so the bound is much tighter. */
#define KERNEL_BOUND 1e-5
/* End-to-end quantization error (kernel on the quantized pool vs the reference on the unquantized
 * inputs): storage-format bounds, not kernel bounds. */
static double quant_bound(kvp_dtype t) { return t == KVP_DTYPE_F32 ? 1e-5 : t == KVP_DTYPE_FP8_E4M3 ? 6e-2 : 1e-2; }

/* Decode of every sequence of c (hq query heads, random q from seed) against the float64 reference on the
 * values the pool holds (raw = 0) or on the original unquantized inputs (raw = 1): relative error. */
static double decode_err(const kcase *c, int32_t hq, uint64_t seed, int raw)
{
    size_t nout = (size_t)c->num_seqs * hq * c->D;
    float *q = randv(nout, seed), *out = kvp_malloc(sizeof(float) * nout), *ref = kvp_malloc(sizeof(float) * nout);
    kvp_attn_params p = kvp_attn_default_params(hq);
    cr_assert_eq(kvp_attn_decode_cpu(&c->kv, q, out, &p), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_attn_decode_ref(raw ? c->kraw : c->kd, raw ? c->vraw : c->vd, c->seq_indptr, c->num_seqs, c->hkv,
                                     c->D, q, ref, &p),
                 KVP_OK);
    double e = rel_err(out, ref, nout);
    kvp_free(q), kvp_free(out), kvp_free(ref);
    return e;
}

Test(attention, decode_matches_reference_on_stored_values_every_dtype_head_dim_gqa)
{
    int n = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 8; di++)
            for (int gi = 0; gi < 4; gi++, n++) {
                kvp_dtype t = k_dtypes[ti];
                int32_t D = k_dims[di], G = k_groups[gi], bs = k_block_sizes[n % 4], hkv = 2, hq = hkv * G;
                uint64_t seed = 1000 + (uint64_t)n;
                /* one sequence at the maximum length (full pages), others partly filled, one of length 1 */
                int32_t maxlen = 6 * bs > 96 ? 6 * bs : 96;
                int32_t lens[4] = {maxlen, 1, 1 + (int32_t)(seed * 37 % (uint64_t)maxlen), bs + 1};
                kcase c;
                case_build(&c, t, D, hkv, bs, 4, lens, seed);
                double e = decode_err(&c, hq, seed, 0);
                cr_assert(e < KERNEL_BOUND, "decode %s D=%d G=%d bs=%d seed=%llu: err %g vs the stored values (bound %g)",
                          kvp_dtype_name(t), D, G, bs, (unsigned long long)seed, e, KERNEL_BOUND);
                case_free(&c);
            }
}

Test(attention, fp8_decode_within_1e_2_of_reference_on_dequantized_values)
{
    /* issue #6 as stated: fp8-e4m3 decode vs the float64 reference on the dequantized values the pool
     * holds, relative error < 1e-2 (the kernel actually reaches KERNEL_BOUND; asserted too) */
    const double issue_bound = 1e-2;
    int32_t lens[3] = {700, 33, 1};
    for (int gi = 0; gi < 4; gi++) {
        int32_t G = k_groups[gi], hkv = 2, hq = hkv * G, D = 128;
        kcase c;
        case_build(&c, KVP_DTYPE_FP8_E4M3, D, hkv, 16, 3, lens, 1500 + (uint64_t)gi);
        double e = decode_err(&c, hq, 1500 + (uint64_t)gi, 0);
        cr_assert(e < issue_bound, "fp8 G=%d: err %g >= %g", G, e, issue_bound);
        cr_assert(e < KERNEL_BOUND, "fp8 G=%d: err %g >= %g", G, e, KERNEL_BOUND);
        case_free(&c);
    }
}

/* Every fp8 code through the kernels' vector loads, on 8 and 16 lanes: sequences of one token, whose V row
 * holds 8, 16 or 32 of the 256 codes (head_dim 8: a row pair; 16: one vector; 32: the 32-code load), so the
 * output is that row times v_scale exactly (a power of two), and NaN for S.1111.111. */
Test(attention, fp8_loads_give_every_code_exactly)
{
    const int counts[] = {8, 16}, nl = kvp_cpu_max_lanes() == 16 ? 2 : 1;
    const int32_t dims[] = {8, 16, 32};
    for (int li = 0; li < nl; li++)
        for (int di = 0; di < 3; di++) {
            const int32_t D = dims[di], S = 256 / D;
            kvp_paged_kv kv;
            cr_assert_eq(kvp_paged_kv_init(&kv, KVP_DTYPE_FP8_E4M3, S, 1, 16, D), KVP_OK);
            cr_assert_eq(kvp_paged_kv_alloc_pools(&kv), KVP_OK);
            kv.v_scale = 0.5f;
            int32_t indptr[33], indices[32], last[32];
            for (int32_t s = 0; s < S; s++) {
                indptr[s] = s;
                indices[s] = S - 1 - s; /* not the identity */
                last[s] = 1;
                for (int32_t d = 0; d < D; d++) {
                    ((uint8_t *)kv.k)[kvp_paged_kv_elem_offset(&kv, indices[s], 0, 0) + d] = 0x38; /* 1.0 */
                    ((uint8_t *)kv.v)[kvp_paged_kv_elem_offset(&kv, indices[s], 0, 0) + d] = (uint8_t)(s * D + d);
                }
            }
            indptr[S] = S;
            kvp_paged_kv_set_pages(&kv, S, indptr, indices, last);
            float q[256], out[256];
            for (int i = 0; i < 256; i++) q[i] = 0.25f;
            kvp_attn_params p = kvp_attn_default_params(1);
            cr_assert_eq(kvp_attn_set_lanes(counts[li]), KVP_OK);
            cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_OK, "%s", kvp_error_detail());
            for (int c = 0; c < 256; c++) {
                const float want = kvp_fp8e4m3_to_f32((uint8_t)c) * 0.5f;
                if (isnan(want)) cr_assert(isnan(out[c]), "%d lanes, D=%d: code 0x%02x gave %g", counts[li], D, c, out[c]);
                else cr_assert(out[c] == want, "%d lanes, D=%d: code 0x%02x gave %g, not %g", counts[li], D, c, out[c], want);
            }
            kvp_paged_kv_free_pools(&kv);
        }
    cr_assert_eq(kvp_attn_set_lanes(0), KVP_OK);
}

Test(attention, quantization_error_vs_unquantized_inputs_within_dtype_bound)
{
    /* end to end: the kernel on the quantized pool vs the reference on the original f32 inputs */
    int n = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 8; di++, n++) {
            kvp_dtype t = k_dtypes[ti];
            int32_t D = k_dims[di], G = k_groups[n % 4], bs = k_block_sizes[(n / 4) % 4], hkv = 2, hq = hkv * G;
            uint64_t seed = 1200 + (uint64_t)n;
            int32_t lens[3] = {150, 1, 40};
            kcase c;
            case_build(&c, t, D, hkv, bs, 3, lens, seed);
            double eq = decode_err(&c, hq, seed, 1);
            cr_assert(eq < quant_bound(t), "decode vs unquantized %s D=%d G=%d seed=%llu: err %g (bound %g)",
                      kvp_dtype_name(t), D, G, (unsigned long long)seed, eq, quant_bound(t));
            case_free(&c);
        }
}

/* Lane counts: the automatic choice, and 8 or 16 forced (16 only where the CPU has AVX-512). */
Test(attention, lane_choice_rules_and_errors)
{
    const int max = kvp_cpu_max_lanes();
    cr_assert(max == 8 || max == 16, "max lanes %d", max);
    cr_assert_eq(kvp_attn_set_lanes(12), KVP_EINVAL);
    cr_assert_eq(kvp_attn_set_lanes(-1), KVP_EINVAL);
    cr_assert_eq(kvp_attn_get_lanes(), 0, "a refused count changed the setting");
    kvp_paged_kv kv = {.dtype = KVP_DTYPE_F16, .head_dim = 128, .block_size = 16};
    int sl, vl;
    kvp_attn_lanes_for(&kv, 1, &sl, &vl);
    cr_assert(sl == 8 && vl == max, "automatic decode: scores on 8, values on the widest (%d/%d)", sl, vl);
    kv.dtype = KVP_DTYPE_F32;
    kvp_attn_lanes_for(&kv, 1, &sl, &vl);
    cr_assert(sl == 8 && vl == 8, "automatic f32 decode: 8 lanes (%d/%d)", sl, vl);
    kvp_attn_lanes_for(&kv, 0, &sl, &vl);
    cr_assert(sl == max && vl == max, "automatic f32 prefill: the widest (%d/%d)", sl, vl);
    kv.dtype = KVP_DTYPE_F16;
    kvp_attn_lanes_for(&kv, 0, &sl, &vl);
    cr_assert(sl == max && vl == max, "automatic prefill: the widest (%d/%d)", sl, vl);
    kv.head_dim = 8;
    kv.dtype = KVP_DTYPE_F32;
    for (int decode = 0; decode < 2; decode++) {
        kvp_attn_lanes_for(&kv, decode, &sl, &vl);
        cr_assert(sl == max && vl == max, "head_dim 8 (%s): the widest for both passes (%d/%d)",
                  decode ? "decode" : "prefill", sl, vl);
    }
    kv.dtype = KVP_DTYPE_FP8_E4M3;
    kv.head_dim = 128;
    kvp_attn_lanes_for(&kv, 1, &sl, &vl);
    cr_assert(sl == max && vl == max, "automatic fp8 decode: the widest for both passes (%d/%d)", sl, vl);
    kv.dtype = KVP_DTYPE_F16;
    cr_assert_eq(kvp_attn_set_lanes(8), KVP_OK);
    kvp_attn_lanes_for(&kv, 0, &sl, &vl);
    cr_assert(sl == 8 && vl == 8);
    if (max == 16) {
        cr_assert_eq(kvp_attn_set_lanes(16), KVP_OK);
        kvp_attn_lanes_for(&kv, 1, &sl, &vl);
        cr_assert(sl == 16 && vl == 16, "a forced count applies to decode's both passes too");
    } else {
        cr_assert_eq(kvp_attn_set_lanes(16), KVP_EUNSUPPORTED);
    }
    cr_assert_eq(kvp_attn_set_lanes(0), KVP_OK);
}

/* Decode and prefill with 8 and with 16 lanes forced, every dtype and head_dim (8 puts two rows in a vector,
 * 16 and 80 take the 16-lane passes' half-strip tail), GQA ratios and block sizes rotating, block size 1 included:
 * each against the float64 reference, and the two lane counts against each other. */
Test(attention, both_lane_counts_match_reference_and_each_other)
{
    const int counts[] = {8, 16}, nl = kvp_cpu_max_lanes() == 16 ? 2 : 1;
    if (nl == 1) cr_log_info("this CPU (or build) has no AVX-512 (F, BW, VL): 8 lanes only");
    int n = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 8; di++, n++) {
            kvp_dtype t = k_dtypes[ti];
            int32_t D = k_dims[di], G = k_groups[n % 4], bs = k_block_sizes[(n / 4 + ti) % 4], hkv = 2, hq = hkv * G;
            int32_t lens[3] = {150, 1, 37}, qo[4] = {0, 20, 21, 21 + 37};
            kcase c;
            case_build(&c, t, D, hkv, bs, 3, lens, 2600 + (uint64_t)n);
            size_t nd = (size_t)3 * hq * D, np = (size_t)qo[3] * hq * D;
            float *q = randv(np, 2700 + (uint64_t)n), *ref = kvp_malloc(sizeof(float) * np);
            float *out[2][2] = {{NULL}}; /* [lanes][decode, prefill] */
            kvp_attn_params p = kvp_attn_default_params(hq);
            for (int li = 0; li < nl; li++) {
                cr_assert_eq(kvp_attn_set_lanes(counts[li]), KVP_OK);
                out[li][0] = kvp_malloc(sizeof(float) * nd);
                out[li][1] = kvp_malloc(sizeof(float) * np);
                cr_assert_eq(kvp_attn_decode_cpu(&c.kv, q, out[li][0], &p), KVP_OK, "%s", kvp_error_detail());
                cr_assert_eq(kvp_attn_prefill_cpu(&c.kv, q, qo, out[li][1], &p), KVP_OK, "%s", kvp_error_detail());
                cr_assert_eq(kvp_attn_decode_ref(c.kd, c.vd, c.seq_indptr, 3, hkv, D, q, ref, &p), KVP_OK);
                double e = rel_err(out[li][0], ref, nd);
                cr_assert(e < KERNEL_BOUND, "decode %d lanes %s D=%d G=%d bs=%d: err %g", counts[li], kvp_dtype_name(t),
                          D, G, bs, e);
                cr_assert_eq(kvp_attn_prefill_ref(c.kd, c.vd, c.seq_indptr, 3, hkv, D, q, qo, ref, &p), KVP_OK);
                e = rel_err(out[li][1], ref, np);
                cr_assert(e < KERNEL_BOUND, "prefill %d lanes %s D=%d G=%d bs=%d: err %g", counts[li],
                          kvp_dtype_name(t), D, G, bs, e);
            }
            if (nl == 2) {
                cr_assert(rel_err(out[1][0], out[0][0], nd) < KERNEL_BOUND, "decode: 16 lanes vs 8 disagree");
                cr_assert(rel_err(out[1][1], out[0][1], np) < KERNEL_BOUND, "prefill: 16 lanes vs 8 disagree");
            }
            for (int li = 0; li < nl; li++) kvp_free(out[li][0]), kvp_free(out[li][1]);
            kvp_free(q), kvp_free(ref);
            case_free(&c);
        }
    cr_assert_eq(kvp_attn_set_lanes(0), KVP_OK);
}

/* Prefill with a cached prefix: sequence s has lens[s] tokens of which nq[s] are new. */
/* Prefill over 4 sequences (a whole prompt, chunks, none) against the float64 reference; returns the output. */
static float *check_prefill_capped(kvp_dtype t, int32_t D, int32_t G, int32_t bs, int32_t window, float cap,
                                   uint64_t seed)
{
    int32_t hkv = 2, hq = hkv * G;
    int32_t lens[4] = {45, 33, 9, 70}, nq[4] = {45, 5, 0, 23}; /* a whole prompt, a chunk, none, a chunk */
    int32_t qo[5] = {0};
    for (int s = 0; s < 4; s++) qo[s + 1] = qo[s] + nq[s];
    kcase c;
    case_build(&c, t, D, hkv, bs, 4, lens, seed);
    size_t nout = (size_t)qo[4] * hq * D;
    float *q = randv(nout, seed), *out = kvp_malloc(sizeof(float) * nout), *ref = kvp_malloc(sizeof(float) * nout);
    float *lse = kvp_malloc(sizeof(float) * (size_t)qo[4] * hq), *lse_ref = kvp_malloc(sizeof(float) * (size_t)qo[4] * hq);
    kvp_attn_params p = kvp_attn_default_params(hq);
    p.window_left = window;
    p.logits_soft_cap = cap;
    p.sm_scale = 0.3f;
    p.lse = lse;
    cr_assert_eq(kvp_attn_prefill_cpu(&c.kv, q, qo, out, &p), KVP_OK, "%s", kvp_error_detail());
    p.lse = lse_ref;
    cr_assert_eq(kvp_attn_prefill_ref(c.kd, c.vd, c.seq_indptr, 4, hkv, D, q, qo, ref, &p), KVP_OK);
    double e = rel_err(out, ref, nout), el = rel_err(lse, lse_ref, (size_t)qo[4] * hq);
    cr_assert(e < 1e-5, "prefill %s D=%d G=%d bs=%d window=%d cap=%g seed=%llu: err %g", kvp_dtype_name(t), D, G, bs,
              window, (double)cap, (unsigned long long)seed, e);
    cr_assert(el < 1e-5, "prefill lse %s D=%d G=%d: err %g", kvp_dtype_name(t), D, G, el);
    kvp_free(q), kvp_free(ref), kvp_free(lse), kvp_free(lse_ref);
    case_free(&c);
    return out;
}

static void check_prefill(kvp_dtype t, int32_t D, int32_t G, int32_t bs, int32_t window, uint64_t seed)
{
    kvp_free(check_prefill_capped(t, D, G, bs, window, 0.0f, seed));
}

Test(attention, prefill_matches_reference_causal_over_prefix)
{
    /* every dtype x head_dim (GQA ratio and block size rotating), and every GQA ratio at head_dim 128 */
    int n = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 8; di++, n++)
            check_prefill(k_dtypes[ti], k_dims[di], k_groups[(ti + di) % 4], k_block_sizes[n % 4], -1, 2000 + n);
    for (int gi = 0; gi < 4; gi++) check_prefill(KVP_DTYPE_F16, 128, k_groups[gi], k_block_sizes[gi], -1, 2100 + gi);
}

Test(attention, sliding_window_matches_reference)
{
    int32_t windows[] = {0, 1, 7, 16, 50};
    for (int w = 0; w < 5; w++) check_prefill(KVP_DTYPE_F32, 64, 4, 16, windows[w], 3000 + w);
    check_prefill(KVP_DTYPE_F16, 128, 8, 1, 31, 3100);
    /* head dims 8 and 16 (rows shorter than a cache line: their own score and value loops) */
    for (int w = 0; w < 5; w++) {
        check_prefill(KVP_DTYPE_F32, 8, 2, 5, windows[w], 3050 + w);
        check_prefill(KVP_DTYPE_F16, 16, 4, 16, windows[w], 3060 + w);
    }
    /* decode with a window, split into chunks (bf16 at head_dim 128, f32 at 8) */
    for (int k = 0; k < 2; k++) {
        const int32_t D = k ? 8 : 128;
        int32_t lens[3] = {300, 17, 64};
        kcase c;
        case_build(&c, k ? KVP_DTYPE_F32 : KVP_DTYPE_BF16, D, 2, 16, 3, lens, 3200 + (uint64_t)k);
        size_t nout = (size_t)3 * 8 * D;
        float *q = randv(nout, 5), *out = kvp_malloc(sizeof(float) * nout), *ref = kvp_malloc(sizeof(float) * nout);
        kvp_attn_params p = kvp_attn_default_params(8);
        p.window_left = 40;
        p.kv_chunk_size = 32; /* chunks wholly outside the window must contribute nothing */
        cr_assert_eq(kvp_attn_decode_cpu(&c.kv, q, out, &p), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_attn_decode_ref(c.kd, c.vd, c.seq_indptr, 3, 2, D, q, ref, &p), KVP_OK);
        cr_assert(rel_err(out, ref, nout) < 1e-5, "windowed decode D=%d err %g", D, rel_err(out, ref, nout));
        kvp_free(q), kvp_free(out), kvp_free(ref);
        case_free(&c);
    }
}

Test(attention, logits_soft_cap_matches_reference_and_changes_the_output)
{
    /* every dtype at head_dim 8 and 128, with and without a window; caps the random scores reach */
    const float caps[] = {0.5f, 2.0f, 4.0f};
    for (int ti = 0; ti < 4; ti++)
        for (int k = 0; k < 3; k++) {
            const int32_t D = k == 1 ? 8 : 128, window = k == 2 ? 20 : -1;
            const uint64_t seed = 3300 + (uint64_t)(ti * 3 + k);
            float *plain = check_prefill_capped(k_dtypes[ti], D, 2, 16, window, 0.0f, seed);
            float *capped = check_prefill_capped(k_dtypes[ti], D, 2, 16, window, caps[k], seed);
            const size_t nout = (size_t)(45 + 5 + 23) * 4 * D;
            const double d = rel_err(capped, plain, nout);
            cr_assert(d > 1e-3, "%s D=%d cap %g moved the output by %g", kvp_dtype_name(k_dtypes[ti]),
                      D, (double)caps[k], d);
            kvp_free(plain), kvp_free(capped);
        }
}

Test(attention, chunked_prefill_equals_one_shot)
{
    const int32_t L = 150, D = 64, G = 4, hkv = 2, hq = hkv * G, bs = 16;
    int32_t lens[1] = {L};
    kcase c;
    case_build(&c, KVP_DTYPE_F16, D, hkv, bs, 1, lens, 4000);
    size_t nout = (size_t)L * hq * D;
    float *q = randv(nout, 4001), *one = kvp_malloc(sizeof(float) * nout), *chunked = kvp_malloc(sizeof(float) * nout);
    kvp_attn_params p = kvp_attn_default_params(hq);
    int32_t qo[2] = {0, L};
    cr_assert_eq(kvp_attn_prefill_cpu(&c.kv, q, qo, one, &p), KVP_OK, "%s", kvp_error_detail());
    /* the same prompt in chunks of 40, 1, 64, 45 tokens: the page table grows with each chunk */
    int32_t cuts[] = {0, 40, 41, 105, 150};
    for (int i = 0; i < 4; i++) {
        int32_t len = cuts[i + 1], pages = (len + bs - 1) / bs;
        int32_t indptr[2] = {0, pages}, last[1] = {len - (pages - 1) * bs}, cq[2] = {0, cuts[i + 1] - cuts[i]};
        kvp_paged_kv kv = c.kv;
        kvp_paged_kv_set_pages(&kv, 1, indptr, c.indices, last);
        cr_assert_eq(kvp_attn_prefill_cpu(&kv, q + (size_t)cuts[i] * hq * D, cq, chunked + (size_t)cuts[i] * hq * D, &p),
                     KVP_OK, "%s", kvp_error_detail());
    }
    double e = rel_err(chunked, one, nout);
    cr_assert(e < 1e-6, "chunked vs one-shot prefill: err %g", e);
    kvp_free(q), kvp_free(one), kvp_free(chunked);
    case_free(&c);
}

Test(attention, split_decode_equals_unsplit_any_chunk_and_threads)
{
    int32_t lens[5] = {1000, 1, 257, 64, 700};
    const int32_t D = 128, hkv = 2, G = 4, hq = hkv * G;
    kcase c;
    case_build(&c, KVP_DTYPE_F32, D, hkv, 16, 5, lens, 5000);
    size_t nout = (size_t)5 * hq * D, nl = (size_t)5 * hq;
    float *q = randv(nout, 5001), *base = kvp_malloc(sizeof(float) * nout), *out = kvp_malloc(sizeof(float) * nout);
    float *lse0 = kvp_malloc(sizeof(float) * nl), *lse = kvp_malloc(sizeof(float) * nl);
    kvp_attn_params p = kvp_attn_default_params(hq);
    p.kv_chunk_size = INT32_MAX; /* never split */
    p.lse = lse0;
    kvp_attn_set_threads(1);
    cr_assert_eq(kvp_attn_decode_cpu(&c.kv, q, base, &p), KVP_OK);
    int32_t chunks[] = {1, 3, 16, 100, 256, 999, 0};
    for (int th = 1; th <= 2; th++)
        for (int i = 0; i < 7; i++) {
            kvp_attn_set_threads(th);
            p.kv_chunk_size = chunks[i];
            p.lse = lse;
            cr_assert_eq(kvp_attn_decode_cpu(&c.kv, q, out, &p), KVP_OK);
            double e = rel_err(out, base, nout), el = rel_err(lse, lse0, nl);
            cr_assert(e < 1e-6 && el < 1e-6, "chunk %d threads %d: err %g lse err %g", chunks[i], th, e, el);
        }
    kvp_attn_set_threads(0);
    cr_assert_geq(kvp_attn_get_threads(), 1);
    kvp_free(q), kvp_free(base), kvp_free(out), kvp_free(lse0), kvp_free(lse);
    case_free(&c);
}

Test(attention, one_long_sequence_auto_split_matches_reference)
{
    int32_t lens[1] = {6000};
    kcase c;
    case_build(&c, KVP_DTYPE_F16, 128, 1, 16, 1, lens, 6000); /* MQA: 1 KV head, 8 query heads */
    size_t nout = (size_t)8 * 128;
    float *q = randv(nout, 6001), *out = kvp_malloc(sizeof(float) * nout), *ref = kvp_malloc(sizeof(float) * nout);
    kvp_attn_params p = kvp_attn_default_params(8);
    kvp_attn_set_threads(2);
    cr_assert_eq(kvp_attn_decode_cpu(&c.kv, q, out, &p), KVP_OK);
    kvp_attn_set_threads(0);
    cr_assert_eq(kvp_attn_decode_ref(c.kd, c.vd, c.seq_indptr, 1, 1, 128, q, ref, &p), KVP_OK);
    cr_assert(rel_err(out, ref, nout) < 1e-5, "err %g", rel_err(out, ref, nout));
    kvp_free(q), kvp_free(out), kvp_free(ref);
    case_free(&c);
}

/* Groups that are not a power of two: SmolLM2 has 3 query heads per KV head (9 / 3, 15 / 5), Qwen2.5-0.5B 7
 * (14 / 2); rows then split into multiply-add tiles of 4, 2 and 1. Decode and prefill vs the reference. */
Test(attention, odd_gqa_groups_match_reference)
{
    const int32_t groups[3] = {3, 5, 7}, hkv = 2, D = 64;
    for (int gi = 0; gi < 3; gi++) {
        const int32_t hq = hkv * groups[gi];
        int32_t lens[3] = {77, 16, 3};
        kcase c;
        case_build(&c, KVP_DTYPE_F16, D, hkv, 16, 3, lens, 7300 + (uint64_t)gi);
        double e = decode_err(&c, hq, 7310 + (uint64_t)gi, 0);
        cr_assert(e < KERNEL_BOUND, "decode G=%d: err %g", groups[gi], e);
        int32_t qo[4] = {0, 20, 36, 39}; /* the last 20, all 16 and all 3 tokens are new */
        size_t nout = (size_t)39 * hq * D;
        float *q = randv(nout, 7320 + (uint64_t)gi), *out = kvp_malloc(sizeof(float) * nout),
              *ref = kvp_malloc(sizeof(float) * nout);
        kvp_attn_params p = kvp_attn_default_params(hq);
        cr_assert_eq(kvp_attn_prefill_cpu(&c.kv, q, qo, out, &p), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_attn_prefill_ref(c.kd, c.vd, c.seq_indptr, 3, hkv, D, q, qo, ref, &p), KVP_OK);
        cr_assert(rel_err(out, ref, nout) < 1e-5, "prefill G=%d: err %g", groups[gi], rel_err(out, ref, nout));
        kvp_free(q), kvp_free(out), kvp_free(ref);
        case_free(&c);
    }
}

Test(attention, large_group_mqa_and_single_thread)
{
    /* 48 query heads on one KV head: more rows than one work item holds */
    int32_t lens[2] = {90, 45};
    kcase c;
    case_build(&c, KVP_DTYPE_BF16, 64, 1, 8, 2, lens, 7000);
    int32_t qo[3] = {0, 3, 4};
    size_t nout = (size_t)4 * 48 * 64;
    float *q = randv(nout, 7001), *out = kvp_malloc(sizeof(float) * nout), *ref = kvp_malloc(sizeof(float) * nout);
    kvp_attn_params p = kvp_attn_default_params(48);
    kvp_attn_set_threads(1);
    cr_assert_eq(kvp_attn_prefill_cpu(&c.kv, q, qo, out, &p), KVP_OK, "%s", kvp_error_detail());
    kvp_attn_set_threads(0);
    cr_assert_eq(kvp_attn_prefill_ref(c.kd, c.vd, c.seq_indptr, 2, 1, 64, q, qo, ref, &p), KVP_OK);
    cr_assert(rel_err(out, ref, nout) < 1e-5, "err %g", rel_err(out, ref, nout));
    kvp_free(q), kvp_free(out), kvp_free(ref);
    case_free(&c);
}

/* Scores from corrupt weights: a query scaled by 1e30 (softmax exactly one-hot: the other keys' 2^x fall
 * below 2^-126) matches the float64 reference; NaN and infinite queries in another sequence stay in their rows
 * (the sanitizer build checks that exp2 never converts a NaN or huge exponent to an integer). */
Test(attention, extreme_and_nan_scores_stay_in_their_rows)
{
    const int32_t dims[2] = {8, 128}, hkv = 2, hq = 4;
    for (int di = 0; di < 2; di++) {
        const int32_t D = dims[di];
        int32_t lens[3] = {40, 33, 20};
        kcase c;
        case_build(&c, KVP_DTYPE_F32, D, hkv, 16, 3, lens, 7100 + (uint64_t)di);
        const size_t per_seq = (size_t)hq * D, nout = 3 * per_seq;
        float *q = randv(nout, 7200), *out = kvp_malloc(sizeof(float) * nout), *ref = kvp_malloc(sizeof(float) * nout);
        for (size_t i = 0; i < per_seq; i++) q[i] *= 1e30f;
        q[per_seq] = NAN;                       /* sequence 1, head 0 */
        q[per_seq + (size_t)D] = INFINITY;      /* head 1 */
        q[per_seq + 2 * (size_t)D] = -1e38f;    /* head 2: scores overflow to -inf */
        q[per_seq + 2 * (size_t)D + 1] = 1e38f; /* and +inf */
        kvp_attn_params p = kvp_attn_default_params(hq);
        cr_assert_eq(kvp_attn_decode_cpu(&c.kv, q, out, &p), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_attn_decode_ref(c.kd, c.vd, c.seq_indptr, 3, hkv, D, q, ref, &p), KVP_OK);
        cr_assert(rel_err(out, ref, per_seq) < 1e-5, "D=%d, query x 1e30: err %g", D, rel_err(out, ref, per_seq));
        cr_assert(rel_err(out + 2 * per_seq, ref + 2 * per_seq, per_seq) < 1e-5, "D=%d: a NaN query elsewhere changed "
                  "sequence 2: err %g", D, rel_err(out + 2 * per_seq, ref + 2 * per_seq, per_seq));
        kvp_free(q), kvp_free(out), kvp_free(ref);
        case_free(&c);
    }
}

Test(attention, unsupported_head_dims_and_dtypes_rejected)
{
    kvp_paged_kv kv;
    int32_t bad[] = {4, 12, 48, 100, 112, 160, 192, 512};
    for (int i = 0; i < 8; i++) {
        cr_assert(!kvp_attn_supported(KVP_DTYPE_F16, bad[i]));
        cr_assert_eq(kvp_paged_kv_init(&kv, KVP_DTYPE_F16, 4, 1, 16, bad[i]), KVP_EUNSUPPORTED, "head_dim %d", bad[i]);
    }
    for (int i = 0; i < 8; i++)
        for (int t = 0; t < 4; t++) cr_assert(kvp_attn_supported((kvp_dtype)t, k_dims[i]));
    cr_assert_eq(kvp_paged_kv_init(&kv, (kvp_dtype)9, 4, 1, 16, 64), KVP_EINVAL);
    /* a hand-made descriptor with an unsupported head_dim reaches the kernel: rejected, out untouched */
    cr_assert_eq(kvp_paged_kv_init(&kv, KVP_DTYPE_F32, 4, 1, 16, 64), KVP_OK);
    kv.head_dim = 100;
    kv.stride_token = 100, kv.stride_head = 1600, kv.stride_block = 1600;
    cr_assert_eq(kvp_paged_kv_alloc_pools(&kv), KVP_OK);
    int32_t indptr[2] = {0, 1}, idx[1] = {2}, last[1] = {3};
    kvp_paged_kv_set_pages(&kv, 1, indptr, idx, last);
    float q[100] = {0}, out[100];
    for (int i = 0; i < 100; i++) out[i] = 42.0f;
    kvp_attn_params p = kvp_attn_default_params(1);
    cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_EUNSUPPORTED);
    cr_assert(strstr(kvp_error_message(), "head_dim 100") != NULL, "%s", kvp_error_message());
    int32_t qo[2] = {0, 1};
    cr_assert_eq(kvp_attn_prefill_cpu(&kv, q, qo, out, &p), KVP_EUNSUPPORTED);
    for (int i = 0; i < 100; i++) cr_assert_eq(out[i], 42.0f);
    kvp_paged_kv_free_pools(&kv);
}

Test(attention, bad_inputs_rejected_and_outputs_unchanged)
{
    int32_t lens[2] = {20, 7};
    kcase c;
    case_build(&c, KVP_DTYPE_F32, 32, 2, 4, 2, lens, 8000);
    size_t nout = (size_t)2 * 4 * 32;
    float *q = randv(nout, 1), *out = kvp_malloc(sizeof(float) * nout);
    for (size_t i = 0; i < nout; i++) out[i] = 7.0f;
    kvp_attn_params p = kvp_attn_default_params(4);
    kvp_paged_kv kv = c.kv;
    int32_t idx[16];
    memcpy(idx, c.indices, sizeof(int32_t) * (size_t)c.indptr[2]);
    kv.kv_indices = idx;
    idx[3] = kv.num_blocks; /* block id out of range */
    cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "kv_indices[3]") != NULL, "%s", kvp_error_message());
    idx[3] = -1;
    cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_EINVAL);
    kv.kv_indices = c.indices;
    int32_t last[2] = {5, 3}; /* > block_size */
    kv.kv_last_page_len = last;
    cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_EINVAL);
    kv.kv_last_page_len = c.last;
    p.num_q_heads = 3; /* not a multiple of 2 KV heads */
    cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_EINVAL);
    p.num_q_heads = 4;
    p.window_left = -2;
    cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_EINVAL);
    p.window_left = -1;
    p.logits_soft_cap = -1.0f;
    cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_EINVAL);
    p.logits_soft_cap = INFINITY;
    cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "logits_soft_cap") != NULL, "%s", kvp_error_message());
    p.logits_soft_cap = 0.0f;
    p.sm_scale = -1.0f;
    cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_EINVAL);
    p.sm_scale = 0.0f;
    int32_t qo[3] = {0, 21, 22}; /* 21 new tokens in a sequence of 20 */
    cr_assert_eq(kvp_attn_prefill_cpu(&kv, q, qo, out, &p), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "append") != NULL, "%s", kvp_error_message());
    int32_t qo2[3] = {1, 2, 3};
    cr_assert_eq(kvp_attn_prefill_cpu(&kv, q, qo2, out, &p), KVP_EINVAL);
    int32_t indptr[3] = {0, 5, 5}, last2[2] = {4, 0}; /* an empty sequence cannot decode */
    kvp_paged_kv_set_pages(&kv, 2, indptr, c.indices, last2);
    cr_assert_eq(kvp_attn_decode_cpu(&kv, q, out, &p), KVP_EINVAL);
    for (size_t i = 0; i < nout; i++) cr_assert_eq(out[i], 7.0f, "output changed by a failed call");
    kvp_free(q), kvp_free(out);
    case_free(&c);
}

Test(attention, allocation_failure_leaves_output_unchanged)
{
    int32_t lens[2] = {40, 9};
    kcase c;
    case_build(&c, KVP_DTYPE_F16, 64, 2, 8, 2, lens, 9000);
    size_t nout = (size_t)2 * 4 * 64;
    float *q = randv(nout, 2), *out = kvp_malloc(sizeof(float) * nout), *good = kvp_malloc(sizeof(float) * nout);
    kvp_attn_params p = kvp_attn_default_params(4);
    p.kv_chunk_size = 8;
    cr_assert_eq(kvp_attn_decode_cpu(&c.kv, q, good, &p), KVP_OK);
    int failed = 0;
    for (int64_t n = 1;; n++) {
        for (size_t i = 0; i < nout; i++) out[i] = -3.0f;
        kvp_alloc_fail_at(n);
        kvp_status st = kvp_attn_decode_cpu(&c.kv, q, out, &p);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (made < n) {
            cr_assert_eq(st, KVP_OK);
            cr_assert_eq(memcmp(out, good, sizeof(float) * nout), 0);
            break;
        }
        cr_assert_eq(st, KVP_ENOMEM, "allocation %lld failed but status %d", (long long)n, st);
        for (size_t i = 0; i < nout; i++) cr_assert_eq(out[i], -3.0f);
        failed++;
    }
    cr_assert_geq(failed, 1);
    kvp_free(q), kvp_free(out), kvp_free(good);
    case_free(&c);
}

Test(attention, append_cpu_matches_ref_and_rejects_bad_slots)
{
    for (int ti = 0; ti < 4; ti++) {
        kvp_paged_kv a, b;
        cr_assert_eq(kvp_paged_kv_init(&a, k_dtypes[ti], 6, 3, 4, 32), KVP_OK);
        a.k_scale = 0.05f, a.v_scale = 0.02f;
        b = a;
        cr_assert_eq(kvp_paged_kv_alloc_pools(&a), KVP_OK);
        cr_assert_eq(kvp_paged_kv_alloc_pools(&b), KVP_OK);
        size_t bytes = kvp_paged_kv_pool_bytes(&a);
        memset(a.k, 0x55, bytes), memset(a.v, 0x55, bytes), memset(b.k, 0x55, bytes), memset(b.v, 0x55, bytes);
        int64_t slots[7] = {23, -1, 0, 5, 17, -1, 11};
        float *k = randv(7 * 3 * 32, 11), *v = randv(7 * 3 * 32, 12);
        k[5] = 1e6f; /* saturates in fp8, infinity in f16 */
        cr_assert_eq(kvp_attn_append_kv_cpu(&a, k, v, slots, 7), KVP_OK);
        cr_assert_eq(kvp_attn_append_kv_ref(&b, k, v, slots, 7), KVP_OK);
        cr_assert_eq(memcmp(a.k, b.k, bytes), 0, "dtype %s", kvp_dtype_name(k_dtypes[ti]));
        cr_assert_eq(memcmp(a.v, b.v, bytes), 0, "dtype %s", kvp_dtype_name(k_dtypes[ti]));
        slots[3] = 24; /* 6 blocks * 4 slots */
        cr_assert_eq(kvp_attn_append_kv_cpu(&a, v, k, slots, 7), KVP_EINVAL);
        slots[3] = -2;
        cr_assert_eq(kvp_attn_append_kv_cpu(&a, v, k, slots, 7), KVP_EINVAL);
        cr_assert_eq(memcmp(a.k, b.k, bytes), 0, "pool changed by a failed append");
        kvp_free(k), kvp_free(v);
        kvp_paged_kv_free_pools(&a);
        kvp_paged_kv_free_pools(&b);
    }
}

Test(attention, copy_blocks_and_swap_round_trip_exactly)
{
    for (int ti = 0; ti < 4; ti++) {
        int32_t lens[2] = {40, 21};
        kcase c;
        case_build(&c, k_dtypes[ti], 64, 2, 8, 2, lens, 10000 + ti);
        size_t blk = (size_t)c.kv.stride_block * kvp_dtype_size(c.kv.dtype);
        /* CoW: copy the last block of sequence 1 into a spare block */
        int32_t src = c.indices[c.indptr[2] - 1], dst = c.indices[c.indptr[2]]; /* indices past the table are spare */
        int32_t pairs[2] = {src, dst};
        cr_assert_eq(kvp_attn_copy_blocks_cpu(&c.kv, pairs, 1), KVP_OK);
        cr_assert_eq(memcmp((char *)c.kv.k + dst * blk, (char *)c.kv.k + src * blk, blk), 0);
        cr_assert_eq(memcmp((char *)c.kv.v + dst * blk, (char *)c.kv.v + src * blk, blk), 0);
        int32_t badp[2] = {src, c.kv.num_blocks};
        cr_assert_eq(kvp_attn_copy_blocks_cpu(&c.kv, badp, 1), KVP_EINVAL);
        /* swap every used block out to a host pool (in reverse), back into a fresh device pool, compare */
        kvp_paged_kv host, dev2;
        cr_assert_eq(kvp_paged_kv_init(&host, c.kv.dtype, c.kv.num_blocks + 3, 2, 8, 64), KVP_OK);
        cr_assert_eq(kvp_paged_kv_alloc_pools(&host), KVP_OK);
        dev2 = c.kv;
        cr_assert_eq(kvp_paged_kv_alloc_pools(&dev2), KVP_OK);
        int32_t np = c.indptr[2], out_pairs[64], in_pairs[64];
        for (int32_t i = 0; i < np; i++) {
            out_pairs[2 * i] = c.indices[i], out_pairs[2 * i + 1] = host.num_blocks - 1 - i;
            in_pairs[2 * i] = host.num_blocks - 1 - i, in_pairs[2 * i + 1] = c.indices[i];
        }
        cr_assert_eq(kvp_attn_swap_blocks_cpu(&host, &c.kv, out_pairs, np), KVP_OK);
        cr_assert_eq(kvp_attn_swap_blocks_cpu(&dev2, &host, in_pairs, np), KVP_OK);
        for (int32_t i = 0; i < np; i++) {
            size_t o = (size_t)c.indices[i] * blk;
            cr_assert_eq(memcmp((char *)dev2.k + o, (char *)c.kv.k + o, blk), 0, "K block %d", c.indices[i]);
            cr_assert_eq(memcmp((char *)dev2.v + o, (char *)c.kv.v + o, blk), 0, "V block %d", c.indices[i]);
        }
        kvp_paged_kv other;
        cr_assert_eq(kvp_paged_kv_init(&other, c.kv.dtype, 4, 2, 16, 64), KVP_OK);
        other.k = other.v = host.k;
        cr_assert_eq(kvp_attn_swap_blocks_cpu(&other, &c.kv, out_pairs, 1), KVP_EINVAL, "block sizes differ");
        /* the swapped-back pool answers attention exactly like the original */
        size_t nout = (size_t)2 * 4 * 64;
        float *q = randv(nout, 3), *o1 = kvp_malloc(sizeof(float) * nout), *o2 = kvp_malloc(sizeof(float) * nout);
        kvp_attn_params p = kvp_attn_default_params(4);
        cr_assert_eq(kvp_attn_decode_cpu(&c.kv, q, o1, &p), KVP_OK);
        cr_assert_eq(kvp_attn_decode_cpu(&dev2, q, o2, &p), KVP_OK);
        cr_assert_eq(memcmp(o1, o2, sizeof(float) * nout), 0);
        kvp_free(q), kvp_free(o1), kvp_free(o2);
        kvp_paged_kv_free_pools(&host);
        kvp_paged_kv_free_pools(&dev2);
        case_free(&c);
    }
}

Test(attention, gather_returns_the_stored_values)
{
    int32_t lens[3] = {13, 1, 32};
    kcase c;
    case_build(&c, KVP_DTYPE_FP8_E4M3, 16, 2, 8, 3, lens, 11000);
    size_t n = (size_t)c.total * 2 * 16;
    float *k = kvp_malloc(sizeof(float) * n), *v = kvp_malloc(sizeof(float) * n);
    cr_assert_eq(kvp_paged_kv_gather(&c.kv, k, v), KVP_OK);
    cr_assert_eq(memcmp(k, c.kq, sizeof(float) * n), 0);
    cr_assert_eq(memcmp(v, c.vq, sizeof(float) * n), 0);
    kvp_free(k), kvp_free(v);
    case_free(&c);
}
