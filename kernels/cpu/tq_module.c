/* tramontane.kernels._cpu: quantized matmuls on GGUF blocks for the CPU.
 *
 * - kernel variant chosen once at import from the CPU's features: x86-64 (cpuid) avx512vnni,
 *   avx2, generic; aarch64 (the OS's hwcaps) neondot, neon (generic is never needed there);
 *   TRAMONTANE_CPU_VARIANT=<name> or use_variant() overrides (tests run them all).
 * - a persistent thread pool: workers spin briefly between calls (decode issues ~60 matmuls
 *   per token back to back), then sleep on a condition variable.
 * - every call releases the GIL; calls from several Python threads are serialized here.
 * Pointers are passed as Python ints (tensor.data_ptr()); the Python wrapper checks shapes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#if defined(__linux__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif
#ifdef TQ_HAVE_NEON_VARIANTS
#include "arch/arm/features.h"
#endif
#include "arch/x86/features.h"

#ifndef _WIN32
#define TQ_THREADS 1
#include <pthread.h>
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

static const tq_kernels *K = &tq_kernels_generic;

/* ------------------------------------------------------------------------------ variants */
static int variant_supported(const tq_kernels *k) {
    if (k == &tq_kernels_generic) return 1;
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
    /* the one x86 probe: every feature the variant is compiled for, and the OS's state for it */
    if (k->target) return tq_x86_has_all(k->target);
#endif
#ifdef TQ_HAVE_NEON_VARIANTS
    if (k == &tq_kernels_neon) return 1; /* Advanced SIMD is part of every aarch64 CPU */
    if (k == &tq_kernels_neondot) return tq_arm_has_dotprod();
#endif
    return 0;
}

static const tq_kernels *all_variants[] = {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
    &tq_kernels_avx512, &tq_kernels_avxvnni, &tq_kernels_avx2,
#endif
#ifdef TQ_HAVE_NEON_VARIANTS
    &tq_kernels_neondot, &tq_kernels_neon,
#endif
    &tq_kernels_generic, NULL};

/* ------------------------------------------------------------------------------ thread pool
 * Work is split in units handed out by an atomic counter; the calling thread takes units too.
 * So a call never waits for a worker that is asleep or preempted to *start*: whoever is
 * running takes the next unit, and the caller only waits for units already being computed.
 * (On a loaded machine, a pool that waits for every worker costs milliseconds per call.) */
typedef void (*unit_fn)(void *arg, int unit);

static int n_threads = 1;
static int spin_iters = 1 << 15;

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
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;

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
static void pool_for(unit_fn fn, void *arg, int n_units) {
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
#define LOCK_CALLS() pthread_mutex_lock(&call_mu)
#define UNLOCK_CALLS() pthread_mutex_unlock(&call_mu)
#else
static void pool_for(unit_fn fn, void *arg, int n_units) {
    for (int u = 0; u < n_units; ++u) fn(arg, u);
}
static int pool_start(int n) { (void)n; return 0; }
#define LOCK_CALLS() ((void)0)
#define UNLOCK_CALLS() ((void)0)
#endif

/* ------------------------------------------------------------------------------ scratch */
static void *scratch = NULL;
static size_t scratch_size = 0;

static void *get_scratch(size_t n) {
    if (n <= scratch_size) return scratch;
#ifdef _WIN32
    _aligned_free(scratch);
#else
    free(scratch);
#endif
    scratch = NULL;
    scratch_size = 0;
    size_t sz = (n + 4095) & ~(size_t)4095;
#ifdef _WIN32
    scratch = _aligned_malloc(sz, 64);
#else
    if (posix_memalign(&scratch, 64, sz) != 0) scratch = NULL;
#endif
    if (scratch) scratch_size = sz;
    return scratch;
}

/* ------------------------------------------------------------------------------ matmul job */
typedef struct {
    int type;
    const uint8_t *w;
    size_t w_stride;
    int n_out;
    int64_t k;
    const uint8_t *x; /* float rows */
    size_t x_stride;  /* bytes */
    int n_x;
    uint8_t *xq; /* quantized rows (or x itself for float weights) */
    size_t xq_stride;
    tq_quant_fn quant;
    tq_gemm_fn gemm;
    float *y;
    size_t ldy;
    int rows_per_unit;
} mm_job;

static void unit_quant(void *arg, int j) {
    mm_job *J = (mm_job *)arg;
    J->quant((const float *)(J->x + (size_t)j * J->x_stride), J->xq + (size_t)j * J->xq_stride, J->k);
}

static void unit_gemm(void *arg, int u) {
    mm_job *J = (mm_job *)arg;
    int r0 = u * J->rows_per_unit;
    int n = J->n_out - r0 < J->rows_per_unit ? J->n_out - r0 : J->rows_per_unit;
    J->gemm(J->w + (size_t)r0 * J->w_stride, J->w_stride, n, J->xq, J->xq_stride, J->n_x, J->k, J->y + r0,
            J->ldy);
}

/* returns 0, or -1 when the scratch buffer could not be allocated */
static int run_matmul(mm_job *J) {
    const int act = tq_act_kind(J->type);
    J->gemm = K->gemm[J->type];
    if (act == TQ_ACT_F32) {
        J->xq = (uint8_t *)J->x;
        J->xq_stride = J->x_stride;
        if (J->n_x >= TQ_WIDE_MIN_ROWS && K->gemm_wide[J->type]) J->gemm = K->gemm_wide[J->type];
    } else {
        const int64_t nb = J->k / (act == TQ_ACT_Q8K ? TQ_QK : TQ_QB);
        J->xq_stride = (size_t)nb * (act == TQ_ACT_Q8K ? sizeof(tq_q8k) : sizeof(tq_q8b));
        J->xq = (uint8_t *)get_scratch(J->xq_stride * (size_t)J->n_x);
        if (!J->xq) return -1;
        J->quant = act == TQ_ACT_Q8K ? K->quant_q8k : K->quant_q8b;
        /* repacked rows: the wide tile for any row count, unless the type has a narrow one */
        if (J->n_x < TQ_WIDE_MIN_ROWS && K->gemm_narrow[J->type]) {
            J->quant = K->quant_narrow[J->type];
            J->gemm = K->gemm_narrow[J->type];
        } else if ((J->n_x >= TQ_WIDE_MIN_ROWS || K->repack[J->type]) && J->k % TQ_QK == 0 && K->gemm_wide[J->type]) {
            J->quant = K->quant_wide[J->type];
            J->gemm = K->gemm_wide[J->type];
        }
        pool_for(unit_quant, J, J->n_x);
    }
    /* units of weight rows handed out dynamically (balances noisy cores) */
    /* about 16 units per thread (fewer atomics on big matrices such as the vocabulary head),
     * at least 16 rows (4 for small matrices), and for prefill a unit's weight rows fit in L2
     * (they are re-read once per tile of 4 activation rows) */
    int rpu = J->n_out / (16 * n_threads);
    int cap = 1024;
    if (J->n_x > 4) {
        size_t fit = ((size_t)256 << 10) / J->w_stride;
        cap = fit < 16 ? 16 : fit > 1024 ? 1024 : (int)fit;
    }
    if (rpu > cap) rpu = cap;
    if (rpu < 16) rpu = 16;
    rpu &= ~3;
    while (rpu > 4 && (J->n_out + rpu - 1) / rpu < 4 * n_threads) rpu /= 2;
    J->rows_per_unit = rpu;
    pool_for(unit_gemm, J, (J->n_out + rpu - 1) / rpu);
    return 0;
}

typedef struct {
    int type;
    const uint8_t *w;
    size_t w_stride;
    int n_rows;
    int64_t k;
    float *out;
} dq_job;

#define DQ_ROWS 16
static void unit_dequant(void *arg, int u) {
    dq_job *J = (dq_job *)arg;
    int r0 = u * DQ_ROWS, r1 = r0 + DQ_ROWS < J->n_rows ? r0 + DQ_ROWS : J->n_rows;
    K->dequant[J->type](J->w + (size_t)r0 * J->w_stride, J->w_stride, r1 - r0, J->k, J->out + (size_t)r0 * J->k);
}

/* ------------------------------------------------------------------------------ Python API */
static int check_type(int t, int64_t k) {
    if (t < 0 || t >= TQ_NTYPES || tq_block_elems(t) == 0) {
        PyErr_Format(PyExc_ValueError, "ggml type %d is not supported by the native CPU kernels", t);
        return -1;
    }
    if ((t == TQ_Q4_K_R || t == TQ_Q6_K_R) && !K->repack[t]) {
        PyErr_Format(PyExc_ValueError, "repacked %s weights do not run on the %s kernels (repacking_variants())",
                     t == TQ_Q4_K_R ? "Q4_K" : "Q6_K", K->name);
        return -1;
    }
    if (k <= 0 || k % tq_block_elems(t)) {
        PyErr_Format(PyExc_ValueError, "k=%lld is not a positive multiple of the block size %d", (long long)k,
                     tq_block_elems(t));
        return -1;
    }
    return 0;
}

/* repacked rows have tiles, no dequantizer: refused rather than called through NULL */
static int check_dequant(int t) {
    if (K->dequant[t]) return 0;
    PyErr_Format(PyExc_ValueError, "type %d cannot be dequantized (a repacked type: dequantize the file's rows)", t);
    return -1;
}

static int get_ptr(PyObject *o, void **p) {
    *p = PyLong_AsVoidPtr(o);
    return (*p == NULL && PyErr_Occurred()) ? -1 : 0;
}

static int get_ssize(PyObject *o, Py_ssize_t *v) {
    *v = PyLong_AsSsize_t(o);
    return (*v == -1 && PyErr_Occurred()) ? -1 : 0;
}

PyDoc_STRVAR(matmul_doc,
             "matmul(ggml_type, w_ptr, w_row_bytes, n_out, k, x_ptr, x_row_bytes, n_x, y_ptr, y_row_floats)\n"
             "y[j, r] = sum_e W[r, e] * x[j, e] for r < n_out, j < n_x: W in GGUF blocks, x and y float32.");

static PyObject *py_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "matmul takes 10 arguments");
        return NULL;
    }
    Py_ssize_t type, w_stride, n_out, k, x_stride, n_x, ldy;
    void *w, *x, *y;
    if (get_ssize(args[0], &type) || get_ptr(args[1], &w) || get_ssize(args[2], &w_stride) ||
        get_ssize(args[3], &n_out) || get_ssize(args[4], &k) || get_ptr(args[5], &x) ||
        get_ssize(args[6], &x_stride) || get_ssize(args[7], &n_x) || get_ptr(args[8], &y) ||
        get_ssize(args[9], &ldy))
        return NULL;
    if (check_type((int)type, k)) return NULL;
    if (n_out <= 0 || n_x < 0 || n_out > INT32_MAX || n_x > INT32_MAX || !w || !x || !y ||
        w_stride < (Py_ssize_t)(k / tq_block_elems((int)type) * tq_block_bytes((int)type)) ||
        x_stride < k * 4 || ldy < n_out) {
        PyErr_SetString(PyExc_ValueError, "matmul: inconsistent sizes or null pointers");
        return NULL;
    }
    if (n_x == 0) Py_RETURN_NONE;
    mm_job J;
    memset(&J, 0, sizeof(J));
    J.type = (int)type;
    J.w = (const uint8_t *)w;
    J.w_stride = (size_t)w_stride;
    J.n_out = (int)n_out;
    J.k = k;
    J.x = (const uint8_t *)x;
    J.x_stride = (size_t)x_stride;
    J.n_x = (int)n_x;
    J.y = (float *)y;
    J.ldy = (size_t)ldy;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    rc = run_matmul(&J);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(dequantize_doc,
             "dequantize(ggml_type, w_ptr, w_row_bytes, n_rows, k, out_ptr): float32 rows (n_rows, k).");

