/* common/stats.c — see stats.h. */
#include "common/stats.h"

#include <math.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void kvp_sort_doubles(double *v, int64_t n)
{
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_double);
}

double kvp_percentile(const double *v, int64_t n, double p)
{
    if (n <= 0) return 0;
    double pos = p / 100.0 * (double)(n - 1);
    int64_t lo = (int64_t)floor(pos);
    if (lo >= n - 1) return v[n - 1];
    double f = pos - (double)lo;
    return v[lo] + f * (v[lo + 1] - v[lo]);
}

double kvp_mean(const double *v, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return n > 0 ? s / (double)n : 0;
}
