/* Checks the NEON kernel variants against the portable C one on random GGUF blocks.
 *
 * Built for aarch64 with the same kernel sources as the module (generic.c, arch/arm/neon.c,
 * arch/arm/neon_dot.c) and run under qemu-aarch64 by test_neon_cross.py. For each variant the CPU can
 * run (neondot only where the OS reports dotprod) and every weight type:
 *   - activation quantization: the same bytes as the generic variant (random rows, zeros, ties);
 *   - dequantization: bit-exact;
 *   - gemm: K of one block and of many, 7 weight rows (odd, unaligned row stride), 1..9
 *     activation rows (tiles of TQ_NXMAX = 4 and every remainder), each output within
 *     1e-5 * sum|w||x| of the generic one, the output stride's gap left untouched;
 *   - a corrupted nibble: where the generic output changes, the variant's must change by more
 *     than the tolerance and still agree with the generic one;
 *   - decode attention within 1e-5 * max|v|.
 * Prints one line per variant and type, then "N passed, M failed"; exits 1 on any failure.
 * Usage: neon_harness [seed]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch/arm/features.h"
#include "common.h"

#define REL_TOL 1e-5
#define SENTINEL 12345.0f

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

/* a finite IEEE half with a random sign and mantissa, exponent field in [emin, emax] */
static uint16_t rand_half(int emin, int emax) {
    uint32_t e = (uint32_t)(emin + (int)(rnd() % (uint32_t)(emax - emin + 1)));
    return (uint16_t)(((rnd() & 1u) << 15) | (e << 10) | (rnd() & 0x3ffu));
}
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static int n_pass, n_fail;
static int fail(const char *variant, const char *type, const char *what) {
    ++n_fail;
    if (n_fail <= 40) printf("FAIL %s %s: %s\n", variant, type, what);
    return 1;
}

static const struct { int type; const char *name; int qs_lo, qs_hi; } TYPES[] = {
    /* qs_lo..qs_hi: the bytes of a block holding quants (where the nibble is corrupted) */
    {TQ_Q4_K, "Q4_K", 16, 144},  {TQ_Q5_K, "Q5_K", 48, 176},  {TQ_Q6_K, "Q6_K", 0, 128},
    {TQ_Q8_0, "Q8_0", 2, 34},    {TQ_Q2_K, "Q2_K", 16, 80},   {TQ_Q3_K, "Q3_K", 32, 96},
    {TQ_IQ4_XS, "IQ4_XS", 8, 136}, {TQ_Q4_0, "Q4_0", 2, 18},  {TQ_Q4_1, "Q4_1", 4, 20},
    {TQ_Q5_0, "Q5_0", 6, 22},    {TQ_Q5_1, "Q5_1", 8, 24},    {TQ_IQ4_NL, "IQ4_NL", 2, 18},
    {TQ_F16, "F16", 0, 2},       {TQ_BF16, "BF16", 0, 2},     {TQ_F32, "F32", 2, 3},
};

/* random blocks whose f16 scales are finite (the quants stay random bytes) */
static void fill_row(int type, uint8_t *row, int64_t k) {
    const int be = tq_block_elems(type), bb = tq_block_bytes(type);
    const int64_t nb = k / be;
    for (int64_t i = 0; i < nb * bb; ++i) row[i] = (uint8_t)rnd();
    for (int64_t i = 0; i < nb; ++i) {
        uint8_t *b = row + i * bb;
        switch (type) {
        case TQ_F16: put16(b, rand_half(0, 17)); break; /* subnormals included */
        case TQ_BF16: put16(b, (uint16_t)(((rnd() & 1u) << 15) | ((120u + rnd() % 12u) << 7) | (rnd() & 0x7fu))); break;
        case TQ_F32: { float f = frand(); memcpy(b, &f, 4); break; }
        case TQ_Q4_1: case TQ_Q5_1: case TQ_Q4_K: case TQ_Q5_K:
            put16(b, rand_half(8, 16));
            put16(b + 2, rand_half(8, 16));
            break;
        case TQ_Q2_K: put16(b + 80, rand_half(8, 16)); put16(b + 82, rand_half(8, 16)); break;
        case TQ_Q3_K: put16(b + 108, rand_half(8, 16)); break;
        case TQ_Q6_K: put16(b + 208, rand_half(8, 16)); break;
        default: put16(b, rand_half(8, 16)); /* Q4_0 Q5_0 Q8_0 IQ4_NL IQ4_XS: d first */
        }
    }
}

