/* attention/paged_kv.h — the paged-KV descriptor shared by every attention backend (CPU and CUDA), element
 * types and their conversions, and index helpers that compile for host and device.
 *
 * One descriptor describes ONE layer: its K pool, its V pool and the page table of the current batch.
 *
 *   pool (k or v), HND layout, strides in elements (head_dim is contiguous):
 *
 *     block 0                       block 1                       ...   block num_blocks-1
 *     +---------------------------+ +---------------------------+
 *     | head 0: tok 0 [head_dim]  | | head 0: tok 0 ...         |
 *     |         tok 1 [head_dim]  | |  ...                      |
 *     |         ... block_size    | |                           |
 *     | head 1: tok 0 ...         | |                           |
 *     +---------------------------+ +---------------------------+
 *     element (b, h, t, d) = pool[b*stride_block + h*stride_head + t*stride_token + d]
 *
 *   page table (CSR, FlashInfer style), all int32:
 *     kv_indptr[num_seqs+1]       pages of sequence s are kv_indices[kv_indptr[s] .. kv_indptr[s+1])
 *     kv_indices[...]             physical block ids, in logical order
 *     kv_last_page_len[num_seqs]  tokens used in the last page (1..block_size; 0 when the sequence has no page)
 *     seq_len(s) = block_size * (pages - 1) + kv_last_page_len[s]   (0 when pages == 0)
 *     token j of sequence s lives in block kv_indices[kv_indptr[s] + j / block_size], slot j % block_size.
 *
 * Ownership: the descriptor borrows every pointer; nothing is freed through it except pools allocated with
 * kvp_paged_kv_alloc_pools (released by kvp_paged_kv_free_pools). The caller keeps the pointed-to memory
 * alive for the duration of every call that takes the descriptor.
 *
 * fp8-e4m3 (OCP "E4M3FN": bias 7, no infinity, NaN = S.1111.111, max finite 448) stores value/scale:
 * a stored code c means kvp_fp8e4m3_to_f32(c) * scale, with k_scale for K and v_scale for V. Scales are
 * ignored (treated as 1) for the other element types.
 */
#ifndef KVP_ATTENTION_PAGED_KV_H
#define KVP_ATTENTION_PAGED_KV_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#define KVP_HD static inline __host__ __device__
#else
#define KVP_HD static inline
#endif

typedef enum {
    KVP_DTYPE_F32 = 0,
    KVP_DTYPE_F16,      /* IEEE binary16, stored as uint16_t bits */
    KVP_DTYPE_BF16,     /* bfloat16, stored as uint16_t bits */
    KVP_DTYPE_FP8_E4M3, /* OCP e4m3fn, stored as uint8_t bits, with a per-tensor scale */
    KVP_DTYPE_COUNT
} kvp_dtype;

/* Bytes per element (4, 2, 2, 1); 0 for an invalid dtype. */
size_t kvp_dtype_size(kvp_dtype t);
/* "f32", "f16", "bf16", "fp8"; "?" for an invalid dtype. */
const char *kvp_dtype_name(kvp_dtype t);
/* Accepts the names above (and "fp8_e4m3", "float32", "float16", "bfloat16"); KVP_EINVAL naming s otherwise. */
kvp_status kvp_dtype_parse(const char *s, kvp_dtype *out);

/* Scalar conversions, all round-to-nearest-even. f32->f16 overflows to infinity (IEEE); f32->fp8 saturates
 * to +-448 (infinity too) and maps NaN to 0x7F (sign kept); f32->bf16 keeps NaN a (quiet) NaN. */
uint16_t kvp_f32_to_f16(float x);
float kvp_f16_to_f32(uint16_t h);
uint16_t kvp_f32_to_bf16(float x);
float kvp_bf16_to_f32(uint16_t h);
uint8_t kvp_f32_to_fp8e4m3(float x);
float kvp_fp8e4m3_to_f32(uint8_t c);

typedef struct kvp_paged_kv {
    /* --- pools of one layer (borrowed) --- */
    void *k; /* (num_blocks, num_kv_heads, block_size, head_dim) elements of dtype */
    void *v; /* (num_blocks, num_kv_heads, block_size, head_dim), same strides as k */
    kvp_dtype dtype;
    float k_scale; /* fp8 only: real value = code value * k_scale (1 for the other dtypes) */
    float v_scale; /* fp8 only: real value = code value * v_scale */
    int32_t num_blocks;
    int32_t num_kv_heads;
    int32_t block_size; /* tokens per block, >= 1 */
    int32_t head_dim;
    int64_t stride_block; /* elements between blocks (>= num_kv_heads*block_size*head_dim when contiguous) */
    int64_t stride_head;  /* elements between heads of one block */
    int64_t stride_token; /* elements between tokens of one head (>= head_dim) */
    /* --- page table of the current batch (borrowed; NULL/0 when only append/copy/swap are called) --- */
    int32_t num_seqs;
    const int32_t *kv_indptr;        /* (num_seqs + 1), non-decreasing, kv_indptr[0] >= 0 */
    const int32_t *kv_indices;       /* (kv_indptr[num_seqs]) block ids in [0, num_blocks) */
    const int32_t *kv_last_page_len; /* (num_seqs) */
} kvp_paged_kv;

