/* attention/cuda/attn_decode_fp8.cu — the decode kernels for fp8 KV pools (attention/cuda/attn_kernels.cuh). */
#define KVP_ATTN_DT KVP_DTYPE_FP8_E4M3
#define KVP_ATTN_NAME fp8
#define KVP_ATTN_DECODE 1
#include "attention/cuda/attn_kernels.cuh"