static PyObject *py_dequantize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "dequantize takes 6 arguments");
        return NULL;
    }
    Py_ssize_t type, w_stride, n_rows, k;
    void *w, *out;
    if (get_ssize(args[0], &type) || get_ptr(args[1], &w) || get_ssize(args[2], &w_stride) ||
        get_ssize(args[3], &n_rows) || get_ssize(args[4], &k) || get_ptr(args[5], &out))
        return NULL;
    if (check_type((int)type, k) || check_dequant((int)type)) return NULL;
    if (n_rows < 0 || n_rows > INT32_MAX || !w || !out ||
        w_stride < (Py_ssize_t)(k / tq_block_elems((int)type) * tq_block_bytes((int)type))) {
        PyErr_SetString(PyExc_ValueError, "dequantize: inconsistent sizes or null pointers");
        return NULL;
    }
    if (n_rows == 0) Py_RETURN_NONE;
    dq_job J = {(int)type, (const uint8_t *)w, (size_t)w_stride, (int)n_rows, k, (float *)out};
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    pool_for(unit_dequant, &J, ((int)n_rows + DQ_ROWS - 1) / DQ_ROWS);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* RMSNorm of rows [r0, r1): the sum of squares in double, as HF's float32 formula rounds */
static void rms_norm_rows(const float *x, const float *w, float *o, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t n,
                          float eps) {
    for (Py_ssize_t r = r0; r < r1; ++r) {
        const float *xr = x + r * n;
        float *orow = o + r * n;
        double ss = 0.0;
        for (Py_ssize_t i = 0; i < n; ++i) ss += (double)xr[i] * xr[i];
        const float inv = (float)(1.0 / sqrt((double)(float)(ss / (double)n) + (double)eps));
        for (Py_ssize_t i = 0; i < n; ++i) orow[i] = w[i] * (xr[i] * inv);
    }
}

typedef struct {
    const float *x, *w;
    float *o;
    Py_ssize_t rows, n;
    float eps;
    int n_units;
} rn_job;

static void unit_rms_norm(void *arg, int u) {
    rn_job *J = (rn_job *)arg;
    rms_norm_rows(J->x, J->w, J->o, J->rows * u / J->n_units, J->rows * (u + 1) / J->n_units, J->n, J->eps);
}

static int pool_units(Py_ssize_t rows, Py_ssize_t row_elems);

/* rows on the pool when there are many (prefill); the caller holds the call lock */
static void rms_norm_pool(const float *x, const float *w, float *o, Py_ssize_t rows, Py_ssize_t n, float eps) {
    rn_job J = {x, w, o, rows, n, eps, pool_units(rows, n)};
    pool_for(unit_rms_norm, &J, J.n_units);
}

PyDoc_STRVAR(rms_norm_doc,
             "rms_norm(x_ptr, w_ptr, out_ptr, rows, n, eps): out = w * (x / sqrt(mean(x^2) + eps)) per row, "
             "float32, contiguous rows (the sum of squares in double).");

static PyObject *py_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "rms_norm takes 6 arguments");
        return NULL;
    }
    void *xp, *wp, *op;
    Py_ssize_t rows, n;
    if (get_ptr(args[0], &xp) || get_ptr(args[1], &wp) || get_ptr(args[2], &op) || get_ssize(args[3], &rows) ||
        get_ssize(args[4], &n))
        return NULL;
    double eps = PyFloat_AsDouble(args[5]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    if (rows < 0 || n <= 0 || !xp || !wp || !op) {
        PyErr_SetString(PyExc_ValueError, "rms_norm: inconsistent sizes or null pointers");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    rms_norm_pool((const float *)xp, (const float *)wp, (float *)op, rows, n, (float)eps);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyDoc_STRVAR(rope_doc,
             "rope_pairs(x_ptr, cos_ptr, sin_ptr, out_ptr, T, H, d): out[t, h] = x[t, h] * cos[t] + "
             "swap_pairs(x[t, h]) * sin[t], float32, contiguous (T, H, d) and (T, d).");

static PyObject *py_rope_pairs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "rope_pairs takes 7 arguments");
        return NULL;
    }
    void *xp, *cp, *sp, *op;
    Py_ssize_t T, H, d;
    if (get_ptr(args[0], &xp) || get_ptr(args[1], &cp) || get_ptr(args[2], &sp) || get_ptr(args[3], &op) ||
        get_ssize(args[4], &T) || get_ssize(args[5], &H) || get_ssize(args[6], &d))
        return NULL;
    if (T < 0 || H <= 0 || d <= 0 || d % 2 || !xp || !cp || !sp || !op) {
        PyErr_SetString(PyExc_ValueError, "rope_pairs: inconsistent sizes or null pointers");
        return NULL;
    }
    const float *x = (const float *)xp, *c = (const float *)cp, *sn = (const float *)sp;
    float *o = (float *)op;
    for (Py_ssize_t t = 0; t < T; ++t) {
        const float *ct = c + t * d, *st = sn + t * d;
        for (Py_ssize_t h = 0; h < H; ++h) {
            const float *xr = x + (t * H + h) * d;
            float *orow = o + (t * H + h) * d;
            for (Py_ssize_t i = 0; i < d; i += 2) {
                const float a = xr[i], b = xr[i + 1];
                const float p0 = a * ct[i], q0 = b * st[i];
                const float p1 = b * ct[i + 1], q1 = a * st[i + 1];
                orow[i] = p0 + q0;
                orow[i + 1] = p1 + q1;
            }
        }
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------ fused forward-pass ops
 * The non-matmul steps of a CPU forward pass (engine/mistral3/text.py), each one call instead of several
 * torch ops: RoPE + KV-cache write, causal attention over the cache, SwiGLU, a gather of embedding rows,
 * greedy argmax. Rows go to the pool when there are enough of them (prefill). */

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define TQ_ELEMENTWISE_X86 1
#endif
#if defined(__GNUC__) || defined(__clang__)
#define TQ_PREFILL_ATTENTION 1 /* written in GCC / clang vector types */
#endif

static int pool_units(Py_ssize_t rows, Py_ssize_t row_elems) {
    /* one unit for small work (the pool's hand-off costs more than it saves), else about 4 per thread */
    if (rows <= 1 || rows * row_elems < (1 << 15)) return 1;
    Py_ssize_t u = 4 * (Py_ssize_t)n_threads;
    return (int)(u < rows ? u : rows);
}

typedef struct {
    float *q;
    const float *k, *v, *cq, *sq, *ck, *sk;
    float *kc, *vc;
    int T, hq, hkv, d, dv, n_units;
    size_t q_row, k_row, v_row, kh, kr, vh, vr; /* strides in floats */
    Py_ssize_t pos;
} rkv_job;

static inline void rope_row(const float *x, const float *c, const float *s, float *o, int d) {
    for (int i = 0; i < d; i += 2) { /* the same products and sum as py_rope_pairs (bit-exact) */
        const float a = x[i], b = x[i + 1];
        const float p0 = a * c[i], q0 = b * s[i];
        const float p1 = b * c[i + 1], q1 = a * s[i + 1];
        o[i] = p0 + q0;
        o[i + 1] = p1 + q1;
    }
}

static void unit_rope_kv(void *arg, int u) {
    rkv_job *J = (rkv_job *)arg;
    int t0 = (int)((int64_t)J->T * u / J->n_units), t1 = (int)((int64_t)J->T * (u + 1) / J->n_units);
    for (int t = t0; t < t1; ++t) {
        const size_t row = (size_t)J->pos + (size_t)t;
        float *q = J->q + (size_t)t * J->q_row;
        for (int h = 0; h < J->hq; ++h) /* in place: each pair is read before it is written */
            rope_row(q + (size_t)h * J->d, J->cq + (size_t)t * J->d, J->sq + (size_t)t * J->d, q + (size_t)h * J->d,
                     J->d);
        for (int h = 0; h < J->hkv; ++h) {
            rope_row(J->k + (size_t)t * J->k_row + (size_t)h * J->d, J->ck + (size_t)t * J->d, J->sk + (size_t)t * J->d,
                     J->kc + (size_t)h * J->kh + row * J->kr, J->d);
            memcpy(J->vc + (size_t)h * J->vh + row * J->vr, J->v + (size_t)t * J->v_row + (size_t)h * J->dv,
                   sizeof(float) * (size_t)J->dv);
        }
    }
}

PyDoc_STRVAR(rope_kv_doc,
             "rope_kv(q, k, v, cos_q, sin_q, cos_k, sin_k, k_cache, v_cache, T, Hq, Hkv, d, dv, pos, q_row, k_row, "
             "v_row, kc_head, kc_row, vc_head, vc_row)\n"
             "Pointers then sizes, strides in floats. For each row t < T: q[t] (Hq heads of d) rotated in place with "
             "tables row t (as rope_pairs); k[t] rotated into k_cache[h, pos + t]; v[t] copied to v_cache[h, pos + t].");

/* rope_kv's 22 arguments into its job; -1 with an exception set when they do not fit */
static int parse_rope_kv(PyObject *const *args, rkv_job *J) {
    void *p[9];
    Py_ssize_t s[13];
    for (int i = 0; i < 9; ++i)
        if (get_ptr(args[i], &p[i])) return -1;
    for (int i = 0; i < 13; ++i)
        if (get_ssize(args[9 + i], &s[i])) return -1;
    int ok = s[1] > 0 && s[2] > 0 && s[3] > 0 && s[3] % 2 == 0 && s[4] > 0;
    for (int i = 0; i < 9; ++i) ok = ok && p[i];
    for (int i = 0; i < 13; ++i) ok = ok && s[i] >= 0 && s[i] <= INT32_MAX;
    if (!ok || s[0] + s[5] > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "rope_kv: inconsistent sizes or null pointers");
        return -1;
    }
    rkv_job j = {(float *)p[0], (const float *)p[1], (const float *)p[2], (const float *)p[3], (const float *)p[4],
                 (const float *)p[5], (const float *)p[6], (float *)p[7], (float *)p[8], (int)s[0], (int)s[1],
                 (int)s[2], (int)s[3], (int)s[4], 1, (size_t)s[6], (size_t)s[7], (size_t)s[8], (size_t)s[9],
                 (size_t)s[10], (size_t)s[11], (size_t)s[12], s[5]};
    j.n_units = pool_units(j.T, (Py_ssize_t)(j.hq + 2 * j.hkv) * j.d);
    *J = j;
    return 0;
}

