/* The cuda executor's device side (runtime/executor/cuda_executor.h, cuda/cuda_dev.h): every kernel against
 * the CPU op it mirrors, and the stories260K golden stories token for token through the executor and through
 * `kvpage generate --device cuda` (kvp_cmd_generate). Built twice by kvp_cuda_test: runtime_test_cuda_exec_emu
 * on the CPU emulator of CUDA (CI), runtime_test_cuda_exec natively (skipped without a device). */
#include "common/kvp_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "common/alloc.h"
#include "common/json.h"
#include "cuda_testutil.h"
#include "generate_testutil.h"
#include "golden_testutil.h"
#include "runtime/executor/cuda/cuda_dev.h"
#include "runtime/executor/cuda_executor.h"
#include "runtime/model/model_export.h"
#include "runtime/model/model_internal.h"

#define S260 "../shared/models/stories260K"


static void fill(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = frand();
}

static void close_to(const float *got, const float *want, int64_t n, double tol, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs((double)got[i] - want[i]) <= tol * (1 + fabs((double)want[i])), "%s[%lld]: %.7g, want %.7g",
                  what, (long long)i, got[i], want[i]);
}

Test(cuda_exec_kernels, rmsnorm_per_token_per_head_and_gathered)
{
    open_dev();
    enum { T = 5, H = 72, G = 3 };
    float x[T * H], w[H], out[T * H], want[T * H];
    fill(x, T * H);
    fill(w, H);
    float *dx = up(x, sizeof x), *dw = up(w, sizeof w), *dout = up(x, sizeof x);
    cr_assert_eq(kvp_cudev_rmsnorm(dev, dout, H, dx, H, dw, T, 1, H, 1e-5f, NULL), KVP_OK);
    down(out, dout, sizeof out);
    for (int t = 0; t < T; t++) mdl_rmsnorm(want + t * H, x + t * H, w, H, 1e-5);
    close_to(out, want, T * H, 1e-5, "rmsnorm");
    /* per head (qwen3's q_norm): G heads of H / G at a token stride of H, in place */
    float *dy = up(x, sizeof x);
    cr_assert_eq(kvp_cudev_rmsnorm(dev, dy, H, dy, H, dw, T, G, H / G, 1e-6f, NULL), KVP_OK);
    down(out, dy, sizeof out);
    for (int t = 0; t < T; t++)
        for (int g = 0; g < G; g++) mdl_rmsnorm(want + t * H + g * (H / G), x + t * H + g * (H / G), w, H / G, 1e-6);
    close_to(out, want, T * H, 1e-5, "rmsnorm per head");
    /* the final norm gathers the logits rows */
    const int32_t rows[2] = {4, 1};
    int32_t *drows = up(rows, sizeof rows);
    cr_assert_eq(kvp_cudev_rmsnorm(dev, dout, H, dx, H, dw, 2, 1, H, 1e-5f, drows), KVP_OK);
    down(out, dout, 2 * H * sizeof(float));
    mdl_rmsnorm(want, x + 4 * H, w, H, 1e-5);
    mdl_rmsnorm(want + H, x + 1 * H, w, H, 1e-5);
    close_to(out, want, 2 * H, 1e-5, "rmsnorm gathered");
    kvp_cudev_free(dev, dx), kvp_cudev_free(dev, dw), kvp_cudev_free(dev, dout), kvp_cudev_free(dev, dy);
    kvp_cudev_free(dev, drows);
    close_dev();
}

/* RoPE of both styles, partial rotary (rot < head_dim), at a token stride wider than the heads. */
Test(cuda_exec_kernels, rope_pairs_halves_partial)
{
    open_dev();
    enum { T = 3, NH = 4, HD = 16, TS = NH * HD + 8 };
    for (int style = 0; style < 2; style++)
        for (int rot = 8; rot <= HD; rot += 8) {
            float v[T * TS], cs[T * HD], out[T * TS], want[T * TS];
            fill(v, T * TS);
            double inv[HD / 2];
            for (int i = 0; i < rot / 2; i++) inv[i] = 1.0 / pow(10000.0, 2.0 * i / rot);
            for (int t = 0; t < T; t++) kvp_model_rope_angles(inv, rot, 0.9, 7 * t + 3, cs + t * rot);
            float *dv = up(v, sizeof v), *dcs = up(cs, sizeof cs);
            cr_assert_eq(kvp_cudev_rope(dev, dv, TS, T, NH, HD, rot, style, dcs), KVP_OK);
            down(out, dv, sizeof out);
            kvp_model m;
            memset(&m, 0, sizeof m);
            m.cfg.head_dim = HD;
            m.rot = rot;
            m.rope = style == 0 ? KVP_ROPE_PAIRS : KVP_ROPE_HALF;
            memcpy(want, v, sizeof v);
            for (int t = 0; t < T; t++) mdl_rope(&m, want + t * TS, NH, cs + t * rot);
            close_to(out, want, T * TS, 1e-6, style ? "rope halves" : "rope pairs");
            kvp_cudev_free(dev, dv), kvp_cudev_free(dev, dcs);
        }
    close_dev();
}

Test(cuda_exec_kernels, glu_softcap_add_bias)
{
    open_dev();
    enum { T = 3, N = 37 };
    float gu[T * 2 * N], out[T * N], want[T * N];
    fill(gu, T * 2 * N);
    for (int i = 0; i < T * 2 * N; i++) gu[i] *= 4;
    float *dgu = up(gu, sizeof gu), *dout = up(out, sizeof out);
    for (int act = KVP_ACT_SILU; act <= KVP_ACT_GELU; act++) {
        cr_assert_eq(kvp_cudev_glu(dev, act, dout, dgu, dgu + N, 2 * N, T, N), KVP_OK);
        down(out, dout, sizeof out);
        for (int t = 0; t < T; t++) {
            float g[N], u[N];
            memcpy(g, gu + t * 2 * N, sizeof g);
            memcpy(u, gu + t * 2 * N + N, sizeof u);
            mdl_glu(act, g, u, N);
            memcpy(want + t * N, g, sizeof g);
        }
        close_to(out, want, T * N, 2e-6, "glu");
    }
    memcpy(want, out, sizeof out);
    mdl_softcap(want, T * N, 3.0);
    cr_assert_eq(kvp_cudev_softcap(dev, dout, T * N, 3.0f), KVP_OK);
    float capped[T * N];
    down(capped, dout, sizeof capped);
    close_to(capped, want, T * N, 1e-6, "softcap");
    float b[N];
    fill(b, N);
    float *db = up(b, sizeof b);
    cr_assert_eq(kvp_cudev_bias(dev, dgu, 2 * N, db, T, N), KVP_OK);
    cr_assert_eq(kvp_cudev_add(dev, dgu + N, dgu, N), KVP_OK); /* row 0: u += g + b */
    float back[T * 2 * N];
    down(back, dgu, sizeof back);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < N; i++) cr_assert_float_eq(back[t * 2 * N + i], gu[t * 2 * N + i] + b[i], 1e-6);
    for (int i = 0; i < N; i++) cr_assert_float_eq(back[N + i], gu[N + i] + gu[i] + b[i], 1e-6);
    kvp_cudev_free(dev, dgu), kvp_cudev_free(dev, dout), kvp_cudev_free(dev, db);
    close_dev();
}

