/* The thread pool every kernel call runs on, and the lock that serializes calls. */
#include <stdlib.h>

#include "runtime.h"
#ifdef TQ_THREADS
#include <sched.h>
#include <stdatomic.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* ------------------------------------------------------------------------------ thread pool
 * Work is split in units handed out by an atomic counter; the calling thread takes units too.
 * So a call never waits for a worker that is asleep or preempted to *start*: whoever is
 * running takes the next unit, and the caller only waits for units already being computed.
 * (On a loaded machine, a pool that waits for every worker costs milliseconds per call.) */

int n_threads = 1;
static const int spin_iters = 1 << 15; /* polls of an idle worker before it sleeps */

#ifdef TQ_THREADS
typedef struct {
    unit_fn fn;
    void *arg;
    int n_units;
    atomic_int next;
    atomic_int finished;
} pjob;

typedef struct {
    int n; /* threads including the caller */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int gen;      /* bumped for every job: wakes the workers */
    atomic_int sleeping; /* workers waiting on cv */
    atomic_int busy;     /* workers that may be looking at `job` */
    atomic_int stop;
    _Atomic(pjob *) job;
    int start_gen;
} pool_t;

static pool_t P = {.n = 1, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;

static void do_units(pjob *J) {
    for (;;) {
        int u = atomic_fetch_add_explicit(&J->next, 1, memory_order_relaxed);
        if (u >= J->n_units) break;
        J->fn(J->arg, u);
        atomic_fetch_add_explicit(&J->finished, 1, memory_order_release);
    }
}

static void *worker_main(void *p) {
    (void)p;
    int seen = P.start_gen;
    for (;;) {
        int g, it = 0;
        for (;;) {
            g = atomic_load_explicit(&P.gen, memory_order_acquire);
            if (g != seen || atomic_load(&P.stop)) break;
            if (++it < spin_iters) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&P.mu);
            atomic_fetch_add(&P.sleeping, 1);
            while ((g = atomic_load(&P.gen)) == seen && !atomic_load(&P.stop)) pthread_cond_wait(&P.cv, &P.mu);
            atomic_fetch_sub(&P.sleeping, 1);
            pthread_mutex_unlock(&P.mu);
            break;
        }
        if (atomic_load(&P.stop)) return NULL;
        seen = g;
        atomic_fetch_add(&P.busy, 1); /* seq_cst: pairs with the caller's job = NULL, busy load */
        pjob *J = atomic_load(&P.job);
        if (J) do_units(J);
        atomic_fetch_sub_explicit(&P.busy, 1, memory_order_release);
    }
}

static void pool_stop(void) {
    if (P.n <= 1) return;
    pthread_mutex_lock(&P.mu);
    atomic_store(&P.stop, 1);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    for (int i = 1; i < P.n; ++i) pthread_join(P.th[i - 1], NULL);
    free(P.th);
    P.th = NULL;
    P.n = 1;
    atomic_store(&P.stop, 0);
}

static int pool_start(int n) {
    pool_stop();
    if (n <= 1) return 0;
    P.th = (pthread_t *)calloc((size_t)n - 1, sizeof(pthread_t));
    if (!P.th) return -1;
    P.start_gen = atomic_load(&P.gen);
    int started = 1;
    for (int i = 1; i < n; ++i) {
        if (pthread_create(&P.th[i - 1], NULL, worker_main, (void *)(intptr_t)i) != 0) break;
        started++;
    }
    P.n = started;
    return started == n ? 0 : -1;
}

static inline void wait_relax(int *it) {
    if (++*it < (1 << 12)) cpu_relax();
    else sched_yield(); /* let a preempted worker finish its unit */
}

/* fn(arg, u) for every u < n_units, on the pool; returns when all are done. */
void pool_for(unit_fn fn, void *arg, int n_units) {
    if (P.n <= 1 || n_threads <= 1 || n_units <= 1) {
        for (int u = 0; u < n_units; ++u) fn(arg, u);
        return;
    }
    pjob J;
    J.fn = fn;
    J.arg = arg;
    J.n_units = n_units;
    atomic_init(&J.next, 0);
    atomic_init(&J.finished, 0);
    atomic_store(&P.job, &J);
    atomic_fetch_add(&P.gen, 1); /* seq_cst: pairs with a worker's sleeping++ then gen load */
    if (atomic_load(&P.sleeping) > 0) {
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.cv);
        pthread_mutex_unlock(&P.mu);
    }
    do_units(&J);
    int it = 0;
    while (atomic_load_explicit(&J.finished, memory_order_acquire) < n_units) wait_relax(&it);
    atomic_store(&P.job, NULL);
    it = 0;
    while (atomic_load(&P.busy) > 0) wait_relax(&it);
}
#else
void pool_for(unit_fn fn, void *arg, int n_units) {
    for (int u = 0; u < n_units; ++u) fn(arg, u);
}
static int pool_start(int n) { (void)n; return 0; }
#endif

int pool_units(ptrdiff_t rows, ptrdiff_t row_elems) {
    /* one unit for small work (the pool's hand-off costs more than it saves), else about 4 per thread */
    if (rows <= 1 || rows * row_elems < (1 << 15)) return 1;
    ptrdiff_t u = 4 * (ptrdiff_t)n_threads;
    return (int)(u < rows ? u : rows);
}

/* n threads (the caller included); 0, or -1 when fewer could be started (n_threads says how many) */
int set_pool_threads(int n) {
    int rc = pool_start(n);
#ifdef TQ_THREADS
    n_threads = P.n;
#else
    n_threads = 1;
#endif
    return rc;
}
