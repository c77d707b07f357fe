/* attention/cuda/attn_prefill_tc_fp8.cu — the tensor-core prefill kernels for fp8 KV pools (attention/cuda/attn_kernels.cuh). */
#define KVP_ATTN_DT KVP_DTYPE_FP8_E4M3
#define KVP_ATTN_NAME fp8
#define KVP_ATTN_PREFILL_TC 1
#include "attention/cuda/attn_kernels.cuh"