/* y = x W^T with f32 and bf16 weights, x read at a row stride wider than K, against a double loop over the
 * same (rounded) values. */
Test(cuda_exec_kernels, gemm_f32_and_bf16)
{
    open_dev();
    enum { T = 4, N = 19, K = 33, LDX = 40 };
    float x[T * LDX], w[N * K], y[T * N];
    fill(x, T * LDX);
    fill(w, N * K);
    uint16_t wb[N * K];
    for (int i = 0; i < N * K; i++) wb[i] = kvp_f32_to_bf16(w[i]);
    void *scratch;
    cr_assert_eq(kvp_cudev_malloc(dev, &scratch, T * K * 2, "scratch"), KVP_OK);
    float *dx = up(x, sizeof x), *dy = up(y, sizeof y);
    void *dw = up(w, sizeof w), *dwb = up(wb, sizeof wb);
    for (int bf = 0; bf < 2; bf++) {
        cr_assert_eq(kvp_cudev_gemm(dev, dy, N, dx, LDX, bf ? dwb : dw, bf ? KVP_DTYPE_BF16 : KVP_DTYPE_F32, T, N, K,
                                    scratch),
                     KVP_OK, "%s", kvp_error_detail());
        down(y, dy, sizeof y);
        for (int t = 0; t < T; t++)
            for (int o = 0; o < N; o++) {
                double s = 0;
                for (int k = 0; k < K; k++) {
                    const float xv = bf ? kvp_bf16_to_f32(kvp_f32_to_bf16(x[t * LDX + k])) : x[t * LDX + k];
                    s += (double)xv * (bf ? kvp_bf16_to_f32(wb[o * K + k]) : w[o * K + k]);
                }
                cr_assert(fabs(y[t * N + o] - s) <= 1e-5 * (1 + fabs(s)), "%s y[%d][%d] = %g, want %g",
                          bf ? "bf16" : "f32", t, o, y[t * N + o], s);
            }
    }
    cr_assert_eq(kvp_cudev_gemm(dev, dy, N, dx, LDX, dw, KVP_DTYPE_F16, T, N, K, scratch), KVP_EUNSUPPORTED);
    kvp_cudev_free(dev, dx), kvp_cudev_free(dev, dy), kvp_cudev_free(dev, dw), kvp_cudev_free(dev, dwb);
    kvp_cudev_free(dev, scratch);
    close_dev();
}

/* The tiled GEMM of --deterministic (kvp_cudev_set_invariant_gemm): 37 rows (two full tiles and a partial
 * one; N past a block's columns, K past a chunk), f32 and bf16 weights, y at a stride wider than N, within
 * 1e-5 of the double loop; the same rows alone, and in reverse order, give the same bits (batch invariance:
 * what cuBLAS does not promise); under the emulator the default stand-in's bits too. Rows of y past T are not
 * written. */
Test(cuda_exec_kernels, tiled_gemm_is_batch_invariant)
{
    open_dev();
    enum { T = 37, N = 150, K = 70, LDX = 72, LDY = 152 };
    static float x[T * LDX], xr[T * LDX], w[N * K], y[(T + 1) * LDY], y1[LDY], yr[T * LDY], ys[T * LDY];
    static uint16_t wb[N * K];
    fill(x, T * LDX);
    fill(w, N * K);
    for (int i = 0; i < N * K; i++) wb[i] = kvp_f32_to_bf16(w[i]);
    for (int t = 0; t < T; t++) memcpy(xr + t * LDX, x + (T - 1 - t) * LDX, sizeof(float) * LDX);
    void *scratch;
    cr_assert_eq(kvp_cudev_malloc(dev, &scratch, T * K * 2, "scratch"), KVP_OK);
    float *dx = up(x, sizeof x), *dxr = up(xr, sizeof xr), *dy = up(y, sizeof y);
    void *dw = up(w, sizeof w), *dwb = up(wb, sizeof wb);
    for (int bf = 0; bf < 2; bf++) {
        const void *W = bf ? dwb : dw;
        const kvp_dtype wd = bf ? KVP_DTYPE_BF16 : KVP_DTYPE_F32;
        kvp_cudev_set_invariant_gemm(dev, 0);
        cr_assert_eq(kvp_cudev_gemm(dev, dy, LDY, dx, LDX, W, wd, T, N, K, scratch), KVP_OK, "%s", kvp_error_detail());
        down(ys, dy, sizeof ys);
        kvp_cudev_set_invariant_gemm(dev, 1);
        cr_assert_eq(kvp_cudev_memset(dev, dy, 0xFF, sizeof y), KVP_OK);
        cr_assert_eq(kvp_cudev_gemm(dev, dy, LDY, dx, LDX, W, wd, T, N, K, NULL), KVP_OK, "%s", kvp_error_detail());
        down(y, dy, sizeof y);
        for (int i = 0; i < LDY; i++) {
            uint32_t u;
            memcpy(&u, &y[T * LDY + i], 4);
            cr_assert_eq(u, 0xFFFFFFFFu, "row %d of y written", T);
        }
        for (int t = 0; t < T; t++)
            for (int o = 0; o < N; o++) {
                double s = 0;
                for (int k = 0; k < K; k++) {
                    const float xv = bf ? kvp_bf16_to_f32(kvp_f32_to_bf16(x[t * LDX + k])) : x[t * LDX + k];
                    s += (double)xv * (bf ? kvp_bf16_to_f32(wb[o * K + k]) : w[o * K + k]);
                }
                cr_assert(fabs(y[t * LDY + o] - s) <= 1e-5 * (1 + fabs(s)), "%s y[%d][%d] = %g, want %g",
                          bf ? "bf16" : "f32", t, o, y[t * LDY + o], s);
                if (dev_info.emulated) cr_assert_eq(y[t * LDY + o], ys[t * LDY + o], "the emulator's stand-in differs");
            }
        for (int t = 0; t < T; t += 5) { /* one row alone */
            cr_assert_eq(kvp_cudev_gemm(dev, dy, LDY, dx + t * LDX, LDX, W, wd, 1, N, K, NULL), KVP_OK);
            down(y1, dy, sizeof y1);
            cr_assert_eq(memcmp(y1, y + t * LDY, sizeof(float) * N), 0, "%s row %d alone differs", bf ? "bf16" : "f32", t);
        }
        cr_assert_eq(kvp_cudev_gemm(dev, dy, LDY, dxr, LDX, W, wd, T, N, K, NULL), KVP_OK);
        down(yr, dy, sizeof yr);
        for (int t = 0; t < T; t++)
            cr_assert_eq(memcmp(yr + t * LDY, y + (T - 1 - t) * LDY, sizeof(float) * N), 0, "%s row %d reversed differs",
                         bf ? "bf16" : "f32", t);
    }
    kvp_cudev_free(dev, dx), kvp_cudev_free(dev, dxr), kvp_cudev_free(dev, dy), kvp_cudev_free(dev, dw);
    kvp_cudev_free(dev, dwb), kvp_cudev_free(dev, scratch);
    close_dev();
}

