/* common/report.h — benchmark and sweep results: one field list defines the table columns, the CSV header
 * and the JSON keys. Data goes to a FILE* (stdout); logs go elsewhere.
 *
 *   static const char *const fields[] = {"block_size", "ns_per_op", "validated"};
 *   kvp_report *r; kvp_report_create(fields, 3, &r);
 *   cJSON *row; kvp_report_row(r, &row);          // row is owned by r
 *   cJSON_AddNumberToObject(row, "block_size", 16); ...
 *   kvp_report_print(r, stdout, KVP_FMT_TABLE);
 *
 * Every row also gets "machine" (CPU model and cores) and "commit" (git commit at configure time),
 * appended to the field list automatically.
 */
#ifndef KVP_COMMON_REPORT_H
#define KVP_COMMON_REPORT_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "common/status.h"

typedef enum { KVP_FMT_TABLE = 0, KVP_FMT_CSV, KVP_FMT_JSON } kvp_format;

/* "table" | "csv" | "json" -> format; KVP_EINVAL naming the value otherwise. */
kvp_status kvp_format_parse(const char *s, kvp_format *out);

typedef struct kvp_report kvp_report;

/* fields are copied. */
kvp_status kvp_report_create(const char *const *fields, int nfields, kvp_report **out);
void kvp_report_destroy(kvp_report *r);
/* Appends an empty row (with machine and commit filled in); *row stays owned by r. */
kvp_status kvp_report_row(kvp_report *r, cJSON **row);
int kvp_report_num_rows(const kvp_report *r);
/* The rows as a JSON array, borrowed from r. */
const cJSON *kvp_report_rows(const kvp_report *r);

kvp_status kvp_report_print(const kvp_report *r, FILE *f, kvp_format fmt);
kvp_status kvp_report_write_csv(const kvp_report *r, const char *path);
kvp_status kvp_report_write_json(const kvp_report *r, const char *path);

/* "Intel(R) Xeon(R) ... (2 cores)"; static storage. */
const char *kvp_machine_string(void);
/* Short git commit the build was configured at, or "unknown". */
const char *kvp_git_commit(void);

#endif
