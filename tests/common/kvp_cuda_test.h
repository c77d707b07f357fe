/* tests/common/kvp_cuda_test.h — for CUDA suites (tests/common/kvp_test.h first): KVP_REQUIRE_DEVICE() skips the
 * calling test when the CUDA runtime sees no device (a native build without a GPU or driver; the emulator always
 * has one), so the native suite shows as skipped, never as passed, where it could not run. */
#ifndef KVP_TESTS_COMMON_KVP_CUDA_TEST_H
#define KVP_TESTS_COMMON_KVP_CUDA_TEST_H

#include <cuda_runtime_api.h>

#define KVP_REQUIRE_DEVICE()                                                                       \
    do {                                                                                           \
        int kvp_ndev_ = 0;                                                                         \
        cudaError_t kvp_e_ = cudaGetDeviceCount(&kvp_ndev_);                                       \
        if (kvp_e_ != cudaSuccess || kvp_ndev_ == 0) {                                             \
            (void)cudaGetLastError();                                                              \
            cr_skip_test("no CUDA device: %s", kvp_e_ != cudaSuccess ? cudaGetErrorString(kvp_e_)  \
                                                                     : "cudaGetDeviceCount is 0"); \
        }                                                                                          \
    } while (0)

#endif
