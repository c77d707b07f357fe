/* runtime/loader/tensor.h — a borrowed view of one weight tensor in a loaded GGUF or safetensors file, and
 * its conversion to f32. Shapes are row-major, outermost first, from both loaders (a q_proj is [out, in];
 * the GGUF loader reverses ne[]). `data` points into the loader's map: valid while the loader lives.
 */
#ifndef KVP_RUNTIME_TENSOR_H
#define KVP_RUNTIME_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* The quantized types are ggml's blocks, converted bit for bit as ggml-quants.c's dequantize_row_*: a block
 * holds `block` consecutive elements of a row (a multiple of it); little endian, d/m/dmin f16, unaligned.
 *
 *   type  ggml block bytes  layout                                   value of an element (q: its quant)
 *   Q4_0    2    32   18    d | qs[16]                               d*(q-8)
 *   Q4_1    3    32   20    d | m | qs[16]                           d*q + m
 *   Q5_0    6    32   22    d | qh[4] | qs[16]                       d*(q-16)
 *   Q5_1    7    32   24    d | m | qh[4] | qs[16]                   d*q + m
 *   Q8_0    8    32   34    d | int8 qs[32]                          d*q
 *   Q2_K   10   256   84    scales[16] | qs[64] | d | dmin           (d*sc)*q - dmin*mn      16 per scale
 *   Q3_K   11   256  110    hmask[32] | qs[64] | scales[12] | d      (d*(sc-32))*(q-4)       16 per scale
 *   Q4_K   12   256  144    d | dmin | scales[12] | qs[128]          (d*sc)*q - dmin*mn      32 per scale
 *   Q5_K   13   256  176    d | dmin | scales[12] | qh[32] | qs[128] (d*sc)*q - dmin*mn      32 per scale
 *   Q6_K   14   256  210    ql[128] | qh[64] | int8 scales[16] | d   (d*sc)*(q-32)           16 per scale
 *
 * Q4_0..Q5_1: element i < 16 is qs[i]'s low nibble, i + 16 its high one; bit 5 of element i is bit i of qh.
 * The K types' bit and 6-bit scale packing is drawn in tensor.c. */
typedef enum {
    KVP_WT_F32 = 0,
    KVP_WT_F16,
    KVP_WT_BF16,
    KVP_WT_Q8_0,
    KVP_WT_Q4_0,
    KVP_WT_Q4_1,
    KVP_WT_Q5_0,
    KVP_WT_Q5_1,
    KVP_WT_Q2_K,
    KVP_WT_Q3_K,
    KVP_WT_Q4_K,
    KVP_WT_Q5_K,
    KVP_WT_Q6_K,
    KVP_WT_COUNT
} kvp_wtype;

enum { KVP_TENSOR_MAX_DIMS = 4 };

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

const char *kvp_wtype_name(kvp_wtype dt); /* "F32", "Q4_K", ...; "?" outside the enum */
int32_t kvp_wtype_block(kvp_wtype dt); /* 1 (F32, F16, BF16), 32, 256 (K types); 0 outside the enum */
/* GGUF's ggml type id -> 1 and *dt, or 0 (*dt untouched) when unsupported. */
int kvp_wtype_from_ggml(uint32_t ggml_type, kvp_wtype *dt);
/* Bytes of numel elements (a multiple of the block); 0 on overflow or a bad count. */
size_t kvp_wtype_nbytes(kvp_wtype dt, int64_t numel);

/* out[numel], the caller's. Never fails for a loader's view (checked at open). */
void kvp_tensor_to_f32(const kvp_tensor_view *t, float *out);

/* f32 -> f16 / bf16 bits, nearest even, for tests that write weight files (loader/ needs no attention/). */
uint16_t kvp_wt_f32_to_f16(float f);
uint16_t kvp_wt_f32_to_bf16(float f);

#endif
