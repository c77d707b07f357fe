/* common/status.h — kvp_status return codes and the per-thread error detail.
 *
 * Every public function that can fail returns a kvp_status. On failure it records a detail message
 * ("file:line: cause") for the calling thread with KVP_ERR(); callers print it with kvp_error_detail().
 * The detail is overwritten by the next failure on the same thread; it is never freed by the caller.
 */
#ifndef KVP_COMMON_STATUS_H
#define KVP_COMMON_STATUS_H

#ifdef __cplusplus
extern "C" { /* C++: the CUDA files (attention/cuda/, the CUDA emulator) */
#endif

typedef enum {
    KVP_OK = 0,
    KVP_EINVAL,        /* an argument is out of range or inconsistent */
    KVP_ENOMEM,        /* host allocation failed */
    KVP_ENOBLOCKS,     /* the block pool has too few free blocks */
    KVP_EUNSUPPORTED,  /* valid but not implemented (dtype, head_dim, model type, ...) */
    KVP_ENODEVICE,     /* no GPU / no such device */
    KVP_ECUDA,         /* a CUDA runtime or cuBLAS call failed */
    KVP_ENCCL,         /* an NCCL call failed */
    KVP_EMPI,          /* an MPI call failed */
    KVP_EPARSE,        /* a file or a value could not be parsed */
    KVP_EIO,           /* a file could not be opened, read or written */
    KVP_ENOTFOUND,     /* an id or a key does not exist */
    KVP_ESTATE,        /* the call is not allowed in the object's current state (e.g. double free) */
    KVP_ETIMEDOUT,     /* a wait ran past its deadline (a collective some rank never joined) */
    KVP_STATUS_COUNT
} kvp_status;

/* Short constant name of a status ("KVP_EINVAL: invalid argument"); never NULL. */
const char *kvp_status_str(kvp_status s);

/* Records `s` with a printf-style cause for this thread and returns `s` (so `return KVP_ERR(...)` works). */
kvp_status kvp_error_set(kvp_status s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define KVP_ERR(status, ...) kvp_error_set((status), __FILE__, __LINE__, __VA_ARGS__)

/* The cause recorded by the last KVP_ERR on this thread ("" if none). Valid until the next KVP_ERR. */
const char *kvp_error_detail(void);
/* The cause text alone, without "file:line: ", for one-line user messages. */
const char *kvp_error_message(void);
void kvp_error_clear(void);

/* Propagate a failure: `KVP_TRY(f(x));` returns f's status from the enclosing function when not KVP_OK. */
#define KVP_TRY(expr)                                                                              \
    do {                                                                                           \
        kvp_status kvp_try_s_ = (expr);                                                            \
        if (kvp_try_s_ != KVP_OK) return kvp_try_s_;                                               \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
