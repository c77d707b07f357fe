/* tests/runtime/http_testutil.h — a plain-socket HTTP/1.1 client for the serve tests (libc only, no test
 * framework: the standalone CUDA test runner includes it too). Static functions: one copy per test file. */
#ifndef KVP_TESTS_HTTP_TESTUTIL_H
#define KVP_TESTS_HTTP_TESTUTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* One HTTP/1.1 exchange with 127.0.0.1:port, blen bytes of body (any bytes): the status code and the body in
 * *resp (malloc'ed; chunked transfer decoded), or -1 and *resp NULL when the exchange fails. No asserts:
 * client threads call it too. */
static int tu_http(int port, const char *method, const char *path, const char *body, size_t blen, char **resp)
{
    *resp = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int rc;
    while ((rc = connect(fd, (struct sockaddr *)&a, sizeof a)) != 0 && errno == EINTR) {}
    char head[512];
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n", method, path, blen);
    if (rc != 0 || send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl) {
        close(fd);
        return -1;
    }
    for (size_t at = 0; at < blen;) {
        ssize_t k = send(fd, body + at, blen - at, MSG_NOSIGNAL);
        if (k <= 0) break; /* the server may answer (413) and close before reading it all */
        at += (size_t)k;
    }
    char *all = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096 && !(all = realloc(all, cap = cap ? 2 * cap : 1 << 16))) break;
        ssize_t k = recv(fd, all + len, cap - len - 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(fd);
    int code = -1;
    if (all) {
        all[len] = '\0';
        char *b = strstr(all, "\r\n\r\n");
        if (sscanf(all, "HTTP/1.1 %d", &code) == 1 && b) {
            *b = '\0';
            int chunked = strcasestr(all, "\r\nTransfer-Encoding: chunked") != NULL;
            b += 4;
            if (chunked) { /* size in hex, CRLF, data, CRLF; size 0 ends */
                char *w = b;
                for (const char *r = b;;) {
                    char *end;
                    unsigned long n = strtoul(r, &end, 16);
                    if (end == r || strncmp(end, "\r\n", 2) != 0 || n == 0) break;
                    memmove(w, end + 2, n);
                    w += n;
                    r = end + 2 + n + 2;
                }
                *w = '\0';
            }
            *resp = strdup(b);
        } else {
            code = -1;
        }
    }
    free(all);
    return *resp ? code : -1;
}

#endif
