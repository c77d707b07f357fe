/* ggml's quantized GGUF tensor types (Q4_0..Q8_0, Q2_K..Q6_K) against gguf-py: tests/data/quant_types.gguf
 * (written by scripts/gguf-quant-fixture.py) holds, for each type, a tensor of random blocks and beside it
 * NAME.ref, gguf-py's dequantization of the same bytes; kvp_tensor_to_f32 must give NAME.ref bit for bit.
 * Then corrupted copies of that file: rows that are not whole blocks, truncated data, unknown type ids. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_testutil.h"
#include "runtime/loader/gguf.h"

#define FIXTURE "tests/data/quant_types.gguf"

/* The block sizes from ggml-common.h, written out here rather than read from tensor.c. */
static const struct {
    kvp_wtype dt;
    const char *name; /* the fixture's tensor: the type name in lower case */
    uint32_t ggml;
    int32_t block, bytes;
} TYPES[] = {
    {KVP_WT_Q4_0, "q4_0", 2, 32, 18},    {KVP_WT_Q4_1, "q4_1", 3, 32, 20},    {KVP_WT_Q5_0, "q5_0", 6, 32, 22},
    {KVP_WT_Q5_1, "q5_1", 7, 32, 24},    {KVP_WT_Q8_0, "q8_0", 8, 32, 34},    {KVP_WT_Q2_K, "q2_k", 10, 256, 84},
    {KVP_WT_Q3_K, "q3_k", 11, 256, 110}, {KVP_WT_Q4_K, "q4_k", 12, 256, 144}, {KVP_WT_Q5_K, "q5_k", 13, 256, 176},
    {KVP_WT_Q6_K, "q6_k", 14, 256, 210},
};
enum { NTYPES = sizeof TYPES / sizeof TYPES[0] };

static void require_fixture(void)
{
    cr_assert(access(FIXTURE, R_OK) == 0,
              "test data missing: %s (run from the project root; scripts/gguf-quant-fixture.py writes it)", FIXTURE);
}

static int type_index(kvp_wtype dt)
{
    for (int i = 0; i < NTYPES; i++)
        if (TYPES[i].dt == dt) return i;
    return -1;
}

/* Converts t and wants ref's floats exactly (compared as bits: -0 is not 0, and a NaN would not pass). */
static void expect_same_as_ref(const kvp_tensor_view *t, const kvp_tensor_view *ref, const char *what)
{
    cr_assert_eq(ref->dtype, KVP_WT_F32, "%s", what);
    cr_assert_eq(ref->numel, t->numel, "%s", what);
    float *got = malloc(sizeof(float) * (size_t)t->numel), *want = malloc(sizeof(float) * (size_t)t->numel);
    kvp_tensor_to_f32(t, got);
    kvp_tensor_to_f32(ref, want);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < t->numel; i++) {
        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0, "%s: element %lld is %.9g, gguf-py has %.9g", what,
                  (long long)i, (double)got[i], (double)want[i]);
        nonzero += want[i] != 0;
    }
    cr_assert_gt(nonzero, t->numel / 2, "%s: the reference is mostly zeros (%lld of %lld nonzero)", what,
                 (long long)nonzero, (long long)t->numel);
    free(got);
    free(want);
}

Test(quant, every_type_dequantizes_as_gguf_py)
{
    require_fixture();
    kvp_gguf *g = NULL;
    cr_assert_eq(kvp_gguf_open(FIXTURE, &g), KVP_OK, "%s", kvp_error_detail());
    int seen[NTYPES] = {0};
    for (int64_t i = 0; i < kvp_gguf_num_tensors(g); i++) {
        kvp_tensor_view t, ref;
        kvp_gguf_tensor_at(g, i, &t);
        size_t len = strlen(t.name);
        if (len > 4 && strcmp(t.name + len - 4, ".ref") == 0) continue;
        int k = type_index(t.dtype);
        cr_assert_geq(k, 0, "tensor '%s' has type %s, not a quantized one", t.name, kvp_wtype_name(t.dtype));
        cr_assert_str_eq(t.name, TYPES[k].name, "tensor '%s' holds %s", t.name, kvp_wtype_name(t.dtype));
        seen[k]++;
        cr_assert_eq(t.ndim, 2);
        cr_assert_eq(t.shape[0], 2);
        cr_assert_eq(t.shape[1], 256);
        cr_assert_eq(t.nbytes, (size_t)(512 / TYPES[k].block * TYPES[k].bytes), "%s: %zu bytes", t.name, t.nbytes);
        char rname[64];
        snprintf(rname, sizeof rname, "%s.ref", t.name);
        cr_assert_eq(kvp_gguf_tensor(g, rname, &ref), KVP_OK, "%s", kvp_error_detail());
        cr_assert(ref.shape[0] == 2 && ref.shape[1] == 256, "%s", rname);
        expect_same_as_ref(&t, &ref, t.name);
    }
    for (int k = 0; k < NTYPES; k++) cr_assert_eq(seen[k], 1, "%s: %d tensors in the fixture", TYPES[k].name, seen[k]);
    kvp_gguf_close(g);
}

