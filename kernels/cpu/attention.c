/* RoPE with the KV-cache write, and causal attention over the cache on the pool: prefill rows
 * against keys transposed once per call, the decode step one (row, KV group) per unit. The cache is
 * float32, or binary16 (kv_f16: written rounded to nearest even, read back into float32 math), and
 * a pool of blocks read through a block table (paged KV; the contiguous cache is one block). */
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

const int32_t tq_one_block[1] = {0};

/* row t's K/V rows into the pools: at pos + t of the one sequence, or (positions) at positions[t] of
 * sequence t's own table, nothing for a negative position (a padding row) */
void unit_rope_kv(void *arg, int u) {
    rkv_job *J = (rkv_job *)arg;
    int t0 = (int)((int64_t)J->T * u / J->n_units), t1 = (int)((int64_t)J->T * (u + 1) / J->n_units);
    for (int t = t0; t < t1; ++t) {
        float *q = J->q + (size_t)t * J->q_row;
        for (int h = 0; h < J->hq; ++h) /* in place: each pair is read before it is written */
            rope_row(q + (size_t)h * J->d, J->cq + (size_t)t * J->d, J->sq + (size_t)t * J->d, q + (size_t)h * J->d,
                     J->d);
        const ptrdiff_t p = J->positions ? J->positions[t] : J->pos + t;
        if (p < 0) continue;
        tq_kv_blocks b = J->blocks;
        if (J->positions) b.table += (size_t)t * J->table_row;
        const size_t ko = tq_kv_row(&b, b.k_block, J->kr, p), vo = tq_kv_row(&b, b.v_block, J->vr, p);
        const float *kt = J->k + (size_t)t * J->k_row, *vt = J->v + (size_t)t * J->v_row;
        const float *ck = J->ck + (size_t)t * J->d, *sk = J->sk + (size_t)t * J->d;
        for (int h = 0; h < J->hkv; ++h) {
            const float *ks = kt + (size_t)h * J->d, *vs = vt + (size_t)h * J->dv;
            if (J->kv_f16) {
                uint16_t *vd = (uint16_t *)J->vc + vo + (size_t)h * J->vh;
                rope_row_f16(ks, ck, sk, (uint16_t *)J->kc + ko + (size_t)h * J->kh, J->d);
                for (int e = 0; e < J->dv; ++e) vd[e] = tq_f32_to_f16(vs[e]);
            } else {
                rope_row(ks, ck, sk, (float *)J->kc + ko + (size_t)h * J->kh, J->d);
                memcpy((float *)J->vc + vo + (size_t)h * J->vh, vs, sizeof(float) * (size_t)J->dv);
            }
        }
    }
}

/* floats of a unit's scores and value sums kept on its stack (larger ones are allocated): 4096 scores
 * and the value sums of four heads of 256 */
#define TQ_STACK_SCORES (4096 + 4 * 256)

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
    const uint16_t *k16 = (const uint16_t *)J->k + (size_t)g * J->kh;
    float *kt = P->kt + (size_t)g * J->d * P->n_pad;
    for (int e = 0; e < J->d; ++e) {
        float *row = kt + (size_t)e * P->n_pad;
        if (J->kv_f16) /* converted here, once per call: the row kernel reads float32 keys */
            TQ_KV_SPANS(uint16_t, kr, s0, len, k16 + e, J->kr, J->blocks.k_block, &J->blocks, n, INT32_MAX)
            for (int j = 0; j < len; ++j) row[s0 + j] = tq_f16_to_f32(kr[(size_t)j * J->kr]);
        else
            TQ_KV_SPANS(float, kr, s0, len, k + e, J->kr, J->blocks.k_block, &J->blocks, n, INT32_MAX)
            for (int j = 0; j < len; ++j) row[s0 + j] = kr[(size_t)j * J->kr];
        for (int s = n; s < P->n_pad; ++s) row[s] = 0.0f;
    }
}

static void unit_prefill_row(void *arg, int u) {
    pf_job *P = (pf_job *)arg;
    ac_job *J = P->J;
    const int t = J->T - 1 - u / J->n_kv, g = u % J->n_kv; /* the longest rows first: they finish last */
    float stack_scores[TQ_STACK_SCORES];
    const size_t n_scores = (size_t)J->n_rep * (size_t)P->n_pad + 4 * (size_t)J->dv; /* + the value sums */
    float *scores = n_scores <= TQ_STACK_SCORES ? stack_scores : (float *)malloc(sizeof(float) * n_scores);
    if (!scores) {
        J->failed = 1;
        return;
    }
    const float *q = J->q + (size_t)t * J->q_row + (size_t)g * J->n_rep * J->d;
    const float *kt = P->kt + (size_t)g * J->d * P->n_pad;
    float *out = J->out + (size_t)t * J->out_row + (size_t)g * J->n_rep * J->dv;
    if (J->kv_f16)
        K->attn_prefill_row_f16(q, J->n_rep, J->d, kt, P->n_pad, (const uint16_t *)J->v + (size_t)g * J->vh, J->vr,
                                &J->blocks, J->dv, (int)(J->start + t + 1), J->scale, out, scores);
    else
        K->attn_prefill_row(q, J->n_rep, J->d, kt, P->n_pad, (const float *)J->v + (size_t)g * J->vh, J->vr,
                            &J->blocks, J->dv, (int)(J->start + t + 1), J->scale, out, scores);
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

/* unit (row r, KV group g) of a decode: row r's query at its position over its own blocks */
static void unit_decode_group(void *arg, int u) {
    ac_job *J = (ac_job *)arg;
    const int r = u / J->n_kv, g = u % J->n_kv;
    const ptrdiff_t p = J->positions ? J->positions[r] : J->start;
    float *out = J->out + (size_t)r * J->out_row + (size_t)g * J->n_rep * J->dv;
    if (p < 0) { /* a padding row: zeros, nothing read */
        memset(out, 0, sizeof(float) * (size_t)J->n_rep * (size_t)J->dv);
        return;
    }
    tq_kv_blocks b = J->blocks;
    b.table += (size_t)r * J->table_row;
    const float *q = J->q + (size_t)r * J->q_row + (size_t)g * J->n_rep * J->d;
    const int n_keys = (int)(p + 1);
    const int n_pad = (n_keys + TQ_ATT_PAD - 1) / TQ_ATT_PAD * TQ_ATT_PAD;
    float stack_scores[TQ_STACK_SCORES];
    const size_t n_scores = 4 * ((size_t)n_pad + (size_t)J->dv); /* the scores, then the value sums */
    float *scores = n_scores <= TQ_STACK_SCORES ? stack_scores : (float *)malloc(sizeof(float) * n_scores);
    if (!scores) {
        J->failed = 1;
        return;
    }
    if (J->kv_f16)
        K->attn_decode_f16(q, J->n_rep, J->d, (const uint16_t *)J->k + (size_t)g * J->kh, J->kr,
                           (const uint16_t *)J->v + (size_t)g * J->vh, J->vr, &b, J->dv, n_keys, n_pad, J->scale, out,
                           scores);
    else
        K->attn_decode(q, J->n_rep, J->d, (const float *)J->k + (size_t)g * J->kh, J->kr,
                       (const float *)J->v + (size_t)g * J->vh, J->vr, &b, J->dv, n_keys, n_pad, J->scale, out, scores);
    if (scores != stack_scores) free(scores);
}

/* the caller holds the call lock; J->failed when out of memory */
void run_attend(ac_job *J) {
    if (J->T > 1)
        attend_prefill(J);
    else
        pool_for(unit_decode_group, J, J->n_seqs * J->n_kv);
}
