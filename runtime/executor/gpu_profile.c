/* runtime/executor/gpu_profile.c — the GPU table (see gpu_profile.h for units).
 *
 * Sources (NVIDIA datasheets; memory totals as nvidia-smi reports them on the SXM parts):
 *   A100-40G  A100 Tensor Core GPU datasheet (2021), SXM4 40GB: HBM2 1,555 GB/s; BF16 312 TFLOPS dense;
 *             NVLink 600 GB/s (both directions). nvidia-smi: 40960 MiB.
 *   A100-80G  same datasheet, SXM4 80GB: HBM2e 2,039 GB/s; BF16 312 TFLOPS; NVLink 600 GB/s.
 *             nvidia-smi: 81920 MiB.
 *   H100-SXM  H100 Tensor Core GPU datasheet, SXM5 80GB: HBM3 3.35 TB/s; BF16 1,979 TFLOPS with sparsity
 *             = 989.4 TFLOPS dense; NVLink 900 GB/s. nvidia-smi: 81559 MiB.
 *   H200      H200 Tensor Core GPU datasheet, SXM 141GB: HBM3e 4.8 TB/s; BF16 989 TFLOPS dense (1,979 with
 *             sparsity); NVLink 900 GB/s. nvidia-smi: 143771 MiB (the "141GB" of the datasheet).
 *   A100-80G-PCIe  A100 datasheet, PCIe 80GB: HBM2e 1,935 GB/s; BF16 312 TFLOPS; PCIe Gen4 64 GB/s; NVLink
 *             600 GB/s only through the optional bridge, which joins pairs. nvidia-smi: 81920 MiB.
 *   H100-PCIe H100 datasheet, PCIe 80GB: HBM2e 2 TB/s; BF16 1,513 TFLOPS with sparsity = 756 dense; PCIe Gen5
 *             128 GB/s; NVLink 600 GB/s through the optional pair bridge. nvidia-smi: 81559 MiB.
 * The PCIe parts' nvlink_bw_bytes_s is the bridge's; a ring over more than two of them runs over PCIe, which
 * is what the cost model's all-reduce assumes for them (runtime/cost_model.c).
 */
#include "runtime/executor/gpu_profile.h"

#include <stddef.h>
#include <stdio.h>
#include <strings.h>

#define MIB (1024LL * 1024LL)

static const kvp_gpu_profile profiles[] = {
    {"A100-40G", 40960 * MIB, 1555e9, 312e12, 300e9},
    {"A100-80G", 81920 * MIB, 2039e9, 312e12, 300e9},
    {"H100-SXM", 81559 * MIB, 3350e9, 989.4e12, 450e9},
    {"H200", 143771 * MIB, 4800e9, 989.4e12, 450e9},
    {"A100-80G-PCIe", 81920 * MIB, 1935e9, 312e12, 300e9},
    {"H100-PCIe", 81559 * MIB, 2000e9, 756e12, 300e9},
};
enum { NPROFILES = (int)(sizeof profiles / sizeof profiles[0]) };

const kvp_gpu_profile *kvp_gpu_profile_list(int *count)
{
    if (count) *count = NPROFILES;
    return profiles;
}

kvp_status kvp_gpu_profile_find(const char *name, const kvp_gpu_profile **out)
{
    if (!name || !out) return KVP_ERR(KVP_EINVAL, "kvp_gpu_profile_find: NULL argument");
    for (int i = 0; i < NPROFILES; i++)
        if (strcasecmp(name, profiles[i].name) == 0) {
            *out = &profiles[i];
            return KVP_OK;
        }
    char known[256];
    size_t n = 0;
    known[0] = '\0';
    for (int i = 0; i < NPROFILES && n < sizeof known; i++) {
        int w = snprintf(known + n, sizeof known - n, "%s%s", i ? ", " : "", profiles[i].name);
        if (w < 0) break;
        n += (size_t)w;
    }
    return KVP_ERR(KVP_ENOTFOUND, "unknown GPU '%s' (known: %s)", name, known);
}
