/* common/json.h — reading files and typed JSON access on top of cJSON.
 *
 * Errors name the file (and for parse errors the line and column) through KVP_ERR.
 * The typed getters distinguish "absent" (KVP_OK, *present = 0, *out untouched) from "present with the
 * wrong type or an out-of-range value" (KVP_EPARSE naming the key). `present` may be NULL.
 */
#ifndef KVP_COMMON_JSON_H
#define KVP_COMMON_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

/* Reads a whole file ("-": standard input) into a NUL-terminated buffer owned by the caller (kvp_free). *len
 * excludes the NUL. max_bytes bounds the size (KVP_EINVAL above it). */
kvp_status kvp_read_file(const char *path, size_t max_bytes, char **data, size_t *len);

/* Parses a JSON file (at most 64 MiB). *out is owned by the caller (cJSON_Delete). */
kvp_status kvp_json_parse_file(const char *path, cJSON **out);
/* Parses a JSON text; `what` names it in errors (a file name, "line 12 of trace.jsonl", ...). */
kvp_status kvp_json_parse(const char *text, size_t len, const char *what, cJSON **out);

kvp_status kvp_json_int(const cJSON *obj, const char *key, int64_t *out, int *present);
kvp_status kvp_json_num(const cJSON *obj, const char *key, double *out, int *present);
kvp_status kvp_json_bool(const cJSON *obj, const char *key, int *out, int *present);
/* *out borrows the string inside obj: valid while obj lives. */
kvp_status kvp_json_str(const cJSON *obj, const char *key, const char **out, int *present);

/* Adds s as string member key of obj, each byte sequence that is not valid UTF-8 replaced by U+FFFD (as
 * Python's errors="replace"): model text may end inside a character, or a prompt file hold raw bytes, and
 * the output must stay valid JSON. KVP_ENOMEM. */
kvp_status kvp_json_add_text(cJSON *obj, const char *key, const char *s);
/* 1 when the NUL-terminated s is valid UTF-8 (no overlong forms, surrogates or code points above U+10FFFF). */
int kvp_utf8_valid(const char *s);

/* Prints obj (formatted) and a newline to f. */
kvp_status kvp_json_print(FILE *f, const cJSON *obj);
kvp_status kvp_json_write_file(const char *path, const cJSON *obj);

#endif
