/* attention/attn_cpu.c — paged decode and prefill on the CPU (OpenMP threads, 8-lane vector inner loops; the
 * score and value passes also on 16 lanes where the CPU has AVX-512F, see kvp_attn_lanes_for).
 *
 * Work split: one item = (sequence, KV head, tile of query tokens, group of query heads, KV chunk).
 * Its rows are the (query token, query head) pairs sharing one KV head (GQA: each K/V row is loaded and
 * converted once for all of them). An item walks its KV range in tiles (16 tokens for rows of 256 bytes
 * and more, 256 for rows shorter than a line, else 32), and each tile one KV head at a time (a unit: that
 * head's K and V rows of the tile, 8 KiB at head_dim 128 in f16, stay in L1 from the score pass to the
 * values pass; the next unit's rows are prefetched meanwhile, and both fit in L1):
 *
 *     offsets of the tile's K/V rows (page table walk, once per tile)
 *     for each head:  S[row][i] = q_row . k_i (log2 units)  ->  online softmax per row (running max m,
 *                     sum l)  ->  acc[row] += p[row][i] * v_i
 *
 * When a sequence's KV range is split into chunks (flash-decoding), each chunk writes a normalized partial
 * output and its log-sum-exp; a merge pass combines them: out = sum_c 2^(lse_c - M) o_c / sum_c 2^(lse_c - M).
 * Everything is specialized at compile time on (dtype, head_dim) and dispatched through one table.
 */
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/attn_simd.h"
#include "common/alloc.h"
#include "common/cpu.h"

enum { TILE = 256, MAXROWS = 32, MAXD = 256 }; /* TILE: the longest tile (and the stride of S) */

#define NUM_HEAD_DIMS KVP_NUM_HEAD_DIMS /* the dispatch tables' second index: kvp_paged_kv_head_dim_index */

static atomic_int g_threads;

void kvp_attn_set_threads(int n) { atomic_store(&g_threads, n < 0 ? 0 : n); }

int kvp_attn_get_threads(void)
{
    int n = atomic_load(&g_threads);
    return n > 0 ? n : omp_get_num_procs();
}

static atomic_int g_lanes; /* 0: automatic */

kvp_status kvp_attn_set_lanes(int lanes)
{
    if (lanes != 0 && lanes != 8 && lanes != 16)
        return KVP_ERR(KVP_EINVAL, "attention lanes must be 0 (automatic), 8 or 16, not %d", lanes);
    if (lanes > kvp_cpu_max_lanes())
        return KVP_ERR(KVP_EUNSUPPORTED,
                       "16-lane attention needs AVX-512 (F, BW and VL), which this CPU (or build) lacks");
    atomic_store(&g_lanes, lanes);
    return KVP_OK;
}

int kvp_attn_get_lanes(void) { return atomic_load(&g_lanes); }

void kvp_attn_lanes_for(const kvp_paged_kv *kv, int decode, int *score_lanes, int *value_lanes)
{
    const int set = atomic_load(&g_lanes), wide = kv != NULL ? kvp_cpu_max_lanes() : 8;
    /* Automatic: prefill reuses each K row for many query rows and is bound by arithmetic, 16 lanes
     * measured 1.39-1.48x (4 x 1024 tokens, head_dim 128, 2 threads). Decode is mostly bound by memory:
     * there the 16-lane score pass measured up to 17 % slower than the 8-lane one when the memory bus was
     * busy (32 x 4096 tokens, f16), while with 16-lane values only it stayed within 6 % of all-8 there and
     * gained 14 % when the bus was not busy (and 9-21 % on decodes whose K/V mostly fit in cache), so decode
     * takes 8-lane scores and 16-lane values; with f32 rows (twice the bytes per multiply-add) the 16-lane
     * values measured 2-3 % slower, so f32 decode stays on 8. */
    const int f32_decode = decode && kv != NULL && kv->dtype == KVP_DTYPE_F32;
    /* head_dim 8 (two rows per 16-lane vector) is bound by arithmetic and shuffles, never by memory: 16 lanes
     * for both passes (measured 7 % faster, 64 sequences x 200 tokens, f32, one thread). So is fp8, by its
     * conversion (shifts, a multiply, a NaN test per element): 16-lane scores measured 1.17-1.37x faster
     * (8 x 4096 tokens, head_dim 64, 128 and 256, 2 threads). */
    const int d8 = kv != NULL && kv->head_dim == 8, fp8 = kv != NULL && kv->dtype == KVP_DTYPE_FP8_E4M3;
    *score_lanes = set == 16 ? wide : set == 8 || (decode && !d8 && !fp8) ? 8 : wide;
    *value_lanes = set == 16 ? wide : set == 8 || (f32_decode && !d8) ? 8 : wide;
}

kvp_status kvp_attn_lanes_parse(const char *s, int *lanes)
{
    if (s != NULL && strcmp(s, "auto") == 0) return *lanes = 0, KVP_OK;
    if (s != NULL && strcmp(s, "8") == 0) return *lanes = 8, KVP_OK;
    if (s != NULL && strcmp(s, "16") == 0) return *lanes = 16, KVP_OK;
    return KVP_ERR(KVP_EINVAL, "'%s' is not a lane count (auto, 8 or 16)", s ? s : "(null)");
}

kvp_attn_params kvp_attn_default_params(int32_t num_q_heads)
{
    kvp_attn_params p = {.num_q_heads = num_q_heads, .sm_scale = 0.0f, .window_left = -1, .logits_soft_cap = 0.0f,
                         .kv_chunk_size = 0, .lse = NULL};
    return p;
}

static int head_dim_index(int32_t head_dim) { return kvp_paged_kv_head_dim_index(head_dim); }

/* One work item. part < 0: rows are written straight to out; else partial results go to rows
 * part .. part + rows-1 of the workspace (chunk c of a split at part_base + c * rows). */
typedef struct {
    int32_t seq, kvh, nh, q0, nq, g0, ng, c0, c1; /* KV heads kvh .. kvh+nh-1 */
    int64_t part;
} item_t;

/* A split row group: nchunks partial results to merge into rows of out. */
typedef struct {
    int32_t seq, kvh, nh, q0, nq, g0, ng, nchunks;
    int64_t part;
} merge_t;

/* Rows to fetch while a unit is computed: token element offsets off[0..n) plus shift, relative to the
 * unit's head base (off NULL: none). */
typedef struct {
    const int64_t *off;
    int64_t shift;
    int n;
} pf_t;

/* The 16-lane score and value passes of one dtype and head_dim (row blocks of RB = 1, 2 or 4 rows). */
typedef void (*scores16_fn)(const float *qs, const void *kbase, const int64_t *off, int n, float *S, int RB,
                            int dense, const pf_t *pf);
typedef void (*tile_exp16_fn)(float *S, int nr, int n, const float *m_old, float *mn, float *sum);
typedef void (*values16_fn)(float *acc, const float *P, const void *vbase, const int64_t *off, int n, int RB,
                            int dense, const pf_t *pf);

KVP_INLINE int64_t elem_bytes(const kvp_dtype T) { return T == KVP_DTYPE_F32 ? 4 : T == KVP_DTYPE_FP8_E4M3 ? 1 : 2; }

typedef struct {
    const kvp_paged_kv *kv;
    const float *q;
    float *out;
    const int32_t *qo_indptr; /* NULL: decode (one token per sequence) */
    int32_t hq, group, window_left;
    float qscale; /* sm_scale * log2(e) * k_scale: scores come out in log2 units (fp8: x KVP_FP8_LOAD_SCALE) */
    float softcap; /* logits_soft_cap * log2(e), the cap in those units (0: off) */
    float oscale; /* v_scale (fp8: x KVP_FP8_LOAD_SCALE) */
    float *lse;   /* optional user output */
    float *part_o, *part_lse;
    scores16_fn scores16; /* NULL: the 8-lane passes (inlined) */
    values16_fn values16;
    tile_exp16_fn tile_exp16; /* NULL: tile_exp8 */
} job_t;

