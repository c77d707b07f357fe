#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"
#include "common/parse.h"
#include "common/report.h"
#include "common/stats.h"
#include "common/status.h"
#include "common/timer.h"

Test(common, status_strings_and_detail)
{
    for (int s = 0; s < KVP_STATUS_COUNT; s++) cr_assert(strncmp(kvp_status_str(s), "KVP_", 4) == 0);
    cr_assert_str_eq(kvp_status_str((kvp_status)999), "KVP_E?: unknown status");
    kvp_status st = KVP_ERR(KVP_EPARSE, "bad %s at %d", "thing", 7);
    cr_assert_eq(st, KVP_EPARSE);
    cr_assert(strstr(kvp_error_detail(), "test_common.c:") != NULL);
    cr_assert_str_eq(kvp_error_message(), "bad thing at 7");
    /* wrapping the previous message (a caller naming what failed around its callee's error) */
    KVP_ERR(KVP_EINVAL, "%s", "0.5 is out of range [1, 2]");
    KVP_ERR(KVP_EINVAL, "workload %s: share: %s", "system", kvp_error_message());
    cr_assert_str_eq(kvp_error_message(), "workload system: share: 0.5 is out of range [1, 2]");
    kvp_error_clear();
    cr_assert_str_eq(kvp_error_detail(), "");
}

Test(common, alloc_failure_hook_fails_exactly_the_nth)
{
    for (int n = 1; n <= 4; n++) {
        kvp_alloc_fail_at(n);
        void *p[4];
        for (int i = 0; i < 4; i++) {
            p[i] = kvp_malloc(16);
            cr_assert_eq(p[i] == NULL, i + 1 == n, "allocation %d with fail_at=%d", i + 1, n);
        }
        cr_assert_eq(kvp_alloc_count(), 4);
        for (int i = 0; i < 4; i++) kvp_free(p[i]);
    }
    kvp_alloc_fail_at(0);
    void *q = kvp_calloc(10, 10);
    cr_assert_not_null(q);
    for (int i = 0; i < 100; i++) cr_assert_eq(((char *)q)[i], 0);
    kvp_free(q);
    cr_assert_null(kvp_calloc(SIZE_MAX / 2, 4), "overflowing calloc must fail");
    void *a = kvp_aligned_alloc(64, 100);
    cr_assert_not_null(a);
    cr_assert_eq((uintptr_t)a % 64, 0);
    kvp_free(a);
    kvp_free(NULL);
}

Test(common, grow_keeps_array_on_failure)
{
    int *arr = NULL;
    size_t cap = 0;
    cr_assert_eq(kvp_grow((void **)&arr, &cap, 5, sizeof(int)), KVP_OK);
    cr_assert_geq(cap, 5);
    arr[0] = 42;
    size_t old = cap;
    kvp_alloc_fail_at(1);
    cr_assert_eq(kvp_grow((void **)&arr, &cap, 1000, sizeof(int)), KVP_ENOMEM);
    kvp_alloc_fail_at(0);
    cr_assert_eq(cap, old);
    cr_assert_eq(arr[0], 42);
    kvp_free(arr);
}

Test(common, parse_values)
{
    int64_t v;
    cr_assert_eq(kvp_parse_bytes("80GiB", &v), KVP_OK);
    cr_assert_eq(v, 80LL << 30);
    cr_assert_eq(kvp_parse_bytes("141GB", &v), KVP_OK);
    cr_assert_eq(v, 141000000000LL);
    cr_assert_eq(kvp_parse_bytes("1024", &v), KVP_OK);
    cr_assert_eq(v, 1024);
    cr_assert_eq(kvp_parse_bytes("1.5KiB", &v), KVP_OK);
    cr_assert_eq(v, 1536);
    cr_assert_eq(kvp_parse_bytes("12XB", &v), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "unknown size unit") != NULL);
    cr_assert_eq(kvp_parse_bytes("-3GB", &v), KVP_EINVAL);
    cr_assert_eq(kvp_parse_bytes("", &v), KVP_EINVAL);
    cr_assert_eq(kvp_parse_i64("12", 0, 100, &v), KVP_OK);
    cr_assert_eq(v, 12);
    cr_assert_eq(kvp_parse_i64("12x", 0, 100, &v), KVP_EINVAL);
    cr_assert_eq(kvp_parse_i64("101", 0, 100, &v), KVP_EINVAL);
    cr_assert_eq(kvp_parse_i64("99999999999999999999", 0, INT64_MAX, &v), KVP_EINVAL);
    double d;
    cr_assert_eq(kvp_parse_f64("0.9", 0, 1, &d), KVP_OK);
    cr_assert_float_eq(d, 0.9, 1e-12);
    cr_assert_eq(kvp_parse_f64("1.5", 0, 1, &d), KVP_EINVAL);
    cr_assert_eq(kvp_parse_f64("nan", 0, 1, &d), KVP_EINVAL);
    /* plain decimal only: strtoll/strtod would take leading blanks and hexadecimal */
    static const char *const odd[] = {" 5", "\t5", "0x10", "-0x1", "infinity", "+ 5"};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        cr_assert_eq(kvp_parse_i64(odd[i], -100, 100, &v), KVP_EINVAL, "'%s'", odd[i]);
        cr_assert_eq(kvp_parse_f64(odd[i], -100, 100, &d), KVP_EINVAL, "'%s'", odd[i]);
        cr_assert_eq(kvp_parse_bytes(odd[i], &v), KVP_EINVAL, "'%s'", odd[i]);
    }
    cr_assert_eq(kvp_parse_f64("-.5", -1, 1, &d), KVP_OK);
    cr_assert_eq(kvp_parse_i64("+7", 0, 10, &v), KVP_OK);
}

