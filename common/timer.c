#include "common/timer.h"

#include <time.h>

int64_t kvp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

double kvp_now_s(void) { return (double)kvp_now_ns() * 1e-9; }