/* Tensor data inside a file is aligned, but the contract is 1 byte: every type from an odd address. */
Test(quant, data_at_an_odd_address_converts_the_same)
{
    require_fixture();
    kvp_gguf *g = NULL;
    cr_assert_eq(kvp_gguf_open(FIXTURE, &g), KVP_OK, "%s", kvp_error_detail());
    for (int k = 0; k < NTYPES; k++) {
        kvp_tensor_view t, ref;
        char rname[64];
        snprintf(rname, sizeof rname, "%s.ref", TYPES[k].name);
        cr_assert_eq(kvp_gguf_tensor(g, TYPES[k].name, &t), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_gguf_tensor(g, rname, &ref), KVP_OK, "%s", kvp_error_detail());
        unsigned char *buf = malloc(t.nbytes + 1);
        memcpy(buf + 1, t.data, t.nbytes);
        t.data = buf + 1;
        expect_same_as_ref(&t, &ref, TYPES[k].name);
        free(buf);
    }
    kvp_gguf_close(g);
}

Test(quant, block_table_matches_ggml)
{
    for (int k = 0; k < NTYPES; k++) {
        kvp_wtype dt = KVP_WT_F32;
        cr_assert_eq(kvp_wtype_from_ggml(TYPES[k].ggml, &dt), 1, "ggml type %u", TYPES[k].ggml);
        cr_assert_eq(dt, TYPES[k].dt, "ggml type %u", TYPES[k].ggml);
        cr_assert_eq(kvp_wtype_block(dt), TYPES[k].block, "%s", TYPES[k].name);
        cr_assert_eq(kvp_wtype_nbytes(dt, 2 * 256), (size_t)(2 * 256 / TYPES[k].block * TYPES[k].bytes), "%s",
                     TYPES[k].name);
        cr_assert_eq(kvp_wtype_nbytes(dt, TYPES[k].block + 1), 0, "%s: a partial block has a size", TYPES[k].name);
        char upper[8];
        snprintf(upper, sizeof upper, "%s", TYPES[k].name);
        for (char *c = upper; *c; c++)
            if (*c >= 'a' && *c <= 'z') *c = (char)(*c - 'a' + 'A');
        cr_assert_str_eq(kvp_wtype_name(dt), upper);
    }
    kvp_wtype dt = KVP_WT_Q6_K;
    cr_assert_eq(kvp_wtype_from_ggml(9 /* Q8_1 */, &dt), 0);
    cr_assert_eq(kvp_wtype_from_ggml(23 /* IQ4_XS */, &dt), 0);
    cr_assert_eq(dt, KVP_WT_Q6_K, "a refused id changed *dt");
    cr_assert_eq(kvp_wtype_from_ggml(30, &dt), 1);
    cr_assert_eq(dt, KVP_WT_BF16);
    cr_assert_eq(kvp_wtype_block(KVP_WT_F16), 1);
    cr_assert_eq(kvp_wtype_block(KVP_WT_COUNT), 0);
    cr_assert_str_eq(kvp_wtype_name(KVP_WT_COUNT), "?");
    cr_assert_eq(kvp_wtype_nbytes(KVP_WT_COUNT, 256), 0);
    cr_assert_eq(kvp_wtype_nbytes(KVP_WT_Q4_K, INT64_MAX / 256 * 256), 0, "an overflowing size");
}

/* ---- corrupted copies of the fixture ---- */

