/* attention/cuda/attn_prefill_tc_f16.cu — the tensor-core prefill kernels for f16 KV pools (attention/cuda/attn_kernels.cuh). */
#define KVP_ATTN_DT KVP_DTYPE_F16
#define KVP_ATTN_NAME f16
#define KVP_ATTN_PREFILL_TC 1
#include "attention/cuda/attn_kernels.cuh"
