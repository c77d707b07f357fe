/* runtime/executor/cuda/cuda_dev_none.c — the device layer of a build with neither nvcc nor the CPU emulator
 * of CUDA: no device, every call KVP_ENODEVICE (contract: cuda_dev.h). */
#include "runtime/executor/cuda/cuda_dev.h"

#define NO_DEVICE KVP_ERR(KVP_ENODEVICE, "cuda executor: no CUDA device (this kvpage was built without nvcc: configure with a CUDA toolkit)")

int kvp_cudev_emulated(void) { return 0; }

kvp_status kvp_cudev_count(int *n)
{
    *n = 0;
    return NO_DEVICE;
}
kvp_status kvp_cudev_open(int index, kvp_cudev **out, kvp_cudev_info *info)
{
    (void)index, (void)out, (void)info;
    return NO_DEVICE;
}
void kvp_cudev_close(kvp_cudev *d) { (void)d; }

kvp_status kvp_cudev_mem_info(kvp_cudev *d, int64_t *free_bytes, int64_t *total_bytes)
{
    (void)d, (void)free_bytes, (void)total_bytes;
    return NO_DEVICE;
}

kvp_status kvp_cudev_malloc(kvp_cudev *d, void **d_p, size_t bytes, const char *what)
{
    (void)d, (void)d_p, (void)bytes, (void)what;
    return NO_DEVICE;
}

void kvp_cudev_free(kvp_cudev *d, void *d_p)
{
    (void)d, (void)d_p;
}

kvp_status kvp_cudev_host_alloc(kvp_cudev *d, void **h_p, size_t bytes, const char *what)
{
    (void)d, (void)h_p, (void)bytes, (void)what;
    return NO_DEVICE;
}

void kvp_cudev_host_free(kvp_cudev *d, void *h_p)
{
    (void)d, (void)h_p;
}

kvp_status kvp_cudev_memset(kvp_cudev *d, void *d_p, int byte, size_t bytes)
{
    (void)d, (void)d_p, (void)byte, (void)bytes;
    return NO_DEVICE;
}

kvp_status kvp_cudev_copy(kvp_cudev *d, void *dst, const void *src, size_t bytes, int kind)
{
    (void)d, (void)dst, (void)src, (void)bytes, (void)kind;
    return NO_DEVICE;
}

kvp_status kvp_cudev_copy_async(kvp_cudev *d, void *dst, const void *src, size_t bytes, int kind)
{
    (void)d, (void)dst, (void)src, (void)bytes, (void)kind;
    return NO_DEVICE;
}

kvp_status kvp_cudev_sync(kvp_cudev *d, int copy_stream)
{
    (void)d, (void)copy_stream;
    return NO_DEVICE;
}

kvp_status kvp_cudev_copy_2d(kvp_cudev *d, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                             size_t height, int kind)
{
    (void)d, (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)height, (void)kind;
    return NO_DEVICE;
}

void *kvp_cudev_stream(kvp_cudev *d)
{
    (void)d;
    return NULL;
}

int kvp_cudev_is_device(const void *p, size_t bytes)
{
    (void)p, (void)bytes;
    return 0;
}

kvp_status kvp_cudev_embed(kvp_cudev *d, float *d_x, const void *d_embed, kvp_dtype wdt, const int32_t *d_tokens, int64_t T, int64_t H, float scale, int64_t v0, int64_t nv)
{
    (void)d, (void)d_x, (void)d_embed, (void)wdt, (void)d_tokens, (void)T, (void)H, (void)scale, (void)v0, (void)nv;
    return NO_DEVICE;
}

kvp_status kvp_cudev_rmsnorm(kvp_cudev *d, float *d_out, int64_t out_tstride, const float *d_x, int64_t x_tstride, const float *d_w, int64_t T, int64_t group, int64_t n, float eps, const int32_t *d_src_row)
{
    (void)d, (void)d_out, (void)out_tstride, (void)d_x, (void)x_tstride, (void)d_w, (void)T, (void)group, (void)n, (void)eps, (void)d_src_row;
    return NO_DEVICE;
}

kvp_status kvp_cudev_bias(kvp_cudev *d, float *d_x, int64_t tstride, const float *d_b, int64_t T, int64_t n)
{
    (void)d, (void)d_x, (void)tstride, (void)d_b, (void)T, (void)n;
    return NO_DEVICE;
}

kvp_status kvp_cudev_add(kvp_cudev *d, float *d_x, const float *d_y, int64_t n)
{
    (void)d, (void)d_x, (void)d_y, (void)n;
    return NO_DEVICE;
}

kvp_status kvp_cudev_rope(kvp_cudev *d, float *d_v, int64_t tstride, int64_t T, int64_t nheads, int64_t hd, int64_t rot, int style, const float *d_cs)
{
    (void)d, (void)d_v, (void)tstride, (void)T, (void)nheads, (void)hd, (void)rot, (void)style, (void)d_cs;
    return NO_DEVICE;
}

kvp_status kvp_cudev_glu(kvp_cudev *d, int act, float *d_out, const float *d_g, const float *d_u, int64_t tstride, int64_t T, int64_t n)
{
    (void)d, (void)act, (void)d_out, (void)d_g, (void)d_u, (void)tstride, (void)T, (void)n;
    return NO_DEVICE;
}

