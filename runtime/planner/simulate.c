/* runtime/planner/simulate.c — capacity from the planner, cost model, one engine run (see simulate.h). */
#include "runtime/planner/simulate.h"


#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/timer.h"
#include "runtime/planner/planner.h"
#include "runtime/executor/sim_executor.h"

void kvp_sim_hw_default(kvp_sim_hw *hw)
{
    hw->tp = 1;
    hw->gpu_util = 0.9;
    hw->dtype_bytes = 2;
    hw->kv_mem_bytes = 0;
    hw->swap_bytes = -1; /* as much as the KV memory */
    hw->offload_bytes = 0;
    hw->activation_bytes = -1;
}

kvp_status kvp_sim_prepare(const kvp_model_config *cfg, const kvp_gpu_profile *gpu, const kvp_sim_hw *hw,
                           kvp_engine_config *ecfg, kvp_cost_model *cm, kvp_sim_memory *mem)
{
    if (!cfg || !gpu || !hw || !ecfg || !cm || !mem) return KVP_ERR(KVP_EINVAL, "simulate: NULL argument");
    kvp_cost_model c;
    KVP_TRY(kvp_cost_model_from_config(cfg, gpu, hw->tp, hw->dtype_bytes, &c));
    kvp_plan_params pp;
    kvp_plan_params_default(cfg, &pp);
    pp.gpu_mem_bytes = gpu->mem_bytes;
    pp.gpu_util = hw->gpu_util;
    pp.weight_bytes = hw->dtype_bytes;
    pp.kv_bytes = hw->dtype_bytes;
    pp.block_size = ecfg->block_size > 0 ? ecfg->block_size : 16;
    pp.tp = hw->tp;
    pp.activation_reserve = hw->activation_bytes;
    pp.max_batched_tokens = ecfg->max_batched_tokens;
    kvp_plan plan;
    KVP_TRY(kvp_plan_compute(cfg, &pp, &plan));
    kvp_sim_memory m = {0};
    m.usable_bytes = (double)gpu->mem_bytes * hw->gpu_util;
    m.weight_bytes = (double)plan.per_rank.weights_bytes;
    m.activation_bytes = (double)plan.per_rank.activation_bytes;
    m.kv_bytes_per_token = (double)plan.per_rank.kv_bytes_per_token;
    if (m.kv_bytes_per_token <= 0) return KVP_ERR(KVP_EINVAL, "model stores no KV per token");
    if (hw->kv_mem_bytes > 0) {
        m.kv_bytes = (double)hw->kv_mem_bytes;
    } else {
        m.kv_bytes = (double)plan.per_rank.kv_budget_bytes;
        if (m.kv_bytes <= 0)
            return KVP_ERR(KVP_EINVAL,
                           "the model does not fit on %s: weights %.2f GB + activations %.2f GB per GPU exceed the "
                           "%.2f GB usable (%.0f%% of %.2f GB) by %.2f GB (try --tp or a larger GPU)",
                           gpu->name, m.weight_bytes / 1e9, m.activation_bytes / 1e9, m.usable_bytes / 1e9,
                           hw->gpu_util * 100, (double)gpu->mem_bytes / 1e9, -m.kv_bytes / 1e9);
    }
    m.kv_slots = (int64_t)floor(m.kv_bytes / m.kv_bytes_per_token);
    m.host_slots = hw->swap_bytes < 0   ? m.kv_slots
                   : hw->swap_bytes > 0 ? (int64_t)floor((double)hw->swap_bytes / m.kv_bytes_per_token)
                                        : 0;
    m.host_cache_slots = hw->offload_bytes > 0 ? (int64_t)floor((double)hw->offload_bytes / m.kv_bytes_per_token) : 0;
    if (m.kv_slots < 1)
        return KVP_ERR(KVP_EINVAL, "KV memory of %.3f GB holds no token (%.0f bytes each)", m.kv_bytes / 1e9,
                       m.kv_bytes_per_token);
    if (hw->offload_bytes > 0 && m.host_cache_slots < pp.block_size)
        return KVP_ERR(KVP_EINVAL, "--kv-offloading-size of %lld bytes holds no block of %d tokens (%.0f bytes a token)",
                       (long long)hw->offload_bytes, (int)pp.block_size, m.kv_bytes_per_token);
    ecfg->kv_slots = m.kv_slots;
    ecfg->host_slots = m.host_slots;
    ecfg->host_cache_slots = m.host_cache_slots;
    *cm = c;
    *mem = m;
    return KVP_OK;
}

