/* runtime/loader/mapfile.h — read-only memory map of a whole file (loaders). Owned by whoever opened it. */
#ifndef KVP_RUNTIME_MAPFILE_H
#define KVP_RUNTIME_MAPFILE_H

#include <stddef.h>

#include "common/status.h"

typedef struct {
    char *path;             /* owned copy */
    const unsigned char *data; /* size bytes; NULL when size == 0 */
    size_t size;
} kvp_mapfile;

/* KVP_EIO naming the file when it cannot be opened, is not a regular file, or cannot be mapped.
 * *m is written only on success. */
kvp_status kvp_mapfile_open(const char *path, kvp_mapfile *m);
void kvp_mapfile_close(kvp_mapfile *m); /* zeroes *m; closing a zeroed one is a no-op */

#endif