static inline int64_t q_row(const job_t *j, int32_t seq, int32_t tok)
{
    return (j->qo_indptr ? (int64_t)j->qo_indptr[seq] : (int64_t)seq) + tok;
}

static inline int32_t num_q(const job_t *j, int32_t seq)
{
    return j->qo_indptr ? j->qo_indptr[seq + 1] - j->qo_indptr[seq] : 1;
}

/* head_dim 8: a key row is one vector, so a per-key horizontal sum would cost more than the dot product.
 * Eight keys at a time: eight products per row, then one transposing sum gives their eight scores. */
KVP_INLINE void scores8_rb(const float *qs, const void *kbase, const int64_t *off, int n, float *S, const int RB,
                           const kvp_dtype T)
{
    kvp_v8 q[4];
    for (int r = 0; r < RB; r++) q[r] = v8_loadf(qs + r * 8);
    for (int i0 = 0; i0 < n; i0 += 8) {
        const int cnt = n - i0 < 8 ? n - i0 : 8;
        kvp_v8 k[8], p[8];
        if (cnt == 8) /* every step but a tile's last: no per-key test */
            for (int t = 0; t < 8; t++) k[t] = v8_load_elem(kbase, off[i0 + t], T);
        else
            for (int t = 0; t < 8; t++) k[t] = t < cnt ? v8_load_elem(kbase, off[i0 + t], T) : v8_zero();
        for (int r = 0; r < RB; r++) {
            for (int t = 0; t < 8; t++) p[t] = v8_mul(q[r], k[t]);
            v8_storef(S + r * TILE + i0, v8_hsum8(p)); /* lanes past n: overwritten by the mask */
        }
    }
}

/* Prefetches every 64-byte line of the rows of tokens i0 .. i1-1 of pf (NULL: nothing). Rows shorter than a
 * line are left to prefetch_short_rows (one prefetch per row here cost ~20 % of such a decode). */
KVP_INLINE void prefetch_span(const void *base, const pf_t *pf, int i0, int i1, const int64_t es, const int64_t row_bytes)
{
    if (pf == NULL || pf->off == NULL || row_bytes < 64) return;
    const int e = i1 < pf->n ? i1 : pf->n;
    for (int t = i0; t < e; t++)
        for (int64_t b = 0; b < row_bytes; b += 64) KVP_PREFETCH((const char *)base + (pf->off[t] + pf->shift) * es + b);
}

/* Rows shorter than a line (head_dim 8 in f32, 16 in f16) of tokens 0 .. n-1 at element offsets off from
 * base, the first at slot `slot` of its block: every line of each run of the tokens within one block (its
 * rows are contiguous). Issued one unit ahead (the next head of the tile, or the first of the next tile or
 * item), before the unit's score pass (K) and its values pass (V): with tiles of 256 such rows a unit
 * computes long enough to hide the misses. */
KVP_INLINE void prefetch_short_rows(const void *base, const int64_t *off, int n, int32_t slot, int32_t bs,
                                    const int64_t st, const int64_t es)
{
    for (int t = 0; t < n; slot = 0) {
        const int run = bs - slot < n - t ? bs - slot : n - t;
        const char *a = (const char *)base + off[t] * es, *end = a + ((run - 1) * st + st) * es;
        for (a = (const char *)((uintptr_t)a & ~(uintptr_t)63); a < end; a += 64) KVP_PREFETCH(a);
        t += run;
    }
}

/* S[r][i] = qs[r] . k_i for RB rows, KB = 8 / RB keys per step: each q chunk loaded once feeds KB keys and
 * each converted K chunk feeds RB rows (8 independent accumulators, one per (row, key) pair), then one
 * transposing sum turns the 8 accumulators into 8 scores. Lanes past n (a partial last step) read key n-1
 * and land in S[r][n..TILE), which the mask overwrites. With pf != NULL, also prefetches the rows
 * pf[i] + shift (the next unit's K) one token per key. */
KVP_INLINE void scores_rb(const float *qs, const void *kbase, const int64_t *off, int n, float *S, const int RB,
                          const int D, const kvp_dtype T, const pf_t *pf)
{
    const int64_t es = elem_bytes(T);
    if (D == 8) {
        prefetch_span(kbase, pf, 0, n, es, D * es);
        scores8_rb(qs, kbase, off, n, S, RB, T);
        return;
    }
    const int KB = 8 / RB;
    for (int i = 0; i < n; i += KB) {
        prefetch_span(kbase, pf, i, i + KB, es, D * es);
        int64_t o[8];
        for (int k = 0; k < KB; k++) o[k] = off[i + k < n ? i + k : n - 1];
        kvp_v8 a[8];
        for (int t = 0; t < 8; t++) a[t] = v8_zero();
        for (int d = 0; d < D; d += 8) {
            kvp_v8 kk[8];
            for (int k = 0; k < KB; k++) kk[k] = v8_load_elem(kbase, o[k] + d, T);
            for (int r = 0; r < RB; r++) {
                kvp_v8 qv = v8_loadf(qs + r * D + d);
                if (KB > 1) v8_pin(qv);
                for (int k = 0; k < KB; k++) a[r * KB + k] = v8_fma(qv, kk[k], a[r * KB + k]);
            }
        }
        float s[8];
        v8_storef(s, v8_hsum8(a));
        for (int r = 0; r < RB; r++)
            for (int k = 0; k < KB; k++) S[r * TILE + i + k] = s[r * KB + k];
    }
}

/* acc[r] += sum_i P[r][i] * v_i for RB rows, two 8-lane strips at a time kept in registers (the head's V
 * rows of the tile stay in L1 across the strips). With pf != NULL, the strips also prefetch the rows
 * pf[i] + shift (the next unit's V), row i during strip i mod (strips): spread over the pass, not in one
 * burst during the first strip (measured: 30-40 % -> 48-53 % of the copy bandwidth on the target decode,
 * together with 16-token tiles). */
KVP_INLINE void values_rb(float *acc, const float *P, const void *vbase, const int64_t *off, int n, const int RB,
                          const int D, const kvp_dtype T, const pf_t *pf)
{
    const int64_t es = elem_bytes(T);
    int d = 0;
    for (; d + 16 <= D; d += 16) {
        kvp_v8 a[4], b[4];
        for (int r = 0; r < RB; r++) {
            a[r] = v8_loadf(acc + r * D + d);
            b[r] = v8_loadf(acc + r * D + d + 8);
        }
        for (int i = 0; i < n; i++) {
            if (i % (D / 16) == d / 16) prefetch_span(vbase, pf, i, i + 1, es, D * es); /* spread over the strips */
            kvp_v8 v0 = v8_load_elem(vbase, off[i] + d, T), v1 = v8_load_elem(vbase, off[i] + d + 8, T);
            for (int r = 0; r < RB; r++) {
                kvp_v8 p = v8_set1(P[r * TILE + i]);
                a[r] = v8_fma(p, v0, a[r]);
                b[r] = v8_fma(p, v1, b[r]);
            }
        }
        for (int r = 0; r < RB; r++) {
            v8_storef(acc + r * D + d, a[r]);
            v8_storef(acc + r * D + d + 8, b[r]);
        }
    }
    /* head_dim 8 (the only size with an 8-wide tail): one vector per row, so four accumulators per row over
     * alternate tokens keep the multiply-add chains independent (a single chain waits on FMA latency). */
    for (; d < D; d += 8) {
        prefetch_span(vbase, pf, 0, n, es, D * es);
        kvp_v8 a[4][4];
        for (int r = 0; r < RB; r++) {
            a[r][0] = v8_loadf(acc + r * D + d);
            a[r][1] = a[r][2] = a[r][3] = v8_zero();
        }
        int i = 0;
        for (; i + 4 <= n; i += 4) {
            kvp_v8 v[4];
            for (int u = 0; u < 4; u++) v[u] = v8_load_elem(vbase, off[i + u] + d, T);
            for (int r = 0; r < RB; r++)
                for (int u = 0; u < 4; u++) a[r][u] = v8_fma(v8_set1(P[r * TILE + i + u]), v[u], a[r][u]);
        }
        for (; i < n; i++) {
            kvp_v8 v0 = v8_load_elem(vbase, off[i] + d, T);
            for (int r = 0; r < RB; r++) a[r][0] = v8_fma(v8_set1(P[r * TILE + i]), v0, a[r][0]);
        }
        for (int r = 0; r < RB; r++)
            v8_storef(acc + r * D + d, v8_add(v8_add(a[r][0], a[r][1]), v8_add(a[r][2], a[r][3])));
    }
}