/* The head dimensions the attention kernels handle (8, 16, 32, 64, 80, 96, 128, 256), with every dtype: the
 * index of head_dim among them (the kernels' dispatch tables follow this order), or -1 for one they do not. */
#define KVP_NUM_HEAD_DIMS 8
int kvp_paged_kv_head_dim_index(int32_t head_dim);

/* Fills *kv for contiguous HND pools (strides from the sizes), scales 1, no page table. Pointers k and v
 * may be NULL (set later, e.g. per layer, or by kvp_paged_kv_alloc_pools). KVP_EINVAL on sizes < 1 or an
 * invalid dtype; KVP_EUNSUPPORTED for a head_dim no kernel handles (kvp_paged_kv_head_dim_index). */
kvp_status kvp_paged_kv_init(kvp_paged_kv *kv, kvp_dtype dtype, int32_t num_blocks, int32_t num_kv_heads,
                             int32_t block_size, int32_t head_dim);
/* Sets the page table (borrowed). No validation here: kernels validate it (kvp_paged_kv_check). */
void kvp_paged_kv_set_pages(kvp_paged_kv *kv, int32_t num_seqs, const int32_t *kv_indptr,
                            const int32_t *kv_indices, const int32_t *kv_last_page_len);
/* Bytes of one pool (k or v) for the descriptor's num_blocks and strides. */
size_t kvp_paged_kv_pool_bytes(const kvp_paged_kv *kv);
/* Allocates k and v (64-byte aligned, contents undefined) and stores them in kv; the caller owns them and
 * releases them with kvp_paged_kv_free_pools. KVP_ENOMEM leaves kv unchanged. */
kvp_status kvp_paged_kv_alloc_pools(kvp_paged_kv *kv);
void kvp_paged_kv_free_pools(kvp_paged_kv *kv); /* frees k and v, sets them NULL; NULL pools are fine */
/* Writes the dtype's quiet NaN into every element of both pools (unused slots that poison a kernel which
 * reads them). */
void kvp_paged_kv_fill_nan(kvp_paged_kv *kv);

/* Validates the pool fields, and the page table too when with_pages is nonzero (indptr monotone,
 * block ids in range, last_page_len in 1..block_size for non-empty sequences). KVP_EINVAL naming the
 * first problem. */
kvp_status kvp_paged_kv_check(const kvp_paged_kv *kv, int with_pages);

/* ---- index helpers (host and device) ---- */

KVP_HD int32_t kvp_paged_kv_num_pages(const kvp_paged_kv *kv, int32_t seq)
{
    return kv->kv_indptr[seq + 1] - kv->kv_indptr[seq];
}

KVP_HD int32_t kvp_paged_kv_seq_len(const kvp_paged_kv *kv, int32_t seq)
{
    int32_t pages = kv->kv_indptr[seq + 1] - kv->kv_indptr[seq];
    return pages == 0 ? 0 : kv->block_size * (pages - 1) + kv->kv_last_page_len[seq];
}

/* Element offset of (block, head, slot, 0) in a pool; block widened to 64 bits before multiplying. */
KVP_HD int64_t kvp_paged_kv_elem_offset(const kvp_paged_kv *kv, int32_t block, int32_t head, int32_t slot)
{
    return (int64_t)block * kv->stride_block + (int64_t)head * kv->stride_head + (int64_t)slot * kv->stride_token;
}

/* Element offset of token `pos` (0-based within the sequence) of sequence seq, head `head`. */
KVP_HD int64_t kvp_paged_kv_token_offset(const kvp_paged_kv *kv, int32_t seq, int32_t head, int32_t pos)
{
    int32_t block = kv->kv_indices[kv->kv_indptr[seq] + pos / kv->block_size];
    return kvp_paged_kv_elem_offset(kv, block, head, pos % kv->block_size);
}

/* Element offset of a slot-mapping entry (slot = block * block_size + offset, >= 0). */
KVP_HD int64_t kvp_paged_kv_slot_offset(const kvp_paged_kv *kv, int64_t slot, int32_t head)
{
    return kvp_paged_kv_elem_offset(kv, (int32_t)(slot / kv->block_size), head, (int32_t)(slot % kv->block_size));
}

#ifdef __cplusplus
}
#endif

#endif