static PyObject *py_rope_kv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 22) {
        PyErr_SetString(PyExc_TypeError, "rope_kv takes 22 arguments");
        return NULL;
    }
    rkv_job J;
    if (parse_rope_kv(args, &J)) return NULL;
    if (J.T == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    pool_for(unit_rope_kv, &J, J.n_units);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    const float *q, *k, *v;
    float *out;
    int T, n_kv, n_rep, d, dv;
    size_t q_row, out_row, kh, kr, vh, vr;
    Py_ssize_t start;
    float scale;
    int failed; /* a unit could not allocate its scores */
} ac_job;

#ifndef TQ_PREFILL_ATTENTION /* the per-head decode kernel, where vector types are missing */
static void unit_attn_causal(void *arg, int u) {
    ac_job *J = (ac_job *)arg;
    const int t = J->T - 1 - u / J->n_kv, g = u % J->n_kv; /* the longest rows first: they finish last */
    const int n_keys = (int)(J->start + t + 1);
    float stack_scores[1024];
    float *scores = n_keys <= 1024 ? stack_scores : (float *)malloc(sizeof(float) * (size_t)n_keys);
    if (!scores) {
        J->failed = 1;
        return;
    }
    K->attn_group(J->q + (size_t)t * J->q_row + (size_t)g * J->n_rep * J->d, J->n_rep, J->d, J->k + (size_t)g * J->kh,
                  J->kr, J->v + (size_t)g * J->vh, J->vr, J->dv, n_keys, J->scale,
                  J->out + (size_t)t * J->out_row + (size_t)g * J->n_rep * J->dv, scores);
    if (scores != stack_scores) free(scores);
}
#endif

#ifdef TQ_PREFILL_ATTENTION
static void attend_prefill(ac_job *J); /* T > 1: below, beside the vectorized exp */
static void attend_decode_groups(ac_job *J); /* T = 1: below */
#endif

/* the caller holds the call lock */
static void run_attend(ac_job *J) {
#ifdef TQ_PREFILL_ATTENTION
    if (J->T > 1)
        attend_prefill(J);
    else
        attend_decode_groups(J);
#else
    pool_for(unit_attn_causal, J, J->T * J->n_kv); /* a compiler without vector types */
#endif
}

PyDoc_STRVAR(attend_causal_doc,
             "attend_causal(q, k_cache, v_cache, out, T, n_heads, n_kv_heads, d, dv, start, q_row, out_row, k_head, "
             "k_row, v_head, v_row, scale)\n"
             "Causal attention of T query rows at positions start..start+T-1 over the cached keys/values "
             "[0, start + t] of each (float32, strides in floats; a row's heads contiguous): query head h reads KV "
             "head h // (n_heads / n_kv_heads). out[t]: (n_heads, dv). The decode step is T = 1.");