/* activation rows: mostly small, a few outliers (as hidden states have) */
static void fill_x(float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = frand() + frand() + (rnd() % 61 == 0 ? 8.0f * frand() : 0.0f);
}

typedef struct {
    const tq_kernels *v;
    int type;
    const char *name;
    double max_rel; /* largest |diff| / sum|w||x| seen */
} ctx;

static size_t act_row_bytes(int type, int64_t k) {
    const int act = tq_act_kind(type);
    if (act == TQ_ACT_Q8K) return (size_t)(k / TQ_QK) * sizeof(tq_q8k);
    if (act == TQ_ACT_Q8B) return (size_t)(k / TQ_QB) * sizeof(tq_q8b);
    return (size_t)k * 4;
}

/* activation quants -> floats (what the integer dot products multiply) */
static void act_values(int type, const uint8_t *xq, const float *x, int64_t k, double *out) {
    const int act = tq_act_kind(type);
    for (int64_t e = 0; e < k; ++e) {
        if (act == TQ_ACT_Q8K) {
            const tq_q8k *b = (const tq_q8k *)xq + e / TQ_QK;
            out[e] = (double)b->d * b->qs[e % TQ_QK];
        } else if (act == TQ_ACT_Q8B) {
            const tq_q8b *b = (const tq_q8b *)xq + e / TQ_QB;
            out[e] = (double)b->d * b->qs[e % TQ_QB];
        } else {
            out[e] = x[e];
        }
    }
}

/* quantizes n_x rows with a variant (float types: the rows themselves) */
static uint8_t *quantize(const tq_kernels *v, int type, const float *x, int n_x, int64_t k) {
    const size_t rb = act_row_bytes(type, k);
    uint8_t *q = calloc((size_t)n_x, rb);
    for (int j = 0; j < n_x; ++j) {
        const float *xr = x + (size_t)j * k;
        switch (tq_act_kind(type)) {
        case TQ_ACT_Q8K: v->quant_q8k(xr, q + j * rb, k); break;
        case TQ_ACT_Q8B: v->quant_q8b(xr, q + j * rb, k); break;
        default: memcpy(q + j * rb, xr, rb);
        }
    }
    return q;
}

/* y[j * ldy + r] for n_w weight rows and n_x activation rows, ldy = n_w + 1 (gap = sentinel) */
static float *run_gemm(const tq_kernels *v, int type, const uint8_t *w, size_t ws, int n_w, const uint8_t *xq,
                       int n_x, int64_t k) {
    const size_t ldy = (size_t)n_w + 1;
    float *y = malloc(sizeof(float) * ldy * (size_t)n_x);
    for (size_t i = 0; i < ldy * (size_t)n_x; ++i) y[i] = SENTINEL;
    v->gemm[type](w, ws, n_w, xq, act_row_bytes(type, k), n_x, k, y, ldy);
    return y;
}

