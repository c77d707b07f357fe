/* runtime/executor/gpu_profile.h — datasheet figures of the GPUs the planner and the `sim` executor know.
 *
 * A profile is a static, read-only record: pointers returned here stay valid for the life of the program
 * and are never freed by the caller.
 *
 * Units: bytes, bytes per second, FLOP per second (dense, no structured sparsity).
 *   mem_bytes         device memory as the driver reports it (nvidia-smi "memory.total"); see gpu_profile.c
 *                     for the figure behind each number. GPU memory is sold in binary units: the
 *                     "40GB" A100 has 40960 MiB, the "141GB" H200 has 143771 MiB (about 140.4 GiB).
 *   mem_bw_bytes_s    peak HBM bandwidth from the datasheet (decimal: 1555 GB/s = 1.555e12 B/s).
 *   bf16_flops        peak dense BF16 tensor-core throughput from the datasheet.
 *   nvlink_bw_bytes_s NVLink bandwidth per GPU, ONE direction (datasheets quote both directions
 *                     together: 600 GB/s for A100 -> 300e9 here, 900 GB/s for H100/H200 -> 450e9 here).
 *                     This is what a ring all-reduce moves data at.
 */
#ifndef KVP_RUNTIME_GPU_PROFILE_H
#define KVP_RUNTIME_GPU_PROFILE_H

#include <stdint.h>

#include "common/status.h"

typedef struct {
    const char *name;          /* "A100-40G", "A100-80G", "H100-SXM", "H200" */
    int64_t mem_bytes;
    double mem_bw_bytes_s;
    double bf16_flops;
    double nvlink_bw_bytes_s;
} kvp_gpu_profile;

/* Finds a profile by name, case-insensitively ("h200" == "H200"). KVP_ENOTFOUND with a message listing
 * the known names otherwise (KVP_EINVAL for NULL arguments). *out is a static profile (never freed). */
kvp_status kvp_gpu_profile_find(const char *name, const kvp_gpu_profile **out);

/* All known profiles: *count entries in a static array. */
const kvp_gpu_profile *kvp_gpu_profile_list(int *count);

#endif
