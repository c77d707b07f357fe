/* runtime/tensor.h — a borrowed view of one weight tensor inside a loaded file (GGUF or safetensors),
 * and its conversion to f32.
 *
 * Shapes are row-major, outermost first, for both loaders: a Llama q_proj is [out_features, in_features]
 * whether it came from safetensors ([out, in] as stored) or GGUF (whose ne[] lists the innermost dim first;
 * the GGUF loader reverses it). `data` points into the loader's memory map: valid while the loader lives.
 */
#ifndef KVP_RUNTIME_TENSOR_H
#define KVP_RUNTIME_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum {
    KVP_WT_F32 = 0,
    KVP_WT_F16,
    KVP_WT_BF16,
    KVP_WT_Q8_0, /* GGUF blocks of 32: f16 scale d, 32 x int8 q; value = d * q (34 bytes a block) */
    KVP_WT_COUNT
} kvp_wtype;

enum { KVP_TENSOR_MAX_DIMS = 4, KVP_Q8_0_BLOCK = 32, KVP_Q8_0_BYTES = 34 };

typedef struct {
    const char *name;  /* borrowed from the loader */
    const char *file;  /* the file holding the data (for error messages); borrowed */
    kvp_wtype dtype;
    int32_t ndim;
    int64_t shape[KVP_TENSOR_MAX_DIMS]; /* row-major, outermost first */
    int64_t numel;
    size_t nbytes;
    const void *data; /* borrowed, inside the file map; not necessarily aligned beyond 1 byte */
} kvp_tensor_view;

/* "F32", "F16", "BF16", "Q8_0". */
const char *kvp_wtype_name(kvp_wtype dt);
/* Bytes that `numel` elements take in dtype dt (Q8_0: numel must be a multiple of 32); 0 on overflow or
 * a bad count. */
size_t kvp_wtype_nbytes(kvp_wtype dt, int64_t numel);

/* Converts the whole tensor to f32 into out[numel] (caller-owned). Never fails for a view made by a
 * loader (sizes were checked at open). */
void kvp_tensor_to_f32(const kvp_tensor_view *t, float *out);

/* f32 -> f16 / bf16 bits, round to nearest even (for tests that write weight files). The attention module
 * has its own KV-cache conversions (attention/paged_kv.h); these are separate to keep runtime loaders
 * independent of it. */
uint16_t kvp_wt_f32_to_f16(float f);
uint16_t kvp_wt_f32_to_bf16(float f);

#endif
