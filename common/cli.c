#include "common/cli.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int kvp_cli_fail(const char *cmd, kvp_status st)
{
    const char *msg = kvp_error_message();
    const size_t n = strlen(cmd);
    if (strncmp(msg, cmd, n) == 0 && strncmp(msg + n, ": ", 2) == 0) msg += n + 2; /* "generate: " once */
    fprintf(stderr, "kvpage %s: error: %s\n", cmd, msg[0] ? msg : kvp_status_str(st));
    switch (st) {
    case KVP_EINVAL:
    case KVP_EPARSE:
    case KVP_EIO:
    case KVP_EUNSUPPORTED:
    case KVP_ENOTFOUND:
    case KVP_ENOBLOCKS:
    /* the machine cannot run what was asked: no device, a bad rank count, a collective that failed or timed out */
    case KVP_ENODEVICE:
    case KVP_ECUDA:
    case KVP_ENCCL:
    case KVP_EMPI:
    case KVP_ETIMEDOUT:
        return KVP_EXIT_USAGE;
    default:
        return KVP_EXIT_FAIL;
    }
}

int kvp_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvpage %s: error: %s (see kvpage %s --help)\n", cmd, msg, cmd);
    return KVP_EXIT_USAGE;
}

int kvp_cli_getopt_error(const char *cmd, int c, char *const argv[])
{
    const char *opt = optind > 0 ? argv[optind - 1] : "?";
    if (c == ':') return kvp_cli_usage_error(cmd, "option '%s' needs a value", opt);
    return kvp_cli_usage_error(cmd, "unknown option '%s'", opt);
}
