/* bench/plot.h — run bench/plot.py (python3-matplotlib) to turn a benchmark CSV into a PNG.
 *
 * The script is looked up as bench/plot.py under the current directory (the project root, where
 * `make run` and the tests run), then next to the executable's parent directory (build-X/kvpage ->
 * bench/plot.py beside build-X). args: the script's arguments (argv[1..]), NULL-terminated, borrowed.
 * KVP_ENOTFOUND when the script or /usr/bin/python3 is missing, KVP_EIO when the script fails (its own
 * message goes to stderr). Never exits the process.
 */
#ifndef KVP_BENCH_PLOT_H
#define KVP_BENCH_PLOT_H

#include "common/status.h"

kvp_status kvp_bench_plot(const char *const *args);

#endif