/* append_kv through a slot mapping (-1 skipped) and the per-row attention over a random page table against
 * kvp_attn_append_kv_cpu and kvp_attn_decode_cpu, GQA 2, f32, f16 and fp8 pools, a window and a soft cap; unused
 * slots hold NaN on both sides (a kernel that reads one fails). */
Test(cuda_exec_kernels, append_and_attention_match_the_cpu_kernels)
{
    open_dev();
    enum { NB = 9, NKV = 2, NQ = 4, BS = 3, HD = 8, L = 11, PAGES = (L + BS - 1) / BS };
    const int32_t pages[PAGES] = {7, 2, 5, 0};
    for (int dt = 0; dt < 3; dt++)
        for (int variant = 0; variant < 3; variant++) {
            const kvp_dtype kd = dt == 2 ? KVP_DTYPE_FP8_E4M3 : dt ? KVP_DTYPE_F16 : KVP_DTYPE_F32;
            const size_t es = kvp_dtype_size(kd), pool = (size_t)NB * NKV * BS * HD * es;
            /* CPU side */
            kvp_paged_kv cpu;
            cr_assert_eq(kvp_paged_kv_init(&cpu, kd, NB, NKV, BS, HD), KVP_OK, "%s", kvp_error_detail());
            cr_assert_eq(kvp_paged_kv_alloc_pools(&cpu), KVP_OK);
            memset(cpu.k, 0xFF, pool), memset(cpu.v, 0xFF, pool);
            float k[L * NKV * HD], v[L * NKV * HD], q[L * NQ * HD];
            fill(k, L * NKV * HD), fill(v, L * NKV * HD), fill(q, L * NQ * HD);
            int64_t slots[L];
            for (int t = 0; t < L; t++) slots[t] = (int64_t)pages[t / BS] * BS + t % BS;
            cr_assert_eq(kvp_attn_append_kv_cpu(&cpu, k, v, slots, L), KVP_OK);
            /* device side */
            void *dk, *dv;
            cr_assert_eq(kvp_cudev_malloc(dev, &dk, pool, "k"), KVP_OK);
            cr_assert_eq(kvp_cudev_malloc(dev, &dv, pool, "v"), KVP_OK);
            cr_assert_eq(kvp_cudev_memset(dev, dk, 0xFF, pool), KVP_OK);
            cr_assert_eq(kvp_cudev_memset(dev, dv, 0xFF, pool), KVP_OK);
            kvp_cudev_pool p = {.k = dk, .v = dv, .dtype = kd, .num_blocks = NB, .nkv = NKV, .block_size = BS, .hd = HD};
            int64_t dslots_h[L + 1];
            memcpy(dslots_h, slots, sizeof slots);
            dslots_h[L] = -1; /* a padding row: written nowhere */
            float kk[(L + 1) * NKV * HD], vv[(L + 1) * NKV * HD];
            memcpy(kk, k, sizeof k), memcpy(vv, v, sizeof v);
            for (int i = 0; i < NKV * HD; i++) kk[L * NKV * HD + i] = vv[L * NKV * HD + i] = 1e30f;
            float *dkk = up(kk, sizeof kk), *dvv = up(vv, sizeof vv);
            int64_t *ds = up(dslots_h, sizeof dslots_h);
            cr_assert_eq(kvp_cudev_append_kv(dev, &p, dkk, dvv, NKV * HD, ds, L + 1), KVP_OK);
            unsigned char *back = kvp_malloc(pool);
            down(back, dk, pool);
            cr_assert_eq(memcmp(back, cpu.k, pool), 0, "the K pools differ");
            down(back, dv, pool);
            cr_assert_eq(memcmp(back, cpu.v, pool), 0, "the V pools differ");
            kvp_free(back);
            /* attention of every row over its prefix (the expanded page table of forward.c) */
            kvp_attn_params ap = kvp_attn_default_params(NQ);
            ap.kv_chunk_size = 1 << 30;
            if (variant == 1) ap.window_left = 3;
            if (variant == 2) ap.logits_soft_cap = 1.5f, ap.sm_scale = 0.7f;
            int32_t x_indptr[L + 1], x_indices[L * PAGES], x_last[L], kv_begin[L], len[L];
            int at = 0;
            for (int t = 0; t < L; t++) {
                x_indptr[t] = at;
                for (int i = 0; i <= t / BS; i++) x_indices[at++] = pages[i];
                x_last[t] = t % BS + 1;
                kv_begin[t] = 0;
                len[t] = t + 1;
            }
            x_indptr[L] = at;
            kvp_paged_kv_set_pages(&cpu, L, x_indptr, x_indices, x_last);
            float want[L * NQ * HD], got[L * NQ * HD];
            cr_assert_eq(kvp_attn_decode_cpu(&cpu, q, want, &ap), KVP_OK, "%s", kvp_error_detail());
            float *dq = up(q, sizeof q), *dout = up(got, sizeof got);
            int32_t *dbeg = up(kv_begin, sizeof kv_begin), *dlen = up(len, sizeof len), *didx = up(pages, sizeof pages);
            const float sm = ap.sm_scale > 0 ? ap.sm_scale : 1.0f / sqrtf((float)HD);
            cr_assert_eq(kvp_cudev_attention(dev, &p, dq, NQ * HD, dout, L, NQ, dbeg, dlen, didx, ap.window_left, sm,
                                             ap.logits_soft_cap),
                         KVP_OK, "%s", kvp_error_detail());
            down(got, dout, sizeof got);
            close_to(got, want, L * NQ * HD, 2e-5, "attention");
            void *ps[] = {dk, dv, dkk, dvv, ds, dq, dout, dbeg, dlen, didx};
            for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvp_cudev_free(dev, ps[i]);
            kvp_paged_kv_free_pools(&cpu);
        }
    close_dev();
}