/* Sorts the rejected requests of e (a finished run of w) by reason: the engine's own test (kvp_engine_fits)
 * gives the words, the request's lengths the figures. */
static kvp_status rejections(const kvp_engine *e, const kvp_engine_config *ecfg, const kvp_workload *w,
                             kvp_sim_rejections *rej)
{
    memset(rej, 0, sizeof *rej);
    rej->max_model_len = ecfg->max_model_len;
    if (ecfg->alloc == KVP_ALLOC_PAGED)
        rej->kv_tokens = (ecfg->kv_slots / ecfg->block_size - ecfg->watermark_blocks) * ecfg->block_size;
    for (int64_t i = 0; i < w->n; i++) {
        kvp_req_result r;
        KVP_TRY(kvp_engine_request(e, i, &r));
        if (r.state != KVP_REQ_REJECTED) continue;
        rej->n++;
        const kvp_request *q = &w->reqs[i];
        const bool beams = q->out && q->out->beam_width > 1;
        const int32_t group = !q->out ? 1 : beams ? q->out->beam_width : q->out->n;
        const kvp_status why = kvp_engine_fits(e, r.prompt_len, r.output_len, group, beams);
        const int64_t len = (int64_t)r.prompt_len + r.output_len;
        if (r.prompt_len >= ecfg->max_model_len) {
            rej->context++;
            if (r.prompt_len > rej->longest_prompt) rej->longest_prompt = r.prompt_len;
        } else if (why == KVP_ENOBLOCKS) {
            if (rej->kv++ == 0) snprintf(rej->kv_reason, sizeof rej->kv_reason, "%s", kvp_error_message());
            if (len > rej->longest_tokens) rej->longest_tokens = len;
        } else {
            if (rej->other++ == 0)
                snprintf(rej->other_reason, sizeof rej->other_reason, "%s",
                         why != KVP_OK ? kvp_error_message() : "the engine found it could never run");
        }
        kvp_error_clear();
    }
    return KVP_OK;
}

kvp_status kvp_simulate_run(const kvp_engine_config *ecfg, kvp_executor *ex, const kvp_workload *w,
                            kvp_progress_fn progress, void *pctx, kvp_engine_metrics *m, kvp_req_result *per_req,
                            kvp_sim_rejections *rej)
{
    kvp_engine *e = NULL;
    kvp_status st = kvp_engine_create(ecfg, ex, &e);
    if (st == KVP_OK) st = kvp_engine_run(e, w->reqs, w->n, progress, pctx);
    if (st == KVP_OK) st = kvp_engine_metrics_get(e, m);
    for (int64_t i = 0; per_req && st == KVP_OK && i < w->n; i++) st = kvp_engine_request(e, i, &per_req[i]);
    if (st == KVP_OK && rej) st = rejections(e, ecfg, w, rej);
    kvp_engine_destroy(e);
    return st;
}

kvp_status kvp_simulate_on(const kvp_engine_config *ecfg, kvp_executor *ex, const kvp_workload *w,
                           kvp_progress_fn progress, void *pctx, kvp_engine_metrics *m, kvp_req_result *per_req)
{
    return kvp_simulate_run(ecfg, ex, w, progress, pctx, m, per_req, NULL);
}

/* v with thousands separators (12,345) into buf. */
static const char *grouped(int64_t v, char *buf, size_t cap)
{
    char raw[32];
    const int n = snprintf(raw, sizeof raw, "%lld", (long long)(v < 0 ? -v : v));
    size_t o = 0;
    if (v < 0 && o + 1 < cap) buf[o++] = '-';
    for (int i = 0; i < n && o + 1 < cap; i++) {
        buf[o++] = raw[i];
        if ((n - 1 - i) % 3 == 0 && i < n - 1 && o + 1 < cap) buf[o++] = ',';
    }
    buf[o] = '\0';
    return buf;
}

