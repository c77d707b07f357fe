/* common/parse.h — strict parsing of command-line values. Each rejects trailing junk, empty strings and
 * out-of-range values with KVP_EINVAL and a detail naming the value and the allowed range. */
#ifndef KVP_COMMON_PARSE_H
#define KVP_COMMON_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

kvp_status kvp_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
kvp_status kvp_parse_i32(const char *s, int32_t min, int32_t max, int32_t *out);
kvp_status kvp_parse_f64(const char *s, double min, double max, double *out);
/* Byte sizes: "1024", "80GiB", "141GB", "512MiB", "1.5TB". Decimal units KB/MB/GB/TB (1000^k), binary
 * units KiB/MiB/GiB/TiB and the bare letters K/M/G/T (1024^k); case-insensitive. */
kvp_status kvp_parse_bytes(const char *s, int64_t *out);

/* A comma-separated list of integers in [min, max] ("1,16,64"): at most cap of them into out, *n set.
 * KVP_EINVAL for an empty list, a bad element (named) or more than cap elements. */
kvp_status kvp_parse_i32_list(const char *s, int32_t min, int32_t max, int32_t *out, int cap, int *n);
/* A comma-separated list ("a,b,c"): each item parsed by parse into out[i] (elem bytes apart), at most cap
 * of them, *n set. KVP_EINVAL for an empty list or item, more than cap items, or an item parse rejects
 * (its message kept: "'x': ..."). */
kvp_status kvp_parse_list(const char *s, kvp_status (*parse)(const char *item, void *out), void *out, size_t elem,
                          int cap, int *n);
/* A request rate: a number in [1e-9, 1e12] requests/s, or "inf" / "infinity" (everything arrives at once)
 * as INFINITY. */
kvp_status kvp_parse_rate(const char *s, double *out);

#endif
