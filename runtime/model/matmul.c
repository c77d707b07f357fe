/* runtime/model/matmul.c — y = x W^T: the batch-invariant kernel (8 and 16 lanes) and OpenBLAS (the parts: model_internal.h).
 *
 * The invariant kernel is the default because OpenBLAS's sgemm rounds a row differently depending on the
 * batch size and on its thread split. Both lane widths give the same bits: one fused multiply-add chain per
 * output, in k order; 16 lanes do twice the multiply-adds a cycle when the weights are reused across rows. */
#include "runtime/model/model_internal.h"

#include <cblas.h>
#include <dirent.h>
#if defined(__FMA__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "attention/attention.h"
#include "common/alloc.h"
#include "common/cpu.h"
#include "common/json.h"
#include "common/timer.h"
#include "parallel/comm.h"
#include "parallel/shard.h"
#include "runtime/loader/gguf.h"
#include "runtime/loader/safetensors.h"

/* ---------------------------------------------------------------- kernels */

/* y (T, N) = x (T, K) . W^T   (W is the [out = N, in = K] weight).
 *
 * The invariant kernel computes every y[t][o] as a chain of multiply-adds in k order,
 * y = mac(x[t][k], W[o][k], y) for k = 0, 1, ..., so a row's result does not depend on T, on the tiling or
 * on the thread split. mac is a fused multiply-add where the target has one (x86-64-v3: the Release build),
 * else a multiply then an add; every row of a build takes the same one. Vector lanes run across outputs,
 * over the packed panels of mat_w (16 outputs x K, contiguous): tiles of 4 rows x 16 outputs keep 8
 * accumulators in registers, a single row takes 4 panels at once (8 independent accumulators). The partial
 * last panel is computed on its zero padding and stored only up to N, so every element goes through the
 * same operations. */

/* Stores a (16)-wide accumulator pair to y[0..ncols). */
MM_INLINE void mm_store16(float *restrict y, const kvp_v8f *a0, const kvp_v8f *a1, int64_t ncols)
{
    if (ncols == KVP_MM_PANEL) {
        V8_ST(y, *a0);
        V8_ST(y + 8, *a1);
        return;
    }
    float tmp[KVP_MM_PANEL];
    V8_ST(tmp, *a0);
    V8_ST(tmp + 8, *a1);
    memcpy(y, tmp, (size_t)ncols * sizeof(float));
}

/* Row k (W[o][k] of the panel's 16 outputs) of panel pan (of type DT, a constant at every call) as two f32
 * vectors: f16 through F16C's conversion, bf16 by a shift into the high half of each lane, Q8_0 as d * q
 * (all exact). */
MM_INLINE void mm_load16(const void *restrict pan, int64_t k, const kvp_weight_type DT, kvp_v8f *w0, kvp_v8f *w1)
{
    if (DT == KVP_WEIGHT_F32) {
        const float *p = (const float *)pan + k * KVP_MM_PANEL;
        V8_LD(*w0, p);
        V8_LD(*w1, p + 8);
        return;
    }
    if (DT == KVP_WEIGHT_Q8_0) {
        const unsigned char *blk = (const unsigned char *)pan + (k / KVP_Q8_BLOCK) * KVP_Q8_BLOCK_BYTES;
        const int8_t *q = (const int8_t *)(blk + KVP_MM_PANEL * sizeof(float)) + (k % KVP_Q8_BLOCK) * KVP_MM_PANEL;
        kvp_v8f d0, d1;
        V8_LD(d0, blk);
        V8_LD(d1, blk + 8 * sizeof(float));
#if defined(__AVX2__)
        __m128i v;
        memcpy(&v, q, sizeof v);
        const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
        memcpy(w0, &q0, sizeof q0);
        memcpy(w1, &q1, sizeof q1);
#else
        float f[KVP_MM_PANEL];
        for (int j = 0; j < KVP_MM_PANEL; j++) f[j] = (float)q[j];
        V8_LD(*w0, f);
        V8_LD(*w1, f + 8);
#endif
        *w0 *= d0;
        *w1 *= d1;
        return;
    }
    const uint16_t *h = (const uint16_t *)pan + k * KVP_MM_PANEL;
#if !(defined(__F16C__) && defined(__AVX2__))
    float f[KVP_MM_PANEL]; /* builds without them (the sanitizer build): the same values, one by one */
    for (int j = 0; j < KVP_MM_PANEL; j++) f[j] = DT == KVP_WEIGHT_F16 ? kvp_f16_to_f32(h[j]) : kvp_bf16_to_f32(h[j]);
    V8_LD(*w0, f);
    V8_LD(*w1, f + 8);
#else
    __m128i lo, hi;
    memcpy(&lo, h, sizeof lo);
    memcpy(&hi, h + 8, sizeof hi);
    __m256 f0, f1;
    if (DT == KVP_WEIGHT_F16) {
        f0 = _mm256_cvtph_ps(lo);
        f1 = _mm256_cvtph_ps(hi);
    } else {
        f0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16));
        f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16));
    }
    memcpy(w0, &f0, sizeof f0);
    memcpy(w1, &f1, sizeof f1);
