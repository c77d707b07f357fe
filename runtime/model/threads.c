/* runtime/model/threads.c — the model's worker pool, kvp_model_run (the parts: model_internal.h). */
#include "runtime/model/model_internal.h"

#include <cblas.h>
#include <dirent.h>
#if defined(__FMA__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "attention/attention.h"
#include "common/alloc.h"
#include "common/cpu.h"
#include "common/json.h"
#include "common/timer.h"
#include "parallel/comm.h"
#include "parallel/shard.h"
#include "runtime/loader/gguf.h"
#include "runtime/loader/safetensors.h"

/* ---------------------------------------------------------------- worker threads */

/* Polls, without the pool's lock, until a worker's next run is posted (epoch past `seen`, or stop), or for
 * the caller until every worker is done (remaining 0), or until POOL_SPIN_NS pass. A hint only: the
 * condition is then checked again under the lock. */
static void spin_for(worker_pool *wp, int caller, uint64_t seen)
{
    const int64_t t0 = kvp_now_ns();
    for (int i = 1;; i++) {
        if (caller ? __atomic_load_n(&wp->remaining, __ATOMIC_ACQUIRE) == 0
                   : __atomic_load_n(&wp->epoch, __ATOMIC_ACQUIRE) != seen || __atomic_load_n(&wp->stop, __ATOMIC_ACQUIRE))
            return;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        if (i % 64 == 0 && kvp_now_ns() - t0 > POOL_SPIN_NS) return;
    }
}

static void *worker_main(void *p)
{
    worker_arg *wa = p;
    worker_pool *wp = wa->pool;
    pthread_mutex_lock(&wp->mu);
    uint64_t seen = wa->epoch0;
    for (;;) {
        if (!wp->stop && wp->epoch == seen) {
            pthread_mutex_unlock(&wp->mu);
            spin_for(wp, 0, seen);
            pthread_mutex_lock(&wp->mu);
        }
        while (!wp->stop && wp->epoch == seen) pthread_cond_wait(&wp->go, &wp->mu);
        if (wp->stop) break;
        seen = wp->epoch;
        if (wa->index < wp->ntasks) {
            void (*fn)(void *, int) = wp->fn;
            void *arg = wp->arg;
            pthread_mutex_unlock(&wp->mu);
            fn(arg, wa->index);
            pthread_mutex_lock(&wp->mu);
            if (__atomic_sub_fetch(&wp->remaining, 1, __ATOMIC_RELEASE) == 0) pthread_cond_signal(&wp->done);
        }
    }
    pthread_mutex_unlock(&wp->mu);
    return NULL;
}

void mdl_pool_destroy(worker_pool *wp)
{
    if (!wp->inited) return;
    pthread_mutex_lock(&wp->mu);
    __atomic_store_n(&wp->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&wp->go);
    pthread_mutex_unlock(&wp->mu);
    for (int i = 1; i <= wp->nworkers; i++) pthread_join(wp->tid[i], NULL);
    pthread_cond_destroy(&wp->go);
    pthread_cond_destroy(&wp->done);
    pthread_mutex_destroy(&wp->mu);
    wp->inited = 0;
}

void kvp_model_run(kvp_model *m, int n, void (*fn)(void *arg, int i), void *arg)
{
    worker_pool *wp = &m->pool;
    if (n > KVP_FWD_MAX_GROUPS) n = KVP_FWD_MAX_GROUPS;
    if (n > 1 && !wp->inited) {
        if (pthread_mutex_init(&wp->mu, NULL) == 0) {
            if (pthread_cond_init(&wp->go, NULL) == 0) {
                if (pthread_cond_init(&wp->done, NULL) == 0) wp->inited = 1;
                else pthread_cond_destroy(&wp->go);
            }
            if (!wp->inited) pthread_mutex_destroy(&wp->mu);
        }
    }
    int have = 0; /* tasks 1 .. have run on workers */
    if (n > 1 && wp->inited) {
        pthread_mutex_lock(&wp->mu);
        while (wp->nworkers < n - 1) { /* a worker that cannot start leaves its tasks to the caller */
            int i = wp->nworkers + 1;
            wp->args[i] = (worker_arg){wp, i, wp->epoch};
            if (pthread_create(&wp->tid[i], NULL, worker_main, &wp->args[i]) != 0) break;
            wp->nworkers = i;
        }
        have = wp->nworkers < n - 1 ? wp->nworkers : n - 1;
        wp->fn = fn;
        wp->arg = arg;
        wp->ntasks = have + 1;
        wp->remaining = have;
        __atomic_store_n(&wp->epoch, wp->epoch + 1, __ATOMIC_RELEASE);
        if (have > 0) pthread_cond_broadcast(&wp->go);
        pthread_mutex_unlock(&wp->mu);
    }
    fn(arg, 0);
    for (int i = have + 1; i < n; i++) fn(arg, i);
    if (have > 0) {
        spin_for(wp, 1, 0);
        pthread_mutex_lock(&wp->mu);
        while (wp->remaining > 0) pthread_cond_wait(&wp->done, &wp->mu);
        pthread_mutex_unlock(&wp->mu);
    }
}

