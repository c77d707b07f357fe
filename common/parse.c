#include "common/parse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* strtoll / strtod take leading blanks, and strtod hexadecimal ("0x10") and "inf"/"nan" spellings: a value
 * here is plain decimal, an optional sign then a digit or '.'. */
static int plain_decimal(const char *s)
{
    if (*s == '+' || *s == '-') s++;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) return 0;
    return (*s >= '0' && *s <= '9') || *s == '.';
}

kvp_status kvp_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    if (s == NULL || *s == '\0') return KVP_ERR(KVP_EINVAL, "empty value where an integer is expected");
    if (!plain_decimal(s)) return KVP_ERR(KVP_EINVAL, "'%s' is not an integer", s);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0' || end == s) return KVP_ERR(KVP_EINVAL, "'%s' is not an integer", s);
    if (errno == ERANGE || v < min || v > max)
        return KVP_ERR(KVP_EINVAL, "%s is out of range [%lld, %lld]", s, (long long)min, (long long)max);
    *out = v;
    return KVP_OK;
}

kvp_status kvp_parse_i32(const char *s, int32_t min, int32_t max, int32_t *out)
{
    int64_t v = 0;
    KVP_TRY(kvp_parse_i64(s, min, max, &v));
    *out = (int32_t)v;
    return KVP_OK;
}

kvp_status kvp_parse_f64(const char *s, double min, double max, double *out)
{
    if (s == NULL || *s == '\0') return KVP_ERR(KVP_EINVAL, "empty value where a number is expected");
    if (!plain_decimal(s)) return KVP_ERR(KVP_EINVAL, "'%s' is not a number", s);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0' || end == s || !isfinite(v)) return KVP_ERR(KVP_EINVAL, "'%s' is not a number", s);
    if (v < min || v > max) return KVP_ERR(KVP_EINVAL, "%s is out of range [%g, %g]", s, min, max);
    *out = v;
    return KVP_OK;
}

kvp_status kvp_parse_bytes(const char *s, int64_t *out)
{
    if (s == NULL || *s == '\0') return KVP_ERR(KVP_EINVAL, "empty value where a byte size is expected");
    if (!plain_decimal(s)) return KVP_ERR(KVP_EINVAL, "'%s' is not a byte size", s);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0) return KVP_ERR(KVP_EINVAL, "'%s' is not a byte size", s);
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1},          {"B", 1},
        {"KB", 1e3},      {"MB", 1e6},      {"GB", 1e9},      {"TB", 1e12},
        {"K", 1024.0},    {"M", 1048576.0}, {"G", 1073741824.0}, {"T", 1099511627776.0},
        {"KiB", 1024.0},  {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix) == 0 && strlen(end) == strlen(units[i].suffix)) {
            double b = v * units[i].mult;
            if (b > 9.0e18) return KVP_ERR(KVP_EINVAL, "byte size '%s' is too large", s);
            if (b != floor(b)) return KVP_ERR(KVP_EINVAL, "byte size '%s' is not a whole number of bytes", s);
            *out = (int64_t)b;
            return KVP_OK;
        }
    }
    return KVP_ERR(KVP_EINVAL, "'%s': unknown size unit (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", s);
}

kvp_status kvp_parse_i32_list(const char *s, int32_t min, int32_t max, int32_t *out, int cap, int *n)
{
    int k = 0;
    for (const char *p = s; *p != '\0';) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof item) return KVP_ERR(KVP_EINVAL, "bad list '%s'", s);
        if (k == cap) return KVP_ERR(KVP_EINVAL, "list '%s' has more than %d values", s, cap);
        memcpy(item, p, len);
        item[len] = '\0';
        KVP_TRY(kvp_parse_i32(item, min, max, &out[k]));
        k++;
        p += len + (comma != NULL);
        if (comma && *p == '\0') return KVP_ERR(KVP_EINVAL, "bad list '%s'", s);
    }
    if (k == 0) return KVP_ERR(KVP_EINVAL, "empty list where integers are expected");
    *n = k;
    return KVP_OK;
}

kvp_status kvp_parse_list(const char *s, kvp_status (*parse)(const char *item, void *out), void *out, size_t elem,
                          int cap, int *n)
{
    int k = 0;
    for (const char *p = s;; p++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[64];
        if (len == 0) return KVP_ERR(KVP_EINVAL, "'%s' has an empty item", s);
        if (len >= sizeof item) return KVP_ERR(KVP_EINVAL, "'%.*s' is too long", (int)len, p);
        if (k == cap) return KVP_ERR(KVP_EINVAL, "'%s' has more than %d items", s, cap);
        memcpy(item, p, len);
        item[len] = '\0';
        KVP_TRY(parse(item, (char *)out + (size_t)k * elem));
        k++;
        if (!comma) break;
        p = comma;
    }
    *n = k;
    return KVP_OK;
}

kvp_status kvp_parse_rate(const char *s, double *out)
{
    if (s != NULL && (strcasecmp(s, "inf") == 0 || strcasecmp(s, "infinity") == 0)) {
        *out = INFINITY;
        return KVP_OK;
    }
    double v = 0;
    KVP_TRY(kvp_parse_f64(s, 1e-9, 1e12, &v)); /* below a request in 30 years, times lose their precision */
    *out = v;
    return KVP_OK;
}