static kvp_status parse_unit(const char *s, void *out) { return kvp_parse_f64(s, 0, 1e9, out); }

Test(common, parse_lists_and_rates)
{
    int32_t v[4];
    int n = 0;
    cr_assert_eq(kvp_parse_i32_list("1,16,64", 1, 256, v, 4, &n), KVP_OK);
    cr_assert(n == 3 && v[0] == 1 && v[1] == 16 && v[2] == 64);
    n = 99;
    cr_assert_eq(kvp_parse_i32_list("1,x", 1, 256, v, 4, &n), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "'x'") != NULL, "%s", kvp_error_message());
    cr_assert_eq(n, 99, "n untouched on failure");
    cr_assert_eq(kvp_parse_i32_list("1,2,3,4,5", 1, 256, v, 4, &n), KVP_EINVAL);
    cr_assert_eq(kvp_parse_i32_list("", 1, 256, v, 4, &n), KVP_EINVAL);
    cr_assert_eq(kvp_parse_i32_list("1,,2", 1, 256, v, 4, &n), KVP_EINVAL);
    cr_assert_eq(kvp_parse_i32_list("1,", 1, 256, v, 4, &n), KVP_EINVAL);
    cr_assert_eq(kvp_parse_i32_list("512", 1, 256, v, 4, &n), KVP_EINVAL);
    double d[3];
    cr_assert_eq(kvp_parse_list("0.5,2,1e3", parse_unit, d, sizeof d[0], 3, &n), KVP_OK);
    cr_assert(n == 3 && d[0] == 0.5 && d[1] == 2 && d[2] == 1e3);
    static const char *const bad[] = {"", ",", "1,,2", "1,", ",1", "1,2,3,4", "1,z"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = 99;
        cr_assert_eq(kvp_parse_list(bad[i], parse_unit, d, sizeof d[0], 3, &n), KVP_EINVAL, "'%s'", bad[i]);
        cr_assert_eq(n, 99, "'%s': n untouched on failure", bad[i]);
    }
    cr_assert(strstr(kvp_error_message(), "'z'") != NULL, "the item's own error: %s", kvp_error_message());
    double r = 0;
    cr_assert_eq(kvp_parse_rate("2.5", &r), KVP_OK);
    cr_assert_float_eq(r, 2.5, 0);
    cr_assert_eq(kvp_parse_rate("inf", &r), KVP_OK);
    cr_assert(isinf(r));
    cr_assert_eq(kvp_parse_rate("0", &r), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "out of range [1e-09") != NULL, "%s", kvp_error_message());
    cr_assert_eq(kvp_parse_rate("-1", &r), KVP_EINVAL);
    cr_assert_eq(kvp_parse_rate("1e-300", &r), KVP_EINVAL, "times would lose their precision");
}

Test(common, json_text_replaces_invalid_utf8)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"plain", "plain"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"a\xff" "b", "a\xef\xbf\xbd" "b"},
        {"cut \xc3", "cut \xef\xbf\xbd"},                        /* a character cut at the end */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                /* overlong '/' */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a UTF-16 surrogate */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* above U+10FFFF */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *o = cJSON_CreateObject();
        cr_assert_eq(kvp_json_add_text(o, "t", cases[i].in), KVP_OK);
        cr_assert_str_eq(cJSON_GetObjectItem(o, "t")->valuestring, cases[i].want, "case %zu", i);
        cJSON_Delete(o);
    }
}

