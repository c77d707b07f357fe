/* scripts/kv-read-probe.c — how fast can this machine read the K/V of bench generate's batched decode, warm?
 *
 * The batched run of `kvpage bench generate` on stories260K attends, each decode step, over 64 sequences x
 * 5 layers of f32 K/V: blocks of 16 tokens x 4 KV heads x head_dim 8 (2 KiB of K and 2 KiB of V a block and
 * layer), a sequence's blocks 64 blocks apart (the 64 sequences grow in lockstep and take turns allocating).
 * This program reads the same bytes in the same layout on T threads (the sequences split between them), with
 * no arithmetic but a sum, and reports the fastest of 20 steps: the floor of the attention's memory time.
 *   order block: each block's 2 KiB of K then of V, block after block;
 *   order head:  the attention kernel's order (attention/attn_cpu.c, head_dim 8): tiles of 16 blocks, and in a
 *                tile one KV head at a time, its 512 bytes of K in each block, then of V.
 *
 *   gcc -O2 -mavx512f -fopenmp scripts/kv-read-probe.c -o /tmp/kv-read-probe
 *   /tmp/kv-read-probe CONTEXT THREADS block|head      e.g. 128 2 head
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { SEQS = 64, LAYERS = 5, BLOCK = 16, HEADS = 4, CHUNK = 2048 / 4, HEAD = CHUNK / HEADS, TILE_BLOCKS = 16 };

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static __m512 sum_floats(__m512 a, const float *p, int n)
{
    for (int c = 0; c < n; c += 16) a = _mm512_add_ps(a, _mm512_load_ps(p + c));
    return a;
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[3], "block") != 0 && strcmp(argv[3], "head") != 0) || atoi(argv[1]) < 1 ||
        atoi(argv[2]) < 1) {
        fprintf(stderr, "usage: %s CONTEXT THREADS block|head\n", argv[0]);
        return 2;
    }
    const int ctx = atoi(argv[1]), threads = atoi(argv[2]), by_head = strcmp(argv[3], "head") == 0;
    const int nb = (ctx + BLOCK - 1) / BLOCK, blocks = SEQS * nb;
    float *k[LAYERS], *v[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        k[l] = aligned_alloc(4096, (size_t)blocks * CHUNK * sizeof(float));
        v[l] = aligned_alloc(4096, (size_t)blocks * CHUNK * sizeof(float));
        if (!k[l] || !v[l]) return 1;
        for (size_t i = 0; i < (size_t)blocks * CHUNK; i++) k[l][i] = v[l][i] = 1.0f;
    }
    double best = 1e30, total = 0;
    for (int step = 0; step < 20; step++) {
        const double t0 = now();
        for (int l = 0; l < LAYERS; l++) {
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
            for (int s = 0; s < SEQS; s++) {
                __m512 a = _mm512_setzero_ps();
                for (int j0 = 0; j0 < nb; j0 += by_head ? TILE_BLOCKS : nb) {
                    const int j1 = by_head && j0 + TILE_BLOCKS < nb ? j0 + TILE_BLOCKS : nb;
                    for (int h = 0; h < (by_head ? HEADS : 1); h++) {
                        const int off = by_head ? h * HEAD : 0, n = by_head ? HEAD : CHUNK;
                        for (int j = j0; j < j1; j++) a = sum_floats(a, k[l] + (size_t)(j * SEQS + s) * CHUNK + off, n);
                        for (int j = j0; j < j1; j++) a = sum_floats(a, v[l] + (size_t)(j * SEQS + s) * CHUNK + off, n);
                    }
                }
                total += _mm512_reduce_add_ps(a);
            }
        }
        const double t = now() - t0;
        best = t < best ? t : best;
    }
    const double bytes = (double)LAYERS * blocks * 2 * CHUNK * sizeof(float);
    printf("context %d, %d threads, %s order: %.1f MB of K/V, %.1f us a step, %.1f GB/s (sum %g)\n", ctx, threads,
           argv[3], bytes / 1e6, best * 1e6, bytes / best / 1e9, total);
    return 0;
}