/* attention/cuda's paged kernels behind the executor (kvp_cudev_paged_attention) against its rowwise kernel
 * (itself checked against the CPU above): a mixed step (a prefill chunk, two decodes; prefill kernel), a decode
 * step with a padding sequence (split-KV decode kernel), q read from a wider fused QKV row; f32, f16, bf16 and
 * fp8 pools, plain, a window, soft cap with sm_scale. */
Test(cuda_exec_kernels, paged_kernels_match_the_rowwise_kernel)
{
    open_dev();
    enum { NB = 12, NKV = 2, NQ = 4, BS = 4, HD = 8, QTS = NQ * HD + 2 * NKV * HD, NS = 3, T = 6 };
    /* seq 0: 9 cached + 4 new (13 tokens: pages 3 1 8 0); seq 1: 6 tokens, decode (pages 5 2); seq 2: 1 token,
     * decode (page 9) */
    const int32_t indices[8] = {3, 1, 8, 0, 5, 2, 9, 11}; /* 11: the padding sequence's page */
    const int32_t lens[NS] = {13, 6, 1}, nq_of[NS] = {4, 1, 1};
    for (int dt = 0; dt < 4; dt++)
        for (int variant = 0; variant < 3; variant++) {
            const kvp_dtype kd = dt == 0 ? KVP_DTYPE_F32 : dt == 1 ? KVP_DTYPE_F16 : dt == 2 ? KVP_DTYPE_BF16
                                                                                               : KVP_DTYPE_FP8_E4M3;
            cr_assert(kvp_cudev_paged_supported(kd, HD));
            const size_t pool = (size_t)NB * NKV * BS * HD * kvp_dtype_size(kd);
            void *dk, *dv;
            cr_assert_eq(kvp_cudev_malloc(dev, &dk, pool, "k"), KVP_OK);
            cr_assert_eq(kvp_cudev_malloc(dev, &dv, pool, "v"), KVP_OK);
            /* every slot of the pools random (written through append: slot = block * BS + offset) */
            enum { SLOTS = NB * BS };
            float *kvh = kvp_malloc(sizeof(float) * SLOTS * NKV * HD * 2);
            fill(kvh, (int64_t)SLOTS * NKV * HD * 2);
            int64_t slots[SLOTS];
            for (int i = 0; i < SLOTS; i++) slots[i] = i;
            float *dkv = up(kvh, sizeof(float) * SLOTS * NKV * HD * 2);
            int64_t *dsl = up(slots, sizeof slots);
            kvp_cudev_pool p = {.k = dk, .v = dv, .dtype = kd, .num_blocks = NB, .nkv = NKV, .block_size = BS, .hd = HD};
            cr_assert_eq(kvp_cudev_append_kv(dev, &p, dkv, dkv + NKV * HD, 2 * NKV * HD, dsl, SLOTS), KVP_OK);
            float q[(T + 1) * QTS]; /* + the padding row's */
            fill(q, (T + 1) * QTS);
            float *dq = up(q, sizeof q);
            const int32_t window = variant == 1 ? 3 : -1;
            const float sm = variant == 2 ? 0.7f : 1.0f / sqrtf((float)HD), cap = variant == 2 ? 1.5f : 0.0f;
            for (int decode = 0; decode < 2; decode++) {
                /* mixed: the three sequences (6 rows); decode: sequences 1 and 2 and a padding sequence (3 rows) */
                const int first = decode ? 1 : 0, nseq = decode ? 3 : NS, rows = decode ? 3 : T;
                int32_t indptr[4], last[3], qo[4], kv_begin[T], len[T];
                const int32_t page0[NS] = {0, 4, 6};
                int r = 0;
                for (int s = 0; s < nseq; s++) {
                    const int real = first + s < NS, seq = first + s;
                    indptr[s] = real ? page0[seq] : 7;
                    const int32_t L = real ? lens[seq] : 1, nqs = real ? nq_of[seq] : 1;
                    last[s] = (L - 1) % BS + 1;
                    qo[s] = r;
                    for (int i = 0; i < nqs; i++, r++) kv_begin[r] = indptr[s], len[r] = L - nqs + i + 1;
                }
                indptr[nseq] = decode ? 8 : 7;
                qo[nseq] = r;
                cr_assert_eq(r, rows);
                int32_t *di = up(indices, sizeof indices), *dp = up(indptr, sizeof indptr), *dl = up(last, sizeof last);
                int32_t *dqo = up(qo, sizeof qo), *db = up(kv_begin, sizeof kv_begin), *dn = up(len, sizeof len);
                float want[T * NQ * HD], got[T * NQ * HD];
                memset(want, 0, sizeof want), memset(got, 0, sizeof got);
                float *dw = up(want, sizeof want), *dg = up(got, sizeof got), *dqc = up(got, sizeof got);
                const float *qrows = dq + (decode ? nq_of[0] * QTS : 0); /* decode: from sequence 1's row */
                cr_assert_eq(kvp_cudev_attention(dev, &p, qrows, QTS, dw, rows, NQ, db, dn, di, window, sm, cap), KVP_OK,
                             "%s", kvp_error_detail());
                const kvp_cudev_pages pg = {.nseq = nseq, .decode = decode, .chunk = 2, .d_indptr = dp, .d_indices = di,
                                            .d_last = dl, .d_qo = dqo};
                cr_assert_eq(kvp_cudev_paged_attention(dev, &p, qrows, QTS, dqc, dg, rows, NQ, &pg, window, sm, cap),
                             KVP_OK, "%s", kvp_error_detail());
                down(want, dw, sizeof want);
                down(got, dg, sizeof got);
                close_to(got, want, (int64_t)rows * NQ * HD, 2e-5, decode ? "paged decode" : "paged prefill");
                void *ps[] = {di, dp, dl, dqo, db, dn, dw, dg, dqc};
                for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvp_cudev_free(dev, ps[i]);
            }
            void *ps[] = {dk, dv, dkv, dsl, dq};
            for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvp_cudev_free(dev, ps[i]);
            kvp_free(kvh);
        }
    cr_assert(!kvp_cudev_paged_supported(KVP_DTYPE_F32, 12), "head_dim 12 has no attention/cuda kernel");
    close_dev();
}