void kvp_sim_rejections_summary(const kvp_sim_rejections *r, char *buf, size_t cap)
{
    char a[32], b[32], c[32];
    size_t o = 0;
    if (cap == 0) return;
    buf[0] = '\0';
#define PUT(...) (o += (size_t)snprintf(buf + (o < cap ? o : cap - 1), o < cap ? cap - o : 1, __VA_ARGS__))
    if (r->n == 0) {
        PUT("none");
        return;
    }
    PUT("%lld: ", (long long)r->n);
    const char *sep = "";
    /* a reason's count is written only when there are several reasons: "51 whose prompt ..." */
    if (r->kv > 0) {
        const char *cnt = r->kv < r->n ? grouped(r->kv, a, sizeof a) : "", *sp = r->kv < r->n ? " whose " : "";
        if (r->kv_tokens > 0)
            PUT("%s%s%sprompt + max_tokens exceed the KV cache (%s%s tokens > %s)", sep, cnt, sp,
                r->kv > 1 ? "the longest " : "", grouped(r->longest_tokens, b, sizeof b),
                grouped(r->kv_tokens, c, sizeof c));
        else
            PUT("%s%s%s%s", sep, cnt, r->kv < r->n ? " " : "", r->kv_reason);
        sep = "; ";
    }
    if (r->context > 0) {
        const int several = r->context < r->n;
        PUT("%s%s%s%s max_model_len (%s%s tokens >= %s)", sep, several ? grouped(r->context, a, sizeof a) : "",
            several ? " whose prompt reaches" : r->context > 1 ? "prompts reach" : "prompt reaches", "",
            r->context > 1 ? "the longest " : "", grouped(r->longest_prompt, b, sizeof b),
            grouped(r->max_model_len, c, sizeof c));
        sep = "; ";
    }
    if (r->other > 0 && r->other < r->n)
        PUT("%s%s with another reason (%s)", sep, grouped(r->other, a, sizeof a), r->other_reason);
    else if (r->other > 0)
        PUT("%s", r->other_reason);
#undef PUT
}

kvp_status kvp_simulate(const kvp_engine_config *ecfg, const kvp_cost_model *cm, const kvp_workload *w,
                        kvp_progress_fn progress, void *pctx, kvp_engine_metrics *m, kvp_req_result *per_req)
{
    kvp_executor ex = {0};
    KVP_TRY(kvp_sim_executor_create(cm, 0, &ex));
    kvp_status st = kvp_simulate_on(ecfg, &ex, w, progress, pctx, m, per_req);
    kvp_executor_destroy(&ex);
    return st;
}

void kvp_progress_bar_init(kvp_progress_bar *bar, const char *label)
{
    bar->start_s = kvp_now_s();
    bar->last_draw_s = 0;
    bar->drawn = 0;
    bar->label = label ? label : "simulate";
}

void kvp_progress_bar_fn(void *vbar, int64_t done, int64_t total, double sim_time_s)
{
    kvp_progress_bar *bar = vbar;
    double now = kvp_now_s();
    if (now - bar->start_s < 1.0 || (bar->drawn && now - bar->last_draw_s < 0.2 && done < total)) return;
    double f = total > 0 ? (double)done / (double)total : 1.0;
    char bars[31];
    int filled = (int)(f * 30);
    for (int i = 0; i < 30; i++) bars[i] = i < filled ? '#' : '.';
    bars[30] = '\0';
    fprintf(stderr, "\r%s [%s] %5.1f%%  %lld/%lld requests  sim %.1f s  wall %.1f s", bar->label, bars, f * 100,
            (long long)done, (long long)total, sim_time_s, now - bar->start_s);
    fflush(stderr);
    bar->drawn = 1;
    bar->last_draw_s = now;
}

void kvp_progress_bar_end(kvp_progress_bar *bar)
{
    if (bar->drawn) fputc('\n', stderr);
    bar->drawn = 0;
}

#include <stdlib.h>
#include <string.h>

#include "common/parse.h"
#include "runtime/workload/workload_synth.h"