kvp_status kvp_cudev_softcap(kvp_cudev *d, float *d_x, int64_t n, float cap)
{
    (void)d, (void)d_x, (void)n, (void)cap;
    return NO_DEVICE;
}

kvp_status kvp_cudev_append_kv(kvp_cudev *d, const kvp_cudev_pool *p, const float *d_k, const float *d_v, int64_t tstride, const int64_t *d_slots, int64_t T)
{
    (void)d, (void)p, (void)d_k, (void)d_v, (void)tstride, (void)d_slots, (void)T;
    return NO_DEVICE;
}

kvp_status kvp_cudev_attention(kvp_cudev *d, const kvp_cudev_pool *p, const float *d_q, int64_t q_tstride, float *d_out, int64_t T, int64_t nq, const int32_t *d_kv_begin, const int32_t *d_len, const int32_t *d_kv_indices, int32_t window_left, float sm_scale, float cap)
{
    (void)d, (void)p, (void)d_q, (void)q_tstride, (void)d_out, (void)T, (void)nq, (void)d_kv_begin, (void)d_len, (void)d_kv_indices, (void)window_left, (void)sm_scale, (void)cap;
    return NO_DEVICE;
}

kvp_status kvp_cudev_paged_attention(kvp_cudev *d, const kvp_cudev_pool *p, const float *d_q, int64_t q_tstride, float *d_qc, float *d_out, int64_t T, int64_t nq, const kvp_cudev_pages *pg, int32_t window_left, float sm_scale, float cap)
{
    (void)d, (void)p, (void)d_q, (void)q_tstride, (void)d_qc, (void)d_out, (void)T, (void)nq, (void)pg, (void)window_left, (void)sm_scale, (void)cap;
    return NO_DEVICE;
}

int kvp_cudev_paged_supported(kvp_dtype dtype, int32_t hd)
{
    (void)dtype, (void)hd;
    return 0;
}

size_t kvp_cudev_paged_workspace_bytes(int32_t nseq, int32_t nq, int32_t hd)
{
    (void)nseq, (void)nq, (void)hd;
    return 0;
}

kvp_status kvp_cudev_copy_blocks(kvp_cudev *d, void *const *d_pools, int32_t n_pools, size_t block_bytes, const int32_t *d_pairs, int32_t n_pairs)
{
    (void)d, (void)d_pools, (void)n_pools, (void)block_bytes, (void)d_pairs, (void)n_pairs;
    return NO_DEVICE;
}

kvp_status kvp_cudev_random(kvp_cudev *d, void *d_p, kvp_dtype dt, int64_t n, uint64_t seed, float scale)
{
    (void)d, (void)d_p, (void)dt, (void)n, (void)seed, (void)scale;
    return NO_DEVICE;
}

kvp_status kvp_cudev_fill(kvp_cudev *d, void *d_p, kvp_dtype dt, int64_t n, float value)
{
    (void)d, (void)d_p, (void)dt, (void)n, (void)value;
    return NO_DEVICE;
}

kvp_status kvp_cudev_gemm(kvp_cudev *d, float *d_y, int64_t ldy, const float *d_x, int64_t ldx, const void *d_w, kvp_dtype wdt, int64_t T, int64_t N, int64_t K, void *d_scratch)
{
    (void)d, (void)d_y, (void)ldy, (void)d_x, (void)ldx, (void)d_w, (void)wdt, (void)T, (void)N, (void)K, (void)d_scratch;
    return NO_DEVICE;
}

kvp_status kvp_cudev_moe_ffn(kvp_cudev *d, float *d_out, const float *d_x, const float *d_router, const void *d_wgu,
                             const void *d_wdown, kvp_dtype wdt, int64_t T, int64_t H, int64_t E, int64_t k,
                             int64_t MF, int norm_topk, void *d_ws, size_t ws_bytes)
{
    (void)d, (void)d_out, (void)d_x, (void)d_router, (void)d_wgu, (void)d_wdown, (void)wdt, (void)T, (void)H;
    (void)E, (void)k, (void)MF, (void)norm_topk, (void)d_ws, (void)ws_bytes;
    return NO_DEVICE;
}

size_t kvp_cudev_moe_workspace_bytes(int64_t T, int64_t H, int64_t E, int64_t k, int64_t MF)
{
    (void)T, (void)H, (void)E, (void)k, (void)MF;
    return 0;
}

void kvp_cudev_set_invariant_gemm(kvp_cudev *d, int on) { (void)d, (void)on; }

kvp_status kvp_cudev_capture_begin(kvp_cudev *d)
{
    (void)d;
    return NO_DEVICE;
}
kvp_status kvp_cudev_capture_end(kvp_cudev *d, kvp_cudev_graph **g)
{
    (void)d;
    if (g) *g = NULL;
    return NO_DEVICE;
}
kvp_status kvp_cudev_graph_launch(kvp_cudev *d, kvp_cudev_graph *g)
{
    (void)d, (void)g;
    return NO_DEVICE;
}
void kvp_cudev_graph_destroy(kvp_cudev *d, kvp_cudev_graph *g) { (void)d, (void)g; }
