/* common/cli.h — conventions of every `kvpage` subcommand: data to stdout; an error is one line on stderr,
 * "kvpage CMD: error: CAUSE"; exit 0 on success, 2 on bad input (an option, a value, an unreadable or
 * malformed file, impossible sizes) and on what the machine cannot run (no device, a bad rank count, a failed
 * or timed-out collective), 1 on any other failure. Options: getopt_long with a leading ':' in the
 * optstring, `optind = 0` (glibc's full reset) first, `default: return kvp_cli_getopt_error(cmd, c, argv);`.
 */
#ifndef KVP_COMMON_CLI_H
#define KVP_COMMON_CLI_H

#include "common/status.h"

enum { KVP_EXIT_OK = 0, KVP_EXIT_FAIL = 1, KVP_EXIT_USAGE = 2 };

int kvp_cli_fail(const char *cmd, kvp_status st); /* prints st's detail message; returns st's exit code */
/* Prints "kvpage CMD: error: ..." and a hint to use --help; returns KVP_EXIT_USAGE. */
int kvp_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int kvp_cli_getopt_error(const char *cmd, int c, char *const argv[]); /* getopt's '?' and ':'; as above */

#endif
