#include <criterion/criterion.h>
#include <string.h>

#include "runtime/executor/gpu_profile.h"

Test(gpu_profile, find_is_case_insensitive)
{
    const kvp_gpu_profile *p = NULL;
    cr_assert_eq(kvp_gpu_profile_find("h200", &p), KVP_OK);
    cr_assert_str_eq(p->name, "H200");
    cr_assert_eq(p->mem_bytes, 143771LL * 1024 * 1024);
    cr_assert_float_eq(p->mem_bw_bytes_s, 4.8e12, 1);
    cr_assert_eq(kvp_gpu_profile_find("A100-40g", &p), KVP_OK);
    cr_assert_eq(p->mem_bytes, 40LL << 30);
    cr_assert_float_eq(p->bf16_flops, 312e12, 1);
}

Test(gpu_profile, unknown_name_lists_known_ones)
{
    const kvp_gpu_profile *p = NULL;
    cr_assert_eq(kvp_gpu_profile_find("V100", &p), KVP_ENOTFOUND);
    cr_assert_null(p);
    cr_assert(strstr(kvp_error_message(), "V100") != NULL);
    cr_assert(strstr(kvp_error_message(), "H100-SXM") != NULL);
    cr_assert_eq(kvp_gpu_profile_find(NULL, &p), KVP_EINVAL);
}

Test(gpu_profile, list_is_sane)
{
    int n = 0;
    const kvp_gpu_profile *l = kvp_gpu_profile_list(&n);
    cr_assert_geq(n, 4);
    for (int i = 0; i < n; i++) {
        cr_assert_gt(l[i].mem_bytes, 30LL << 30);
        cr_assert_gt(l[i].mem_bw_bytes_s, 1e12);
        cr_assert_gt(l[i].bf16_flops, 1e14);
        cr_assert_gt(l[i].nvlink_bw_bytes_s, 1e11);
    }
}