static int check_gemm(ctx *c, int64_t k, int n_w, int n_x) {
    const tq_kernels *G = &tq_kernels_generic;
    const int type = c->type;
    char what[160];
    const size_t rb = (size_t)(k / tq_block_elems(type)) * (size_t)tq_block_bytes(type);
    const int pad = type == TQ_F32 || type == TQ_F16 || type == TQ_BF16 ? 0 : 3; /* unaligned rows */
    const size_t ws = rb + (size_t)pad;
    uint8_t *w = calloc((size_t)n_w, ws);
    for (int r = 0; r < n_w; ++r) fill_row(type, w + r * ws, k);
    float *x = malloc(sizeof(float) * (size_t)k * (size_t)n_x);
    fill_x(x, k * n_x);
    int bad = 0;

    uint8_t *xg = quantize(G, type, x, n_x, k), *xv = quantize(c->v, type, x, n_x, k);
    if (memcmp(xg, xv, act_row_bytes(type, k) * (size_t)n_x) != 0) {
        snprintf(what, sizeof what, "activation quantization differs (K=%lld, rows=%d)", (long long)k, n_x);
        bad |= fail(c->v->name, c->name, what);
    }
    float *dg = malloc(sizeof(float) * (size_t)k * (size_t)n_w), *dv = malloc(sizeof(float) * (size_t)k * (size_t)n_w);
    memset(dv, 0xA5, sizeof(float) * (size_t)k * (size_t)n_w);
    G->dequant[type](w, ws, n_w, k, dg);
    c->v->dequant[type](w, ws, n_w, k, dv);
    if (memcmp(dg, dv, sizeof(float) * (size_t)k * (size_t)n_w) != 0) {
        snprintf(what, sizeof what, "dequantization not bit-exact (K=%lld)", (long long)k);
        bad |= fail(c->v->name, c->name, what);
    }

    float *yg = run_gemm(G, type, w, ws, n_w, xg, n_x, k), *yv = run_gemm(c->v, type, w, ws, n_w, xg, n_x, k);
    double *xa = malloc(sizeof(double) * (size_t)k);
    const size_t ldy = (size_t)n_w + 1;
    for (int j = 0; j < n_x && !bad; ++j) {
        act_values(type, xg + j * act_row_bytes(type, k), x + (size_t)j * k, k, xa);
        for (int r = 0; r < n_w; ++r) {
            double mag = 0.0;
            for (int64_t e = 0; e < k; ++e) mag += fabs((double)dg[(size_t)r * k + e] * xa[e]);
            const double diff = fabs((double)yv[j * ldy + r] - (double)yg[j * ldy + r]);
            if (!(diff <= REL_TOL * mag + 1e-30)) {
                snprintf(what, sizeof what, "K=%lld rows=%d: y[%d][%d] = %.9g, generic %.9g (|diff| %.3g > %.3g)",
                         (long long)k, n_x, j, r, yv[j * ldy + r], yg[j * ldy + r], diff, REL_TOL * mag);
                bad |= fail(c->v->name, c->name, what);
                break;
            }
            if (mag > 0 && diff / mag > c->max_rel) c->max_rel = diff / mag;
        }
        if (yv[j * ldy + (size_t)n_w] != SENTINEL) bad |= fail(c->v->name, c->name, "wrote past its output row");
    }
    free(xa), free(yg), free(yv), free(dg), free(dv), free(xg), free(xv), free(x), free(w);
    return bad;
}

/* flips the low nibble of one quant byte of block 0, row 0; the first byte (from qs_lo) where
 * the generic output changes is the case: the variant must change too, by more than the tolerance */
static int check_corrupt(ctx *c, int qs_lo, int qs_hi) {
    const tq_kernels *G = &tq_kernels_generic;
    const int type = c->type, n_w = 3, n_x = 5;
    const int64_t k = tq_block_elems(type) == 1 ? 64 : 2 * tq_block_elems(type);
    const size_t ws = (size_t)(k / tq_block_elems(type)) * (size_t)tq_block_bytes(type);
    uint8_t *w = calloc((size_t)n_w, ws);
    for (int r = 0; r < n_w; ++r) fill_row(type, w + r * ws, k);
    float *x = malloc(sizeof(float) * (size_t)k * n_x);
    fill_x(x, k * n_x);
    uint8_t *xq = quantize(G, type, x, n_x, k);
    const size_t ldy = (size_t)n_w + 1;
    float *g0 = run_gemm(G, type, w, ws, n_w, xq, n_x, k), *v0 = run_gemm(c->v, type, w, ws, n_w, xq, n_x, k);
    int bad = 1, tried = 0;
    for (int off = qs_lo; off < (type == TQ_F32 || type == TQ_F16 || type == TQ_BF16 ? 64 : qs_hi); ++off) {
        if (type == TQ_F32 && off % 4 != 2) continue; /* a high mantissa byte */
        if ((type == TQ_F16 || type == TQ_BF16) && off % 2 != 0) continue;
        w[off] ^= 0x0F;
        float *g1 = run_gemm(G, type, w, ws, n_w, xq, n_x, k), *v1 = run_gemm(c->v, type, w, ws, n_w, xq, n_x, k);
        int changed = 0, ok = 1;
        for (int j = 0; j < n_x; ++j) {
            const double dg = fabs((double)g1[j * ldy] - g0[j * ldy]), dv = fabs((double)v1[j * ldy] - v0[j * ldy]);
            const double agree = fabs((double)v1[j * ldy] - g1[j * ldy]);
            const double tol = REL_TOL * (fabs((double)g0[j * ldy]) + fabs((double)g1[j * ldy]) + 1e-20);
            if (dg > 100 * tol) changed = 1;
            if (dg > 100 * tol && (dv <= tol || agree > 0.01 * dg)) ok = 0;
        }
        free(g1), free(v1);
        w[off] ^= 0x0F;
        ++tried;
        if (changed) {
            bad = !ok;
            break;
        }
    }
    if (bad) fail(c->v->name, c->name, "corrupted nibble: the output did not change as the generic one did");
    free(g0), free(v0), free(xq), free(x), free(w);
    return bad;
}