/* Copy-on-write pairs over every pool in one launch. */
Test(cuda_exec_kernels, copy_blocks_all_layers_one_launch)
{
    open_dev();
    enum { NP = 4, NB = 6, W = 10 };
    float h[NP][NB * W];
    void *d[NP];
    for (int p = 0; p < NP; p++) {
        fill(h[p], NB * W);
        d[p] = up(h[p], sizeof h[p]);
    }
    void **dp = up(d, sizeof d);
    const int32_t pairs[4] = {1, 4, 5, 0};
    int32_t *dpairs = up(pairs, sizeof pairs);
    cr_assert_eq(kvp_cudev_copy_blocks(dev, dp, NP, W * sizeof(float), dpairs, 2), KVP_OK);
    for (int p = 0; p < NP; p++) {
        float got[NB * W];
        down(got, d[p], sizeof got);
        for (int b = 0; b < NB; b++)
            for (int i = 0; i < W; i++) {
                const int src = b == 4 ? 1 : b == 0 ? 5 : b;
                cr_assert_eq(got[b * W + i], h[p][src * W + i], "pool %d block %d", p, b);
            }
        kvp_cudev_free(dev, d[p]);
    }
    kvp_cudev_free(dev, dp), kvp_cudev_free(dev, dpairs);
    close_dev();
}

/* ---------------------------------------------------------------- the golden stories */

/* The stories from case `first` on at once, block size bs, with CUDA-graph buckets or eagerly, attention att;
 * every token as golden.json's. */
static void golden_run(kvp_model *m, int first, int32_t bs, int eager, int32_t max_tokens, kvp_cuda_attention att)
{
    tu_golden g;
    tu_golden_load(&g);
    cr_assert_eq(g.n, 2, "golden.json's two stories");
    memmove(g.reqs, g.reqs + first, sizeof g.reqs[0] * (size_t)(g.n - first));
    memmove(g.want, g.want + first, sizeof g.want[0] * (size_t)(g.n - first));
    memmove(g.nwant, g.nwant + first, sizeof g.nwant[0] * (size_t)(g.n - first));
    g.n -= first;
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.block_size = bs;
    cfg.engine.max_batched_tokens = max_tokens;
    cfg.engine.max_num_seqs = 8;
    cfg.kv_dtype = KVP_DTYPE_F32;
    cfg.engine.stop_at_eos = false;
    kvp_cuda_options o = kvp_cuda_options_default();
    o.enforce_eager = eager;
    o.kv_cache_memory = 4 << 20;
    o.attention = att;
    kvp_session_result res[4];
    kvp_cuda_info info;
    cr_assert_eq(kvp_cuda_generate(m, &o, &cfg, g.reqs, g.n, res, NULL, NULL, NULL, &info), KVP_OK, "%s",
                 kvp_error_detail());
    cr_assert_eq(info.weights, KVP_DTYPE_F32, "an f32 checkpoint stays f32 on the device");
    cr_assert_eq(info.graph_buckets > 0, !eager);
    cr_assert_eq(info.attention, att, "head_dim 8 has attention/cuda kernels");
    if (eager) cr_assert(info.graphs_captured == 0 && info.graph_replays == 0, "--enforce-eager captured graphs");
    else /* every bucket's graph at start-up (1, 2, 4, 8), replayed by the decode steps */
        cr_assert(info.graphs_captured == info.graph_buckets && info.graph_replays > 2 * info.graphs_captured,
                  "%d graphs captured, %lld replays", info.graphs_captured, (long long)info.graph_replays);
    cr_assert_eq(info.split.kv, 4 << 20);
    cr_assert_eq(info.split.num_blocks, (4 << 20) / info.split.block_bytes);
    for (int i = 0; i < g.n; i++) {
        cr_assert_eq(res[i].n_tokens[0], g.nwant[i], "story %d: %d tokens, want %d", i, res[i].n_tokens[0], g.nwant[i]);
        for (int j = 0; j < g.nwant[i]; j++)
            cr_assert_eq(res[i].tokens[0][j], g.want[i][j], "bs %d eager %d story %d token %d: %d, want %d", bs, eager, i,
                         j, res[i].tokens[0][j], g.want[i][j]);
    }
    kvp_session_results_free(res, g.n);
}

Test(cuda_exec, golden_stories_token_for_token, .timeout = 600)
{
    open_dev();
    close_dev();
    kvp_model *m;
    cr_assert_eq(kvp_model_load(S260 "/stories260K.gguf", &m), KVP_OK, "%s", kvp_error_detail());
    /* both stories; decode steps padded to their bucket; attention/cuda's kernels */
    golden_run(m, 0, 16, 0, 64, KVP_CUDA_ATTN_PAGED);
    /* the short one eagerly, a block size that splits pages everywhere, the prompt in chunks of 2, the rowwise
       kernel */
    golden_run(m, 1, 3, 1, 2, KVP_CUDA_ATTN_ROWWISE);
    kvp_model_destroy(m);
}

/* The Hugging Face layout (rotate-half RoPE) gives the same (short) story. */
Test(cuda_exec, golden_story_from_safetensors, .timeout = 600)
{
    open_dev();
    close_dev();
    kvp_model *m;
    cr_assert_eq(kvp_model_load(S260 "/hf", &m), KVP_OK, "%s", kvp_error_detail());
    golden_run(m, 1, 16, 0, 2048, KVP_CUDA_ATTN_PAGED);
    kvp_model_destroy(m);
}

/* ---------------------------------------------------------------- CUDA graphs against eager steps */

enum { GBS = 16 };
static const int32_t g_blocks[4][4] = {{7, 2, 30, 11}, {5, 19, 1, 24}, {33, 8, 14, 3}, {9, 27, 0, 16}};

/* One step of sequences which[0..n) (n_new[i] new tokens each, ids tok, flat) over their cached ctx_len
 * tokens and the pages of tables[s] (32 at most), through ex; the one logits row of each sequence into out
 * (n x vocab). */
static void gstep_tables(kvp_executor *ex, const int32_t *which, const int32_t *n_new, int n, const int32_t *tok,
                         const int32_t *ctx_len, const int32_t *const *tables, float *out, int32_t vocab)
{
    kvp_exec_seq seqs[4];
    int32_t pos[64], qo[5] = {0}, kvi[5] = {0}, idx[128], last[4];
    int64_t slot[64];
    int t = 0, p = 0;
    for (int i = 0; i < n; i++) {
        const int s = which[i], c = ctx_len[s], L = c + n_new[i], pages = (L + GBS - 1) / GBS;
        seqs[i] = (kvp_exec_seq){.req_id = s, .context_len = c, .num_new = n_new[i], .sample = 1, .tokens = tok + t,
                                 .block_table = tables[s], .num_blocks = pages};
        for (int j = 0; j < n_new[i]; j++, t++) {
            pos[t] = c + j;
            slot[t] = (int64_t)tables[s][pos[t] / GBS] * GBS + pos[t] % GBS;
        }
        for (int g = 0; g < pages; g++) idx[p++] = tables[s][g];
        qo[i + 1] = t;
        kvi[i + 1] = p;
        last[i] = L - GBS * (pages - 1);
    }
    kvp_exec_batch b = {.seqs = seqs, .n = n, .block_size = GBS,
                        .flat = {.num_tokens = t, .tokens = tok, .positions = pos, .slot_mapping = slot, .qo_indptr = qo,
                                 .kv_indptr = kvi, .kv_indices = idx, .kv_last_page_len = last, .num_rows = n}};
    kvp_exec_result r;
    cr_assert_eq(ex->step(ex->ctx, &b, &r), KVP_OK, "%s", kvp_error_detail());
    cr_assert(r.logits && r.vocab == vocab);
    memcpy(out, r.logits, (size_t)n * (size_t)vocab * sizeof(float));
}