/* ---- 16 lanes (AVX-512F): the score and value passes as scores_rb / values_rb, with vectors twice as wide:
 * half the multiply-adds, loads and conversions per key (head_dim 8: two rows a vector), and the softmax of
 * a tile. With the memory bus free, the 8-lane f16 decode at head_dim 128 ran at ~15 multiply-adds per cycle
 * of 16: bound by arithmetic. run_item is also built without avx512f, so it calls these through a table (one
 * call per row block of a unit). */
#ifdef KVP_BUILD_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
/* head_dim 8 on 16 lanes: two keys per vector (key 2t of a step in lanes 0-7 of k[t], key 2t+1 in 8-15),
 * sixteen keys a step; a key past n reads key n-1 (a real row: its score lands past n, where the mask
 * overwrites it, and its value is weighted by a masked-out zero). dense: the sixteen rows of a full step
 * are consecutive in memory (one block, rows of exactly D elements), so each vector is one plain load, not
 * two halves joined by a shuffle (a 64 x 128-token head_dim-8 decode at block size 16, one thread: 0.99 ->
 * 0.95 ns a (key, query row); 0.75 -> 0.69 with 1024-token rows held in L2). */
KVP_INLINE void load_pairs16(kvp_v16 *k, const void *base, const int64_t *off, int i0, int n, const int dense,
                             const kvp_dtype T)
{
    if (dense && n - i0 >= 16) /* sixteen consecutive rows: whole vectors, no shuffle */
        for (int t = 0; t < 8; t += 2) v16_load_elem2(base, off[i0] + 16 * t, T, &k[t], &k[t + 1]);
    else if (n - i0 >= 16) /* every step but a tile's last: no per-key test */
        for (int t = 0; t < 8; t++) k[t] = v16_load_pair(base, off[i0 + 2 * t], off[i0 + 2 * t + 1], T);
    else
        for (int t = 0; t < 8; t++) {
            const int a = i0 + 2 * t < n ? i0 + 2 * t : n - 1, b = i0 + 2 * t + 1 < n ? i0 + 2 * t + 1 : n - 1;
            k[t] = v16_load_pair(base, off[a], off[b], T);
        }
}

/* Lanes [a0+a1, a2+a3, b0+b1, b2+b3] in each 128-bit lane (hadd, which AVX-512 lacks). */
KVP_INLINE kvp_v16 v16_hadd(kvp_v16 a, kvp_v16 b)
{
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

/* The eight vectors of a step (two rows each) transposed: kt[d] = dim d of the sixteen keys, in the order
 * 0,2,4,6,1,3,5,7,8,10,12,14,9,11,13,15 (two in-lane 4x4 transposes, then 128-bit lanes regrouped). */
KVP_INLINE void transpose16_d8(const kvp_v16 *k, kvp_v16 *kt)
{
    kvp_v16 y[2][4];
    for (int g = 0; g < 2; g++) {
        const kvp_v16 *x = k + 4 * g;
        const kvp_v16 t0 = _mm512_unpacklo_ps(x[0], x[1]), t1 = _mm512_unpackhi_ps(x[0], x[1]);
        const kvp_v16 t2 = _mm512_unpacklo_ps(x[2], x[3]), t3 = _mm512_unpackhi_ps(x[2], x[3]);
        y[g][0] = _mm512_shuffle_ps(t0, t2, 0x44);
        y[g][1] = _mm512_shuffle_ps(t0, t2, 0xEE);
        y[g][2] = _mm512_shuffle_ps(t1, t3, 0x44);
        y[g][3] = _mm512_shuffle_ps(t1, t3, 0xEE);
    }
    for (int d = 0; d < 4; d++) {
        kt[d] = _mm512_shuffle_f32x4(y[0][d], y[1][d], _MM_SHUFFLE(2, 0, 2, 0));
        kt[d + 4] = _mm512_shuffle_f32x4(y[0][d], y[1][d], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* S[r][i] = qs[r] . k_i. One row: the eight product vectors of a step are summed by a transposing tree (pair
 * sums within 128-bit lanes twice: lane j of u0 = the lane-j quarter sums of keys 0,2,4,6 (j = 0, 1) or
 * 1,3,5,7 (j = 2, 3); then the two quarters of each key added). Two rows and more: the step's keys are
 * transposed once (transpose16_d8) and each row's scores are eight multiply-adds of a broadcast q element
 * (24 shuffles a step for every row, where the tree takes 15 a row; a 64 x 128-token decode with two rows
 * a KV head, one thread: 0.88 -> 0.85 ns a (key, query row), 0.65 -> 0.60 with 1024-token rows in L2). Both
 * leave the scores in the order 0,2,4,6,1,3,5,7,8,10,...; one permute puts them back. */
KVP_INLINE void scores16_d8(const float *qs, const void *kbase, const int64_t *off, int n, float *S, const int RB,
                            const int dense, const kvp_dtype T)
{
    const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    const __m256d h = _mm256_castps_pd(_mm256_loadu_ps(qs));
    const kvp_v16 q0 = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(h), h, 1)); /* [q | q], row 0 */
    for (int i0 = 0; i0 < n; i0 += 16) { /* i0 + 16 <= TILE */
        kvp_v16 k[8];
        load_pairs16(k, kbase, off, i0, n, dense, T);
        if (RB == 1) {
            kvp_v16 p[8];
            for (int t = 0; t < 8; t++) p[t] = _mm512_mul_ps(q0, k[t]);
            const kvp_v16 u0 = v16_hadd(v16_hadd(p[0], p[1]), v16_hadd(p[2], p[3]));
            const kvp_v16 u1 = v16_hadd(v16_hadd(p[4], p[5]), v16_hadd(p[6], p[7]));
            const kvp_v16 s = _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xDD));
            v16_storef(S + i0, _mm512_permutexvar_ps(order, s));
            continue;
        }
        kvp_v16 kt[8];
        transpose16_d8(k, kt);
        for (int r = 0; r < RB; r++) {
            const float *qr = qs + r * 8;
            kvp_v16 a = _mm512_mul_ps(_mm512_set1_ps(qr[0]), kt[0]), b = _mm512_mul_ps(_mm512_set1_ps(qr[1]), kt[1]);
            for (int d = 2; d < 8; d += 2) {
                a = _mm512_fmadd_ps(_mm512_set1_ps(qr[d]), kt[d], a);
                b = _mm512_fmadd_ps(_mm512_set1_ps(qr[d + 1]), kt[d + 1], b);
            }
            v16_storef(S + r * TILE + i0, _mm512_permutexvar_ps(order, _mm512_add_ps(a, b)));
        }
    }
}

/* acc[r] += sum_i P[r][i] * v_i: a step's sixteen probabilities in one vector (read whole, lanes past n
 * zeroed in the register), spread by a permute over each pair of value rows; four accumulators per row over
 * the pairs keep the multiply-add chains independent, and lanes 0-7 and 8-15 (even and odd keys) are added
 * at the end. */
