/* common/report.h — benchmark and sweep results: one field list defines the table columns, the CSV header
 * and the JSON keys; data goes to a FILE* (stdout), logs elsewhere. Every row also gets "machine" (CPU model,
 * cores) and "commit" (at configure time), appended to the fields.
 *
 * A table is for people: it shows the brief columns (kvp_report_set_brief; default all), then drops columns
 * from the right until a line fits KVP_TABLE_WIDTH characters, and says in its footer how many it left out.
 * KVP_FMT_WIDE (`--wide`, `--format wide`) prints every column; CSV and JSON always hold every field.
 *
 *   static const char *const fields[] = {"block_size", "ns_per_op", "validated"};
 *   kvp_report *r; kvp_report_create(fields, 3, &r);
 *   cJSON *row; kvp_report_row(r, &row);  cJSON_AddNumberToObject(row, "block_size", 16); ...
 *   kvp_report_print(r, stdout, KVP_FMT_TABLE);
 */
#ifndef KVP_COMMON_REPORT_H
#define KVP_COMMON_REPORT_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "common/status.h"

typedef enum { KVP_FMT_TABLE = 0, KVP_FMT_CSV, KVP_FMT_JSON, KVP_FMT_WIDE } kvp_format;

#define KVP_TABLE_WIDTH 100 /* characters a default table line fits in */

/* "table" | "wide" | "csv" | "json"; else KVP_EINVAL naming it. */
kvp_status kvp_format_parse(const char *s, kvp_format *out);

typedef struct kvp_report kvp_report;

kvp_status kvp_report_create(const char *const *fields, int nfields, kvp_report **out); /* copies fields */
void kvp_report_destroy(kvp_report *r);
/* A new row, machine and commit filled in; *row is owned by r. */
kvp_status kvp_report_row(kvp_report *r, cJSON **row);
int kvp_report_num_rows(const kvp_report *r);
/* The columns a default table shows, in this order (names of fields; copied). Unknown names: KVP_EINVAL. */
kvp_status kvp_report_set_brief(kvp_report *r, const char *const *fields, int n);
const cJSON *kvp_report_rows(const kvp_report *r); /* a JSON array, borrowed from r */

/* Prints all rows in fmt and flushes f, so a log line written after it cannot land inside a row. */
kvp_status kvp_report_print(const kvp_report *r, FILE *f, kvp_format fmt);
kvp_status kvp_report_write_csv(const kvp_report *r, const char *path);
kvp_status kvp_report_write_json(const kvp_report *r, const char *path);

const char *kvp_machine_string(void); /* "Intel(R) Xeon(R) ... (2 cores)", static */
const char *kvp_git_commit(void);     /* the short commit at configure time, or "unknown" */

#endif
