/* runtime/executor/gpu_profile.h — datasheet figures of the GPUs the planner and the `sim` executor know
 * (sources: gpu_profile.c). Profiles are static and read-only: pointers returned here live as long as the
 * program. */
#ifndef KVP_RUNTIME_GPU_PROFILE_H
#define KVP_RUNTIME_GPU_PROFILE_H

#include <stdint.h>

#include "common/status.h"

typedef struct {
    const char *name;          /* "A100-40G", "A100-80G", "H100-SXM", "H200" */
    int64_t mem_bytes;         /* as nvidia-smi reports: binary, the "141GB" H200 has 143771 MiB */
    double mem_bw_bytes_s;     /* peak HBM bandwidth, decimal (1555 GB/s = 1.555e12) */
    double bf16_flops;         /* peak dense BF16 tensor-core FLOP/s (no structured sparsity) */
    double nvlink_bw_bytes_s;  /* per GPU, ONE direction, as a ring all-reduce moves data (datasheets
                                * quote both: A100's 600 GB/s is 300e9 here, H100's 900 is 450e9) */
} kvp_gpu_profile;

/* By name, case-insensitively. KVP_ENOTFOUND listing the known names; KVP_EINVAL for NULL. */
kvp_status kvp_gpu_profile_find(const char *name, const kvp_gpu_profile **out);

const kvp_gpu_profile *kvp_gpu_profile_list(int *count); /* a static array of *count */

#endif