static PyObject *py_attend_causal(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "attend_causal takes 17 arguments");
        return NULL;
    }
    void *p[4];
    Py_ssize_t s[12];
    for (int i = 0; i < 4; ++i)
        if (get_ptr(args[i], &p[i])) return NULL;
    for (int i = 0; i < 12; ++i)
        if (get_ssize(args[4 + i], &s[i])) return NULL;
    double scale = PyFloat_AsDouble(args[16]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
    int ok = p[0] && p[1] && p[2] && p[3] && s[1] > 0 && s[2] > 0 && s[1] % s[2] == 0 && s[3] > 0 && s[4] > 0;
    for (int i = 0; i < 12; ++i) ok = ok && s[i] >= 0 && s[i] <= INT32_MAX;
    if (!ok || s[0] * s[2] > INT32_MAX || s[0] + s[5] > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "attend_causal: inconsistent sizes or null pointers");
        return NULL;
    }
    ac_job J;
    J.q = (const float *)p[0];
    J.k = (const float *)p[1];
    J.v = (const float *)p[2];
    J.out = (float *)p[3];
    J.T = (int)s[0];
    J.n_kv = (int)s[2];
    J.n_rep = (int)(s[1] / s[2]);
    J.d = (int)s[3];
    J.dv = (int)s[4];
    J.start = s[5];
    J.q_row = (size_t)s[6];
    J.out_row = (size_t)s[7];
    J.kh = (size_t)s[8];
    J.kr = (size_t)s[9];
    J.vh = (size_t)s[10];
    J.vr = (size_t)s[11];
    J.scale = (float)scale;
    J.failed = 0;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    run_attend(&J);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (J.failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(rope_kv_attend_doc,
             "rope_kv_attend(<rope_kv's 22 arguments>, out_ptr, scale)\n"
             "rope_kv, then attend_causal of the rotated q over the caches (out: T rows of Hq * dv floats): a "
             "layer's attention before its output projection, one call.");

static PyObject *py_rope_kv_attend(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 24) {
        PyErr_SetString(PyExc_TypeError, "rope_kv_attend takes 24 arguments");
        return NULL;
    }
    rkv_job R;
    void *out;
    if (parse_rope_kv(args, &R) || get_ptr(args[22], &out)) return NULL;
    double scale = PyFloat_AsDouble(args[23]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
    if (!out || R.hq % R.hkv) {
        PyErr_SetString(PyExc_ValueError, "rope_kv_attend: null output or heads not a multiple of the KV heads");
        return NULL;
    }
    if (R.T == 0) Py_RETURN_NONE;
    ac_job A = {R.q, R.kc, R.vc, (float *)out, R.T, R.hkv, R.hq / R.hkv, R.d, R.dv, R.q_row, (size_t)R.hq * R.dv,
                R.kh, R.kr, R.vh, R.vr, R.pos, (float)scale, 0};
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    pool_for(unit_rope_kv, &R, R.n_units);
    run_attend(&A);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (A.failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math") /* lets the clamps below vectorize; results are unchanged */
#endif
/* exp for float32 without libm (so the loops vectorize): Cody-Waite reduction by ln 2 and Cephes'
 * degree-6 polynomial, ~1 ulp; inputs clamped to [-87, 88] (finite, normal results).
 * Plain float ops only, no fused multiply-add (-ffp-contract=off): every variant rounds alike. */
static inline float tq_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * (r * r) + r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) * (1 << 23);
    return y * scale.f;
}

#define SWIGLU_BODY                                                                                          \
    for (int64_t i = 0; i < n; ++i) {                                                                        \
        const float a = g[i];                                                                                \
        out[i] = a / (1.0f + tq_expf(-a)) * u[i];                                                            \
    }
static void swiglu_row_generic(const float *g, const float *u, float *out, int64_t n) { SWIGLU_BODY }
#ifdef TQ_ELEMENTWISE_X86
__attribute__((target("avx2"))) static void swiglu_row_avx2(const float *g, const float *u, float *out, int64_t n) {
    SWIGLU_BODY
}
__attribute__((target("avx2,avx512f"))) static void swiglu_row_avx512(const float *g, const float *u, float *out,
                                                                      int64_t n) {
    SWIGLU_BODY
}
#endif

typedef void (*row_fn)(const float *, const float *, float *, int64_t);

static row_fn swiglu_row(void) {
#ifdef TQ_ELEMENTWISE_X86
    if (K->simd == TQ_SIMD_AVX512) return swiglu_row_avx512;
    if (K->simd == TQ_SIMD_AVX2) return swiglu_row_avx2;
#endif
    return swiglu_row_generic;
}

/* Prefill attention, one query row of a KV group (n_rep heads), in GCC / clang vector types of the
 * variant's register width W (AVX-512 16 floats, AVX2 8, SSE 4) so the accumulators stay in
 * registers. Scores against the group's keys transposed (kt: d rows of n_pad floats, n_pad a
 * multiple of ATT_PAD past n_keys, zero-padded): 2 W keys at a time with no horizontal sum per key,
 * four heads at once so each loaded key vector serves four; softmax with tq_expf; then the weighted
 * sum of values, 2 W output elements of four heads at a time. scores: n_rep * n_pad floats. */
#ifdef TQ_PREFILL_ATTENTION
#define ATT_PAD 64 /* a multiple of 2 W for every W */
typedef float tq_v16 __attribute__((vector_size(64)));
typedef float tq_v8 __attribute__((vector_size(32)));
typedef float tq_v4 __attribute__((vector_size(16)));

/* unaligned loads and stores (macros: a vector return value would be ABI-dependent) */
#define VLOAD(VT, p) __extension__({ VT v_; memcpy(&v_, (p), sizeof(v_)); v_; })
#define VSTORE(VT, p, x) __extension__({ VT v_ = (x); memcpy((p), &v_, sizeof(v_)); })

/* softmax of sc[0, n_keys) in place, sc[n_keys, n_blk) set to 0; inv = 1 / sum */
#define ATT_SOFTMAX(VT, W, sc, inv)                                                                          \
    do {                                                                                                     \
        float lane_max[W];                                                                                   \
        for (int j = 0; j < (W); ++j) lane_max[j] = -INFINITY;                                               \
        int s = 0;                                                                                           \
        for (; s + (W) <= n_keys; s += (W))                                                                  \
            for (int j = 0; j < (W); ++j) lane_max[j] = sc[s + j] > lane_max[j] ? sc[s + j] : lane_max[j];   \
        float mx = -INFINITY;                                                                                \
        for (int j = 0; j < (W); ++j) mx = lane_max[j] > mx ? lane_max[j] : mx;                              \
        for (; s < n_keys; ++s) mx = sc[s] > mx ? sc[s] : mx;                                                \
        for (s = 0; s < n_blk; ++s) sc[s] = tq_expf(sc[s] - mx);                                             \
        for (s = n_keys; s < n_blk; ++s) sc[s] = 0.0f; /* past this row's causal limit */                   \
        VT part = {0};                                                                                       \
        for (s = 0; s < n_blk; s += (W)) part += VLOAD(VT, sc + s);                                          \
        float sum = 0.0f;                                                                                    \
        for (int j = 0; j < (W); ++j) sum += part[j];                                                        \
        inv = 1.0f / sum;                                                                                    \
    } while (0)

/* out rows o0..o3 = (c0..c3 weights over n_keys value rows) * i0..i3, 2 W lanes at a time, then
 * the tail; expects those names, v, vs, dv, n_keys and zero in scope */
#define ATT_PV4(VT, W)                                                                                       \
        int e0 = 0;                                                                                          \
        for (; e0 + 2 * (W) <= dv; e0 += 2 * (W)) {                                                          \
            VT a00 = zero, a01 = zero, a10 = zero, a11 = zero, a20 = zero, a21 = zero, a30 = zero, a31 = zero; \
            for (int s = 0; s < n_keys; ++s) {                                                               \
                const float *vrow = v + (size_t)s * vs + e0;                                                 \
                const VT v0 = VLOAD(VT, vrow), v1 = VLOAD(VT, vrow + (W));                                   \
                const float p0 = c0[s], p1 = c1[s], p2 = c2[s], p3 = c3[s];                                  \
                a00 += p0 * v0;                                                                              \
                a01 += p0 * v1;                                                                              \
                a10 += p1 * v0;                                                                              \
                a11 += p1 * v1;                                                                              \
                a20 += p2 * v0;                                                                              \
                a21 += p2 * v1;                                                                              \
                a30 += p3 * v0;                                                                              \
                a31 += p3 * v1;                                                                              \
            }                                                                                                \
            /* last head first: a missing head aliases the first, whose values win */                        \
            VSTORE(VT, o3 + e0, a30 * i3);                                                                   \
            VSTORE(VT, o3 + e0 + (W), a31 * i3);                                                             \
            VSTORE(VT, o2 + e0, a20 * i2);                                                                   \
            VSTORE(VT, o2 + e0 + (W), a21 * i2);                                                             \
            VSTORE(VT, o1 + e0, a10 * i1);                                                                   \
            VSTORE(VT, o1 + e0 + (W), a11 * i1);                                                             \
            VSTORE(VT, o0 + e0, a00 * i0);                                                                   \
            VSTORE(VT, o0 + e0 + (W), a01 * i0);                                                             \
        }                                                                                                    \
        for (; e0 < dv; ++e0) {                                                                              \
            float b0 = 0.0f, b1 = 0.0f, b2 = 0.0f, b3 = 0.0f;                                                \
            for (int s = 0; s < n_keys; ++s) {                                                               \
                const float x = v[(size_t)s * vs + e0];                                                      \
                b0 += c0[s] * x;                                                                             \
                b1 += c1[s] * x;                                                                             \
                b2 += c2[s] * x;                                                                             \
                b3 += c3[s] * x;                                                                             \
            }                                                                                                \
            o3[e0] = b3 * i3;                                                                                \
            o2[e0] = b2 * i2;                                                                                \
            o1[e0] = b1 * i1;                                                                                \
            o0[e0] = b0 * i0;                                                                                \
        }

#define ATT_ROW_BODY(VT, W)                                                                                  \
    const int n_blk = (n_keys + 2 * (W) - 1) / (2 * (W)) * (2 * (W));                                       \
    const VT zero = {0};                                                                                     \
    int h = 0;                                                                                               \
    for (; h + 4 <= n_rep; h += 4) {                                                                         \
        const float *q0 = q + (size_t)h * d, *q1 = q0 + d, *q2 = q1 + d, *q3 = q2 + d;                       \
        float *c0 = scores + (size_t)h * n_pad, *c1 = c0 + n_pad, *c2 = c1 + n_pad, *c3 = c2 + n_pad;        \
        for (int s0 = 0; s0 < n_blk; s0 += 2 * (W)) {                                                        \
            VT a00 = zero, a01 = zero, a10 = zero, a11 = zero, a20 = zero, a21 = zero, a30 = zero, a31 = zero; \
            for (int e = 0; e < d; ++e) {                                                                    \
                const float *row = kt + (size_t)e * n_pad + s0;                                              \
                const VT k0 = VLOAD(VT, row), k1 = VLOAD(VT, row + (W));                                     \
                const float x0 = q0[e], x1 = q1[e], x2 = q2[e], x3 = q3[e];                                  \
                a00 += x0 * k0;                                                                              \
                a01 += x0 * k1;                                                                              \
                a10 += x1 * k0;                                                                              \
                a11 += x1 * k1;                                                                              \
                a20 += x2 * k0;                                                                              \
                a21 += x2 * k1;                                                                              \
                a30 += x3 * k0;                                                                              \
                a31 += x3 * k1;                                                                              \
            }                                                                                                \
            VSTORE(VT, c0 + s0, a00 * scale);                                                                \
            VSTORE(VT, c0 + s0 + (W), a01 * scale);                                                          \
            VSTORE(VT, c1 + s0, a10 * scale);                                                                \
            VSTORE(VT, c1 + s0 + (W), a11 * scale);                                                          \
            VSTORE(VT, c2 + s0, a20 * scale);                                                                \
            VSTORE(VT, c2 + s0 + (W), a21 * scale);                                                          \
            VSTORE(VT, c3 + s0, a30 * scale);                                                                \
            VSTORE(VT, c3 + s0 + (W), a31 * scale);                                                          \
        }                                                                                                    \
        float i0, i1, i2, i3;                                                                                \
        ATT_SOFTMAX(VT, W, c0, i0);                                                                          \
        ATT_SOFTMAX(VT, W, c1, i1);                                                                          \
        ATT_SOFTMAX(VT, W, c2, i2);                                                                          \
        ATT_SOFTMAX(VT, W, c3, i3);                                                                          \
        float *o0 = out + (size_t)h * dv, *o1 = o0 + dv, *o2 = o1 + dv, *o3 = o2 + dv;                       \
        ATT_PV4(VT, W);                                                                                      \
    }                                                                                                        \
    for (; h < n_rep; ++h) { /* heads past a multiple of four, one at a time */                              \
        const float *qh = q + (size_t)h * d;                                                                 \
        float *c = scores + (size_t)h * n_pad;                                                               \
        for (int s0 = 0; s0 < n_blk; s0 += 2 * (W)) {                                                        \
            VT a0 = zero, a1 = zero;                                                                         \
            for (int e = 0; e < d; ++e) {                                                                    \
                const float *row = kt + (size_t)e * n_pad + s0;                                              \
                a0 += qh[e] * VLOAD(VT, row);                                                                \
                a1 += qh[e] * VLOAD(VT, row + (W));                                                          \
            }                                                                                                \
            VSTORE(VT, c + s0, a0 * scale);                                                                  \
            VSTORE(VT, c + s0 + (W), a1 * scale);                                                            \
        }                                                                                                    \
        float inv;                                                                                           \
        ATT_SOFTMAX(VT, W, c, inv);                                                                          \
        float *o = out + (size_t)h * dv;                                                                     \
        for (int e = 0; e < dv; ++e) {                                                                       \
            float acc = 0.0f;                                                                                \
            for (int s = 0; s < n_keys; ++s) acc += c[s] * v[(size_t)s * vs + e];                            \
            o[e] = acc * inv;                                                                                \
        }                                                                                                    \
    }
#define ATT_ROW_ARGS                                                                                         \
    const float *q, int n_rep, int d, const float *kt, int n_pad, const float *v, size_t vs, int dv, int n_keys, \
        float scale, float *out, float *scores
static void att_row_generic(ATT_ROW_ARGS) { ATT_ROW_BODY(tq_v4, 4) }
#ifdef TQ_ELEMENTWISE_X86
__attribute__((target("avx2"))) static void att_row_avx2(ATT_ROW_ARGS) { ATT_ROW_BODY(tq_v8, 8) }
__attribute__((target("avx2,avx512f"))) static void att_row_avx512(ATT_ROW_ARGS) { ATT_ROW_BODY(tq_v16, 16) }
#endif

typedef void (*att_row_fn)(ATT_ROW_ARGS);

static att_row_fn att_row(void) {
#ifdef TQ_ELEMENTWISE_X86
    if (K->simd == TQ_SIMD_AVX512) return att_row_avx512;
    if (K->simd == TQ_SIMD_AVX2) return att_row_avx2;
#endif
    return att_row_generic;
}

/* Decode attention (one query row), one KV group: its heads four at a time, so each key and value row
 * is loaded once for four heads (the K-quant-free half of a decode step: n_rep x fewer loads than a
 * head at a time); the scores' horizontal sums once per key and head. Keys not transposed (a decode
 * step reads each once). scores: 4 * n_pad floats, n_pad a multiple of ATT_PAD past n_keys. */
#define ATT_DEC_BODY(VT, W)                                                                                  \
    const int n_blk = (n_keys + 2 * (W) - 1) / (2 * (W)) * (2 * (W));                                       \
    const VT zero = {0};                                                                                     \
    for (int h = 0; h < n_rep; h += 4) {                                                                     \
        const int nh = n_rep - h < 4 ? n_rep - h : 4;                                                        \
        const float *q0 = q + (size_t)h * d; /* heads past n_rep repeat the first (computed, not stored) */  \
        const float *q1 = q0 + (size_t)(nh > 1) * d, *q2 = q0 + (size_t)(nh > 2) * 2 * d;                    \
        const float *q3 = q0 + (size_t)(nh > 3) * 3 * d;                                                     \
        float *c0 = scores, *c1 = c0 + n_pad, *c2 = c1 + n_pad, *c3 = c2 + n_pad;                            \
        for (int s = 0; s < n_keys; ++s) {                                                                   \
            const float *kr = k + (size_t)s * ks;                                                            \
            VT a0 = zero, a1 = zero, a2 = zero, a3 = zero;                                                   \
            int e = 0;                                                                                       \
            for (; e + (W) <= d; e += (W)) {                                                                 \
                const VT kv = VLOAD(VT, kr + e);                                                             \
                a0 += VLOAD(VT, q0 + e) * kv;                                                                \
                a1 += VLOAD(VT, q1 + e) * kv;                                                                \
                a2 += VLOAD(VT, q2 + e) * kv;                                                                \
                a3 += VLOAD(VT, q3 + e) * kv;                                                                \
            }                                                                                                \
            float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;                                                \
            for (int j = 0; j < (W); ++j) {                                                                  \
                t0 += a0[j];                                                                                 \
                t1 += a1[j];                                                                                 \
                t2 += a2[j];                                                                                 \
                t3 += a3[j];                                                                                 \
            }                                                                                                \
            for (; e < d; ++e) { /* a head size that is not a multiple of W */                               \
                t0 += q0[e] * kr[e];                                                                         \
                t1 += q1[e] * kr[e];                                                                         \
                t2 += q2[e] * kr[e];                                                                         \
                t3 += q3[e] * kr[e];                                                                         \
            }                                                                                                \
            c0[s] = t0 * scale;                                                                              \
            c1[s] = t1 * scale;                                                                              \
            c2[s] = t2 * scale;                                                                              \
            c3[s] = t3 * scale;                                                                              \
        }                                                                                                    \
        float i0, i1, i2, i3;                                                                                \
        ATT_SOFTMAX(VT, W, c0, i0);                                                                          \
        ATT_SOFTMAX(VT, W, c1, i1);                                                                          \
        ATT_SOFTMAX(VT, W, c2, i2);                                                                          \
        ATT_SOFTMAX(VT, W, c3, i3);                                                                          \
        float *o0 = out + (size_t)h * dv;                                                                    \
        float *o1 = o0 + (size_t)(nh > 1) * dv, *o2 = o0 + (size_t)(nh > 2) * 2 * dv;                        \
        float *o3 = o0 + (size_t)(nh > 3) * 3 * dv;                                                          \
        ATT_PV4(VT, W);                                                                                      \
    }
#define ATT_DEC_ARGS                                                                                         \
    const float *q, int n_rep, int d, const float *k, size_t ks, const float *v, size_t vs, int dv, int n_keys, \
        int n_pad, float scale, float *out, float *scores
static void att_dec_generic(ATT_DEC_ARGS) { ATT_DEC_BODY(tq_v4, 4) }
#ifdef TQ_ELEMENTWISE_X86
__attribute__((target("avx2"))) static void att_dec_avx2(ATT_DEC_ARGS) { ATT_DEC_BODY(tq_v8, 8) }
__attribute__((target("avx2,avx512f"))) static void att_dec_avx512(ATT_DEC_ARGS) { ATT_DEC_BODY(tq_v16, 16) }
#endif

typedef void (*att_dec_fn)(ATT_DEC_ARGS);

static att_dec_fn att_dec(void) {
#ifdef TQ_ELEMENTWISE_X86
    if (K->simd == TQ_SIMD_AVX512) return att_dec_avx512;
    if (K->simd == TQ_SIMD_AVX2) return att_dec_avx2;
#endif
    return att_dec_generic;
}
#endif /* TQ_PREFILL_ATTENTION */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#ifdef TQ_PREFILL_ATTENTION
typedef struct {
    ac_job *J;
    float *kt; /* n_kv groups of (d, n_pad) */
    int n_pad;
    att_row_fn fn;
} pf_job;

static void unit_transpose_keys(void *arg, int g) {
    pf_job *P = (pf_job *)arg;
    const ac_job *J = P->J;
    const int n = (int)(J->start + J->T);
    const float *k = J->k + (size_t)g * J->kh;
    float *kt = P->kt + (size_t)g * J->d * P->n_pad;
    for (int e = 0; e < J->d; ++e) {
        float *row = kt + (size_t)e * P->n_pad;
        for (int s = 0; s < n; ++s) row[s] = k[(size_t)s * J->kr + e];
        for (int s = n; s < P->n_pad; ++s) row[s] = 0.0f;
    }
}

static void unit_prefill_row(void *arg, int u) {
    pf_job *P = (pf_job *)arg;
    ac_job *J = P->J;
    const int t = J->T - 1 - u / J->n_kv, g = u % J->n_kv; /* the longest rows first: they finish last */
    float stack_scores[4096];
    const size_t n_scores = (size_t)J->n_rep * (size_t)P->n_pad;
    float *scores = n_scores <= 4096 ? stack_scores : (float *)malloc(sizeof(float) * n_scores);
    if (!scores) {
        J->failed = 1;
        return;
    }
    P->fn(J->q + (size_t)t * J->q_row + (size_t)g * J->n_rep * J->d, J->n_rep, J->d,
          P->kt + (size_t)g * J->d * P->n_pad, P->n_pad, J->v + (size_t)g * J->vh, J->vr, J->dv,
          (int)(J->start + t + 1), J->scale, J->out + (size_t)t * J->out_row + (size_t)g * J->n_rep * J->dv, scores);
    if (scores != stack_scores) free(scores);
}

/* T > 1 rows: keys transposed once per call, then (row, group) pairs; J->failed when out of memory */
static void attend_prefill(ac_job *J) {
    pf_job P;
    P.J = J;
    P.n_pad = (int)((J->start + J->T + ATT_PAD - 1) / ATT_PAD * ATT_PAD);
    P.fn = att_row();
    P.kt = (float *)malloc(sizeof(float) * (size_t)J->n_kv * (size_t)J->d * (size_t)P.n_pad);
    if (!P.kt) {
        J->failed = 1;
        return;
    }
    pool_for(unit_transpose_keys, &P, J->n_kv);
    pool_for(unit_prefill_row, &P, J->T * J->n_kv);
    free(P.kt);
}

static void unit_decode_group(void *arg, int g) {
    ac_job *J = (ac_job *)arg;
    const int n_keys = (int)(J->start + 1);
    const int n_pad = (n_keys + ATT_PAD - 1) / ATT_PAD * ATT_PAD;
    float stack_scores[4096];
    float *scores = 4 * (size_t)n_pad <= 4096 ? stack_scores : (float *)malloc(sizeof(float) * 4 * (size_t)n_pad);
    if (!scores) {
        J->failed = 1;
        return;
    }
    att_dec()(J->q + (size_t)g * J->n_rep * J->d, J->n_rep, J->d, J->k + (size_t)g * J->kh, J->kr,
              J->v + (size_t)g * J->vh, J->vr, J->dv, n_keys, n_pad, J->scale,
              J->out + (size_t)g * J->n_rep * J->dv, scores);
    if (scores != stack_scores) free(scores);
}

static void attend_decode_groups(ac_job *J) { pool_for(unit_decode_group, J, J->n_kv); }
#endif

typedef struct {
    const float *g, *u;
    float *out;
    int64_t rows, n;
    size_t g_row, u_row, out_row;
    int n_units;
    row_fn fn;
} sw_job;

static void unit_swiglu(void *arg, int unit) {
    sw_job *J = (sw_job *)arg;
    int64_t r0 = J->rows * unit / J->n_units, r1 = J->rows * (unit + 1) / J->n_units;
    for (int64_t r = r0; r < r1; ++r) J->fn(J->g + r * J->g_row, J->u + r * J->u_row, J->out + r * J->out_row, J->n);
}

PyDoc_STRVAR(swiglu_doc,
             "swiglu(gate, up, out, rows, n, gate_row, up_row, out_row): out = silu(gate) * up, float32 rows of n "
             "(strides in floats); silu(a) = a / (1 + exp(-a)).");

static PyObject *py_swiglu(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "swiglu takes 8 arguments");
        return NULL;
    }
    void *g, *u, *o;
    Py_ssize_t rows, n, gr, ur, orow;
    if (get_ptr(args[0], &g) || get_ptr(args[1], &u) || get_ptr(args[2], &o) || get_ssize(args[3], &rows) ||
        get_ssize(args[4], &n) || get_ssize(args[5], &gr) || get_ssize(args[6], &ur) || get_ssize(args[7], &orow))
        return NULL;
    if (!g || !u || !o || rows < 0 || rows > INT32_MAX || n <= 0 || gr < 0 || ur < 0 || orow < n) {
        PyErr_SetString(PyExc_ValueError, "swiglu: inconsistent sizes or null pointers");
        return NULL;
    }
    sw_job J = {(const float *)g, (const float *)u, (float *)o, rows, n, (size_t)gr, (size_t)ur, (size_t)orow,
                pool_units(rows, n), swiglu_row()};
    if (rows == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    pool_for(unit_swiglu, &J, J.n_units);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    int type;
    const uint8_t *w;
    size_t w_stride;
    const int64_t *ids;
    int64_t k;
    float *out;
    int n_ids, n_units;
} gather_job;

