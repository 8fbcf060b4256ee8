/* RoPE with the KV-cache write, and causal attention over the cache on the pool: prefill rows
 * against keys transposed once per call, the decode step one KV group per unit. The cache is
 * float32, or binary16 (kv_f16: written rounded to nearest even, read back into float32 math). */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static inline void rope_row(const float *x, const float *c, const float *s, float *o, int d) {
    for (int i = 0; i < d; i += 2) { /* the same products and sum as py_rope_pairs (bit-exact) */
        const float a = x[i], b = x[i + 1];
        const float p0 = a * c[i], q0 = b * s[i];
        const float p1 = b * c[i + 1], q1 = a * s[i + 1];
        o[i] = p0 + q0;
        o[i + 1] = p1 + q1;
    }
}

/* rope_row into a binary16 row: the same float32 products and sums, then each rounded to nearest even */
static inline void rope_row_f16(const float *x, const float *c, const float *s, uint16_t *o, int d) {
    for (int i = 0; i < d; i += 2) {
        const float a = x[i], b = x[i + 1];
        const float p0 = a * c[i], q0 = b * s[i];
        const float p1 = b * c[i + 1], q1 = a * s[i + 1];
        o[i] = tq_f32_to_f16(p0 + q0);
        o[i + 1] = tq_f32_to_f16(p1 + q1);
    }
}

void unit_rope_kv(void *arg, int u) {
    rkv_job *J = (rkv_job *)arg;
    int t0 = (int)((int64_t)J->T * u / J->n_units), t1 = (int)((int64_t)J->T * (u + 1) / J->n_units);
    for (int t = t0; t < t1; ++t) {
        const size_t row = (size_t)J->pos + (size_t)t;
        float *q = J->q + (size_t)t * J->q_row;
        for (int h = 0; h < J->hq; ++h) /* in place: each pair is read before it is written */
            rope_row(q + (size_t)h * J->d, J->cq + (size_t)t * J->d, J->sq + (size_t)t * J->d, q + (size_t)h * J->d,
                     J->d);
        if (J->kv_f16) {
            for (int h = 0; h < J->hkv; ++h) {
                const float *vs = J->v + (size_t)t * J->v_row + (size_t)h * J->dv;
                uint16_t *vd = (uint16_t *)J->vc + (size_t)h * J->vh + row * J->vr;
                rope_row_f16(J->k + (size_t)t * J->k_row + (size_t)h * J->d, J->ck + (size_t)t * J->d,
                             J->sk + (size_t)t * J->d, (uint16_t *)J->kc + (size_t)h * J->kh + row * J->kr, J->d);
                for (int e = 0; e < J->dv; ++e) vd[e] = tq_f32_to_f16(vs[e]);
            }
            continue;
        }
        for (int h = 0; h < J->hkv; ++h) {
            rope_row(J->k + (size_t)t * J->k_row + (size_t)h * J->d, J->ck + (size_t)t * J->d, J->sk + (size_t)t * J->d,
                     (float *)J->kc + (size_t)h * J->kh + row * J->kr, J->d);
            memcpy((float *)J->vc + (size_t)h * J->vh + row * J->vr, J->v + (size_t)t * J->v_row + (size_t)h * J->dv,
                   sizeof(float) * (size_t)J->dv);
        }
    }
}

typedef struct {
    ac_job *J;
    float *kt; /* n_kv groups of (d, n_pad) */
    int n_pad;
} pf_job;

static void unit_transpose_keys(void *arg, int g) {
    pf_job *P = (pf_job *)arg;
    const ac_job *J = P->J;
    const int n = (int)(J->start + J->T);
    const float *k = (const float *)J->k + (size_t)g * J->kh;
    const uint16_t *kh = (const uint16_t *)J->k + (size_t)g * J->kh;
    float *kt = P->kt + (size_t)g * J->d * P->n_pad;
    for (int e = 0; e < J->d; ++e) {
        float *row = kt + (size_t)e * P->n_pad;
        if (J->kv_f16) /* converted here, once per call: the row kernel reads float32 keys */
            for (int s = 0; s < n; ++s) row[s] = tq_f16_to_f32(kh[(size_t)s * J->kr + e]);
        else
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
    const float *q = J->q + (size_t)t * J->q_row + (size_t)g * J->n_rep * J->d;
    const float *kt = P->kt + (size_t)g * J->d * P->n_pad;
    float *out = J->out + (size_t)t * J->out_row + (size_t)g * J->n_rep * J->dv;
    if (J->kv_f16)
        K->attn_prefill_row_f16(q, J->n_rep, J->d, kt, P->n_pad, (const uint16_t *)J->v + (size_t)g * J->vh, J->vr,
                                J->dv, (int)(J->start + t + 1), J->scale, out, scores);
    else
        K->attn_prefill_row(q, J->n_rep, J->d, kt, P->n_pad, (const float *)J->v + (size_t)g * J->vh, J->vr, J->dv,
                            (int)(J->start + t + 1), J->scale, out, scores);
    if (scores != stack_scores) free(scores);
}

/* T > 1 rows: keys transposed once per call, then (row, group) pairs; J->failed when out of memory */
static void attend_prefill(ac_job *J) {
    pf_job P;
    P.J = J;
    P.n_pad = (int)((J->start + J->T + TQ_ATT_PAD - 1) / TQ_ATT_PAD * TQ_ATT_PAD);
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
    const int n_pad = (n_keys + TQ_ATT_PAD - 1) / TQ_ATT_PAD * TQ_ATT_PAD;
    float stack_scores[4096];
    float *scores = 4 * (size_t)n_pad <= 4096 ? stack_scores : (float *)malloc(sizeof(float) * 4 * (size_t)n_pad);
    if (!scores) {
        J->failed = 1;
        return;
    }
    if (J->kv_f16)
        K->attn_decode_f16(J->q + (size_t)g * J->n_rep * J->d, J->n_rep, J->d, (const uint16_t *)J->k + (size_t)g * J->kh,
                           J->kr, (const uint16_t *)J->v + (size_t)g * J->vh, J->vr, J->dv, n_keys, n_pad, J->scale,
                           J->out + (size_t)g * J->n_rep * J->dv, scores);
    else
        K->attn_decode(J->q + (size_t)g * J->n_rep * J->d, J->n_rep, J->d, (const float *)J->k + (size_t)g * J->kh,
                       J->kr, (const float *)J->v + (size_t)g * J->vh, J->vr, J->dv, n_keys, n_pad, J->scale,
                       J->out + (size_t)g * J->n_rep * J->dv, scores);
    if (scores != stack_scores) free(scores);
}

/* the caller holds the call lock; J->failed when out of memory */
void run_attend(ac_job *J) {
    if (J->T > 1)
        attend_prefill(J);
    else
        pool_for(unit_decode_group, J, J->n_kv);
}