KVP_INLINE void values16_d8(float *acc, const float *P, const void *vbase, const int64_t *off, int n, const int RB,
                            const int dense, const kvp_dtype T)
{
    kvp_v16 a[4][4];
    for (int r = 0; r < RB; r++) {
        a[r][0] = _mm512_castpd_ps(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(acc + r * 8))));
        a[r][0] = _mm512_maskz_mov_ps(0x00ff, a[r][0]); /* the cast leaves lanes 8-15 undefined */
        a[r][1] = a[r][2] = a[r][3] = v16_zero();
    }
    for (int i0 = 0; i0 < n; i0 += 16) {
        const __mmask16 live = v16_live(n - i0);
        kvp_v16 v[8];
        load_pairs16(v, vbase, off, i0, n, dense, T);
        for (int r = 0; r < RB; r++) {
            const kvp_v16 pr = _mm512_maskz_mov_ps(live, v16_loadf(P + r * TILE + i0));
            for (int t = 0; t < 8; t++) {
                const __m512i spread = _mm512_setr_epi32(2 * t, 2 * t, 2 * t, 2 * t, 2 * t, 2 * t, 2 * t, 2 * t,
                                                         2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1,
                                                         2 * t + 1, 2 * t + 1, 2 * t + 1);
                a[r][t % 4] = v16_fma(_mm512_permutexvar_ps(spread, pr), v[t], a[r][t % 4]);
            }
        }
    }
    for (int r = 0; r < RB; r++)
        v8_storef(acc + r * 8, v16_fold(v16_add(v16_add(a[r][0], a[r][1]), v16_add(a[r][2], a[r][3]))));
}

KVP_INLINE void scores16_rb(const float *qs, const void *kbase, const int64_t *off, int n, float *S, const int RB,
                            const int D, const kvp_dtype T, const int dense, const pf_t *pf)
{
    if (D == 8) { /* rows shorter than a line: run_item prefetches them (prefetch_short_rows) */
        scores16_d8(qs, kbase, off, n, S, RB, dense, T);
        return;
    }
    const int64_t es = elem_bytes(T);
    const int KB = 8 / RB;
    for (int i = 0; i < n; i += KB) {
        prefetch_span(kbase, pf, i, i + KB, es, D * es);
        int64_t o[8];
        for (int k = 0; k < KB; k++) o[k] = off[i + k < n ? i + k : n - 1];
        kvp_v16 a[8];
        for (int t = 0; t < 8; t++) a[t] = v16_zero();
        int d = 0;
        for (; d + 32 <= D; d += 32) { /* 32 elements a key at a time (fp8 converts them together) */
            kvp_v16 kk[8], kh[8];
            for (int k = 0; k < KB; k++) v16_load_elem2(kbase, o[k] + d, T, &kk[k], &kh[k]);
            for (int r = 0; r < RB; r++) {
                kvp_v16 q0 = v16_loadf(qs + r * D + d), q1 = v16_loadf(qs + r * D + d + 16);
                if (KB > 1) {
                    v16_pin(q0);
                    v16_pin(q1);
                }
                for (int k = 0; k < KB; k++) a[r * KB + k] = v16_fma(q1, kh[k], v16_fma(q0, kk[k], a[r * KB + k]));
            }
        }
        for (; d < D; d += 16) {
            kvp_v16 kk[8];
            for (int k = 0; k < KB; k++) kk[k] = v16_load_elem(kbase, o[k] + d, T);
            for (int r = 0; r < RB; r++) {
                kvp_v16 qv = v16_loadf(qs + r * D + d);
                if (KB > 1) v16_pin(qv);
                for (int k = 0; k < KB; k++) a[r * KB + k] = v16_fma(qv, kk[k], a[r * KB + k]);
            }
        }
        kvp_v8 h[8];
        for (int t = 0; t < 8; t++) h[t] = v16_fold(a[t]);
        float s[8];
        v8_storef(s, v8_hsum8(h));
        for (int r = 0; r < RB; r++)
            for (int k = 0; k < KB; k++) S[r * TILE + i + k] = s[r * KB + k];
    }
}

/* Strips of 32 values (two vectors per row); the 16 left at head_dim 16 and 80 take even and odd tokens
 * into two accumulators per row (one would wait on the multiply-add latency). Row i is prefetched during
 * strip i mod strips, as in values_rb. */
KVP_INLINE void values16_rb(float *acc, const float *P, const void *vbase, const int64_t *off, int n, const int RB,
                            const int D, const kvp_dtype T, const int dense, const pf_t *pf)
{
    if (D == 8) {
        values16_d8(acc, P, vbase, off, n, RB, dense, T);
        return;
    }
    const int64_t es = elem_bytes(T);
    const int strips = (D + 31) / 32;
    int d = 0;
    for (; d + 32 <= D; d += 32) {
        kvp_v16 a[4], b[4];
        for (int r = 0; r < RB; r++) {
            a[r] = v16_loadf(acc + r * D + d);
            b[r] = v16_loadf(acc + r * D + d + 16);
        }
        for (int i = 0; i < n; i++) {
            if (i % strips == d / 32) prefetch_span(vbase, pf, i, i + 1, es, D * es);
            kvp_v16 v0, v1;
            v16_load_elem2(vbase, off[i] + d, T, &v0, &v1);
            for (int r = 0; r < RB; r++) {
                kvp_v16 p = v16_set1(P[r * TILE + i]);
                a[r] = v16_fma(p, v0, a[r]);
                b[r] = v16_fma(p, v1, b[r]);
            }
        }
        for (int r = 0; r < RB; r++) {
            v16_storef(acc + r * D + d, a[r]);
            v16_storef(acc + r * D + d + 16, b[r]);
        }
    }
    if (d < D) {
        kvp_v16 a[4], b[4];
        for (int r = 0; r < RB; r++) {
            a[r] = v16_loadf(acc + r * D + d);
            b[r] = v16_zero();
        }
        for (int i = 0; i < n; i += 2) {
            const int two = i + 1 < n;
            for (int t = i; t <= i + two; t++)
                if (t % strips == strips - 1) prefetch_span(vbase, pf, t, t + 1, es, D * es);
            kvp_v16 v0 = v16_load_elem(vbase, off[i] + d, T);
            for (int r = 0; r < RB; r++) a[r] = v16_fma(v16_set1(P[r * TILE + i]), v0, a[r]);
            if (two) {
                kvp_v16 v1 = v16_load_elem(vbase, off[i + 1] + d, T);
                for (int r = 0; r < RB; r++) b[r] = v16_fma(v16_set1(P[r * TILE + i + 1]), v1, b[r]);
            }
        }
        for (int r = 0; r < RB; r++) v16_storef(acc + r * D + d, v16_add(a[r], b[r]));
    }
}

/* tile_exp8 on 16 lanes, for the nr rows of a unit (row r at S + r * TILE; m_old, mn, sum indexed by row),
 * two at a time: the two rows' reductions, chains of dependent shuffles, overlap (row by row, a 64 x
 * 128-token head_dim-8 decode on one thread took 0.93 ns a (key, query row); in pairs 0.89). Lanes past n
 * (up to the next multiple of 16, inside the S row) are read and written whole and masked in registers:
 * whatever they hold (a padding key's score, or nothing yet) never reaches the maximum or the sum, and they
 * leave as 0. */