static void unit_gather(void *arg, int u) {
    gather_job *J = (gather_job *)arg;
    const int i0 = (int)((int64_t)J->n_ids * u / J->n_units), i1 = (int)((int64_t)J->n_ids * (u + 1) / J->n_units);
    for (int i = i0; i < i1; ++i)
        K->dequant[J->type](J->w + (size_t)J->ids[i] * J->w_stride, J->w_stride, 1, J->k, J->out + (size_t)i * J->k);
}

PyDoc_STRVAR(dequantize_rows_doc,
             "dequantize_rows(ggml_type, w_ptr, w_row_bytes, w_rows, k, ids_ptr, n_ids, out_ptr): out[i] = float32 "
             "row ids[i] (int64) of the weight (embedding lookup); an id outside [0, w_rows) is an IndexError.");

static PyObject *py_dequantize_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "dequantize_rows takes 8 arguments");
        return NULL;
    }
    Py_ssize_t type, w_stride, w_rows, k, n_ids;
    void *w, *ids, *out;
    if (get_ssize(args[0], &type) || get_ptr(args[1], &w) || get_ssize(args[2], &w_stride) ||
        get_ssize(args[3], &w_rows) || get_ssize(args[4], &k) || get_ptr(args[5], &ids) ||
        get_ssize(args[6], &n_ids) || get_ptr(args[7], &out))
        return NULL;
    if (check_type((int)type, k) || check_dequant((int)type)) return NULL;
    if (!w || !ids || !out || n_ids < 0 || n_ids > INT32_MAX || w_rows < 0 ||
        w_stride < (Py_ssize_t)(k / tq_block_elems((int)type) * tq_block_bytes((int)type))) {
        PyErr_SetString(PyExc_ValueError, "dequantize_rows: inconsistent sizes or null pointers");
        return NULL;
    }
    const int64_t *id = (const int64_t *)ids;
    for (Py_ssize_t i = 0; i < n_ids; ++i) {
        if (id[i] < 0 || id[i] >= w_rows) {
            PyErr_Format(PyExc_IndexError, "row id %lld is outside [0, %lld)", (long long)id[i], (long long)w_rows);
            return NULL;
        }
    }
    gather_job J = {(int)type, (const uint8_t *)w, (size_t)w_stride, id, k, (float *)out, (int)n_ids,
                    pool_units(n_ids, k)};
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    pool_for(unit_gather, &J, J.n_units);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* argmax in two passes: the maximum and a NaN flag (vector max / unordered compares), then the first
 * index holding it, as torch.argmax */