#endif
}

/* R rows (1..6) x one panel: y[r][0..ncols) for rows x + r*K. */
MM_INLINE void mm_rows_panel(float *restrict y, int64_t ldy, const float *restrict x, int64_t K,
                             const void *restrict pan, int64_t ncols, const int R, const kvp_weight_type DT)
{
    kvp_v8f a[6][2];
    for (int r = 0; r < R; r++) a[r][0] = a[r][1] = (kvp_v8f){0};
    for (int64_t k = 0; k < K; k++) {
        kvp_v8f w0, w1;
        mm_load16(pan, k, DT, &w0, &w1);
        for (int r = 0; r < R; r++) {
            const kvp_v8f b = V8_BC(x[r * K + k]);
            a[r][0] = V8_MAC(a[r][0], b, w0);
            a[r][1] = V8_MAC(a[r][1], b, w1);
        }
    }
    for (int r = 0; r < R; r++) mm_store16(y + r * ldy, &a[r][0], &a[r][1], ncols);
}

/* One row x 4 full panels (64 outputs), panel pan and the 3 after it (pb bytes apart). */
MM_INLINE void mm_row_4panels(float *restrict y, const float *restrict x, int64_t K, const void *restrict pan,
                              size_t pb, const kvp_weight_type DT)
{
    const char *p0 = pan, *p1 = p0 + pb, *p2 = p1 + pb, *p3 = p2 + pb;
    kvp_v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (int64_t k = 0; k < K; k++) {
        const kvp_v8f b = V8_BC(x[k]);
        kvp_v8f w0, w1, w2, w3, w4, w5, w6, w7; /* row k of panels 0..3 */
        mm_load16(p0, k, DT, &w0, &w1);
        mm_load16(p1, k, DT, &w2, &w3);
        mm_load16(p2, k, DT, &w4, &w5);
        mm_load16(p3, k, DT, &w6, &w7);
        a0 = V8_MAC(a0, b, w0);
        a1 = V8_MAC(a1, b, w1);
        a2 = V8_MAC(a2, b, w2);
        a3 = V8_MAC(a3, b, w3);
        a4 = V8_MAC(a4, b, w4);
        a5 = V8_MAC(a5, b, w5);
        a6 = V8_MAC(a6, b, w6);
        a7 = V8_MAC(a7, b, w7);
    }
    V8_ST(y, a0);
    V8_ST(y + 8, a1);
    V8_ST(y + 16, a2);
    V8_ST(y + 24, a3);
    V8_ST(y + 32, a4);
    V8_ST(y + 40, a5);
    V8_ST(y + 48, a6);
    V8_ST(y + 56, a7);
}

/* Calls CALL with DT the constant of w->dt: every kernel is compiled once per weight type. */
#define MM_BY_DTYPE(w, CALL)                                                                                 \
    do {                                                                                                     \
        if ((w)->dt == KVP_WEIGHT_F16) {                                                                     \
            const kvp_weight_type DT = KVP_WEIGHT_F16;                                                       \
            CALL;                                                                                            \
        } else if ((w)->dt == KVP_WEIGHT_BF16) {                                                             \
            const kvp_weight_type DT = KVP_WEIGHT_BF16;                                                      \
            CALL;                                                                                            \
        } else if ((w)->dt == KVP_WEIGHT_Q8_0) {                                                             \
            const kvp_weight_type DT = KVP_WEIGHT_Q8_0;                                                      \
            CALL;                                                                                            \
        } else {                                                                                             \
            const kvp_weight_type DT = KVP_WEIGHT_F32;                                                       \
            CALL;                                                                                            \
        }                                                                                                    \
    } while (0)

