/* common/stats.h — summary statistics of latency samples (the engine's metrics, bench serve). */
#ifndef KVP_COMMON_STATS_H
#define KVP_COMMON_STATS_H

#include <stdint.h>

/* Sorts v[0..n) ascending (NaN-free input). */
void kvp_sort_doubles(double *v, int64_t n);
/* The p-th percentile (0..100) of sorted v[0..n): linear interpolation between closest ranks (numpy's
 * default); 0 for an empty set. */
double kvp_percentile(const double *v, int64_t n, double p);
double kvp_mean(const double *v, int64_t n); /* 0 for an empty set */

#endif