static int64_t argmax_generic(const float *x, int64_t n, int *has_nan) {
    float best = -INFINITY;
    int nan = 0;
    for (int64_t i = 0; i < n; ++i) {
        nan |= x[i] != x[i];
        best = x[i] > best ? x[i] : best;
    }
    *has_nan = nan;
    for (int64_t i = 0; i < n; ++i)
        if (x[i] == best) return i;
    return 0; /* all NaN */
}
#ifdef TQ_ELEMENTWISE_X86
__attribute__((target("avx2,avx512f"))) static int64_t argmax_avx512(const float *x, int64_t n, int *has_nan) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    __mmask16 bad = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(v, m); /* a NaN in v leaves m (flagged above) */
    }
    float best = _mm512_reduce_max_ps(m);
    int nan = bad != 0;
    for (int64_t j = i; j < n; ++j) {
        nan |= x[j] != x[j];
        best = x[j] > best ? x[j] : best;
    }
    *has_nan = nan;
    const __m512 b = _mm512_set1_ps(best);
    for (i = 0; i + 16 <= n; i += 16) {
        const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), b, _CMP_EQ_OQ);
        if (eq) return i + __builtin_ctz((unsigned)eq);
    }
    for (; i < n; ++i)
        if (x[i] == best) return i;
    return 0;
}
__attribute__((target("avx2"))) static int64_t argmax_avx2(const float *x, int64_t n, int *has_nan) {
    __m256 m = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(v, m);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float best = -INFINITY;
    for (int l = 0; l < 8; ++l) best = lanes[l] > best ? lanes[l] : best;
    int nan = _mm256_movemask_ps(bad) != 0;
    for (int64_t j = i; j < n; ++j) {
        nan |= x[j] != x[j];
        best = x[j] > best ? x[j] : best;
    }
    *has_nan = nan;
    const __m256 b = _mm256_set1_ps(best);
    for (i = 0; i + 8 <= n; i += 8) {
        const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
        if (eq) return i + __builtin_ctz((unsigned)eq);
    }
    for (; i < n; ++i)
        if (x[i] == best) return i;
    return 0;
}
#endif

PyDoc_STRVAR(argmax_doc, "argmax(x_ptr, n) -> (index, has_nan): the first index of the largest of n float32 values, "
                         "and whether any is NaN (then the index means nothing).");

static PyObject *py_argmax(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "argmax takes 2 arguments");
        return NULL;
    }
    void *x;
    Py_ssize_t n;
    if (get_ptr(args[0], &x) || get_ssize(args[1], &n)) return NULL;
    if (!x || n <= 0) {
        PyErr_SetString(PyExc_ValueError, "argmax: empty input or null pointer");
        return NULL;
    }
    int64_t idx;
    int nan = 0;
#ifdef TQ_ELEMENTWISE_X86
    if (K->simd == TQ_SIMD_AVX512) idx = argmax_avx512((const float *)x, n, &nan);
    else if (K->simd == TQ_SIMD_AVX2) idx = argmax_avx2((const float *)x, n, &nan);
    else
#endif
        idx = argmax_generic((const float *)x, n, &nan);
    return Py_BuildValue("(LO)", (long long)idx, nan ? Py_True : Py_False);
}

/* n_w weights from 6 arguments each (ggml_type, w_ptr, w_row_bytes, n_out, y_ptr, y_row_floats), all against
 * the float32 rows x (k each): their matmul jobs. -1 with an exception set when one does not fit. */
static int parse_weights(PyObject *const *a, int n_w, int64_t k, const void *x, size_t x_stride, int n_x,
                         mm_job *jobs, int y_optional) {
    for (int i = 0; i < n_w; ++i, a += 6) {
        Py_ssize_t type, w_stride, n_out, ldy = 0;
        void *w, *y = NULL;
        const int temp = y_optional && a[4] == Py_None;
        if (get_ssize(a[0], &type) || get_ptr(a[1], &w) || get_ssize(a[2], &w_stride) || get_ssize(a[3], &n_out) ||
            (!temp && (get_ptr(a[4], &y) || get_ssize(a[5], &ldy))))
            return -1;
        if (check_type((int)type, k)) return -1;
        if (n_out <= 0 || n_out > INT32_MAX || !w || (!y && !y_optional) || (y && ldy < n_out) ||
            w_stride < (Py_ssize_t)(k / tq_block_elems((int)type) * tq_block_bytes((int)type))) {
            PyErr_SetString(PyExc_ValueError, "matmuls: inconsistent sizes or null pointers");
            return -1;
        }
        mm_job *J = &jobs[i];
        memset(J, 0, sizeof(*J));
        J->type = (int)type;
        J->w = (const uint8_t *)w;
        J->w_stride = (size_t)w_stride;
        J->n_out = (int)n_out;
        J->k = k;
        J->x = (const uint8_t *)x;
        J->x_stride = x_stride;
        J->n_x = n_x;
        J->y = (float *)y; /* NULL (y_optional): a temporary, placed by the caller */
        J->ldy = y ? (size_t)ldy : (size_t)n_out;
    }
    return 0;
}

/* Temporaries of the fused calls (normalised rows, gate and up outputs), never seen by Python: kept
 * between calls up to TEMP_KEEP bytes (a decode step's: the same cache lines every token), larger
 * ones (prefill) freed after the call. Used under the call lock. */
#define TEMP_KEEP ((size_t)4 << 20)
static float *temp_buf = NULL;
static size_t temp_size = 0;

static float *get_temp(size_t n_floats) {
    const size_t n = n_floats * sizeof(float);
    if (n <= temp_size) return temp_buf;
    free(temp_buf);
    temp_buf = (float *)malloc(n);
    temp_size = temp_buf ? n : 0;
    return temp_buf;
}

static void release_temp(void) {
    if (temp_size > TEMP_KEEP) {
        free(temp_buf);
        temp_buf = NULL;
        temp_size = 0;
    }
}

#define MAX_WEIGHTS 8

PyDoc_STRVAR(matmuls_doc,
             "matmuls(x_ptr, x_row_bytes, n_x, k, (ggml_type, w_ptr, w_row_bytes, n_out, y_ptr, y_row_floats), ...)\n"
             "matmul of one float32 input with each weight in turn (e.g. a layer's q, k and v, at most 8), one call "
             "and one hand-off of the GIL for all of them.");

static PyObject *py_matmuls(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 10 || (nargs - 4) % 6 || (nargs - 4) / 6 > MAX_WEIGHTS) {
        PyErr_SetString(PyExc_TypeError, "matmuls takes 4 arguments then 6 for each of 1..8 weights");
        return NULL;
    }
    void *x;
    Py_ssize_t x_stride, n_x, k;
    if (get_ptr(args[0], &x) || get_ssize(args[1], &x_stride) || get_ssize(args[2], &n_x) || get_ssize(args[3], &k))
        return NULL;
    if (!x || n_x < 0 || n_x > INT32_MAX || x_stride < k * 4) {
        PyErr_SetString(PyExc_ValueError, "matmuls: inconsistent sizes or null pointers");
        return NULL;
    }
    const int n_w = (int)((nargs - 4) / 6);
    mm_job jobs[MAX_WEIGHTS];
    if (parse_weights(args + 4, n_w, k, x, (size_t)x_stride, (int)n_x, jobs, 0)) return NULL;
    if (n_x == 0) Py_RETURN_NONE;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    for (int i = 0; i < n_w && !rc; ++i) rc = run_matmul(&jobs[i]);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(norm_matmuls_doc,
             "norm_matmuls(x_ptr, n_x, k, norm_w_ptr, eps, (ggml_type, w_ptr, w_row_bytes, n_out, y_ptr, "
             "y_row_floats), ...)\n"
             "matmuls(rms_norm(x), ...) (the norm as rms_norm, into a temporary; x contiguous float32 rows of k): "
             "a layer's normalisation and its q, k, v (or gate and up) in one call.");

/* rms_norm of x into a temporary of n_x * k floats followed by `extra` more, then jobs (whose x is
 * the temporary; a NULL y is placed in the extra floats); the caller holds the call lock. -1: no memory */
static int run_norm_matmuls(const float *x, const float *nw, float eps, int n_x, int64_t k, mm_job *jobs, int n_w,
                            size_t extra) {
    float *h = get_temp((size_t)n_x * (size_t)k + extra);
    if (!h) return -1;
    rms_norm_pool(x, nw, h, n_x, k, eps);
    float *y = h + (size_t)n_x * (size_t)k;
    int rc = 0;
    for (int i = 0; i < n_w && !rc; ++i) {
        jobs[i].x = (const uint8_t *)h;
        if (!jobs[i].y) {
            jobs[i].y = y;
            y += (size_t)n_x * jobs[i].ldy;
        }
        rc = run_matmul(&jobs[i]);
    }
    return rc;
}

static PyObject *py_norm_matmuls(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 11 || (nargs - 5) % 6 || (nargs - 5) / 6 > MAX_WEIGHTS) {
        PyErr_SetString(PyExc_TypeError, "norm_matmuls takes 5 arguments then 6 for each of 1..8 weights");
        return NULL;
    }
    void *x, *nw;
    Py_ssize_t n_x, k;
    if (get_ptr(args[0], &x) || get_ssize(args[1], &n_x) || get_ssize(args[2], &k) || get_ptr(args[3], &nw))
        return NULL;
    double eps = PyFloat_AsDouble(args[4]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    if (!x || !nw || n_x < 0 || n_x > INT32_MAX || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "norm_matmuls: inconsistent sizes or null pointers");
        return NULL;
    }
    const int n_w = (int)((nargs - 5) / 6);
    mm_job jobs[MAX_WEIGHTS];
    if (parse_weights(args + 5, n_w, k, x, (size_t)k * 4, (int)n_x, jobs, 0)) return NULL;
    if (n_x == 0) Py_RETURN_NONE;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    rc = run_norm_matmuls((const float *)x, (const float *)nw, (float)eps, (int)n_x, k, jobs, n_w, 0);
    release_temp();
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(norm_swiglu_doc,
             "norm_swiglu(x_ptr, n_x, k, norm_w_ptr, eps, out_ptr, <gate: 4 as in matmuls, without y>, <up: 4>)\n"
             "out = swiglu(gate, up) of norm_matmuls(x, ...) with the two weights (gate and up outputs are "
             "temporaries; out: n_x rows of n_out): an MLP's norm, gate and up projections and activation, one call.");

