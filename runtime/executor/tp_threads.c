/* runtime/executor/tp_threads.c — tensor-parallel ranks as threads of one process (contract: tp_threads.h). */
#include "runtime/executor/tp_threads.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/executor/cuda/cuda_dev.h"

typedef struct {
    kvp_tp_threads_spec spec;
    kvp_comm *comm; /* this rank's; the follower destroys it */
    int rank;
    kvp_status st;
    char err[512];
} follower;

struct kvp_tp_threads {
    int n; /* ranks; followers 1 .. n-1 */
    pthread_t tid[KVP_COMM_MAX_THREADS];
    int started[KVP_COMM_MAX_THREADS];
    follower f[KVP_COMM_MAX_THREADS];
};

static void *follower_main(void *arg)
{
    follower *f = arg;
    const kvp_tp_threads_spec *sp = &f->spec;
    kvp_model *m = NULL;
    kvp_status st = kvp_model_load_ex(sp->path, f->comm, sp->weights, &m);
    if (st == KVP_OK && sp->threads > 0) kvp_model_set_threads(m, sp->threads);
    if (st == KVP_OK) kvp_model_set_matmul(m, sp->matmul);
    if (st == KVP_OK) st = kvp_model_set_max_len(m, sp->max_len);
    if (st == KVP_OK) {
        kvp_cuda_options cu = sp->cu;
        cu.device = kvp_cudev_emulated() ? 0 : f->rank; /* the emulator's one device serves every rank */
        st = sp->cuda ? kvp_cuda_follow(m, &cu, NULL) : kvp_cpu_follow(m, NULL);
    }
    if (st != KVP_OK) {
        snprintf(f->err, sizeof f->err, "rank %d: %s", f->rank, kvp_error_message());
        kvp_comm_abort(f->comm, 1); /* rank 0 must not wait for this one */
    }
    kvp_model_destroy(m);
    kvp_comm_destroy(f->comm);
    f->comm = NULL;
    f->st = st;
    return NULL;
}

kvp_status kvp_tp_threads_start(int n, const kvp_tp_threads_spec *spec, kvp_comm **comm0, kvp_tp_threads **out)
{
    *comm0 = NULL;
    *out = NULL;
    if (n < 2 || n > KVP_COMM_MAX_THREADS)
        return KVP_ERR(KVP_EINVAL, "--tp %d in one process: 2 to %d ranks", n, KVP_COMM_MAX_THREADS);
    if (spec->cuda) {
        int ndev = 0;
        KVP_TRY(kvp_cuda_devices(&ndev));
        if (ndev < n && !kvp_cudev_emulated())
            return KVP_ERR(KVP_EINVAL, "--tp %d on the device: one GPU a rank, and this machine has %d (several "
                                       "machines: mpirun -np %d kvpage ...)", n, ndev, n);
    }
    kvp_tp_threads *t = kvp_calloc(1, sizeof *t);
    if (!t) return KVP_ERR(KVP_ENOMEM, "--tp %d: out of memory", n);
    kvp_comm *comms[KVP_COMM_MAX_THREADS] = {NULL};
    kvp_status st = spec->cuda ? kvp_comm_nccl_threads_create(n, NULL, comms) : kvp_comm_threads_create(n, comms);
    if (st != KVP_OK) {
        kvp_free(t);
        return st;
    }
    t->n = n;
    for (int r = 1; r < n; r++) {
        t->f[r] = (follower){.spec = *spec, .comm = comms[r], .rank = r, .st = KVP_OK};
        if (pthread_create(&t->tid[r], NULL, follower_main, &t->f[r]) != 0) {
            st = KVP_ERR(KVP_ENOMEM, "--tp %d: cannot start the thread of rank %d", n, r);
            kvp_comm_abort(comms[0], 1); /* the ones started return */
            for (int k = r; k < n; k++) kvp_comm_destroy(comms[k]);
            t->n = r;
            kvp_tp_threads_join(t);
            kvp_comm_destroy(comms[0]);
            return st;
        }
        t->started[r] = 1;
    }
    *comm0 = comms[0];
    *out = t;
    return KVP_OK;
}

kvp_status kvp_tp_threads_join(kvp_tp_threads *t)
{
    if (!t) return KVP_OK;
    kvp_status st = KVP_OK;
    char err[512] = "";
    for (int r = 1; r < t->n; r++) {
        if (!t->started[r]) continue;
        pthread_join(t->tid[r], NULL);
        if (st == KVP_OK && t->f[r].st != KVP_OK) {
            st = t->f[r].st;
            snprintf(err, sizeof err, "%s", t->f[r].err);
        }
    }
    kvp_free(t);
    return st == KVP_OK ? KVP_OK : KVP_ERR(st, "%s", err);
}

int kvp_tp_under_launcher(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

kvp_status kvp_tp_comm_create(int n, const kvp_tp_threads_spec *spec, kvp_comm **comm, kvp_tp_threads **followers)
{
    *comm = NULL;
    *followers = NULL;
    if (n <= 1) return kvp_comm_single_create(comm);
    int ndev = 0;
    if (spec->cuda) KVP_TRY(kvp_cuda_devices(&ndev));
    if (!kvp_tp_under_launcher()) return kvp_tp_threads_start(n, spec, comm, followers);
    return spec->cuda ? kvp_comm_nccl_mpi_create(n, -1, comm) : kvp_comm_mpi_create(n, comm);
}