KVP_INLINE void exp_rows16(float *S, const int R, int n, const float *m_old, float *mn, float *sum)
{
    __m512 mv[2];
    for (int r = 0; r < R; r++) mv[r] = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 live = v16_live(n - i);
        for (int r = 0; r < R; r++) mv[r] = _mm512_mask_max_ps(mv[r], live, mv[r], v16_loadf(S + r * TILE + i));
    }
    kvp_v16 mnv[2], acc[2];
    __mmask16 any[2]; /* 0: every score of the row masked (-inf), and the row leaves as 0 */
    for (int r = 0; r < R; r++) {
        const float mt = _mm512_reduce_max_ps(mv[r]);
        any[r] = mt == -INFINITY ? 0 : 0xffff;
        mn[r] = mt == -INFINITY ? -INFINITY : mt > m_old[r] ? mt : m_old[r];
        mnv[r] = v16_set1(mt == -INFINITY ? 0.0f : -mn[r]);
        acc[r] = v16_zero();
    }
    for (int i = 0; i < n; i += 16) {
        const __mmask16 live = v16_live(n - i);
        for (int r = 0; r < R; r++) {
            const kvp_v16 x = v16_add(v16_loadf(S + r * TILE + i), mnv[r]);
            const kvp_v16 e = _mm512_maskz_mov_ps(live & any[r], v16_exp2(x));
            v16_storef(S + r * TILE + i, e);
            acc[r] = v16_add(acc[r], e);
        }
    }
    for (int r = 0; r < R; r++) sum[r] = _mm512_reduce_add_ps(acc[r]);
}

static void tile_exp16(float *S, int nr, int n, const float *m_old, float *mn, float *sum)
{
    int r = 0;
    for (; r + 2 <= nr; r += 2) exp_rows16(S + r * TILE, 2, n, m_old + r, mn + r, sum + r);
    if (r < nr) exp_rows16(S + r * TILE, 1, n, m_old + r, mn + r, sum + r);
}

#define KVP_PASSES16(T, TN, D)                                                                                      \
    static void scores16_##TN##_##D(const float *qs, const void *kb, const int64_t *off, int n, float *S, int RB,  \
                                    int dense, const pf_t *pf)                                                      \
    {                                                                                                               \
        if (RB == 4) scores16_rb(qs, kb, off, n, S, 4, D, T, dense, pf);                                            \
        else if (RB == 2) scores16_rb(qs, kb, off, n, S, 2, D, T, dense, pf);                                       \
        else scores16_rb(qs, kb, off, n, S, 1, D, T, dense, pf);                                                    \
    }                                                                                                               \
    static void values16_##TN##_##D(float *acc, const float *P, const void *vb, const int64_t *off, int n, int RB, \
                                    int dense, const pf_t *pf)                                                      \
    {                                                                                                               \
        if (RB == 4) values16_rb(acc, P, vb, off, n, 4, D, T, dense, pf);                                           \
        else if (RB == 2) values16_rb(acc, P, vb, off, n, 2, D, T, dense, pf);                                      \
        else values16_rb(acc, P, vb, off, n, 1, D, T, dense, pf);                                                   \
    }
#define KVP_PASSES16_ALL(T, TN) \
    KVP_PASSES16(T, TN, 8)      \
    KVP_PASSES16(T, TN, 16)     \
    KVP_PASSES16(T, TN, 32)     \
    KVP_PASSES16(T, TN, 64)     \
    KVP_PASSES16(T, TN, 80)     \
    KVP_PASSES16(T, TN, 96)     \
    KVP_PASSES16(T, TN, 128)    \
    KVP_PASSES16(T, TN, 256)
KVP_PASSES16_ALL(KVP_DTYPE_F32, f32)
KVP_PASSES16_ALL(KVP_DTYPE_F16, f16)
KVP_PASSES16_ALL(KVP_DTYPE_BF16, bf16)
KVP_PASSES16_ALL(KVP_DTYPE_FP8_E4M3, fp8)
#pragma GCC pop_options

/* Indexed like kvp_paged_kv_head_dim_index. */
#define KVP_PASSES16_ROW(P, TN) {P##_##TN##_8, P##_##TN##_16, P##_##TN##_32, P##_##TN##_64, P##_##TN##_80, P##_##TN##_96, \
                                 P##_##TN##_128, P##_##TN##_256}
static const scores16_fn k_scores16[KVP_DTYPE_COUNT][NUM_HEAD_DIMS] = {
    KVP_PASSES16_ROW(scores16, f32), KVP_PASSES16_ROW(scores16, f16), KVP_PASSES16_ROW(scores16, bf16),
    KVP_PASSES16_ROW(scores16, fp8)};
static const values16_fn k_values16[KVP_DTYPE_COUNT][NUM_HEAD_DIMS] = {
    KVP_PASSES16_ROW(values16, f32), KVP_PASSES16_ROW(values16, f16), KVP_PASSES16_ROW(values16, bf16),
    KVP_PASSES16_ROW(values16, fp8)};
#endif

/* The score (or value) pass of rows r0 .. r1-1 of a unit, in blocks of 4, 2, then 1 rows; the first
 * block also prefetches pf. */
KVP_INLINE void scores_rows(const job_t *j, const float *qs, const void *kb, const int64_t *off, int n, float *S,
                            int r0, int r1, const int D, const kvp_dtype T, const int dense, const pf_t *pf)
{
    for (int r = r0; r < r1;) {
        const int rb = r1 - r >= 4 ? 4 : r1 - r >= 2 ? 2 : 1;
        const pf_t *p = r == r0 ? pf : NULL;
        if (j->scores16) j->scores16(qs + r * D, kb, off, n, S + r * TILE, rb, dense, p);
        else if (rb == 4) scores_rb(qs + r * D, kb, off, n, S + r * TILE, 4, D, T, p);
        else if (rb == 2) scores_rb(qs + r * D, kb, off, n, S + r * TILE, 2, D, T, p);
        else scores_rb(qs + r * D, kb, off, n, S + r * TILE, 1, D, T, p);
        r += rb;
    }
}

KVP_INLINE void values_rows(const job_t *j, float *acc, const float *S, const void *vb, const int64_t *off, int n,
                            int r0, int r1, const int D, const kvp_dtype T, const int dense, const pf_t *pf)
{
    for (int r = r0; r < r1;) {
        const int rb = r1 - r >= 4 ? 4 : r1 - r >= 2 ? 2 : 1;
        const pf_t *p = r == r0 ? pf : NULL;
        if (j->values16) j->values16(acc + r * D, S + r * TILE, vb, off, n, rb, dense, p);
        else if (rb == 4) values_rb(acc + r * D, S + r * TILE, vb, off, n, 4, D, T, p);
        else if (rb == 2) values_rb(acc + r * D, S + r * TILE, vb, off, n, 2, D, T, p);
        else values_rb(acc + r * D, S + r * TILE, vb, off, n, 1, D, T, p);
        r += rb;
    }
}

/* A tile's softmax numerators in place: sr[i] = 2^(sr[i] - M) for i < n (scores in log2 units), M = the
 * larger of m_old and the tile's maximum; returns M and the numerators' sum in *sum, or -inf (sr zeroed)
 * when every score of the tile is masked. Lanes past n: -inf in, 0 out. */
KVP_INLINE float tile_exp8(float *sr, int n, float m_old, float *sum)
{
    const int nv = (n + 7) & ~7; /* whole vectors */
    for (int i = n; i < nv; i++) sr[i] = -INFINITY;
    kvp_v8 mv = v8_loadf(sr);
    for (int i = 8; i < nv; i += 8) mv = v8_max(mv, v8_loadf(sr + i));
    const float mt = v8_hmax(mv);
    if (mt == -INFINITY) {
        for (int i = 0; i < nv; i++) sr[i] = 0.0f;
        return -INFINITY;
    }
    const float mn = mt > m_old ? mt : m_old;
    const kvp_v8 mnv = v8_set1(-mn);
    kvp_v8 acc = v8_zero();
    for (int i = 0; i < nv; i += 8) {
        kvp_v8 e = v8_exp2(v8_add(v8_loadf(sr + i), mnv));
        v8_storef(sr + i, e);
        acc = v8_add(acc, e);
    }
    *sum = v8_hsum(acc);
    return mn;
}

/* Element offsets of the K/V rows of tokens ts .. ts+n-1 of one sequence and KV head (a page-table walk:
 * one division per tile, then increments; no division per token, which matters at block size 1). */