static PyObject *py_norm_swiglu(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "norm_swiglu takes 14 arguments");
        return NULL;
    }
    void *x, *nw, *out;
    Py_ssize_t n_x, k;
    if (get_ptr(args[0], &x) || get_ssize(args[1], &n_x) || get_ssize(args[2], &k) || get_ptr(args[3], &nw))
        return NULL;
    double eps = PyFloat_AsDouble(args[4]);
    if ((eps == -1.0 && PyErr_Occurred()) || get_ptr(args[5], &out)) return NULL;
    if (!x || !nw || !out || n_x < 0 || n_x > INT32_MAX || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "norm_swiglu: inconsistent sizes or null pointers");
        return NULL;
    }
    /* each weight: 4 arguments and a NULL output (a temporary) */
    PyObject *w6[12] = {args[6], args[7], args[8], args[9], Py_None, Py_None,
                        args[10], args[11], args[12], args[13], Py_None, Py_None};
    mm_job jobs[2];
    if (parse_weights(w6, 2, k, x, (size_t)k * 4, (int)n_x, jobs, 1)) return NULL;
    if (jobs[0].n_out != jobs[1].n_out) {
        PyErr_SetString(PyExc_ValueError, "norm_swiglu: gate and up differ in size");
        return NULL;
    }
    if (n_x == 0) Py_RETURN_NONE;
    const int n = jobs[0].n_out;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    rc = run_norm_matmuls((const float *)x, (const float *)nw, (float)eps, (int)n_x, k, jobs, 2,
                          2 * (size_t)n_x * (size_t)n);
    if (!rc) {
        sw_job S = {jobs[0].y, jobs[1].y, (float *)out, n_x, n, (size_t)n, (size_t)n, (size_t)n, pool_units(n_x, n),
                    swiglu_row()};
        pool_for(unit_swiglu, &S, S.n_units);
    }
    release_temp();
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(matmul_add_doc,
             "matmul_add(x_ptr, x_row_bytes, n_x, k, r_ptr, r_row_floats, ggml_type, w_ptr, w_row_bytes, n_out, "
             "y_ptr, y_row_floats)\n"
             "y = W x + r (the residual added to the matmul output in the same call), float32.");

static PyObject *py_matmul_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "matmul_add takes 12 arguments");
        return NULL;
    }
    void *x, *r;
    Py_ssize_t x_stride, n_x, k, ldr;
    if (get_ptr(args[0], &x) || get_ssize(args[1], &x_stride) || get_ssize(args[2], &n_x) || get_ssize(args[3], &k) ||
        get_ptr(args[4], &r) || get_ssize(args[5], &ldr))
        return NULL;
    mm_job J;
    if (!x || !r || n_x < 0 || n_x > INT32_MAX || x_stride < k * 4) {
        PyErr_SetString(PyExc_ValueError, "matmul_add: inconsistent sizes or null pointers");
        return NULL;
    }
    if (parse_weights(args + 6, 1, k, x, (size_t)x_stride, (int)n_x, &J, 0)) return NULL;
    if (ldr < J.n_out) {
        PyErr_SetString(PyExc_ValueError, "matmul_add: residual rows shorter than the output");
        return NULL;
    }
    if (n_x == 0) Py_RETURN_NONE;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    rc = run_matmul(&J);
    if (!rc)
        for (int j = 0; j < J.n_x; ++j) {
            float *y = J.y + (size_t)j * J.ldy;
            const float *rr = (const float *)r + (size_t)j * (size_t)ldr;
            for (int o = 0; o < J.n_out; ++o) y[o] += rr[o]; /* the same float sum as torch's r + y */
        }
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------ a decode step's layers
 * One token through a run of layers in one call: per layer the same kernels, in the same order,
 * as norm_matmuls (q, k, v), rope_kv_attend, matmul_add (W_o), norm_swiglu and matmul_add (W_down)
 * (so bit for bit the same hidden row), without a Python round trip between them. The layers'
 * pointers and sizes come from a table of int64 rows that Python builds once per (weights, KV
 * cache) and checks then (cpu_native.DecodeLayers); DL_FIELDS int64 per layer: */
enum {
    DL_ATTN_NORM, DL_FFN_NORM,
    DL_W, /* 7 weights (q, k, v, o, gate, up, down) of 4: ggml type, pointer, row bytes, rows */
    DL_KC = DL_W + 28, DL_VC, DL_KH, DL_KR, DL_VH, DL_VR, /* caches: pointers, head and row strides (floats) */
    DL_FIELDS
};
enum { DL_Q, DL_K, DL_V, DL_O, DL_GATE, DL_UP, DL_DOWN };

static float *dl_buf = NULL; /* the step's rows (kept: the same few KiB every token) */
static size_t dl_size = 0;

static void dl_job(mm_job *J, const int64_t *row, int w, const float *x, int64_t k, float *y) {
    const int64_t *p = row + DL_W + 4 * w;
    memset(J, 0, sizeof(*J));
    J->type = (int)p[0];
    J->w = (const uint8_t *)(uintptr_t)p[1];
    J->w_stride = (size_t)p[2];
    J->n_out = (int)p[3];
    J->k = k;
    J->x = (const uint8_t *)x;
    J->x_stride = (size_t)k * 4;
    J->n_x = 1;
    J->y = y;
    J->ldy = (size_t)p[3];
}

/* x (hidden floats) in place through n_layers; -1: no memory. The caller holds the call lock. */
static int run_decode_layers(const int64_t *table, int n_layers, float *x, Py_ssize_t pos, const float *tab[4],
                             int hidden, int hq, int hkv, int d, int dv, int ffn, float eps, float scale) {
    const size_t need = (size_t)hq * d + (size_t)hkv * (d + dv) + (size_t)hq * dv + 3 * (size_t)ffn + (size_t)hidden;
    if (need * sizeof(float) > dl_size) {
        free(dl_buf);
        dl_buf = (float *)malloc(need * sizeof(float));
        dl_size = dl_buf ? need * sizeof(float) : 0;
        if (!dl_buf) return -1;
    }
    float *q = dl_buf, *k = q + (size_t)hq * d, *v = k + (size_t)hkv * d, *o = v + (size_t)hkv * dv;
    float *gate = o + (size_t)hq * dv, *up = gate + ffn, *act = up + ffn, *y = act + ffn;
    for (int l = 0; l < n_layers; ++l) {
        const int64_t *row = table + (size_t)l * DL_FIELDS;
        mm_job J[3];
        for (int w = 0; w < 3; ++w) dl_job(&J[w], row, DL_Q + w, x, hidden, w == 0 ? q : w == 1 ? k : v);
        if (run_norm_matmuls(x, (const float *)(uintptr_t)row[DL_ATTN_NORM], eps, 1, hidden, J, 3, 0)) return -1;
        rkv_job R = {q, k, v, tab[0], tab[1], tab[2], tab[3], (float *)(uintptr_t)row[DL_KC],
                     (float *)(uintptr_t)row[DL_VC], 1, hq, hkv, d, dv, 1, (size_t)hq * d, (size_t)hkv * d,
                     (size_t)hkv * dv, (size_t)row[DL_KH], (size_t)row[DL_KR], (size_t)row[DL_VH], (size_t)row[DL_VR], pos};
        pool_for(unit_rope_kv, &R, 1);
        ac_job A = {q, R.kc, R.vc, o, 1, hkv, hq / hkv, d, dv, (size_t)hq * d, (size_t)hq * dv,
                    R.kh, R.kr, R.vh, R.vr, pos, scale, 0};
        run_attend(&A);
        if (A.failed) return -1;
        dl_job(&J[0], row, DL_O, o, (int64_t)hq * dv, y);
        if (run_matmul(&J[0])) return -1;
        for (int e = 0; e < hidden; ++e) x[e] = y[e] + x[e]; /* matmul_add's sum */
        dl_job(&J[0], row, DL_GATE, x, hidden, gate);
        dl_job(&J[1], row, DL_UP, x, hidden, up);
        if (run_norm_matmuls(x, (const float *)(uintptr_t)row[DL_FFN_NORM], eps, 1, hidden, J, 2, 0)) return -1;
        sw_job S = {gate, up, act, 1, ffn, (size_t)ffn, (size_t)ffn, (size_t)ffn, 1, swiglu_row()};
        pool_for(unit_swiglu, &S, 1);
        dl_job(&J[0], row, DL_DOWN, act, ffn, y);
        if (run_matmul(&J[0])) return -1;
        for (int e = 0; e < hidden; ++e) x[e] = y[e] + x[e];
    }
    return 0;
}

PyDoc_STRVAR(decode_layers_doc,
             "decode_layers(table_ptr, n_layers, x_ptr, pos, cos_q, sin_q, cos_k, sin_k, hidden, n_heads, n_kv_heads, "
             "d, dv, ffn, eps, scale)\n"
             "One token's hidden row (float32, in place) through n_layers pre-norm layers whose pointers are the "
             "int64 table's rows (cpu_native.DecodeLayers builds and checks it; the kernel trusts it). Tables: the "
             "RoPE rows of position pos (d floats each).");

static PyObject *py_decode_layers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "decode_layers takes 16 arguments");
        return NULL;
    }
    void *p[7];
    Py_ssize_t n_layers, pos, s[6];
    if (get_ptr(args[0], &p[0]) || get_ssize(args[1], &n_layers) || get_ptr(args[2], &p[1]) || get_ssize(args[3], &pos))
        return NULL;
    for (int i = 0; i < 4; ++i)
        if (get_ptr(args[4 + i], &p[2 + i])) return NULL;
    for (int i = 0; i < 6; ++i)
        if (get_ssize(args[8 + i], &s[i])) return NULL;
    const double eps = PyFloat_AsDouble(args[14]), scale = PyFloat_AsDouble(args[15]);
    if (PyErr_Occurred()) return NULL;
    int ok = p[0] && p[1] && p[2] && p[3] && p[4] && p[5] && n_layers >= 0 && n_layers <= INT32_MAX && pos >= 0;
    for (int i = 0; i < 6; ++i) ok = ok && s[i] > 0 && s[i] <= INT32_MAX;
    if (!ok || s[1] % s[2] || s[3] % 2) {
        PyErr_SetString(PyExc_ValueError, "decode_layers: inconsistent sizes or null pointers");
        return NULL;
    }
    const float *tab[4] = {(const float *)p[2], (const float *)p[3], (const float *)p[4], (const float *)p[5]};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    rc = run_decode_layers((const int64_t *)p[0], (int)n_layers, (float *)p[1], pos, tab, (int)s[0], (int)s[1],
                           (int)s[2], (int)s[3], (int)s[4], (int)s[5], (float)eps, (float)scale);
    release_temp();
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_decode_layer_fields(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLong(DL_FIELDS);
}

