/* runtime/loader/mapfile.c — mmap of a whole read-only file. */
#include "runtime/loader/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"

kvp_status kvp_mapfile_open(const char *path, kvp_mapfile *m)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO: refused below, not waited on */
    if (fd < 0) return KVP_ERR(KVP_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return KVP_ERR(KVP_EIO, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    const unsigned char *data = NULL;
    if (size > 0) {
        void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return KVP_ERR(KVP_EIO, "%s: cannot map %zu bytes: %s", path, size, strerror(e));
        }
        data = p;
    }
    close(fd);
    size_t n = strlen(path);
    char *copy = kvp_malloc(n + 1);
    if (!copy) {
        if (data) munmap((void *)data, size);
        return KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
    }
    memcpy(copy, path, n + 1);
    m->path = copy;
    m->data = data;
    m->size = size;
    return KVP_OK;
}

void kvp_mapfile_close(kvp_mapfile *m)
{
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    kvp_free(m->path);
    memset(m, 0, sizeof *m);
}
