#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic int level = -1;

static int level_from_env(void)
{
    const char *e = getenv("KVPAGE_LOG");
    if (e == NULL) return KVP_LOG_WARN;
    if (strcmp(e, "error") == 0) return KVP_LOG_ERROR;
    if (strcmp(e, "info") == 0) return KVP_LOG_INFO;
    if (strcmp(e, "debug") == 0) return KVP_LOG_DEBUG;
    return KVP_LOG_WARN;
}

void kvp_log_set_level(kvp_log_level l) { atomic_store(&level, (int)l); }

kvp_log_level kvp_log_get_level(void)
{
    int l = atomic_load(&level);
    if (l < 0) {
        l = level_from_env();
        atomic_store(&level, l);
    }
    return (kvp_log_level)l;
}

void kvp_log(kvp_log_level l, const char *fmt, ...)
{
    if (l > kvp_log_get_level()) return;
    static const char *const tags[] = {"error", "warn", "info", "debug"};
    char line[2048];
    int n = snprintf(line, sizeof line, "kvpage %s: ", tags[l]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fflush(stdout); /* data written so far goes first: a log line never lands inside a table row */
    fprintf(stderr, "%s\n", line); /* one write per line so threads do not interleave */
}
