/* The forward pass's element-wise steps on the pool: RMSNorm, SwiGLU, a gather of embedding rows. */
#include <math.h>

#include "runtime.h"

/* RMSNorm of rows [r0, r1): the sum of squares in double, as HF's float32 formula rounds */
static void rms_norm_rows(const float *x, const float *w, float *o, ptrdiff_t r0, ptrdiff_t r1, ptrdiff_t n,
                          float eps) {
    for (ptrdiff_t r = r0; r < r1; ++r) {
        const float *xr = x + r * n;
        float *orow = o + r * n;
        double ss = 0.0;
        for (ptrdiff_t i = 0; i < n; ++i) ss += (double)xr[i] * xr[i];
        const float inv = (float)(1.0 / sqrt((double)(float)(ss / (double)n) + (double)eps));
        for (ptrdiff_t i = 0; i < n; ++i) orow[i] = w[i] * (xr[i] * inv);
    }
}

typedef struct {
    const float *x, *w;
    float *o;
    ptrdiff_t rows, n;
    float eps;
    int n_units;
} rn_job;

static void unit_rms_norm(void *arg, int u) {
    rn_job *J = (rn_job *)arg;
    rms_norm_rows(J->x, J->w, J->o, J->rows * u / J->n_units, J->rows * (u + 1) / J->n_units, J->n, J->eps);
}

/* rows on the pool when there are many (prefill); the caller holds the call lock */
void rms_norm_pool(const float *x, const float *w, float *o, ptrdiff_t rows, ptrdiff_t n, float eps) {
    rn_job J = {x, w, o, rows, n, eps, pool_units(rows, n)};
    pool_for(unit_rms_norm, &J, J.n_units);
}

void unit_swiglu(void *arg, int unit) {
    sw_job *J = (sw_job *)arg;
    int64_t r0 = J->rows * unit / J->n_units, r1 = J->rows * (unit + 1) / J->n_units;
    for (int64_t r = r0; r < r1; ++r)
        K->swiglu_row(J->g + r * J->g_row, J->u + r * J->u_row, J->out + r * J->out_row, J->n);
}

void unit_gather(void *arg, int u) {
    gather_job *J = (gather_job *)arg;
    const int i0 = (int)((int64_t)J->n_ids * u / J->n_units), i1 = (int)((int64_t)J->n_ids * (u + 1) / J->n_units);
    for (int i = i0; i < i1; ++i)
        K->dequant[J->type](J->w + (size_t)J->ids[i] * J->w_stride, J->w_stride, 1, J->k, J->out + (size_t)i * J->k);
}