/* gstep_tables over the pages of g_blocks. */
static void gstep(kvp_executor *ex, const int32_t *which, const int32_t *n_new, int n, const int32_t *tok,
                  const int32_t *ctx_len, float *out, int32_t vocab)
{
    const int32_t *const tables[4] = {g_blocks[0], g_blocks[1], g_blocks[2], g_blocks[3]};
    gstep_tables(ex, which, n_new, n, tok, ctx_len, tables, out, vocab);
}

/* A graph executor (ex[0]) and an --enforce-eager one (ex[1]) over m: 1 MiB of KV, steps of max_tokens tokens,
 * 4 sequences. */
static void graph_and_eager(kvp_model *m, int32_t max_tokens, kvp_executor ex[2], kvp_cuda_info info[2])
{
    for (int e = 0; e < 2; e++) {
        kvp_cuda_options o = kvp_cuda_options_default();
        o.enforce_eager = e;
        o.kv_cache_memory = 1 << 20;
        cr_assert_eq(kvp_cuda_executor_create(m, NULL, &o, 0, GBS, 0, KVP_DTYPE_F32, max_tokens, 4, &ex[e], &info[e]),
                     KVP_OK, "%s", kvp_error_detail());
    }
}

/* Decode steps replayed from a bucket's graph give the eager executor's logits bit for bit, for different
 * batches of one bucket (other sequences, positions, pages and order; a padded and a full one), and the
 * replay reads each step's pack (its rows differ from the capture's). --enforce-eager captures nothing. */
Test(cuda_exec, graph_replays_match_eager_logits, .timeout = 600)
{
    open_dev();
    close_dev();
    kvp_model *m;
    cr_assert_eq(kvp_model_load(S260 "/stories260K.gguf", &m), KVP_OK, "%s", kvp_error_detail());
    const int32_t V = (int32_t)kvp_model_cfg(m)->vocab_size;
    kvp_executor ex[2]; /* [0] graphs, [1] --enforce-eager */
    kvp_cuda_info info[2];
    graph_and_eager(m, 64, ex, info);
    for (int e = 0; e < 2; e++) cr_assert_geq(info[e].split.num_blocks, 34);
    cr_assert(info[0].graph_buckets == 3 && info[1].graph_buckets == 0, "buckets 1, 2, 4 for 4 sequences");
    static float lg[2][4 * 512], prev[4 * 512];
    cr_assert_leq(V, 512);
    int32_t ctx_len[4] = {0, 0, 0, 0}, tok[64];
    /* every bucket captured at start-up, nothing replayed yet */
    cr_assert(info[0].graphs_captured == 3 && info[0].graph_replays == 0, "%d graphs at start-up",
              info[0].graphs_captured);
    /* the prompts at once (eager on both), then decode steps of buckets 4, 4, 2, 4 */
    const int32_t all[4] = {0, 1, 2, 3}, plen[4] = {5, 9, 3, 17};
    for (int t = 0; t < 34; t++) tok[t] = (7 * t + 3) % V;
    static const struct {
        int n;
        int32_t which[4];
    } steps[] = {{4, {0, 1, 2, 3}}, {3, {0, 1, 2}}, {3, {3, 0, 1}}, {2, {2, 3}}, {4, {1, 3, 2, 0}}};
    for (int k = 0; k < 5; k++) {
        const int n = steps[k].n;
        const int32_t *which = k ? steps[k].which : all;
        int32_t n_new[4] = {1, 1, 1, 1};
        if (k == 0) memcpy(n_new, plen, sizeof n_new);
        else
            for (int i = 0; i < n; i++) tok[i] = (101 + 13 * which[i] + 29 * k) % V;
        for (int e = 0; e < 2; e++) gstep(&ex[e], which, n_new, n, tok, ctx_len, lg[e], V);
        for (int i = 0; i < n * V; i++)
            cr_assert(lg[0][i] == lg[1][i] || (lg[0][i] != lg[0][i] && lg[1][i] != lg[1][i]),
                      "step %d row %d logit %d: graph %.9g, eager %.9g", k, i / V, i % V, lg[0][i], lg[1][i]);
        for (int i = 0; i < n * V; i++) cr_assert(isfinite(lg[0][i]), "step %d: logit %d is %g", k, i, lg[0][i]);
        if (k == 2) /* the replay of step 1's graph computed this batch, not the captured one */
            cr_assert_neq(memcmp(lg[0], prev, (size_t)V * sizeof(float)), 0, "step 2 repeats step 1's first row");
        memcpy(prev, lg[0], sizeof prev);
        for (int i = 0; i < n; i++) ctx_len[which[i]] += n_new[i];
    }
    for (int e = 0; e < 2; e++) cr_assert_eq(kvp_cuda_executor_info(&ex[e], &info[e]), KVP_OK);
    cr_assert(info[0].graphs_captured == 3 && info[0].graph_replays == 4, "%d graphs captured, %lld replays",
              info[0].graphs_captured, (long long)info[0].graph_replays);
    cr_assert(info[0].graph_capture_s > 0);
    cr_assert(info[1].graphs_captured == 0 && info[1].graph_replays == 0, "--enforce-eager captured graphs");
    for (int e = 0; e < 2; e++) kvp_executor_destroy(&ex[e]);
    kvp_model_destroy(m);
}

/* With steps of at most 4 tokens, a decode step of 4 sequences over 30 pages each (29 of them one shared full
 * block) holds more page indices than the pack sized at start-up: its buffer moves, every graph is dropped,
 * the step's bucket is captured again and its replay gives the eager executor's logits bit for bit; the next
 * step of another bucket is captured again too. */