static inline void tile_offsets(const kvp_paged_kv *kv, const int32_t *pages, int32_t head, int32_t ts, int n,
                                int64_t *off)
{
    const int32_t bs = kv->block_size;
    const int64_t sb = kv->stride_block, st = kv->stride_token, base = (int64_t)head * kv->stride_head;
    int32_t pg = ts / bs, slot = ts % bs;
    if (bs == 1) {
        for (int i = 0; i < n; i++) off[i] = (int64_t)pages[pg + i] * sb + base;
        return;
    }
    for (int i = 0; i < n; pg++, slot = 0) { /* the run of this tile in page pg */
        const int64_t b = (int64_t)pages[pg] * sb + base + (int64_t)slot * st;
        const int run = bs - slot < n - i ? bs - slot : n - i;
        for (int k = 0; k < run; k++) off[i + k] = b + k * st;
        i += run;
    }
}

/* The rows an item walks: row r = (KV head kvh + r / rph, query token q0 + (r % rph) / ng, query head
 * g0 + r % ng of that KV head's group). The item runs in units of (tile of tl tokens, KV head): scores of
 * the head's rows, their online softmax, then their values, so the unit's K and V rows (2 x tl x
 * row_bytes: 8 KiB at head_dim 128 in f16) are still in L1 for the values pass. While one unit is computed
 * the next unit's rows are prefetched (K during the score pass, V during the values pass): the next head of
 * the same tile, else the first head of the next tile, else the first head of `next`, the item this thread
 * runs after this one (NULL: unknown), so a short item does not start on cold rows either. */
KVP_INLINE void run_item(const job_t *j, const item_t *it, const item_t *next, const int D, const kvp_dtype T)
{
    const kvp_paged_kv *kv = j->kv;
    const int rph = it->nq * it->ng, rows = it->nh * rph; /* rows per KV head, rows */
    const int32_t L = kvp_paged_kv_seq_len(kv, it->seq), nqs = num_q(j, it->seq);
    float qs[MAXROWS * MAXD], acc[MAXROWS * MAXD], S[MAXROWS * TILE], m[MAXROWS], l[MAXROWS];
    int32_t lo[MAXROWS], hi[MAXROWS];

    int32_t lo_min = INT32_MAX, lo_max = 0, hi_min = INT32_MAX, hi_max = 0;
    for (int r = 0; r < rows; r++) {
        int32_t tok = it->q0 + (r % rph) / it->ng, head = (it->kvh + r / rph) * j->group + it->g0 + r % it->ng;
        const float *q = j->q + (q_row(j, it->seq, tok) * j->hq + head) * (int64_t)D;
        for (int d = 0; d < D; d++) qs[r * D + d] = q[d] * j->qscale;
        for (int d = 0; d < D; d++) acc[r * D + d] = 0.0f;
        int32_t pos = L - nqs + tok;
        int32_t a = j->window_left >= 0 && pos - j->window_left > 0 ? pos - j->window_left : 0, b = pos + 1;
        a = a > it->c0 ? a : it->c0;
        b = b < it->c1 ? b : it->c1;
        if (b < a) b = a;
        lo[r] = a;
        hi[r] = b;
        m[r] = -INFINITY;
        l[r] = 0.0f;
        lo_min = a < lo_min ? a : lo_min;
        lo_max = a > lo_max ? a : lo_max;
        hi_min = b < hi_min ? b : hi_min;
        hi_max = b > hi_max ? b : hi_max;
    }
    const int32_t *pages = kv->kv_indices + kv->kv_indptr[it->seq];
    const int64_t es = elem_bytes(T), row_bytes = D * es;
    const int64_t sh = kv->stride_head;
    /* tile length: 16 tokens for rows of 256 bytes and more (a unit, its K and V rows, then stays within
     * 8 KiB, so it and the next unit prefetched meanwhile fit in L1 together); 256 for rows shorter than a
     * line (head_dim 8 in f32/f16: a tile's fixed costs, the softmax's reductions and rescaling, the
     * prefetch setup, over more keys; measured on a stories260K-shaped decode, 64 sequences x 200 tokens,
     * one thread: 1.18 ns a (key, query row) with 64, 1.06 with 128, 0.95 with 256); else 32 */
    const int tl = row_bytes >= 256 ? 16 : row_bytes >= 64 ? 32 : TILE;
    /* every full step of 16 tokens of a tile lies in one block, its rows consecutive */
    const int dense = kv->block_size % 16 == 0 && lo_min % 16 == 0 && kv->stride_token == D;
    int64_t offs[2][TILE], offn[TILE];
    int cur = 0;
    if (lo_min < hi_max) {
        const int n0 = hi_max - lo_min < tl ? hi_max - lo_min : tl;
        tile_offsets(kv, pages, it->kvh, lo_min, n0, offs[0]);
        for (int h = 0; h < it->nh; h++) {
            const pf_t first = {offs[0], h * sh, n0};
            prefetch_span(kv->k, &first, 0, n0, es, row_bytes);
            prefetch_span(kv->v, &first, 0, n0, es, row_bytes);
        }
    }
    for (int32_t ts = lo_min; ts < hi_max; ts += tl) {
        const int n = hi_max - ts < tl ? hi_max - ts : tl;
        const int64_t *off = offs[cur];
        const int32_t tn = ts + tl;
        /* the unit after this tile's last head: the next tile, or the next item's first tile */
        const int64_t *pfn = NULL;
        int nn = 0;
        int32_t pfslot = 0; /* block slot of pfn's first token */
        if (tn < hi_max) {
            nn = hi_max - tn < tl ? hi_max - tn : tl;
            tile_offsets(kv, pages, it->kvh, tn, nn, offs[cur ^ 1]);
            pfn = offs[cur ^ 1];
            pfslot = tn % kv->block_size;
        } else if (next != NULL && next->c0 < next->c1) {
            nn = next->c1 - next->c0 < tl ? next->c1 - next->c0 : tl;
            tile_offsets(kv, kv->kv_indices + kv->kv_indptr[next->seq], next->kvh, next->c0, nn, offn);
            pfn = offn;
            pfslot = next->c0 % kv->block_size;
        }
        const int masked = !(ts >= lo_max && ts + n <= hi_min);
        /* Block size 1 scatters every token's rows: the hardware prefetchers cannot follow them, and one unit
         * ahead is too close to hide the misses. Each unit also fetches its head's rows two tiles ahead into
         * L2. 32 x 4096 f16 decode, block 1, memory bus free: 14.5-15.0 -> 13.2-13.6 ms (1.48x -> 1.30-1.35x
         * the contiguous time); busy: 16.3 -> 15.6 ms. Three or four tiles ahead did no better; at blocks of
         * 2 to 8 it cost as much as it gained, or more. */
        int64_t far[TILE];
        int nf = 0;
        if (kv->block_size == 1 && row_bytes >= 64 && ts + 2 * tl < hi_max) {
            nf = hi_max - (ts + 2 * tl) < tl ? hi_max - (ts + 2 * tl) : tl;
            tile_offsets(kv, pages, it->kvh, ts + 2 * tl, nf, far);
        }
        for (int h = 0; h < it->nh; h++) {
            for (int t = 0; t < nf; t++)
                for (int64_t b = 0; b < row_bytes; b += 64) {
                    KVP_PREFETCH_L2((const char *)kv->k + (far[t] + h * sh) * es + b);
                    KVP_PREFETCH_L2((const char *)kv->v + (far[t] + h * sh) * es + b);
                }
            const void *kb = (const char *)kv->k + h * sh * es; /* this head's rows */
            const void *vb = (const char *)kv->v + h * sh * es;
            const int r0 = h * rph, r1 = r0 + rph;
            /* rows to prefetch (the next unit), relative to this head's kb / vb */
            const pf_t pfs = {h + 1 < it->nh ? off : pfn, h + 1 < it->nh ? sh : -h * sh, h + 1 < it->nh ? n : nn};
            const pf_t *pf = &pfs;
            const int32_t pf_slot = h + 1 < it->nh ? ts % kv->block_size : pfslot; /* of pfs's first token */
            const int short_pf = row_bytes < 64 && pfs.off != NULL;
            if (short_pf)
                prefetch_short_rows((const char *)kb + pfs.shift * es, pfs.off, pfs.n, pf_slot, kv->block_size,
                                    kv->stride_token, es);
            scores_rows(j, qs, kb, off, n, S, r0, r1, D, T, dense, pf);
            if (j->softcap > 0.0f) /* c tanh(x / c) in log2 units is the same map (c scaled alike) */
                for (int r = r0; r < r1; r++)
                    for (int i = 0; i < n; i++) S[r * TILE + i] = j->softcap * tanhf(S[r * TILE + i] / j->softcap);
            if (masked)
                for (int r = r0; r < r1; r++)
                    for (int i = 0; i < n; i++)
                        if (ts + i < lo[r] || ts + i >= hi[r]) S[r * TILE + i] = -INFINITY;
            float mn[MAXROWS], sum[MAXROWS];
            if (j->tile_exp16) j->tile_exp16(S + r0 * TILE, rph, n, m + r0, mn + r0, sum + r0);
            else
                for (int r = r0; r < r1; r++) mn[r] = tile_exp8(S + r * TILE, n, m[r], &sum[r]);
            for (int r = r0; r < r1; r++) {
                if (mn[r] == -INFINITY) continue; /* every score of the tile masked */
                if (mn[r] != m[r] && m[r] != -INFINITY) { /* from -inf: l and acc are 0, nothing to rescale */
                    const float alpha = v8_hsum(v8_exp2(v8_set1(m[r] - mn[r]))) * 0.125f;
                    l[r] *= alpha;
                    const kvp_v8 av = v8_set1(alpha);
                    for (int d = 0; d < D; d += 8) v8_storef(acc + r * D + d, v8_mul(v8_loadf(acc + r * D + d), av));
                }
                m[r] = mn[r];
                l[r] += sum[r];
            }
            if (short_pf)
                prefetch_short_rows((const char *)vb + pfs.shift * es, pfs.off, pfs.n, pf_slot, kv->block_size,
                                    kv->stride_token, es);
            values_rows(j, acc, S, vb, off, n, r0, r1, D, T, dense, pf);
        }
        cur ^= 1;
    }
    for (int r = 0; r < rows; r++) {
        int32_t tok = it->q0 + (r % rph) / it->ng, head = (it->kvh + r / rph) * j->group + it->g0 + r % it->ng;
        float inv = l[r] > 0.0f ? j->oscale / l[r] : 0.0f;
        float *o, *lse = NULL, lse_scale = 1.0f; /* lse: where the log-sum-exp goes, if anywhere */
        if (it->part < 0) {
            int64_t row = q_row(j, it->seq, tok) * j->hq + head;
            o = j->out + row * D;
            if (j->lse) lse = j->lse + row, lse_scale = 0.6931471805599453f;
        } else {
            o = j->part_o + (it->part + r) * D;
            lse = j->part_lse + it->part + r;
        }
        if (lse) *lse = (l[r] > 0.0f ? m[r] + log2f(l[r]) : -INFINITY) * lse_scale;
        for (int d = 0; d < D; d++) o[d] = acc[r * D + d] * inv;
    }
}

