#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char detail_buf[1024];
static _Thread_local const char *message_start = "";

const char *kvp_status_str(kvp_status s)
{
    static const char *const names[KVP_STATUS_COUNT] = {
        [KVP_OK] = "KVP_OK: success",
        [KVP_EINVAL] = "KVP_EINVAL: invalid argument",
        [KVP_ENOMEM] = "KVP_ENOMEM: out of host memory",
        [KVP_ENOBLOCKS] = "KVP_ENOBLOCKS: not enough free KV blocks",
        [KVP_EUNSUPPORTED] = "KVP_EUNSUPPORTED: unsupported",
        [KVP_ENODEVICE] = "KVP_ENODEVICE: no such device",
        [KVP_ECUDA] = "KVP_ECUDA: CUDA error",
        [KVP_ENCCL] = "KVP_ENCCL: NCCL error",
        [KVP_EMPI] = "KVP_EMPI: MPI error",
        [KVP_EPARSE] = "KVP_EPARSE: parse error",
        [KVP_EIO] = "KVP_EIO: I/O error",
        [KVP_ENOTFOUND] = "KVP_ENOTFOUND: not found",
        [KVP_ESTATE] = "KVP_ESTATE: invalid state for this operation",
        [KVP_ETIMEDOUT] = "KVP_ETIMEDOUT: timed out",
    };
    if ((int)s < 0 || s >= KVP_STATUS_COUNT) return "KVP_E?: unknown status";
    return names[s];
}

kvp_status kvp_error_set(kvp_status s, const char *file, int line, const char *fmt, ...)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    /* Formatted apart first: an argument may be the previous message (kvp_error_message(), when a caller
     * wraps a callee's error), which lives in detail_buf. */
    char tmp[sizeof detail_buf];
    int n = snprintf(tmp, sizeof tmp, "%s:%d: ", base, line);
    if (n < 0 || (size_t)n >= sizeof tmp) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp + n, sizeof tmp - (size_t)n, fmt, ap);
    va_end(ap);
    memcpy(detail_buf, tmp, sizeof detail_buf);
    message_start = detail_buf + n;
    return s;
}

const char *kvp_error_detail(void) { return detail_buf; }
const char *kvp_error_message(void) { return message_start; }

void kvp_error_clear(void)
{
    detail_buf[0] = '\0';
    message_start = detail_buf;
}