/* Panel p of w. */
static const void *mm_panel(const mat_w *w, int64_t p)
{
    return (const char *)w->p + (size_t)p * mdl_panel_bytes(w->dt, w->K);
}

/* Columns of panel p of w (16 but in the last). */
static int64_t panel_cols(const mat_w *w, int64_t p)
{
    return w->N - p * KVP_MM_PANEL < KVP_MM_PANEL ? w->N - p * KVP_MM_PANEL : KVP_MM_PANEL;
}

/* R = 2..6 rows x panel p (6 rows: 12 accumulators, 8 loads per 12 multiply-adds; 4 rows: 6 per 8). */
static void mm_tile(float *restrict y, int64_t ldy, const float *restrict x, const mat_w *w, int64_t p, int R)
{
    const void *pan = mm_panel(w, p);
    const int64_t ncols = panel_cols(w, p);
    const int64_t K = w->K;
    switch (R) {
    case 6: MM_BY_DTYPE(w, mm_rows_panel(y, ldy, x, K, pan, ncols, 6, DT)); break;
    case 4: MM_BY_DTYPE(w, mm_rows_panel(y, ldy, x, K, pan, ncols, 4, DT)); break;
    case 3: MM_BY_DTYPE(w, mm_rows_panel(y, ldy, x, K, pan, ncols, 3, DT)); break;
    default: MM_BY_DTYPE(w, mm_rows_panel(y, ldy, x, K, pan, ncols, 2, DT)); break;
    }
}

/* One row, panels p0 .. p1-1 (4 full panels at a time, then one by one). */
static void mm_row_panels(float *restrict y, const float *restrict x, const mat_w *w, int64_t p0, int64_t p1)
{
    const int64_t K = w->K, N = w->N, full = N / KVP_MM_PANEL;
    int64_t p = p0;
    const size_t pb = mdl_panel_bytes(w->dt, K);
    for (; p + 4 <= p1 && p + 4 <= full; p += 4)
        MM_BY_DTYPE(w, mm_row_4panels(y + p * KVP_MM_PANEL, x, K, mm_panel(w, p), pb, DT));
    for (; p < p1; p++) {
        int64_t o = p * KVP_MM_PANEL, nc = N - o < KVP_MM_PANEL ? N - o : KVP_MM_PANEL;
        MM_BY_DTYPE(w, mm_rows_panel(y + o, 0, x, K, mm_panel(w, p), nc, 1, DT));
    }
}

/* The row tiles on 16-lane vectors (AVX-512F, chosen at run time where the CPU has it): one panel row is one
 * vector, so a tile of R rows over two panels keeps 2R accumulators (R up to 12). Every output goes through the
 * same fused multiply-add chain in k order as on 8 lanes: the results are the same bits
 * (tests/runtime/test_model_forward.c compares the two). Single rows keep the 8-lane kernel: a row's chains wait on the
 * multiply-add latency, and two 8-lane chains per panel keep twice as many going as one 16-lane chain. */
