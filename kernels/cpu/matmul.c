/* Quantized matmuls on the pool: activations quantized once per call into the variant's
 * format, weight rows handed out in units; dequantization; the fused calls' temporaries. */
#include <stdlib.h>
#include <string.h>
#ifdef _WIN32
#include <malloc.h>
#endif

#include "runtime.h"

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
int run_matmul(mm_job *J) {
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
        /* decode on a type with a narrow tile (every repacked type has one: its rows fit no other
         * tile; the AVX2 builds' Q4_K, Q5_K, Q6_K and Q8_0 read long rows several at a time), and
         * on the repacked types also a few rows (a batch's decode rows, drafted tokens checked at
         * once: the weights read once per 8 rows, each row as it is alone); prefill on the wide tiles */
        const int narrow_max = K->narrow_many[J->type] ? TQ_NARROW_MAX_ROWS : TQ_WIDE_MIN_ROWS - 1;
        if (J->n_x <= narrow_max && K->gemm_narrow[J->type]) {
            J->quant = K->quant_narrow[J->type];
            J->gemm = K->gemm_narrow[J->type];
        } else if (J->n_x > narrow_max && J->k % TQ_QK == 0 && K->gemm_wide[J->type]) {
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
    rpu &= ~7; /* whole decode tiles of 8 weight rows (long rows: tiles.inc's narrow_rows, decode_rows) */
    while (rpu > 4 && (J->n_out + rpu - 1) / rpu < 4 * n_threads) rpu /= 2;
    J->rows_per_unit = rpu;
    pool_for(unit_gemm, J, (J->n_out + rpu - 1) / rpu);
    return 0;
}

void unit_dequant(void *arg, int u) {
    dq_job *J = (dq_job *)arg;
    int r0 = u * DQ_ROWS, r1 = r0 + DQ_ROWS < J->n_rows ? r0 + DQ_ROWS : J->n_rows;
    K->dequant[J->type](J->w + (size_t)r0 * J->w_stride, J->w_stride, r1 - r0, J->k, J->out + (size_t)r0 * J->k);
}

/* Temporaries of the fused calls (normalised rows, gate and up outputs), never seen by Python: kept
 * between calls up to TEMP_KEEP bytes (a decode step's: the same cache lines every token), larger
 * ones (prefill) freed after the call. Used under the call lock. */
#define TEMP_KEEP ((size_t)4 << 20)
static float *temp_buf = NULL;
static size_t temp_size = 0;

float *get_temp(size_t n_floats) {
    const size_t n = n_floats * sizeof(float);
    if (n <= temp_size) return temp_buf;
    free(temp_buf);
    temp_buf = (float *)malloc(n);
    temp_size = temp_buf ? n : 0;
    return temp_buf;
}

void release_temp(void) {
    if (temp_size > TEMP_KEEP) {
        free(temp_buf);
        temp_buf = NULL;
        temp_size = 0;
    }
}

/* rms_norm of x into a temporary of n_x * k floats followed by `extra` more, then jobs (whose x is
 * the temporary; a NULL y is placed in the extra floats); the caller holds the call lock. -1: no memory */
int run_norm_matmuls(const float *x, const float *nw, float eps, int n_x, int64_t k, mm_job *jobs, int n_w,
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
