/* common/cli.h — conventions shared by every `kvpage` subcommand.
 *
 * Exit codes: 0 success; 2 bad input (unknown option, bad value, unreadable or malformed file,
 * impossible sizes); 1 any other failure (out of memory, a device error).
 * Errors are one line on stderr: "kvpage CMD: error: CAUSE". Data goes to stdout.
 *
 * Option parsing uses getopt_long with a leading ':' in the optstring and kvp_cli_getopt_error() for the
 * '?' and ':' cases:
 *
 *     optind = 0;  // full re-initialisation (glibc) before parsing a subcommand's argv
 *     while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) switch (c) {
 *         ...
 *         default: return kvp_cli_getopt_error("plan", c, argv);
 *     }
 */
#ifndef KVP_COMMON_CLI_H
#define KVP_COMMON_CLI_H

#include "common/status.h"

enum { KVP_EXIT_OK = 0, KVP_EXIT_FAIL = 1, KVP_EXIT_USAGE = 2 };

/* Prints the current error detail for a failed status; returns the exit code for it. */
int kvp_cli_fail(const char *cmd, kvp_status st);
/* Prints "kvpage CMD: error: ..." and a hint to use --help; returns KVP_EXIT_USAGE. */
int kvp_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* For getopt_long's '?' (unknown option) and ':' (missing value); returns KVP_EXIT_USAGE. */
int kvp_cli_getopt_error(const char *cmd, int c, char *const argv[]);

#endif
