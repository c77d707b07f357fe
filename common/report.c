#include "common/report.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/json.h"

#include "kvp_commit.h" /* KVPAGE_GIT_COMMIT, written at every build (scripts/commit-stamp.cmake) */

struct kvp_report {
    int nfields;
    char **fields;
    int nbrief; /* 0: every column is brief */
    int *brief; /* indices into fields, in table order */
    cJSON *rows; /* array of objects */
};

const char *kvp_git_commit(void) { return KVPAGE_GIT_COMMIT; }

const char *kvp_machine_string(void)
{
    static _Thread_local char buf[256];
    if (buf[0]) return buf;
    char model[200] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                const char *c = strchr(line, ':');
                if (c) {
                    c++;
                    while (*c == ' ') c++;
                    snprintf(model, sizeof model, "%s", c);
                    model[strcspn(model, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    snprintf(buf, sizeof buf, "%s (%ld cores)", model, sysconf(_SC_NPROCESSORS_ONLN));
    return buf;
}

kvp_status kvp_format_parse(const char *s, kvp_format *out)
{
    if (strcmp(s, "table") == 0) *out = KVP_FMT_TABLE;
    else if (strcmp(s, "csv") == 0) *out = KVP_FMT_CSV;
    else if (strcmp(s, "json") == 0) *out = KVP_FMT_JSON;
    else if (strcmp(s, "wide") == 0) *out = KVP_FMT_WIDE;
    else return KVP_ERR(KVP_EINVAL, "unknown format '%s' (use table, wide, csv or json)", s);
    return KVP_OK;
}

void kvp_report_destroy(kvp_report *r)
{
    if (r == NULL) return;
    for (int i = 0; i < r->nfields; i++) kvp_free(r->fields[i]);
    kvp_free(r->fields);
    kvp_free(r->brief);
    cJSON_Delete(r->rows);
    kvp_free(r);
}

kvp_status kvp_report_create(const char *const *fields, int nfields, kvp_report **out)
{
    kvp_report *r = kvp_calloc(1, sizeof *r);
    if (r == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory creating a report");
    r->fields = kvp_calloc((size_t)nfields + 2, sizeof(char *));
    r->rows = cJSON_CreateArray();
    if (r->fields == NULL || r->rows == NULL) goto oom;
    for (int i = 0; i < nfields + 2; i++) {
        const char *name = i < nfields ? fields[i] : (i == nfields ? "machine" : "commit");
        r->fields[i] = kvp_malloc(strlen(name) + 1);
        if (r->fields[i] == NULL) goto oom;
        strcpy(r->fields[i], name);
        r->nfields = i + 1;
    }
    *out = r;
    return KVP_OK;
oom:
    kvp_report_destroy(r);
    return KVP_ERR(KVP_ENOMEM, "out of memory creating a report");
}

kvp_status kvp_report_row(kvp_report *r, cJSON **row)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || !cJSON_AddStringToObject(o, "machine", kvp_machine_string()) ||
        !cJSON_AddStringToObject(o, "commit", kvp_git_commit())) {
        cJSON_Delete(o);
        return KVP_ERR(KVP_ENOMEM, "out of memory adding a report row");
    }
    cJSON_AddItemToArray(r->rows, o);
    *row = o;
    return KVP_OK;
}

int kvp_report_num_rows(const kvp_report *r) { return cJSON_GetArraySize(r->rows); }

kvp_status kvp_report_set_brief(kvp_report *r, const char *const *fields, int n)
{
    int *idx = kvp_calloc((size_t)(n > 0 ? n : 1), sizeof *idx);
    if (idx == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory choosing a table's columns");
    for (int i = 0; i < n; i++) {
        idx[i] = -1;
        for (int j = 0; j < r->nfields - 2; j++)
            if (strcmp(fields[i], r->fields[j]) == 0) idx[i] = j;
        if (idx[i] < 0) {
            kvp_free(idx);
            return KVP_ERR(KVP_EINVAL, "no column '%s' in this report", fields[i]);
        }
    }
    kvp_free(r->brief);
    r->brief = idx;
    r->nbrief = n;
    return KVP_OK;
}
const cJSON *kvp_report_rows(const kvp_report *r) { return r->rows; }

/* One cell as text: numbers without trailing zeros, booleans as true/false, absent as "". */
static void cell(const cJSON *row, const char *key, char *buf, size_t n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, key);
    if (v == NULL || cJSON_IsNull(v)) snprintf(buf, n, "%s", "");
    else if (cJSON_IsString(v)) snprintf(buf, n, "%s", v->valuestring);
    else if (cJSON_IsBool(v)) snprintf(buf, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d == (double)(long long)d && d < 1e15 && d > -1e15) snprintf(buf, n, "%lld", (long long)d);
        else snprintf(buf, n, "%.6g", d);
    } else snprintf(buf, n, "%s", "?");
}

static void csv_escape(FILE *f, const char *s)
{
    if (strpbrk(s, ",\"\n") == NULL) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

kvp_status kvp_report_print(const kvp_report *r, FILE *f, kvp_format fmt)
{
    char buf[512];
    if (fmt == KVP_FMT_JSON) {
        kvp_status st = kvp_json_print(f, r->rows);
        fflush(f);
        return st;
    }
    if (fmt == KVP_FMT_CSV) {
        for (int i = 0; i < r->nfields; i++) {
            if (i) fputc(',', f);
            csv_escape(f, r->fields[i]);
        }
        fputc('\n', f);
        const cJSON *row;
        cJSON_ArrayForEach(row, r->rows)
        {
            for (int i = 0; i < r->nfields; i++) {
                if (i) fputc(',', f);
                cell(row, r->fields[i], buf, sizeof buf);
                csv_escape(f, buf);
            }
            fputc('\n', f);
        }
        fflush(f);
        return ferror(f) ? KVP_ERR(KVP_EIO, "cannot write CSV") : KVP_OK;
    }
    /* Table for people: machine and commit are the same on every row, so they go in a footer. */
    int nall = r->nfields - 2, ncol = 0;
    size_t *w = kvp_calloc((size_t)nall + 1, sizeof *w);
    int *col = kvp_calloc((size_t)nall + 1, sizeof *col);
    if (w == NULL || col == NULL) {
        kvp_free(w);
        kvp_free(col);
        return KVP_ERR(KVP_ENOMEM, "out of memory printing a table");
    }
    const bool brief = fmt != KVP_FMT_WIDE && r->nbrief > 0;
    for (int i = 0; i < (brief ? r->nbrief : nall); i++) col[ncol++] = brief ? r->brief[i] : i;
    const cJSON *row;
    for (int i = 0; i < ncol; i++) {
        w[i] = strlen(r->fields[col[i]]);
        cJSON_ArrayForEach(row, r->rows)
        {
            cell(row, r->fields[col[i]], buf, sizeof buf);
            if (strlen(buf) > w[i]) w[i] = strlen(buf);
        }
    }
    if (fmt != KVP_FMT_WIDE) { /* keep the columns that fit, left to right (at least one) */
        size_t line = 0;
        int fit = 0;
        while (fit < ncol && (fit == 0 || line + 2 + w[fit] <= KVP_TABLE_WIDTH)) {
            line += (fit ? 2 : 0) + w[fit];
            fit++;
        }
        ncol = fit;
    }
    for (int i = 0; i < ncol; i++) fprintf(f, "%s%*s", i ? "  " : "", (int)w[i], r->fields[col[i]]);
    fputc('\n', f);
    cJSON_ArrayForEach(row, r->rows)
    {
        for (int i = 0; i < ncol; i++) {
            cell(row, r->fields[col[i]], buf, sizeof buf);
            fprintf(f, "%s%*s", i ? "  " : "", (int)w[i], buf);
        }
        fputc('\n', f);
    }
    if (ncol < nall)
        fprintf(f, "# %d of %d columns shown; all of them: --wide, or --format csv|json\n", ncol, nall);
    fprintf(f, "# machine: %s; commit: %s\n", kvp_machine_string(), kvp_git_commit());
    kvp_free(w);
    kvp_free(col);
    fflush(f);
    return ferror(f) ? KVP_ERR(KVP_EIO, "cannot write table") : KVP_OK;
}

static kvp_status write_to(const kvp_report *r, const char *path, kvp_format fmt)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) return KVP_ERR(KVP_EIO, "cannot create %s: %s", path, strerror(errno));
    kvp_status st = kvp_report_print(r, f, fmt);
    if (fclose(f) != 0 && st == KVP_OK) st = KVP_ERR(KVP_EIO, "cannot write %s: %s", path, strerror(errno));
    return st;
}

kvp_status kvp_report_write_csv(const kvp_report *r, const char *path) { return write_to(r, path, KVP_FMT_CSV); }
kvp_status kvp_report_write_json(const kvp_report *r, const char *path) { return write_to(r, path, KVP_FMT_JSON); }