Test(common, json_typed_getters)
{
    const char *text = "{\"a\": 3, \"b\": 2.5, \"c\": \"x\", \"d\": true, \"n\": null}";
    cJSON *o;
    cr_assert_eq(kvp_json_parse(text, strlen(text), "inline", &o), KVP_OK);
    int64_t i = -1;
    double d = 0;
    const char *s = NULL;
    int b = 0, present = 0;
    cr_assert_eq(kvp_json_int(o, "a", &i, &present), KVP_OK);
    cr_assert(present && i == 3);
    cr_assert_eq(kvp_json_int(o, "b", &i, &present), KVP_EPARSE, "2.5 is not an integer");
    cr_assert_eq(kvp_json_num(o, "b", &d, NULL), KVP_OK);
    cr_assert_float_eq(d, 2.5, 0);
    cr_assert_eq(kvp_json_str(o, "c", &s, NULL), KVP_OK);
    cr_assert_str_eq(s, "x");
    cr_assert_eq(kvp_json_str(o, "a", &s, NULL), KVP_EPARSE);
    cr_assert_eq(kvp_json_bool(o, "d", &b, NULL), KVP_OK);
    cr_assert_eq(b, 1);
    i = 77;
    cr_assert_eq(kvp_json_int(o, "n", &i, &present), KVP_OK);
    cr_assert(!present && i == 77, "null counts as absent and leaves the output alone");
    cJSON_Delete(o);

    const char *bad = "{\n  \"a\": 3,\n  \"b\": }";
    cr_assert_eq(kvp_json_parse(bad, strlen(bad), "bad.json", &o), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "bad.json: malformed JSON at line 3") != NULL, "%s",
              kvp_error_message());
    cr_assert_eq(kvp_json_parse_file("/nonexistent/config.json", &o), KVP_EIO);
    cr_assert(strstr(kvp_error_message(), "/nonexistent/config.json") != NULL);
}

Test(common, report_csv_and_json_share_fields)
{
    static const char *const fields[] = {"name", "value", "validated"};
    kvp_report *r;
    cr_assert_eq(kvp_report_create(fields, 3, &r), KVP_OK);
    cJSON *row;
    cr_assert_eq(kvp_report_row(r, &row), KVP_OK);
    cJSON_AddStringToObject(row, "name", "a,b");
    cJSON_AddNumberToObject(row, "value", 1.25);
    cJSON_AddBoolToObject(row, "validated", 1);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(kvp_report_print(r, f, KVP_FMT_CSV), KVP_OK);
    fclose(f);
    cr_assert(strncmp(buf, "name,value,validated,machine,commit\n\"a,b\",1.25,true,", 52) == 0, "%s", buf);
    free(buf);
    cr_assert_eq(kvp_report_num_rows(r), 1);
    kvp_report_destroy(r);
    kvp_format fmt;
    cr_assert_eq(kvp_format_parse("json", &fmt), KVP_OK);
    cr_assert_eq(fmt, KVP_FMT_JSON);
    cr_assert_eq(kvp_format_parse("xml", &fmt), KVP_EINVAL);
}

Test(common, timer_is_monotonic)
{
    int64_t a = kvp_now_ns(), b = kvp_now_ns();
    cr_assert_geq(b, a);
    cr_assert_gt(kvp_now_s(), 0.0);
}

/* Percentiles interpolate between closest ranks as numpy.percentile does (values from numpy). */
Test(common, stats_percentiles_match_numpy)
{
    double v[5] = {4.0, 1.0, 3.0, 2.0, 10.0};
    kvp_sort_doubles(v, 5);
    static const double sorted[5] = {1, 2, 3, 4, 10};
    for (int i = 0; i < 5; i++) cr_assert_eq(v[i], sorted[i]);
    cr_assert_float_eq(kvp_percentile(v, 5, 50), 3.0, 1e-12);
    cr_assert_float_eq(kvp_percentile(v, 5, 90), 7.6, 1e-12);  /* numpy: 7.6 */
    cr_assert_float_eq(kvp_percentile(v, 5, 99), 9.76, 1e-12); /* numpy: 9.76 */
    cr_assert_float_eq(kvp_percentile(v, 4, 99), 3.97, 1e-12); /* [1, 2, 3, 4] */
    cr_assert_eq(kvp_percentile(v, 5, 100), 10.0);
    cr_assert_eq(kvp_percentile(v, 5, 0), 1.0);
    cr_assert_eq(kvp_percentile(v, 1, 99), 1.0);
    cr_assert_eq(kvp_percentile(v, 0, 50), 0.0);
    cr_assert_float_eq(kvp_mean(v, 5), 4.0, 1e-12);
    cr_assert_eq(kvp_mean(v, 0), 0.0);
}
