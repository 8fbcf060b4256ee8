/* Element-wise kernels of the forward pass (exp, SwiGLU, attention rows, argmax) at the vector
 * width of the selected variant. */
#include <math.h>
#include <string.h>

#include "runtime.h"
#ifdef TQ_ELEMENTWISE_X86
#include <immintrin.h>
#endif

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

row_fn swiglu_row(void) {
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
static void att_row_generic(ATT_ROW_ARGS) { ATT_ROW_BODY(tq_v4, 4) }
#ifdef TQ_ELEMENTWISE_X86
__attribute__((target("avx2"))) static void att_row_avx2(ATT_ROW_ARGS) { ATT_ROW_BODY(tq_v8, 8) }
__attribute__((target("avx2,avx512f"))) static void att_row_avx512(ATT_ROW_ARGS) { ATT_ROW_BODY(tq_v16, 16) }
#endif

att_row_fn att_row(void) {
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
static void att_dec_generic(ATT_DEC_ARGS) { ATT_DEC_BODY(tq_v4, 4) }
#ifdef TQ_ELEMENTWISE_X86
__attribute__((target("avx2"))) static void att_dec_avx2(ATT_DEC_ARGS) { ATT_DEC_BODY(tq_v8, 8) }
__attribute__((target("avx2,avx512f"))) static void att_dec_avx512(ATT_DEC_ARGS) { ATT_DEC_BODY(tq_v16, 16) }
#endif

att_dec_fn att_dec(void) {
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

int64_t argmax_f32(const float *x, int64_t n, int *has_nan) {
#ifdef TQ_ELEMENTWISE_X86
    if (K->simd == TQ_SIMD_AVX512) return argmax_avx512(x, n, has_nan);
    if (K->simd == TQ_SIMD_AVX2) return argmax_avx2(x, n, has_nan);
#endif
    return argmax_generic(x, n, has_nan);
}