static void merge_rows(const job_t *j, const merge_t *mg, int D)
{
    const int rph = mg->nq * mg->ng, rows = mg->nh * rph;
    for (int r = 0; r < rows; r++) {
        int32_t tok = mg->q0 + (r % rph) / mg->ng, head = (mg->kvh + r / rph) * j->group + mg->g0 + r % mg->ng;
        int64_t row = q_row(j, mg->seq, tok) * j->hq + head;
        float M = -INFINITY;
        for (int c = 0; c < mg->nchunks; c++) {
            float x = j->part_lse[mg->part + (int64_t)c * rows + r];
            M = x > M ? x : M;
        }
        float *o = j->out + row * D;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        if (M == -INFINITY) {
            if (j->lse) j->lse[row] = -INFINITY;
            continue;
        }
        float wsum = 0.0f;
        for (int c = 0; c < mg->nchunks; c++) {
            int64_t pr = mg->part + (int64_t)c * rows + r;
            float w = exp2f(j->part_lse[pr] - M);
            if (w == 0.0f) continue;
            wsum += w;
            const float *po = j->part_o + pr * D;
            for (int d = 0; d < D; d++) o[d] += w * po[d];
        }
        for (int d = 0; d < D; d++) o[d] /= wsum;
        if (j->lse) j->lse[row] = (M + log2f(wsum)) * 0.6931471805599453f;
    }
}

typedef void (*item_fn)(const job_t *, const item_t *, const item_t *);

#define KVP_ITEM_FN(T, TN, D) \
    static void item_##TN##_##D(const job_t *j, const item_t *it, const item_t *nx) { run_item(j, it, nx, D, T); }
#define KVP_ITEM_FNS(T, TN) \
    KVP_ITEM_FN(T, TN, 8)   \
    KVP_ITEM_FN(T, TN, 16)  \
    KVP_ITEM_FN(T, TN, 32)  \
    KVP_ITEM_FN(T, TN, 64)  \
    KVP_ITEM_FN(T, TN, 80)  \
    KVP_ITEM_FN(T, TN, 96)  \
    KVP_ITEM_FN(T, TN, 128) \
    KVP_ITEM_FN(T, TN, 256)
KVP_ITEM_FNS(KVP_DTYPE_F32, f32)
KVP_ITEM_FNS(KVP_DTYPE_F16, f16)
KVP_ITEM_FNS(KVP_DTYPE_BF16, bf16)
KVP_ITEM_FNS(KVP_DTYPE_FP8_E4M3, fp8)

