/* attention/cuda/attn_decode_f32.cu — the decode kernels for f32 KV pools (attention/cuda/attn_kernels.cuh). */
#define KVP_ATTN_DT KVP_DTYPE_F32
#define KVP_ATTN_NAME f32
#define KVP_ATTN_DECODE 1
#include "attention/cuda/attn_kernels.cuh"
