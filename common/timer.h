/* common/timer.h — monotonic clock for benchmarks and wall-time figures. */
#ifndef KVP_COMMON_TIMER_H
#define KVP_COMMON_TIMER_H

#include <stdint.h>

int64_t kvp_now_ns(void); /* CLOCK_MONOTONIC, nanoseconds */
double kvp_now_s(void);   /* CLOCK_MONOTONIC, seconds */

#endif