#ifdef KVP_BUILD_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f")
/* Row k of panel pan (type DT) as one 16-lane f32 vector. */
MM_INLINE __m512 mm512_load16(const void *restrict pan, int64_t k, const kvp_weight_type DT)
{
    if (DT == KVP_WEIGHT_F32) return _mm512_loadu_ps((const float *)pan + k * KVP_MM_PANEL);
    if (DT == KVP_WEIGHT_Q8_0) {
        const unsigned char *blk = (const unsigned char *)pan + (k / KVP_Q8_BLOCK) * KVP_Q8_BLOCK_BYTES;
        const int8_t *q = (const int8_t *)(blk + KVP_MM_PANEL * sizeof(float)) + (k % KVP_Q8_BLOCK) * KVP_MM_PANEL;
        const __m512 qf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
        return _mm512_mul_ps(qf, _mm512_loadu_ps((const float *)blk));
    }
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)pan + k * KVP_MM_PANEL));
    if (DT == KVP_WEIGHT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* R rows (up to 12) x NP panels (1 or 2): pan, then (NP 2) the one pb bytes after it, a full panel first;
 * y[r][0..ncols) of the last panel, for rows x + r*K. With two panels each broadcast x element feeds two
 * multiply-adds: 14 loads per 24, against 13 per 12 with one. */
MM_INLINE void mm512_rows_panels(float *restrict y, int64_t ldy, const float *restrict x, int64_t K,
                                 const void *restrict pan, size_t pb, int64_t ncols, const int R, const int NP,
                                 const kvp_weight_type DT)
{
    __m512 a[2][12];
    const void *pan1 = (const char *)pan + pb;
    for (int r = 0; r < R; r++) a[0][r] = a[1][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m512 w0 = mm512_load16(pan, k, DT), w1 = NP == 2 ? mm512_load16(pan1, k, DT) : w0;
        for (int r = 0; r < R; r++) {
            const __m512 xb = _mm512_set1_ps(x[r * K + k]);
            a[0][r] = _mm512_fmadd_ps(xb, w0, a[0][r]);
            if (NP == 2) a[1][r] = _mm512_fmadd_ps(xb, w1, a[1][r]);
        }
    }
    const __mmask16 keep = (__mmask16)((1u << ncols) - 1u);
    for (int r = 0; r < R; r++) {
        if (NP == 2) _mm512_storeu_ps(y + r * ldy, a[0][r]);
        _mm512_mask_storeu_ps(y + r * ldy + (NP - 1) * KVP_MM_PANEL, keep, a[NP - 1][r]);
    }
}

/* R = 4, 8 or 12 rows x NP panels from p. */
MM_INLINE void mm512_tile_np(float *restrict y, int64_t ldy, const float *restrict x, const mat_w *w, int64_t p,
                             int R, const int NP)
{
    const void *pan = mm_panel(w, p);
    const int64_t K = w->K, nc = panel_cols(w, p + NP - 1);
    const size_t pb = mdl_panel_bytes(w->dt, K);
    switch (R) {
    case 12: MM_BY_DTYPE(w, mm512_rows_panels(y, ldy, x, K, pan, pb, nc, 12, NP, DT)); break;
    case 8: MM_BY_DTYPE(w, mm512_rows_panels(y, ldy, x, K, pan, pb, nc, 8, NP, DT)); break;
    default: MM_BY_DTYPE(w, mm512_rows_panels(y, ldy, x, K, pan, pb, nc, 4, NP, DT)); break;
    }
}

/* R = 4, 8 or 12 rows x panels p and p + 1, or p alone when it is the last. */
static void mm512_tile(float *restrict y, int64_t ldy, const float *restrict x, const mat_w *w, int64_t p, int R)
{
    if (p + 1 < (w->N + KVP_MM_PANEL - 1) / KVP_MM_PANEL) mm512_tile_np(y, ldy, x, w, p, R, 2);
    else mm512_tile_np(y, ldy, x, w, p, R, 1);
}

#pragma GCC pop_options
#endif

typedef void (*mm_tile_fn)(float *restrict, int64_t, const float *restrict, const mat_w *, int64_t, int);

/* Threads for a product of T rows with w: all of them from 1 MiB of weights for one row (worth a fork/join),
 * else one. */
static int matmul_threads(int threads, int64_t T, const mat_w *w)
{
    return T * w->N * w->K >= (1 << 18) ? threads : 1;
}

/* The invariant matmul over T rows, on 8 lanes or (wide) 16, in column units of one panel (8 lanes) or two
 * (16 lanes: each broadcast input feeds two panels' multiply-adds; the last unit may hold one). When large
 * enough, tiles of 4 (wide: 8) rows per unit split over `threads`, then the remaining rows with their panels
 * split over the threads in runs of 4 (a single row of a model whose weights do not fit in cache is bound by
 * reading them: one core alone does not reach the machine's bandwidth); on one thread tiles of 6 then 4 rows
 * (wide: 12, 8, 4) per unit, then 2 or 3 rows, a single row across several panels at once (8 lanes). Every
 * output goes through the same multiply-add chain whatever the split, the unit and the lanes. */
static void matmul_inv(int threads, int wide, float *y, const float *x, const mat_w *w, int64_t T)
{
    const int64_t K = w->K, N = w->N, np = (N + KVP_MM_PANEL - 1) / KVP_MM_PANEL;
    mm_tile_fn tile = mm_tile;
    int ps = 1; /* panels a unit */
#ifdef KVP_BUILD_AVX512
    if (wide) tile = mm512_tile, ps = 2;
#endif
    const int64_t nu = (np + ps - 1) / ps, uw = ps * KVP_MM_PANEL; /* units, a unit's columns */
    const int RT = wide ? 8 : 4; /* rows of a tile in the threaded split */
    const int64_t ntb = T / RT;
    const int nt = matmul_threads(threads, T, w);
    if (nt > 1) {
        if (ntb > 0) {
#pragma omp parallel for num_threads(nt) schedule(static) collapse(2)
            for (int64_t u = 0; u < nu; u++)
                for (int64_t tb = 0; tb < ntb; tb++) tile(y + tb * RT * N + u * uw, N, x + tb * RT * K, w, u * ps, RT);
        }
        if (ntb * RT < T) {
            const int64_t runs = (np + 3) / 4; /* runs of 4 panels, split evenly */
#pragma omp parallel for num_threads(nt) schedule(static)
            for (int c = 0; c < nt; c++) {
                int64_t p0 = 4 * (runs * c / nt), p1 = 4 * (runs * (c + 1) / nt);
                if (p1 > np) p1 = np;
                for (int64_t t = ntb * RT; t < T; t++) mm_row_panels(y + t * N, x + t * K, w, p0, p1);
            }
        }
        return;
    }
    /* one thread: row tiles per unit. 8 lanes: 6 rows (12 accumulators), then 4 (twice rather than
     * leave 2 or 3 behind 6s: 32 = 4 x 6 + 2 x 4); 16 lanes: 12 rows, then 8, then 4 (2R accumulators each);
     * then a pair or a triple on 8 lanes. A single row left takes several panels at once. */
    const int big = wide ? 12 : 6;
    int64_t n_big = T / big, n8 = 0, n4 = 0, left = T % big;
    if (wide) {
        n8 = left >= 8;
        left -= 8 * n8;
        n4 = left >= 4;
        left -= 4 * n4;
    } else if ((left == 2 || left == 3) && n_big > 0) {
        n_big--;
        n4 = 2;
        left -= 2;
    } else if (left >= 4) {
        n4 = 1;
        left -= 4;
    }
    const int64_t t8 = n_big * big, t4 = t8 + n8 * 8, tl = t4 + n4 * 4;
    for (int64_t u = 0; u < nu; u++) {
        const int64_t o = u * uw, p = u * ps;
        for (int64_t tb = 0; tb < n_big; tb++) tile(y + tb * big * N + o, N, x + tb * big * K, w, p, big);
        if (n8) tile(y + t8 * N + o, N, x + t8 * K, w, p, 8);
        for (int64_t tb = 0; tb < n4; tb++) tile(y + (t4 + tb * 4) * N + o, N, x + (t4 + tb * 4) * K, w, p, 4);
        for (int64_t q = p; left >= 2 && q < p + ps && q < np; q++) /* 8 lanes: 2 chains a row */
            mm_tile(y + tl * N + q * KVP_MM_PANEL, N, x + tl * K, w, q, (int)left);
    }
    if (left == 1) mm_row_panels(y + tl * N, x + tl * K, w, 0, np);
}

void mdl_matmul(const kvp_model *m, int threads, float *y, const float *x, const mat_w *w, int64_t T)
{
    if (m->matmul == KVP_MATMUL_BLAS) {
        /* OpenBLAS's threads as the invariant kernel's: on a smaller product they cost more than they bring
         * (stories260K single-stream on 2 threads: 25,300 - 36,900 tok/s, against 48,700 on one). Inside the
         * data-parallel groups threads is 1 and so is OpenBLAS's count already, so the groups never set it. */
        const int nt = matmul_threads(threads, T, w);
        if (openblas_get_num_threads() != nt) openblas_set_num_threads(nt);
        if (T == 1) { /* y = Wt^T x: a matrix-vector product (sgemm with one row is ~3x slower) */
            cblas_sgemv(CblasRowMajor, CblasTrans, (int)w->K, (int)w->N, 1.0f, w->t, (int)w->N, x, 1, 0.0f, y, 1);
            return;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)w->N, (int)w->K, 1.0f, x, (int)w->K, w->t,
                    (int)w->N, 0.0f, y, (int)w->N);
        return;
    }
    matmul_inv(threads, m->lanes == 16, y, x, w, T);
}

/* exp(x) on 16 lanes (Cephes expf: 2^n * p(r), |r| <= ln2/2, about 1 ulp), x clamped to [-87, 88] so 2^n
 * stays a normal float; NaN lanes stay NaN. Plain vector operations, no FMA: the same bits in every build. */
