/* bench/plot.c — spawn the plotting script (see plot.h). */
#include "bench/plot.h"

#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int find_script(char *out, size_t n)
{
    if (access("bench/plot.py", R_OK) == 0) {
        snprintf(out, n, "bench/plot.py");
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return -1;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return -1;
    *slash = '\0'; /* build dir */
    slash = strrchr(exe, '/');
    if (!slash) return -1;
    *slash = '\0'; /* project root */
    snprintf(out, n, "%s/bench/plot.py", exe);
    return access(out, R_OK) == 0 ? 0 : -1;
}

kvp_status kvp_bench_plot(const char *const *args)
{
    static const char *python = "/usr/bin/python3";
    char script[PATH_MAX + 32];
    if (find_script(script, sizeof script) != 0) return KVP_ERR(KVP_ENOTFOUND, "bench/plot.py not found");
    if (access(python, X_OK) != 0) return KVP_ERR(KVP_ENOTFOUND, "%s not found: no plot", python);
    const char *argv[64];
    int n = 0;
    argv[n++] = python;
    argv[n++] = script;
    for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid;
    fflush(stdout);
    fflush(stderr);
    int rc = posix_spawn(&pid, python, NULL, NULL, (char *const *)argv, environ);
    if (rc != 0) return KVP_ERR(KVP_EIO, "could not start %s: %s", python, strerror(rc));
    int ws = 0;
    if (waitpid(pid, &ws, 0) < 0) return KVP_ERR(KVP_EIO, "waiting for the plot script failed");
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) return KVP_ERR(KVP_EIO, "the plot script failed (status %d)", ws);
    return KVP_OK;
}