static int check_quant_edges(const tq_kernels *v) {
    float x[TQ_QK * 3];
    memset(x, 0, sizeof x); /* block 0: zeros (d = 0) */
    for (int e = 0; e < TQ_QK; ++e) /* block 1: amax 127 so id = 1: half-integers are exact ties */
        x[TQ_QK + e] = e == 0 ? 127.0f : (float)((int)(rnd() % 254) - 127) + 0.5f;
    for (int e = 0; e < TQ_QK; ++e) x[2 * TQ_QK + e] = frand() * (e % 2 ? 1e-3f : 1e3f); /* wide range */
    tq_q8k a[3], b[3];
    tq_q8b p[24], q[24];
    memset(a, 0, sizeof a), memset(b, 0, sizeof b), memset(p, 0, sizeof p), memset(q, 0, sizeof q);
    tq_kernels_generic.quant_q8k(x, a, TQ_QK * 3);
    v->quant_q8k(x, b, TQ_QK * 3);
    tq_kernels_generic.quant_q8b(x, p, TQ_QK * 3);
    v->quant_q8b(x, q, TQ_QK * 3);
    int bad = 0;
    if (memcmp(a, b, sizeof a)) bad |= fail(v->name, "Q8_K", "quantization of zeros / ties / wide range differs");
    if (memcmp(p, q, sizeof p)) bad |= fail(v->name, "Q8_0 act", "quantization of zeros / ties / wide range differs");
    return bad;
}

