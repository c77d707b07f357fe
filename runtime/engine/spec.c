/* runtime/engine/spec.c — n-gram speculation's proposals and vLLM's --speculative-config (contract: engine.h;
 * the drafts are scheduled in scheduler.c and verified in output.c). */
#include <string.h>

#include "common/json.h"
#include "runtime/engine/engine.h"

int32_t kvp_ngram_propose(const int32_t *t, int32_t len, int32_t nmin, int32_t nmax, int32_t max_out, int32_t *out)
{
    if (nmax > len - 1) nmax = len - 1;
    if (nmin < 1 || nmax < nmin || max_out < 1) return 0;
    /* one pass from the latest end e of an occurrence (t[e] = the last token) to the earliest: the longest match
     * so far (n), and where its occurrence ends (at; settled once it has max_out tokens after it) */
    int32_t n = 0, at = -1, settled = 0;
    for (int32_t e = len - 2; e >= 0; e--) {
        if (t[e] != t[len - 1]) continue;
        int32_t m = 1;
        while (m < nmax && m <= e && t[e - m] == t[len - 1 - m]) m++;
        if (m < nmin || m < n || (m == n && settled)) continue;
        n = m; /* longer: this n's first (latest) occurrence; as long: an earlier one, with more after it */
        at = e;
        settled = len - 1 - e >= max_out;
    }
    if (at < 0) return 0;
    const int32_t c = len - 1 - at < max_out ? len - 1 - at : max_out;
    memcpy(out, t + at + 1, (size_t)c * sizeof *t);
    return c;
}

/* Integer member key of o in 1 .. hi into *out (absent: *out unchanged, *given 0; given may be NULL). */
static kvp_status spec_int(const cJSON *o, const char *key, int32_t hi, int32_t *out, int *given)
{
    int64_t v = 0;
    int has = 0;
    KVP_TRY(kvp_json_int(o, key, &v, &has));
    if (has && (v < 1 || v > hi))
        return KVP_ERR(KVP_EINVAL, "speculative config: \"%s\" is %lld, not in 1..%d", key, (long long)v, hi);
    if (has) *out = (int32_t)v;
    if (given) *given = has;
    return KVP_OK;
}

kvp_status kvp_spec_parse(const char *json, kvp_spec_config *cfg)
{
    cJSON *o;
    KVP_TRY(kvp_json_parse(json, strlen(json), "the speculative config", &o));
    static const char *const keys[] = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                                       "disable_by_batch_size"};
    enum { NKEYS = sizeof keys / sizeof keys[0] };
    kvp_status st = cJSON_IsObject(o) ? KVP_OK : KVP_ERR(KVP_EPARSE, "speculative config: not a JSON object");
    for (const cJSON *it = st == KVP_OK ? o->child : NULL; st == KVP_OK && it; it = it->next) {
        size_t k = 0;
        while (k < NKEYS && strcmp(it->string, keys[k]) != 0) k++;
        if (k == NKEYS)
            st = KVP_ERR(KVP_EINVAL, "speculative config: unknown key \"%s\" (method, num_speculative_tokens, "
                                     "prompt_lookup_max, prompt_lookup_min, disable_by_batch_size)", it->string);
    }
    const char *method = NULL;
    int has = 0, gk = 0, gmax = 0, gmin = 0;
    int32_t k = 0, nmax = 5, nmin = 5, batch = 0;
    if (st == KVP_OK) st = kvp_json_str(o, "method", &method, &has);
    if (st == KVP_OK && (!has || strcmp(method, "ngram") != 0))
        st = KVP_ERR(KVP_EINVAL, "speculative config: \"method\" is %s%s%s, not \"ngram\" (the other methods need a "
                                 "draft model)", has ? "\"" : "missing", has ? method : "", has ? "\"" : "");
    if (st == KVP_OK) st = spec_int(o, "num_speculative_tokens", KVP_MAX_SPEC, &k, &gk);
    if (st == KVP_OK && !gk) st = KVP_ERR(KVP_EINVAL, "speculative config: \"num_speculative_tokens\" is required");
    if (st == KVP_OK) st = spec_int(o, "prompt_lookup_max", KVP_MAX_NGRAM, &nmax, &gmax);
    if (st == KVP_OK) st = spec_int(o, "prompt_lookup_min", KVP_MAX_NGRAM, &nmin, &gmin);
    if (st == KVP_OK) st = spec_int(o, "disable_by_batch_size", 1 << 20, &batch, NULL);
    if (gmax && !gmin) nmin = nmax;
    if (gmin && !gmax) nmax = nmin;
    if (st == KVP_OK && nmin > nmax)
        st = KVP_ERR(KVP_EINVAL, "speculative config: prompt_lookup_min %d is above prompt_lookup_max %d", nmin, nmax);
    cJSON_Delete(o);
    if (st != KVP_OK) return st;
    *cfg = (kvp_spec_config){.tokens = k, .ngram_min = nmin, .ngram_max = nmax, .max_batch = batch};
    return KVP_OK;
}
