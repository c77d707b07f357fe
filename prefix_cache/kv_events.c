/* prefix_cache/kv_events.c — vLLM-schema KV events as JSON lines (contract in kv_events.h). The current batch's
 * events are built as text in a buffer; a flush writes them as one line. */
#include "prefix_cache/kv_events.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/prefix_cache_internal.h"

struct kvp_kv_events {
    FILE *f;
    int own;          /* f was opened by kvp_kve_open */
    char path[256];
    int32_t bs;
    kvp_prefix_cache *pc; /* listened to, or NULL */
    char *buf;        /* the current batch's events, comma-separated */
    size_t len, cap;
    int nev;          /* events in buf */
    int removing;     /* the last event in buf is a BlockRemoved still open for more hashes */
    int64_t seq, events;
    double last_ts;
    kvp_status err;   /* first error, kept, and its message */
    char errmsg[256];
};

static void fail(kvp_kv_events *ev, kvp_status st)
{
    if (ev->err != KVP_OK) return;
    ev->err = st;
    snprintf(ev->errmsg, sizeof ev->errmsg, "%s", kvp_error_message());
}

/* The kept error, recorded again as this thread's detail. */
static kvp_status kept(const kvp_kv_events *ev)
{
    return ev->err == KVP_OK ? KVP_OK : KVP_ERR(ev->err, "%s", ev->errmsg);
}

static void put(kvp_kv_events *ev, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(kvp_kv_events *ev, const char *fmt, ...)
{
    if (ev->err != KVP_OK) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = ev->cap - ev->len;
        int n = vsnprintf(ev->buf ? ev->buf + ev->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) return fail(ev, KVP_ERR(KVP_EIO, "kv events: formatting failed"));
        if ((size_t)n < room) {
            ev->len += (size_t)n;
            return;
        }
        if (kvp_grow((void **)&ev->buf, &ev->cap, ev->len + (size_t)n + 1, 1) != KVP_OK)
            return fail(ev, KVP_ERR(KVP_ENOMEM, "kv events: out of memory recording a batch of %zu bytes", ev->len + (size_t)n));
    }
}

/* Closes an open BlockRemoved. */
static void end_removed(kvp_kv_events *ev)
{
    if (!ev->removing) return;
    put(ev, "],\"medium\":\"GPU\"}");
    ev->removing = 0;
}

static void begin_event(kvp_kv_events *ev)
{
    end_removed(ev);
    if (ev->nev++ > 0) put(ev, ",");
    ev->events++;
}

static void on_event(void *ctx, const kvp_pc_event *e)
{
    kvp_kv_events *ev = ctx;
    if (ev->err != KVP_OK) return;
    switch (e->kind) {
    case KVP_PC_EV_STORED:
        begin_event(ev);
        put(ev, "{\"type\":\"BlockStored\",\"block_hashes\":[");
        for (int32_t i = 0; i < e->n; i++) put(ev, "%s%" PRIu64, i ? "," : "", e->hashes[i]);
        if (e->depth > 0) put(ev, "],\"parent_block_hash\":%" PRIu64 ",\"token_ids\":[", e->parent_hash);
        else put(ev, "],\"parent_block_hash\":null,\"token_ids\":[");
        for (int64_t i = 0; i < (int64_t)e->n * ev->bs; i++) put(ev, "%s%" PRId32, i ? "," : "", e->tokens[i]);
        put(ev, "],\"block_size\":%" PRId32 ",\"lora_id\":null,\"medium\":\"GPU\",\"lora_name\":null}", ev->bs);
        break;
    case KVP_PC_EV_REMOVED:
        for (int32_t i = 0; i < e->n; i++) {
            if (!ev->removing) {
                begin_event(ev);
                put(ev, "{\"type\":\"BlockRemoved\",\"block_hashes\":[%" PRIu64, e->hashes[i]);
                ev->removing = 1;
            } else {
                put(ev, ",%" PRIu64, e->hashes[i]);
            }
        }
        break;
    case KVP_PC_EV_CLEARED:
        begin_event(ev);
        put(ev, "{\"type\":\"AllBlocksCleared\"}");
        break;
    }
}

kvp_status kvp_kve_create(FILE *f, int32_t block_size, kvp_kv_events **out)
{
    if (f == NULL || out == NULL || block_size < 1) return KVP_ERR(KVP_EINVAL, "kvp_kve_create: bad arguments");
    kvp_kv_events *ev = kvp_calloc(1, sizeof *ev);
    if (ev == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory for a kv events emitter");
    ev->f = f;
    ev->bs = block_size;
    snprintf(ev->path, sizeof ev->path, "(stream)");
    *out = ev;
    return KVP_OK;
}

kvp_status kvp_kve_open(const char *path, int32_t block_size, kvp_kv_events **out)
{
    if (path == NULL || out == NULL || block_size < 1) return KVP_ERR(KVP_EINVAL, "kvp_kve_open: bad arguments");
    FILE *f = fopen(path, "w");
    if (f == NULL) return KVP_ERR(KVP_EIO, "cannot write kv events to '%s': %s", path, strerror(errno));
    kvp_status st = kvp_kve_create(f, block_size, out);
    if (st != KVP_OK) {
        fclose(f);
        return st;
    }
    (*out)->own = 1;
    snprintf((*out)->path, sizeof (*out)->path, "%s", path);
    return KVP_OK;
}

kvp_status kvp_kve_attach(kvp_kv_events *ev, kvp_prefix_cache *pc)
{
    if (ev == NULL) return KVP_ERR(KVP_EINVAL, "kvp_kve_attach: NULL emitter");
    return pc_follow(&ev->pc, pc, ev->bs, on_event, ev, "kv events");
}

void kvp_kve_detach(kvp_kv_events *ev)
{
    if (ev) pc_unfollow(&ev->pc, on_event, ev);
}

kvp_status kvp_kve_flush(kvp_kv_events *ev, double ts)
{
    if (ev == NULL) return KVP_ERR(KVP_EINVAL, "kvp_kve_flush: NULL emitter");
    ev->last_ts = ts;
    end_removed(ev);
    if (ev->err == KVP_OK && ev->nev > 0) {
        if (fprintf(ev->f, "{\"seq\":%" PRId64 ",\"ts\":%.17g,\"events\":[", ev->seq, ts) < 0 ||
            fwrite(ev->buf, 1, ev->len, ev->f) != ev->len || fputs("]}\n", ev->f) < 0 || fflush(ev->f) != 0)
            fail(ev, KVP_ERR(KVP_EIO, "writing kv events to '%s' failed: %s", ev->path, strerror(errno)));
        else ev->seq++;
    }
    ev->len = 0;
    ev->nev = 0;
    return kept(ev);
}

kvp_status kvp_kve_close(kvp_kv_events *ev)
{
    if (ev == NULL) return KVP_OK;
    kvp_status st = kvp_kve_flush(ev, ev->last_ts);
    kvp_kve_detach(ev);
    if (ev->own && fclose(ev->f) != 0 && st == KVP_OK)
        st = KVP_ERR(KVP_EIO, "closing kv events file '%s' failed: %s", ev->path, strerror(errno));
    kvp_free(ev->buf);
    kvp_free(ev);
    return st;
}

int64_t kvp_kve_batches(const kvp_kv_events *ev)
{
    return ev->seq;
}

int64_t kvp_kve_events(const kvp_kv_events *ev)
{
    return ev->events;
}
