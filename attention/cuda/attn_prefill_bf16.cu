/* attention/cuda/attn_prefill_bf16.cu — the prefill kernels for bf16 KV pools (attention/cuda/attn_kernels.cuh). */
#define KVP_ATTN_DT KVP_DTYPE_BF16
#define KVP_ATTN_NAME bf16
#define KVP_ATTN_PREFILL 1
#include "attention/cuda/attn_kernels.cuh"