static int check_attention(const tq_kernels *v) {
    int bad = 0;
    static const int32_t one_block[1] = {0}; /* the contiguous rows: one block of every row */
    const tq_kv_blocks one = {one_block, INT32_MAX, 0, 0};
    const int shapes[2][3] = {{128, 128, 37}, {67, 70, 5}}; /* d, dv, keys: vector body and tails */
    for (int s = 0; s < 2; ++s) {
        const int d = shapes[s][0], dv = shapes[s][1], n_keys = shapes[s][2], n_rep = 4;
        const size_t ks = (size_t)d + 3, vs = (size_t)dv + 5;
        float *q = malloc(sizeof(float) * n_rep * d), *k = malloc(sizeof(float) * ks * n_keys);
        float *vv = malloc(sizeof(float) * vs * n_keys), *og = malloc(sizeof(float) * n_rep * dv);
        const int n_pad = (n_keys + TQ_ATT_PAD - 1) / TQ_ATT_PAD * TQ_ATT_PAD;
        float *ov = malloc(sizeof(float) * n_rep * dv), *sc = malloc(sizeof(float) * 4 * (n_pad + dv));
        fill_x(q, (int64_t)n_rep * d), fill_x(k, (int64_t)ks * n_keys), fill_x(vv, (int64_t)vs * n_keys);
        float vmax = 0.0f;
        for (size_t i = 0; i < vs * n_keys; ++i) vmax = fabsf(vv[i]) > vmax ? fabsf(vv[i]) : vmax;
        tq_kernels_generic.attn_decode(q, n_rep, d, k, ks, vv, vs, &one, dv, n_keys, n_pad, 1.0f / sqrtf((float)d), og, sc);
        v->attn_decode(q, n_rep, d, k, ks, vv, vs, &one, dv, n_keys, n_pad, 1.0f / sqrtf((float)d), ov, sc);
        for (int i = 0; i < n_rep * dv; ++i) {
            if (!(fabsf(ov[i] - og[i]) <= REL_TOL * vmax)) {
                bad |= fail(v->name, "attention", "decode attention differs");
                break;
            }
        }
        /* a float16 cache: the variant's f16 kernel (fcvtl in registers) is, bit for bit, its f32
         * kernel over the same values widened, and so is the portable one's */
        uint16_t *kh = malloc(sizeof(uint16_t) * ks * n_keys), *vh = malloc(sizeof(uint16_t) * vs * n_keys);
        for (size_t i = 0; i < ks * n_keys; ++i) k[i] = tq_f16_to_f32(kh[i] = tq_f32_to_f16(k[i]));
        for (size_t i = 0; i < vs * n_keys; ++i) vv[i] = tq_f16_to_f32(vh[i] = tq_f32_to_f16(vv[i]));
        const float scale = 1.0f / sqrtf((float)d);
        v->attn_decode(q, n_rep, d, k, ks, vv, vs, &one, dv, n_keys, n_pad, scale, og, sc);
        v->attn_decode_f16(q, n_rep, d, kh, ks, vh, vs, &one, dv, n_keys, n_pad, scale, ov, sc);
        if (memcmp(og, ov, sizeof(float) * n_rep * dv)) bad |= fail(v->name, "attention", "f16 cache differs");
        tq_kernels_generic.attn_decode_f16(q, n_rep, d, kh, ks, vh, vs, &one, dv, n_keys, n_pad, scale, ov, sc);
        tq_kernels_generic.attn_decode(q, n_rep, d, k, ks, vv, vs, &one, dv, n_keys, n_pad, scale, og, sc);
        if (memcmp(og, ov, sizeof(float) * n_rep * dv)) bad |= fail("generic", "attention", "f16 cache differs");
        free(kh), free(vh);
        free(q), free(k), free(vv), free(og), free(ov), free(sc);
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc > 1) rng = strtoull(argv[1], NULL, 0) | 1u;
    const int dotprod = tq_arm_has_dotprod();
    printf("dotprod: %s\n", dotprod ? "yes" : "no");
    const tq_kernels *variants[2] = {&tq_kernels_neon, dotprod ? &tq_kernels_neondot : NULL};
    for (int vi = 0; vi < 2; ++vi) {
        const tq_kernels *v = variants[vi];
        if (!v) continue;
        printf("variant %s\n", v->name);
        if (!check_quant_edges(v)) ++n_pass;
        if (!check_attention(v)) ++n_pass;
        for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; ++t) {
            ctx c = {v, TYPES[t].type, TYPES[t].name, 0.0};
            const int be = tq_block_elems(c.type);
            /* one block and many (an odd count); float rows: a tail only, and body + tail */
            const int64_t ks[2] = {be == 1 ? 7 : be, be == 1 ? 1029 : (be == TQ_QK ? 9 : 37) * (int64_t)be};
            int bad = 0, checks = 0;
            for (int kk = 0; kk < 2; ++kk)
                for (int n_x = 1; n_x <= 9; ++n_x, ++checks) bad |= check_gemm(&c, ks[kk], 7, n_x);
            bad |= check_corrupt(&c, TYPES[t].qs_lo, TYPES[t].qs_hi);
            if (!bad) ++n_pass;
            printf("%s %-6s %s: %d gemm shapes + corrupted nibble, max |diff|/sum|w||x| = %.2e\n",
                   v->name, c.name, bad ? "FAIL" : "ok", checks, c.max_rel);
        }
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
