/* runtime/model/kv_cache.c — the paged KV pools of every layer (the parts: model_internal.h). */
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

/* ---------------------------------------------------------------- KV cache */

void kvp_kv_cache_destroy(kvp_kv_cache *kv)
{
    if (!kv) return;
    if (kv->layers)
        for (int32_t l = 0; l < kv->num_layers; l++) kvp_paged_kv_free_pools(&kv->layers[l]);
    kvp_free(kv->layers);
    kvp_free(kv);
}

kvp_status kvp_kv_cache_create(const kvp_model *m, kvp_dtype dtype, int32_t num_blocks, int32_t block_size,
                               kvp_kv_cache **out)
{
    if (num_blocks < 1 || block_size < 1)
        return KVP_ERR(KVP_EINVAL, "KV cache: num_blocks %d and block_size %d must be >= 1", num_blocks, block_size);
    kvp_kv_cache *kv = kvp_calloc(1, sizeof *kv);
    if (!kv) return KVP_ERR(KVP_ENOMEM, "KV cache: out of memory");
    kv->num_layers = m->cfg.num_layers;
    kv->num_blocks = num_blocks;
    kv->block_size = block_size;
    kv->layers = kvp_calloc((size_t)kv->num_layers, sizeof *kv->layers);
    kvp_status st = kv->layers ? KVP_OK : KVP_ERR(KVP_ENOMEM, "KV cache: out of memory");
    for (int32_t l = 0; st == KVP_OK && l < kv->num_layers; l++) {
        st = kvp_paged_kv_init(&kv->layers[l], dtype, num_blocks, m->tp.nkv, block_size, m->cfg.head_dim);
        if (st == KVP_OK) st = kvp_paged_kv_alloc_pools(&kv->layers[l]);
        if (st == KVP_OK) {
            /* Unused slots hold NaN so a kernel that reads past a sequence's length poisons its output. */
            kvp_paged_kv_fill_nan(&kv->layers[l]);
        }
    }
    if (st != KVP_OK) {
        kvp_kv_cache_destroy(kv);
        return st;
    }
    *out = kv;
    return KVP_OK;
}

double kvp_kv_cache_bytes(const kvp_model *m, kvp_dtype dtype, int64_t num_blocks, int32_t block_size)
{
    return 2.0 * (double)m->cfg.num_layers * (double)m->tp.nkv * (double)m->cfg.head_dim *
           (double)kvp_dtype_size(dtype) * (double)block_size * (double)num_blocks;
}

kvp_status kvp_kv_cache_copy_blocks(kvp_kv_cache *kv, const int32_t *pairs, int32_t n)
{
    if (n == 0) return KVP_OK;
    for (int32_t l = 0; l < kv->num_layers; l++) KVP_TRY(kvp_attn_copy_blocks_cpu(&kv->layers[l], pairs, n));
    return KVP_OK;
}

kvp_status kvp_kv_cache_move_blocks(kvp_kv_cache *dst, const kvp_kv_cache *src, const int32_t *pairs, int32_t n)
{
    if (n == 0) return KVP_OK;
    if (dst->num_layers != src->num_layers || dst->block_size != src->block_size)
        return KVP_ERR(KVP_EINVAL, "moving blocks between KV caches of %d and %d layers, blocks of %d and %d tokens",
                       dst->num_layers, src->num_layers, dst->block_size, src->block_size);
    for (int32_t l = 0; l < dst->num_layers; l++) KVP_TRY(kvp_attn_swap_blocks_cpu(&dst->layers[l], &src->layers[l], pairs, n));
    return KVP_OK;
}