/* "sharegpt" / "alpaca" with optional ":n=N,seed=S". Returns 1 when spec names one of them. */
static kvp_status parse_synth(const char *spec, kvp_synth_opts *o, int *is_synth)
{
    *is_synth = 0;
    size_t nl = strcspn(spec, ":");
    if (nl == 8 && strncmp(spec, "sharegpt", 8) == 0) o->kind = KVP_SYNTH_SHAREGPT;
    else if (nl == 6 && strncmp(spec, "alpaca", 6) == 0) o->kind = KVP_SYNTH_ALPACA;
    else return KVP_OK;
    *is_synth = 1;
    if (spec[nl] == '\0') return KVP_OK;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec + nl + 1);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) return KVP_ERR(KVP_EINVAL, "workload '%s': expected key=value, got '%s'", spec, kv);
        *eq = '\0';
        int64_t v;
        const int is_n = strcmp(kv, "n") == 0;
        if (is_n || strcmp(kv, "seed") == 0) {
            if (kvp_parse_i64(eq + 1, is_n ? 1 : 0, is_n ? 10000000 : INT64_MAX, &v) != KVP_OK)
                return KVP_ERR(KVP_EINVAL, "workload '%s': %s: %s", spec, kv, kvp_error_message());
            if (is_n) o->num_requests = v;
            else o->seed = (uint64_t)v;
        } else {
            return KVP_ERR(KVP_EINVAL, "workload '%s': unknown key '%s' (use n, seed)", spec, kv);
        }
    }
    return KVP_OK;
}

/* *w := its cut (kvp_workload_cut); *w unchanged on failure. */
static kvp_status cut(kvp_workload **w, int64_t max_requests, double duration_s)
{
    kvp_workload *c = NULL;
    KVP_TRY(kvp_workload_cut(*w, max_requests, duration_s, &c));
    kvp_workload_destroy(*w);
    *w = c;
    return KVP_OK;
}

kvp_status kvp_sim_load_workload(const char *trace, const char *spec, int64_t num_requests, double duration_s,
                                 double rate, int32_t max_total, int32_t n, kvp_workload **out)
{
    if (n < 1) return KVP_ERR(KVP_EINVAL, "parallel samples per request must be >= 1 (got %d)", (int)n);
    if ((trace == NULL) == (spec == NULL)) return KVP_ERR(KVP_EINVAL, "give exactly one of a trace and a workload");
    if (!(rate > 0) && rate != 0 && !isnan(rate)) return KVP_ERR(KVP_EINVAL, "request rate must be > 0 (got %g)", rate);
    kvp_workload *w = NULL;
    int synth = 0;
    if (trace) {
        size_t n = strlen(trace);
        if (n >= 4 && strcmp(trace + n - 4, ".csv") == 0) KVP_TRY(kvp_workload_read_azure(trace, 0, &w));
        else KVP_TRY(kvp_workload_read_mooncake(trace, NULL, &w));
    } else {
        kvp_synth_opts o = {.kind = KVP_SYNTH_SHAREGPT, .num_requests = num_requests > 0 ? num_requests : 1000,
                            .rate = rate, .seed = 1, .max_total = max_total};
        KVP_TRY(parse_synth(spec, &o, &synth));
        if (synth) {
            if (!(rate > 0)) return KVP_ERR(KVP_EINVAL, "workload '%s' needs --rate (requests/s, > 0, or inf)", spec);
            KVP_TRY(kvp_workload_synth(&o, &w));
        } else {
            kvp_status st = kvp_workload_generate(spec, &w);
            if (st != KVP_OK && strncmp(kvp_error_message(), "unknown workload", 16) == 0) /* name ours too */
                return KVP_ERR(st, "unknown workload '%s' (expected sharegpt, alpaca, system, chat, fewshot, branch or "
                                   "mooncake:PATH)", spec);
            KVP_TRY(st);
        }
    }
    /* The first num_requests, then the rate over them, then the duration in the rescaled times (the first
     * S seconds at the rate asked for). */
    kvp_status st = KVP_OK;
    if (num_requests > 0) st = cut(&w, num_requests, 0);
    if (st == KVP_OK && !synth && rate > 0) st = kvp_workload_set_rate(w, rate);
    if (st == KVP_OK && duration_s > 0) st = cut(&w, 0, duration_s);
    if (st == KVP_OK && w->n == 0)
        st = KVP_ERR(KVP_EINVAL, "the workload has no requests (after --num-requests/--duration)");
    if (st == KVP_OK && n > 1) {
        kvp_workload *f = NULL;
        if ((st = kvp_workload_fork(w, n, &f)) == KVP_OK) {
            kvp_workload_destroy(w);
            w = f;
        }
    }
    if (st != KVP_OK) {
        kvp_workload_destroy(w);
        return st;
    }
    *out = w;
    return KVP_OK;
}

int32_t kvp_sim_default_max_model_len(const kvp_model_config *cfg)
{
    const int64_t ctx = kvp_model_config_context(cfg), ml = ctx > 0 ? ctx : 4096;
    return (int32_t)(ml < 32768 ? ml : 32768);
}
