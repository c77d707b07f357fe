/* common/json.h — reading files and typed JSON access on top of cJSON. Errors name the file (parse errors
 * the line and column). The typed getters tell "absent" (KVP_OK, *present = 0 unless present is NULL, *out
 * untouched) from a wrong type or range (KVP_EPARSE naming the key). */
#ifndef KVP_COMMON_JSON_H
#define KVP_COMMON_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

/* A whole file ("-": stdin), NUL-terminated, *len without the NUL, the caller's (kvp_free); KVP_EINVAL
 * above max_bytes. */
kvp_status kvp_read_file(const char *path, size_t max_bytes, char **data, size_t *len);

/* At most 64 MiB; *out is the caller's (cJSON_Delete). `what` names a text in errors ("line 12 of x"). */
kvp_status kvp_json_parse_file(const char *path, cJSON **out);
kvp_status kvp_json_parse(const char *text, size_t len, const char *what, cJSON **out);

kvp_status kvp_json_int(const cJSON *obj, const char *key, int64_t *out, int *present);
kvp_status kvp_json_num(const cJSON *obj, const char *key, double *out, int *present);
kvp_status kvp_json_bool(const cJSON *obj, const char *key, int *out, int *present);
/* *out is borrowed from obj. */
kvp_status kvp_json_str(const cJSON *obj, const char *key, const char **out, int *present);

/* s with invalid UTF-8 replaced by U+FFFD (Python's errors="replace"), so that the output stays valid JSON
 * whatever a model or a prompt file wrote. KVP_ENOMEM. */
kvp_status kvp_json_add_text(cJSON *obj, const char *key, const char *s);
int kvp_utf8_valid(const char *s); /* no overlong forms, surrogates, or code points above U+10FFFF */

kvp_status kvp_json_print(FILE *f, const cJSON *obj); /* formatted, and a newline */
kvp_status kvp_json_write_file(const char *path, const cJSON *obj);

#endif