#define KVP_ITEM_ROW(TN)                                                                                     \
    {item_##TN##_8, item_##TN##_16, item_##TN##_32, item_##TN##_64, item_##TN##_80, item_##TN##_96,          \
     item_##TN##_128, item_##TN##_256}
static const item_fn k_dispatch[KVP_DTYPE_COUNT][NUM_HEAD_DIMS] = {KVP_ITEM_ROW(f32), KVP_ITEM_ROW(f16),
                                                                   KVP_ITEM_ROW(bf16), KVP_ITEM_ROW(fp8)};

/* KV heads per work item: as many as fit MAXROWS rows (1 when a head's group alone overflows a tile). */
static int32_t heads_per_item(int multi_head, int32_t nq, int32_t qt, int32_t ng, int32_t hkv)
{
    if (!multi_head || nq < 1) return 1;
    int32_t h = MAXROWS / ((nq < qt ? nq : qt) * ng);
    return h < 1 ? 1 : h > hkv ? hkv : h;
}

/* Validates, plans items (and splits), runs them on the thread pool, merges split rows. */
static kvp_status attend(const kvp_paged_kv *kv, const float *q, const int32_t *qo_indptr, float *out,
                         const kvp_attn_params *p, const char *what)
{
    KVP_TRY(kvp_paged_kv_check(kv, 1));
    if (q == NULL || out == NULL || p == NULL) return KVP_ERR(KVP_EINVAL, "%s: q, out or params is NULL", what);
    KVP_TRY(kvp_attn_check_params(kv, p, what)); /* shared with the CUDA kernels */
    const int32_t D = kv->head_dim, hkv = kv->num_kv_heads, hq = p->num_q_heads;
    if (qo_indptr && kv->num_seqs > 0 && qo_indptr[0] != 0)
        return KVP_ERR(KVP_EINVAL, "%s: qo_indptr[0] = %d, must be 0", what, qo_indptr[0]);
    const int32_t group = hq / hkv;
    const int32_t ng = group < MAXROWS ? group : MAXROWS, qt = MAXROWS / ng;
    const int nt = kvp_attn_get_threads();

    /* One item takes several KV heads (up to MAXROWS query rows), so that it reads each block's heads
     * together (block = [heads][block_size][head_dim], contiguous) instead of a block_size*head_dim slice
     * per item: longer sequential runs per page, fewer page-table walks. Measured better for every block
     * size in decode; prefill tiles already fill MAXROWS with one head. */
    const int multi_head = ng == group;
#define hpi(nq_) heads_per_item(multi_head, (nq_), qt, ng, hkv)
    /* Count base items (without splits) and find the longest sequence. */
    int64_t base = 0;
    int32_t maxlen = 0;
    for (int32_t s = 0; s < kv->num_seqs; s++) {
        int32_t L = kvp_paged_kv_seq_len(kv, s), nq = qo_indptr ? qo_indptr[s + 1] - qo_indptr[s] : 1;
        if (nq < 0) return KVP_ERR(KVP_EINVAL, "%s: qo_indptr decreases at sequence %d", what, s);
        if (nq > L)
            return KVP_ERR(KVP_EINVAL, "%s: sequence %d has %d query tokens but only %d tokens in the cache "
                           "(append the new tokens' K/V first)", what, s, nq, L);
        base += (int64_t)((nq + qt - 1) / qt) * ((hkv + hpi(nq) - 1) / hpi(nq)) * ((group + ng - 1) / ng);
        maxlen = L > maxlen ? L : maxlen;
    }
    int64_t chunk = p->kv_chunk_size;
    if (chunk == 0) {
        /* split only when there are too few items to keep every thread busy */
        chunk = INT32_MAX;
        if (nt > 1 && base > 0 && base < 8 * (int64_t)nt) {
            int64_t nsplit = (8 * (int64_t)nt + base - 1) / base;
            chunk = (maxlen + nsplit - 1) / nsplit;
            if (chunk < 256) chunk = 256;
        }
    }
    /* Plan: items, merges, partial rows. */
    int64_t nitems = 0, nmerges = 0, nparts = 0;
    for (int32_t s = 0; s < kv->num_seqs; s++) {
        int32_t L = kvp_paged_kv_seq_len(kv, s), nq = qo_indptr ? qo_indptr[s + 1] - qo_indptr[s] : 1;
        int64_t groups = (int64_t)((nq + qt - 1) / qt) * ((hkv + hpi(nq) - 1) / hpi(nq)) * ((group + ng - 1) / ng);
        int64_t nc = L > chunk ? (L + chunk - 1) / chunk : 1;
        nitems += groups * nc;
        if (nc > 1) {
            nmerges += groups;
            nparts += nc * (int64_t)nq * hq; /* every row of the sequence, nc times */
        }
    }
    item_t *items = kvp_malloc((size_t)(nitems + 1) * sizeof *items);
    merge_t *merges = kvp_malloc((size_t)(nmerges + 1) * sizeof *merges);
    float *part_o = kvp_malloc((size_t)(nparts + 1) * (size_t)D * sizeof(float));
    float *part_lse = kvp_malloc((size_t)(nparts + 1) * sizeof(float));
    if (!items || !merges || !part_o || !part_lse) {
        kvp_free(items);
        kvp_free(merges);
        kvp_free(part_o);
        kvp_free(part_lse);
        return KVP_ERR(KVP_ENOMEM, "%s: out of memory for the work plan (%lld items, %lld partial rows)", what,
                       (long long)nitems, (long long)nparts);
    }
    int64_t ni = 0, nm = 0, np = 0;
    for (int32_t s = 0; s < kv->num_seqs; s++) {
        int32_t L = kvp_paged_kv_seq_len(kv, s), nq = qo_indptr ? qo_indptr[s + 1] - qo_indptr[s] : 1;
        int64_t nc = L > chunk ? (L + chunk - 1) / chunk : 1;
        const int32_t hs = hpi(nq);
        for (int32_t q0 = 0; q0 < nq; q0 += qt)
            for (int32_t h = 0; h < hkv; h += hs)
                for (int32_t g0 = 0; g0 < group; g0 += ng) {
                    int32_t tq = nq - q0 < qt ? nq - q0 : qt, tg = group - g0 < ng ? group - g0 : ng;
                    int32_t th = hkv - h < hs ? hkv - h : hs;
                    int64_t part = -1, rows = (int64_t)tq * tg * th;
                    if (nc > 1) {
                        part = np;
                        merges[nm++] = (merge_t){s, h, th, q0, tq, g0, tg, (int32_t)nc, np};
                        np += nc * rows;
                    }
                    for (int64_t c = 0; c < nc; c++) {
                        int32_t c0 = (int32_t)(c * chunk), c1 = (int32_t)((c + 1) * chunk < L ? (c + 1) * chunk : L);
                        if (nc == 1) c0 = 0, c1 = L;
                        items[ni++] = (item_t){s, h, th, q0, tq, g0, tg, c0, c1, part < 0 ? -1 : part + c * rows};
                    }
                }
    }
    const int fp8 = kv->dtype == KVP_DTYPE_FP8_E4M3;
    float sm = p->sm_scale > 0.0f ? p->sm_scale : 1.0f / sqrtf((float)D);
    job_t j = {.kv = kv, .q = q, .out = out, .qo_indptr = qo_indptr, .hq = hq, .group = group,
               .window_left = p->window_left,
               .qscale = sm * 1.4426950408889634f * (fp8 ? kv->k_scale * KVP_FP8_LOAD_SCALE : 1.0f),
               .oscale = fp8 ? kv->v_scale * KVP_FP8_LOAD_SCALE : 1.0f,
               .softcap = p->logits_soft_cap * 1.4426950408889634f,
               .lse = p->lse, .part_o = part_o, .part_lse = part_lse};
    item_fn fn = k_dispatch[kv->dtype][head_dim_index(D)];
#ifdef KVP_BUILD_AVX512
    int score_lanes, value_lanes;
    kvp_attn_lanes_for(kv, qo_indptr == NULL, &score_lanes, &value_lanes);
    if (score_lanes == 16) j.scores16 = k_scores16[kv->dtype][head_dim_index(D)];
    if (value_lanes == 16) j.values16 = k_values16[kv->dtype][head_dim_index(D)], j.tile_exp16 = tile_exp16;
#endif
    int threads = nitems < nt ? (int)(nitems > 0 ? nitems : 1) : nt;
    if (threads == 1) {
        /* one thread (e.g. inside the forward pass's data-parallel groups): no OpenMP team per call, and
         * each item knows its successor (prefetch) */
        for (int64_t i = 0; i < nitems; i++) fn(&j, &items[i], i + 1 < nitems ? &items[i + 1] : NULL);
        for (int64_t i = 0; i < nmerges; i++) merge_rows(&j, &merges[i], D);
    } else {
#pragma omp parallel num_threads(threads)
        {
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < nitems; i++) fn(&j, &items[i], NULL);
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < nmerges; i++) merge_rows(&j, &merges[i], D);
        }
    }
    kvp_free(items);
    kvp_free(merges);
    kvp_free(part_o);
    kvp_free(part_lse);
    return KVP_OK;
#undef hpi
}

kvp_status kvp_attn_decode_cpu(const kvp_paged_kv *kv, const float *q, float *out, const kvp_attn_params *p)
{
    if (kv != NULL)
        for (int32_t s = 0; s < kv->num_seqs && kv->kv_indptr; s++)
            if (kv->kv_indptr[s + 1] <= kv->kv_indptr[s])
                return KVP_ERR(KVP_EINVAL, "decode: sequence %d is empty (decode needs seq_len >= 1)", s);
    return attend(kv, q, NULL, out, p, "decode");
}

kvp_status kvp_attn_prefill_cpu(const kvp_paged_kv *kv, const float *q, const int32_t *qo_indptr, float *out,
                                const kvp_attn_params *p)
{
    if (qo_indptr == NULL) return KVP_ERR(KVP_EINVAL, "prefill: qo_indptr is NULL");
    return attend(kv, q, qo_indptr, out, p, "prefill");
}
