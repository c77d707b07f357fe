/* tests/runtime/generate_testutil.h — `kvpage generate ... --json` in process (kvp_cmd_generate, whose sources a
 * suite compiles in), its stdout captured and parsed; for the suites that drive the command on the emulated
 * device. Asserts through common/kvp_test.h (Criterion, or the standalone runner). */
#ifndef KVP_TESTS_RUNTIME_GENERATE_TESTUTIL_H
#define KVP_TESTS_RUNTIME_GENERATE_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/json.h"
#include "common/kvp_test.h"
#include "runtime/cli/commands.h"

/* The JSON that `generate argv[0 .. argc)` printed (argv[0] "generate"; the caller frees it with cJSON_Delete),
 * asserting exit 0; *tokens: the first request's first sample's token array (in the JSON). */
static inline cJSON *tu_generate_json(int argc, char **argv, const cJSON **tokens)
{
    char path[] = "/tmp/kvp_generate_json_XXXXXX";
    const int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    fflush(stdout);
    const int saved = dup(1);
    dup2(fd, 1);
    const int rc = kvp_cmd_generate(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(fd);
    cr_assert_eq(rc, 0, "kvpage generate failed: %s", kvp_error_message());
    cJSON *out;
    cr_assert_eq(kvp_json_parse_file(path, &out), KVP_OK, "%s", kvp_error_detail());
    unlink(path);
    const cJSON *req = cJSON_GetArrayItem(cJSON_GetObjectItem(out, "requests"), 0);
    *tokens = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(req, "samples"), 0), "tokens");
    cr_assert(cJSON_IsArray(*tokens), "no tokens in the JSON");
    return out;
}

#endif
