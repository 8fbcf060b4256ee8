/* A decode step's layers in one call (the table's layout is in runtime.h). */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

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

/* x (hidden floats) in place through n_layers, the caches float32 or (kv_f16) binary16, contiguous or
 * pools read through `blocks`; -1: no memory.
 * The caller holds the call lock. */
int run_decode_layers(const int64_t *table, int n_layers, float *x, ptrdiff_t pos, const float *tab[4],
                      int hidden, int hq, int hkv, int d, int dv, int ffn, float eps, float scale, int kv_f16,
                      tq_kv_blocks blocks) {
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
        blocks.k_block = (size_t)row[DL_KB];
        blocks.v_block = (size_t)row[DL_VB];
        rkv_job R = {q, k, v, tab[0], tab[1], tab[2], tab[3], (void *)(uintptr_t)row[DL_KC],
                     (void *)(uintptr_t)row[DL_VC], 1, hq, hkv, d, dv, 1, (size_t)hq * d, (size_t)hkv * d,
                     (size_t)hkv * dv, (size_t)row[DL_KH], (size_t)row[DL_KR], (size_t)row[DL_VH], (size_t)row[DL_VR], pos,
                     kv_f16, blocks, NULL, 0};
        pool_for(unit_rope_kv, &R, 1);
        ac_job A = {q, R.kc, R.vc, o, 1, hkv, hq / hkv, d, dv, (size_t)hq * d, (size_t)hq * dv,
                    R.kh, R.kr, R.vh, R.vr, pos, scale, 0, kv_f16, R.blocks, NULL, 0, 1};
        run_attend(&A);
        if (A.failed) return -1;
        dl_job(&J[0], row, DL_O, o, (int64_t)hq * dv, y);
        if (run_matmul(&J[0])) return -1;
        for (int e = 0; e < hidden; ++e) x[e] = y[e] + x[e]; /* matmul_add's sum */
        dl_job(&J[0], row, DL_GATE, x, hidden, gate);
        dl_job(&J[1], row, DL_UP, x, hidden, up);
        if (run_norm_matmuls(x, (const float *)(uintptr_t)row[DL_FFN_NORM], eps, 1, hidden, J, 2, 0)) return -1;
        sw_job S = {gate, up, act, 1, ffn, (size_t)ffn, (size_t)ffn, (size_t)ffn, 1};
        pool_for(unit_swiglu, &S, 1);
        dl_job(&J[0], row, DL_DOWN, act, ffn, y);
        if (run_matmul(&J[0])) return -1;
        for (int e = 0; e < hidden; ++e) x[e] = y[e] + x[e];
    }
    return 0;
}