static PyObject *py_set_threads(PyObject *self, PyObject *arg) {
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > 1024) {
        PyErr_Format(PyExc_ValueError, "threads must be in 1..1024, got %ld", n);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    rc = pool_start((int)n);
#ifdef TQ_THREADS
    n_threads = P.n;
#else
    n_threads = 1;
#endif
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (rc) {
        PyErr_Format(PyExc_OSError, "could only start %d of %ld threads", n_threads, n);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_threads(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLong(n_threads);
}

static PyObject *py_set_spin(PyObject *self, PyObject *arg) {
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    spin_iters = n < 0 ? 0 : (int)(n > (1L << 30) ? (1L << 30) : n);
    Py_RETURN_NONE;
}

static PyObject *py_variant(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(K->name);
}

/* the names of the variants this CPU runs (those with repacked Q4_K and Q6_K kernels only, or all) */
static PyObject *variant_names(int repacking_only) {
    PyObject *l = PyList_New(0);
    if (!l) return NULL;
    for (int i = 0; all_variants[i]; ++i) {
        if (!variant_supported(all_variants[i]) || (repacking_only && !all_variants[i]->repack[TQ_Q4_K_R])) continue;
        PyObject *s = PyUnicode_FromString(all_variants[i]->name);
        if (!s || PyList_Append(l, s)) {
            Py_XDECREF(s);
            Py_DECREF(l);
            return NULL;
        }
        Py_DECREF(s);
    }
    return l;
}

static PyObject *py_variants(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return variant_names(0);
}

static PyObject *py_repacking_variants(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return variant_names(1);
}

/* {variant: its compile-target feature list or None} for every variant built in (run or not) */
static PyObject *py_variant_targets(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *d = PyDict_New();
    for (int i = 0; d && all_variants[i]; ++i) {
        PyObject *t = all_variants[i]->target ? PyUnicode_FromString(all_variants[i]->target) : Py_NewRef(Py_None);
        if (!t || PyDict_SetItemString(d, all_variants[i]->name, t) < 0) Py_CLEAR(d);
        Py_XDECREF(t);
    }
    return d;
}

/* the probe's answer for one feature name (x86: cpuid + the OS's saved state; elsewhere False) */
static PyObject *py_cpu_has(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t len;
    const char *name = PyUnicode_AsUTF8AndSize(arg, &len);
    if (!name) return NULL;
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
    return PyBool_FromLong(tq_x86_has(name, (size_t)len));
#else
    return PyBool_FromLong(0);
#endif
}

static int select_variant(const char *name) {
    for (int i = 0; all_variants[i]; ++i) {
        if (strcmp(all_variants[i]->name, name) == 0 && variant_supported(all_variants[i])) {
            K = all_variants[i];
            return 0;
        }
    }
    return -1;
}

static PyObject *py_use_variant(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    rc = select_variant(name);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (rc) {
        PyErr_Format(PyExc_ValueError, "kernel variant %R is not built in or this CPU lacks its instructions", arg);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------ repacking
 * Q4_K -> TQ_Q4_K_R, Q6_K -> TQ_Q6_K_R (the variant's repack[]: the order its tiles read, see
 * arch/x86/repack.inc), rows on the pool; done once per weight. */
typedef struct {
    tq_repack_fn fn;
    const uint8_t *src;
    size_t src_stride;
    uint8_t *dst;
    size_t dst_stride;
    int n_rows, nb;
} repack_job;

#define REPACK_ROWS 64
static void unit_repack(void *arg, int u) {
    repack_job *J = (repack_job *)arg;
    const int r1 = (u + 1) * REPACK_ROWS < J->n_rows ? (u + 1) * REPACK_ROWS : J->n_rows;
    const int r0 = u * REPACK_ROWS;
    J->fn(J->src + (size_t)r0 * J->src_stride, J->src_stride, r1 - r0, J->nb, J->dst + (size_t)r0 * J->dst_stride,
          J->dst_stride);
}

PyDoc_STRVAR(repack_doc, "repack(repacked_type, src_ptr, src_stride, n_rows, k, dst_ptr, dst_stride)\n"
                         "Q4_K rows -> TQ_Q4_K_R (31), Q6_K rows -> TQ_Q6_K_R (32): the internal orders of the "
                         "VNNI kernels (same bytes a row).");
static PyObject *py_repack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "repack takes 7 arguments");
        return NULL;
    }
    void *src, *dst;
    Py_ssize_t type, src_stride, n_rows, k, dst_stride;
    if (get_ssize(args[0], &type) || get_ptr(args[1], &src) || get_ssize(args[2], &src_stride) ||
        get_ssize(args[3], &n_rows) || get_ssize(args[4], &k) || get_ptr(args[5], &dst) || get_ssize(args[6], &dst_stride))
        return NULL;
    if (type != TQ_Q4_K_R && type != TQ_Q6_K_R) {
        PyErr_Format(PyExc_ValueError, "repack: type %zd is not a repacked type (31: Q4_K, 32: Q6_K)", type);
        return NULL;
    }
    const Py_ssize_t row_bytes = k / 256 * tq_block_bytes((int)type);
    if (n_rows < 0 || k <= 0 || k % 256 || src_stride < row_bytes || dst_stride < row_bytes || !src || !dst) {
        PyErr_SetString(PyExc_ValueError, "repack: bad shape, stride or pointer");
        return NULL;
    }
    if (!K->repack[type]) {
        PyErr_Format(PyExc_ValueError, "the %s kernels do not run repacked %s", K->name,
                     type == TQ_Q4_K_R ? "Q4_K" : "Q6_K");
        return NULL;
    }
    repack_job J = {K->repack[type], (const uint8_t *)src, (size_t)src_stride, (uint8_t *)dst, (size_t)dst_stride,
                    (int)n_rows, (int)(k / 256)};
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    {
        /* decode streams these rows once a token: 2 MiB pages spare the TLB a miss every 4 KiB
         * (before the first write, so the pages are allocated huge; a hint, failures ignored) */
        const uintptr_t huge = (uintptr_t)2 << 20, a = ((uintptr_t)dst + huge - 1) / huge * huge;
        const uintptr_t b = ((uintptr_t)dst + (uintptr_t)dst_stride * (uintptr_t)n_rows) / huge * huge;
        if (b > a) (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
    }
#endif
    Py_BEGIN_ALLOW_THREADS LOCK_CALLS();
    pool_for(unit_repack, &J, (int)((n_rows + REPACK_ROWS - 1) / REPACK_ROWS));
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

PyDoc_STRVAR(drop_pages_doc,
             "drop_pages(ptr, nbytes) -> bool\n"
             "Gives back the resident pages wholly inside [ptr, ptr + nbytes) of a read-only FILE mapping "
             "(madvise MADV_DONTNEED: a later read faults them in from the file again). Never call it on "
             "anonymous memory: its contents would be lost. False where the OS has no such call.");
static PyObject *py_drop_pages(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p;
    Py_ssize_t n;
    if (nargs != 2 || get_ptr(args[0], &p) || get_ssize(args[1], &n)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "drop_pages takes 2 arguments");
        return NULL;
    }
#if defined(__linux__) || defined(__APPLE__)
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + (uintptr_t)n) / page * page;
    if (n > 0 && b > a && madvise((void *)a, b - a, MADV_DONTNEED) == 0) Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_FASTCALL, matmul_doc},
    {"repack", (PyCFunction)(void (*)(void))py_repack, METH_FASTCALL, repack_doc},
    {"decode_layers", (PyCFunction)(void (*)(void))py_decode_layers, METH_FASTCALL, decode_layers_doc},
    {"decode_layer_fields", py_decode_layer_fields, METH_NOARGS, "decode_layer_fields(): int64 per decode_layers table row."},
    {"drop_pages", (PyCFunction)(void (*)(void))py_drop_pages, METH_FASTCALL, drop_pages_doc},
    {"dequantize", (PyCFunction)(void (*)(void))py_dequantize, METH_FASTCALL, dequantize_doc},
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_FASTCALL, rms_norm_doc},
    {"rope_pairs", (PyCFunction)(void (*)(void))py_rope_pairs, METH_FASTCALL, rope_doc},
    {"rope_kv", (PyCFunction)(void (*)(void))py_rope_kv, METH_FASTCALL, rope_kv_doc},
    {"attend_causal", (PyCFunction)(void (*)(void))py_attend_causal, METH_FASTCALL, attend_causal_doc},
    {"rope_kv_attend", (PyCFunction)(void (*)(void))py_rope_kv_attend, METH_FASTCALL, rope_kv_attend_doc},
    {"swiglu", (PyCFunction)(void (*)(void))py_swiglu, METH_FASTCALL, swiglu_doc},
    {"dequantize_rows", (PyCFunction)(void (*)(void))py_dequantize_rows, METH_FASTCALL, dequantize_rows_doc},
    {"argmax", (PyCFunction)(void (*)(void))py_argmax, METH_FASTCALL, argmax_doc},
    {"matmuls", (PyCFunction)(void (*)(void))py_matmuls, METH_FASTCALL, matmuls_doc},
    {"norm_matmuls", (PyCFunction)(void (*)(void))py_norm_matmuls, METH_FASTCALL, norm_matmuls_doc},
    {"matmul_add", (PyCFunction)(void (*)(void))py_matmul_add, METH_FASTCALL, matmul_add_doc},
    {"norm_swiglu", (PyCFunction)(void (*)(void))py_norm_swiglu, METH_FASTCALL, norm_swiglu_doc},
    {"set_threads", py_set_threads, METH_O, "set_threads(n): worker threads (the caller included)."},
    {"threads", py_threads, METH_NOARGS, "threads(): the current thread count."},
    {"set_spin", py_set_spin, METH_O, "set_spin(iterations): how long idle workers poll before sleeping."},
    {"variant", py_variant, METH_NOARGS, "variant(): the kernel variant in use."},
    {"variants", py_variants, METH_NOARGS, "variants(): the variants this CPU can run, best first."},
    {"repacking_variants", py_repacking_variants, METH_NOARGS,
     "repacking_variants(): those of variants() that run repacked Q4_K and Q6_K (repack)."},
    {"use_variant", py_use_variant, METH_O, "use_variant(name): switch variant (tests, benchmarks)."},
    {"variant_targets", py_variant_targets, METH_NOARGS,
     "variant_targets(): {variant: the features it is compiled for (x86), or None}, every variant built in."},
    {"cpu_has", py_cpu_has, METH_O, "cpu_has(feature): the x86 probe's answer (cpuid + xgetbv) for one target feature."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_cpu", "Native CPU kernels on GGUF blocks.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cpu(void) {
    const char *forced = getenv("TRAMONTANE_CPU_VARIANT");
    if (!(forced && *forced && select_variant(forced) == 0)) {
        for (int i = 0; all_variants[i]; ++i) {
            if (variant_supported(all_variants[i])) {
                K = all_variants[i];
                break;
            }
        }
    }
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    PyModule_AddIntConstant(m, "Q8K_BLOCK_BYTES", (long)sizeof(tq_q8k));
    PyModule_AddIntConstant(m, "Q8B_BLOCK_BYTES", (long)sizeof(tq_q8b));
    return m;
}