Test(cuda_exec, graphs_survive_the_pack_moving, .timeout = 600)
{
    open_dev();
    close_dev();
    kvp_model *m;
    cr_assert_eq(kvp_model_load(S260 "/stories260K.gguf", &m), KVP_OK, "%s", kvp_error_detail());
    const int32_t V = (int32_t)kvp_model_cfg(m)->vocab_size;
    kvp_executor ex[2]; /* [0] graphs, [1] --enforce-eager */
    kvp_cuda_info info[2];
    graph_and_eager(m, 4, ex, info);
    cr_assert_eq(info[0].graphs_captured, 3);
    cr_assert_gt(30 * 4 * 4, 4 * info[0].split.num_blocks + 8 * 4 + 16, "the step must outgrow the pack");
    /* sequence 0: 29 x block 5, then block 10; 1, 2, 3: the same 29, then blocks 11, 12, 13 */
    static int32_t pages[4][32];
    for (int i = 0; i < 4; i++) {
        for (int g = 0; g < 29; g++) pages[i][g] = 5;
        pages[i][29] = 10 + i;
    }
    const int32_t *const tables[4] = {pages[0], pages[1], pages[2], pages[3]};
    static float lg[2][4 * 512];
    const int32_t all[4] = {0, 1, 2, 3}, four[4] = {4, 4, 4, 4}, one[4] = {1, 1, 1, 1};
    int32_t tok[16], ctx[4];
    /* block 5 full: sequence 0's 16-token prompt in chunks of 4 (eager on both) */
    for (int c = 0; c < GBS; c += 4) {
        for (int t = 0; t < 4; t++) tok[t] = (5 * (c + t) + 1) % V;
        ctx[0] = c;
        for (int e = 0; e < 2; e++) gstep_tables(&ex[e], all, four, 1, tok, ctx, tables, lg[e], V);
    }
    /* 4 sequences decode after 464 tokens each (block 5 29 times): 120 page indices */
    for (int i = 0; i < 4; i++) ctx[i] = 29 * GBS, tok[i] = 17 + 90 * i;
    for (int e = 0; e < 2; e++) gstep_tables(&ex[e], all, one, 4, tok, ctx, tables, lg[e], V);
    for (int i = 0; i < 4 * V; i++)
        cr_assert(lg[0][i] == lg[1][i] && isfinite(lg[0][i]), "row %d logit %d: graph %.9g, eager %.9g", i / V, i % V,
                  lg[0][i], lg[1][i]);
    cr_assert_eq(kvp_cuda_executor_info(&ex[0], &info[0]), KVP_OK);
    cr_assert(info[0].graphs_captured == 4 && info[0].graph_replays == 1, "%d graphs captured, %lld replays",
              info[0].graphs_captured, (long long)info[0].graph_replays);
    /* then sequence 0 alone, bucket 1 (its graph was dropped with the others): captured again, the same logits */
    ctx[0] = 29 * GBS + 1, tok[0] = 42;
    for (int e = 0; e < 2; e++) gstep_tables(&ex[e], all, one, 1, tok, ctx, tables, lg[e], V);
    cr_assert_eq(memcmp(lg[0], lg[1], (size_t)V * sizeof(float)), 0, "bucket 1's new graph differs from eager");
    cr_assert_eq(kvp_cuda_executor_info(&ex[0], &info[0]), KVP_OK);
    cr_assert(info[0].graphs_captured == 5 && info[0].graph_replays == 2, "%d graphs captured, %lld replays",
              info[0].graphs_captured, (long long)info[0].graph_replays);
    for (int e = 0; e < 2; e++) kvp_executor_destroy(&ex[e]);
    kvp_model_destroy(m);
}

/* --deterministic: tiled GEMMs and rowwise attention (also when paged is asked for); sequence 0's logits
 * alone (a 5-token prefill, then decode steps of bucket 1) and in a batch of four (all prompts in one step,
 * then decode steps of bucket 4 with sequence 0 in the second row) are the same bits. On the emulator every
 * path is batch-invariant; on a GPU only this one is (cuBLAS picks GEMM algorithms by shape). */
Test(cuda_exec, deterministic_rows_do_not_depend_on_the_batch, .timeout = 600)
{
    open_dev();
    close_dev();
    kvp_model *m;
    cr_assert_eq(kvp_model_load(S260 "/stories260K.gguf", &m), KVP_OK, "%s", kvp_error_detail());
    const int32_t V = (int32_t)kvp_model_cfg(m)->vocab_size;
    kvp_executor ex[2]; /* [0] sequence 0 alone, [1] in a batch of four */
    kvp_cuda_info info;
    for (int e = 0; e < 2; e++) {
        kvp_cuda_options o = kvp_cuda_options_default();
        o.deterministic = 1;
        o.kv_cache_memory = 1 << 20;
        cr_assert_eq(kvp_cuda_executor_create(m, NULL, &o, 0, GBS, 0, KVP_DTYPE_F32, 64, 4, &ex[e], &info), KVP_OK,
                     "%s", kvp_error_detail());
        cr_assert(info.deterministic && info.attention == KVP_CUDA_ATTN_ROWWISE && info.graph_buckets == 3);
    }
    static float lg[2][4 * 512];
    int32_t ctx[2][4] = {{0}}, tok[64];
    const int32_t all[4] = {0, 1, 2, 3}, later[4] = {3, 0, 1, 2}, plen[4] = {5, 9, 3, 17}, one[1] = {0};
    for (int k = 0; k < 4; k++) {
        int32_t n_new[4] = {1, 1, 1, 1};
        if (k == 0) memcpy(n_new, plen, sizeof n_new);
        for (int t = 0; t < 34; t++) tok[t] = (7 * t + 3 + 31 * k) % V;
        gstep(&ex[0], one, n_new, 1, tok, ctx[0], lg[0], V);
        int32_t btok[64];
        if (k == 0) memcpy(btok, tok, sizeof btok); /* sequence 0's prompt first, as alone */
        else
            for (int i = 0; i < 4; i++) btok[i] = later[i] == 0 ? tok[0] : (11 * later[i] + k) % V;
        gstep(&ex[1], k ? later : all, n_new, 4, btok, ctx[1], lg[1], V);
        const float *row0 = lg[1] + (k ? 1 : 0) * V;
        cr_assert_eq(memcmp(lg[0], row0, (size_t)V * sizeof(float)), 0, "step %d: sequence 0's logits depend on the batch",
                     k);
        ctx[0][0] += n_new[0];
        for (int i = 0; i < 4; i++) ctx[1][i] += n_new[i];
    }
    for (int e = 0; e < 2; e++) kvp_executor_destroy(&ex[e]);
    kvp_model_destroy(m);
}

/* `kvpage generate --device cuda --json`: the golden story's 60 tokens after "Once upon a time", and the
 * memory split in the JSON. */
