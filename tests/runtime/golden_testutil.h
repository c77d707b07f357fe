/* tests/runtime/golden_testutil.h — stories260K's golden.json (published greedy outputs) as session requests,
 * for Criterion suites and the standalone runner of the native CUDA suites alike (common/kvp_test.h). Static,
 * header-only. */
#ifndef KVP_TESTS_RUNTIME_GOLDEN_TESTUTIL_H
#define KVP_TESTS_RUNTIME_GOLDEN_TESTUTIL_H

#include <stdint.h>
#include <string.h>

#include "common/json.h"
#include "common/kvp_test.h"
#include "runtime/engine/session.h"

#define S260_DIR "../shared/models/stories260K"
#define S260_GOLDEN S260_DIR "/golden.json"

/* The cases of golden.json as greedy requests: case i's prompt (with BOS) in prompt[i], the tokens it must
 * generate in want[i] (nwant[i] of them; tokens_after_bos = the prompt without BOS, then these). Returns
 * the number of cases. */
typedef struct {
    kvp_session_request reqs[8];
    int32_t prompt[8][64], want[8][512], nwant[8];
    int n;
} tu_golden;

static inline void tu_golden_load(tu_golden *g)
{
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK, "%s (../shared must be present)", kvp_error_detail());
    g->n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(gold, "cases"))
    {
        cr_assert_lt(g->n, 8);
        int32_t np = 0, nw = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "prompt_tokens")) g->prompt[g->n][np++] = x->valueint;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "tokens_after_bos")) g->want[g->n][nw++] = x->valueint;
        g->nwant[g->n] = nw - (np - 1);
        memmove(g->want[g->n], g->want[g->n] + np - 1, sizeof(int32_t) * (size_t)g->nwant[g->n]);
        g->reqs[g->n] = (kvp_session_request){.prompt = g->prompt[g->n], .n_prompt = np, .max_tokens = g->nwant[g->n],
                                          .sampler = kvp_sampler_default(), .n = 1};
        g->n++;
    }
    cJSON_Delete(gold);
}

#endif