/* Where tensor `name`'s info fields start (u32 n_dims, u64 ne[n_dims], u32 type, u64 offset). */
static size_t tensor_info_at(const unsigned char *buf, size_t len, const char *name)
{
    return tu_gguf_find_str(buf, len, name) + 8 + strlen(name);
}

/* Opens buf[0..len) written to a file named `file`; returns the status, *g must come back NULL on error. */
static kvp_status open_copy(const char *file, const unsigned char *buf, size_t len)
{
    char path[400];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), file);
    tu_write_all(path, buf, len);
    kvp_gguf *g = NULL;
    kvp_status st = kvp_gguf_open(path, &g);
    if (st != KVP_OK) cr_assert_null(g);
    kvp_gguf_close(g);
    return st;
}

Test(quant, k_quant_row_not_a_whole_block_is_refused)
{
    require_fixture();
    size_t len;
    unsigned char *buf = tu_read_all(FIXTURE, &len);
    size_t at = tensor_info_at(buf, len, "q4_k");
    uint32_t nd;
    memcpy(&nd, buf + at, 4);
    cr_assert_eq(nd, 2);
    /* [2, 256] -> ne = (128, 4): the same 512 elements and bytes, but rows of 128 */
    uint64_t ne[2] = {128, 4};
    memcpy(buf + at + 4, ne, sizeof ne);
    cr_assert_eq(open_copy("rows.gguf", buf, len), KVP_EPARSE);
    const char *msg = kvp_error_message();
    cr_assert(strstr(msg, "'q4_k'") && strstr(msg, "Q4_K") && strstr(msg, "128") && strstr(msg, "256") &&
                  strstr(msg, "rows.gguf"),
              "%s", msg);
    free(buf);
}

Test(quant, file_cut_inside_q6_k_data_is_refused)
{
    require_fixture();
    size_t len;
    unsigned char *buf = tu_read_all(FIXTURE, &len);
    kvp_gguf *g = NULL;
    cr_assert_eq(kvp_gguf_open(FIXTURE, &g), KVP_OK, "%s", kvp_error_detail());
    kvp_tensor_view t;
    cr_assert_eq(kvp_gguf_tensor(g, "q6_k", &t), KVP_OK);
    const unsigned char *data = memmem(buf, len, t.data, 64); /* random bytes: found once, where they are */
    cr_assert_not_null(data);
    size_t start = (size_t)(data - buf), cuts[] = {start + 1, start + 100, start + t.nbytes - 1};
    kvp_gguf_close(g);
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        cr_assert_eq(open_copy("cut.gguf", buf, cuts[i]), KVP_EPARSE, "cut at %zu", cuts[i]);
        const char *msg = kvp_error_message();
        cr_assert(strstr(msg, "'q6_k'") && strstr(msg, "past the end") && strstr(msg, "cut.gguf"), "cut at %zu: %s",
                  cuts[i], msg);
    }
    free(buf);
}

Test(quant, unknown_type_ids_are_refused_by_number)
{
    require_fixture();
    size_t len;
    unsigned char *buf = tu_read_all(FIXTURE, &len);
    size_t at = tensor_info_at(buf, len, "q5_1") + 4 + 2 * 8;
    uint32_t type;
    memcpy(&type, buf + at, 4);
    cr_assert_eq(type, 7);
    struct {
        uint32_t id;
        const char *name;
    } cases[] = {{99, "unknown"}, {23, "IQ4_XS"}, {9, "Q8_1"}, {15, "Q8_K"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(buf + at, &cases[i].id, 4);
        cr_assert_eq(open_copy("type.gguf", buf, len), KVP_EUNSUPPORTED, "type %u", cases[i].id);
        const char *msg = kvp_error_message();
        char num[32];
        snprintf(num, sizeof num, "type %u (", cases[i].id);
        cr_assert(strstr(msg, num) && strstr(msg, cases[i].name) && strstr(msg, "'q5_1'") && strstr(msg, "Q6_K"),
                  "%s", msg);
    }
    free(buf);
}

static kvp_status open_gguf(void *path, void **g) { return kvp_gguf_open(path, (kvp_gguf **)g); }
static void close_gguf(void *g) { kvp_gguf_close(g); }

Test(quant, open_survives_every_allocation_failure)
{
    require_fixture();
    tu_every_alloc_failure("quantized gguf open", open_gguf, close_gguf, FIXTURE, 0);
}