Test(cuda_exec, generate_command_on_the_device, .timeout = 600)
{
    open_dev();
    close_dev();
    tu_golden g;
    tu_golden_load(&g);
    cr_assert_eq(g.n, 2, "golden.json's two stories");
    char *argv[] = {"generate", "--model", S260 "/stories260K.gguf", "--prompt", "Once upon a time", "--max-tokens",
                    "60", "--ignore-eos", "--device", "cuda", "--kv-cache-memory", "2MiB", "--cuda-attention",
                    "rowwise", "--json", NULL};
    const cJSON *toks;
    cJSON *out = tu_generate_json(15, argv, &toks);
    const int ngen = g.nwant[1]; /* golden's second case: "Once upon a time", then 60 tokens */
    cr_assert_eq(cJSON_GetArraySize(toks), ngen, "%d tokens, want %d", cJSON_GetArraySize(toks), ngen);
    for (int j = 0; j < ngen; j++)
        cr_assert_eq(cJSON_GetArrayItem(toks, j)->valueint, g.want[1][j], "token %d", j);
    const cJSON *cu = cJSON_GetObjectItem(cJSON_GetObjectItem(out, "totals"), "cuda");
    cr_assert(cJSON_IsObject(cu), "no memory split in the JSON");
    cr_assert_eq(cJSON_GetObjectItem(cu, "kv_bytes")->valuedouble, 2 << 20);
    cr_assert_gt(cJSON_GetObjectItem(cu, "weights_bytes")->valuedouble, 0);
    cr_assert_gt(cJSON_GetObjectItem(cu, "activations_bytes")->valuedouble, 0);
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(cu, "attention")), "rowwise");
    cr_assert_eq(cJSON_GetObjectItem(cu, "graphs_captured")->valuedouble,
                 cJSON_GetObjectItem(cu, "graph_buckets")->valuedouble, "every bucket's graph at start-up");
    cr_assert_eq(cJSON_GetObjectItem(cu, "graph_replays")->valuedouble, ngen - 1, "every decode step replayed");
    cJSON_Delete(out);
}

/* --random-weights: a config's shape with seeded bf16 weights made on the device, driven by the engine: the
 * same seed gives the same greedy tokens and logits, another seed other logits (the tokens may agree: with a
 * tied random embedding the residual stream keeps the last token the likeliest); logits are finite. */
static void random_run(uint64_t seed, int32_t *out, int32_t n)
{
    kvp_model_config cfg;
    cr_assert_eq(kvp_model_config_load(S260 "/hf/config.json", &cfg), KVP_OK, "%s", kvp_error_detail());
    kvp_cuda_options o = kvp_cuda_options_default();
    o.random_seed = seed;
    o.kv_cache_memory = 1 << 20;
    kvp_executor ex;
    kvp_cuda_info info;
    cr_assert_eq(kvp_cuda_executor_create(NULL, &cfg, &o, 0, 16, 0, KVP_DTYPE_BF16, 64, 4, &ex, &info), KVP_OK, "%s",
                 kvp_error_detail());
    cr_assert_eq(info.weights, KVP_DTYPE_BF16);
    cr_assert_eq(info.split.weights, (int64_t)(kvp_model_num_params(&cfg) * 2) + 2 * 64 * 11, "bf16 matrices and "
                 "f32 norms: %lld bytes", (long long)info.split.weights);
    kvp_session_config sc = kvp_session_config_default();
    sc.engine.block_size = 16;
    sc.engine.stop_at_eos = false;
    sc.engine.max_batched_tokens = 64;
    sc.engine.max_num_seqs = 4;
    sc.num_blocks = info.split.num_blocks;
    sc.vocab = (int32_t)cfg.vocab_size;
    sc.engine.max_model_len = 512;
    kvp_session *s;
    cr_assert_eq(kvp_session_create(&sc, ex, &s), KVP_OK, "%s", kvp_error_detail());
    const int32_t prompt[5] = {1, 403, 407, 261, 378};
    kvp_session_request r = {.prompt = prompt, .n_prompt = 5, .max_tokens = n, .sampler = kvp_sampler_default(), .n = 1};
    kvp_session_result res;
    cr_assert_eq(kvp_session_run(s, &r, 1, &res, NULL, NULL, NULL), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(res.n_tokens[0], n);
    memcpy(out, res.tokens[0], (size_t)n * sizeof(int32_t));
    kvp_session_results_free(&res, 1);
    kvp_session_destroy(s);
}

/* The logits of one 5-token prefill step straight through the executor (vocab 512, all finite). */
static void random_logits(uint64_t seed, float *out)
{
    kvp_model_config cfg;
    cr_assert_eq(kvp_model_config_load(S260 "/hf/config.json", &cfg), KVP_OK, "%s", kvp_error_detail());
    kvp_cuda_options o = kvp_cuda_options_default();
    o.random_seed = seed;
    o.kv_cache_memory = 1 << 20;
    kvp_executor ex;
    cr_assert_eq(kvp_cuda_executor_create(NULL, &cfg, &o, 0, 16, 0, KVP_DTYPE_BF16, 64, 4, &ex, NULL), KVP_OK, "%s",
                 kvp_error_detail());
    const int32_t tok[5] = {1, 403, 407, 261, 378}, pos[5] = {0, 1, 2, 3, 4}, qo[2] = {0, 5}, kvi[2] = {0, 1};
    const int32_t idx[1] = {3}, last[1] = {5};
    const int64_t slot[5] = {48, 49, 50, 51, 52};
    kvp_exec_seq seq = {.num_new = 5, .sample = 1, .tokens = tok};
    kvp_exec_batch b = {.seqs = &seq, .n = 1, .block_size = 16,
                        .flat = {.num_tokens = 5, .tokens = tok, .positions = pos, .slot_mapping = slot,
                                 .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = idx, .kv_last_page_len = last,
                                 .num_rows = 1}};
    kvp_exec_result r;
    cr_assert_eq(ex.step(ex.ctx, &b, &r), KVP_OK, "%s", kvp_error_detail());
    cr_assert(r.logits && r.vocab == 512);
    for (int i = 0; i < 512; i++) cr_assert(isfinite(r.logits[i]), "logit %d is %g", i, r.logits[i]);
    memcpy(out, r.logits, 512 * sizeof(float));
    kvp_executor_destroy(&ex);
}

Test(cuda_exec, random_weights_on_the_device, .timeout = 600)
{
    open_dev();
    close_dev();
    int32_t a[8], b[8];
    random_run(7, a, 8);
    random_run(7, b, 8);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "the same seed gave other tokens");
    static float la[512], lb[512], lc[512];
    random_logits(7, la);
    random_logits(7, lb);
    random_logits(8, lc);
    cr_assert_eq(memcmp(la, lb, sizeof la), 0, "the same seed gave other logits");
    cr_assert_neq(memcmp(la, lc, sizeof la), 0, "another seed gave the same logits");
}
