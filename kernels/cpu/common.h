/* Tramontane native CPU kernels: shared declarations.
 *
 * Weights stay in their GGUF block bytes. Activations (float32 rows) are quantized per block
 * into one of two internal formats below, then each output is an integer dot product of
 * weight quants and activation quants, scaled in float32.
 */
#ifndef TQ_COMMON_H
#define TQ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ggml type ids (the numbers in a GGUF file) */
enum {
    TQ_F32 = 0, TQ_F16 = 1, TQ_Q4_0 = 2, TQ_Q4_1 = 3, TQ_Q5_0 = 6, TQ_Q5_1 = 7, TQ_Q8_0 = 8,
    TQ_Q2_K = 10, TQ_Q3_K = 11, TQ_Q4_K = 12, TQ_Q5_K = 13, TQ_Q6_K = 14,
    TQ_IQ4_NL = 20, TQ_IQ4_XS = 23, TQ_BF16 = 30,
    /* not a ggml type: Q4_K blocks with their quants in the order the VNNI tiles read (made
     * once by the variant's repack[TQ_Q4_K_R]; same 144 bytes a block). Only variants with gemm_wide for it run it. */
    TQ_Q4_K_R = 31,
    /* not a ggml type either: Q6_K blocks whose 6-bit quants are stored so that the VNNI tile's
     * int32 lane l holds sub-block l (made once by the variant's repack[TQ_Q6_K_R]; 210 bytes) */
    TQ_Q6_K_R = 32,
    TQ_NTYPES = 33
};

#define TQ_QK 256 /* elements per K-quant super-block */
#define TQ_QB 32  /* elements per legacy block */
#define TQ_WIDE_MIN_ROWS 3 /* activation rows from which a matmul uses gemm_wide */
/* activation rows up to which a type whose narrow tile takes many (narrow_many) stays on it: one
 * pass over the weights per 8 rows beats the wide tiles' setup below this (bench rows 3-12,
 * K = 2048-5632, Q4_K / Q6_K repacked, 2 threads: 5 rows 1.2-1.4x one row's time, 1.9-3.3x on
 * the wide tiles; 16 rows: the wide tiles level with it) */
#define TQ_NARROW_MAX_ROWS 12

/* Activation block for K-quants and IQ4_XS: 256 int8 quants, scale, sums of each 16; padded to
 * 320 bytes (5 cache lines) so that in a 64-byte aligned buffer every block's quants start on a
 * cache line: with 292-byte blocks most 64-byte loads of them straddled two lines. */
typedef struct {
    int8_t qs[TQ_QK];
    float d;
    int16_t bsums[16];
    uint8_t pad[28];
} tq_q8k;

/* Activation block for legacy 32-element types: 32 int8 quants, scale, d * sum(qs). */
typedef struct {
    int8_t qs[TQ_QB];
    float d;
    float s;
} tq_q8b;

/* IEEE binary16 <-> float32, portable (the f16 KV cache). To f16: round to nearest even, with
 * overflow to infinity, subnormals and NaN (quieted, top payload bits kept) as torch's Tensor.half(). */
static inline float tq_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t x;
    if (e == 0x1f)
        x = sign | 0x7f800000u | (m << 13);
    else if (e)
        x = sign | ((e + 112u) << 23) | (m << 13);
    else { /* zero or subnormal: m * 2^-24, exact in float32 (a normal number) */
        float f = (float)m * 5.9604644775390625e-8f;
        memcpy(&x, &f, 4);
        x |= sign;
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline uint16_t tq_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN, quiet, payload kept */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up (and inf): inf */
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal (or zero) in units of 2^-24 */
        if (ax < 0x33000000u) return (uint16_t)sign; /* below 2^-25 (2^-25 itself ties to 0) */
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - (ax >> 23); /* 14..24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        r += rem > half || (rem == half && (r & 1u));
        return (uint16_t)(sign | r);
    }
    /* normal: rebias the exponent (127 -> 15), round the 13 dropped bits to nearest even */
    return (uint16_t)(sign | ((ax - 0x38000000u + 0xfffu + ((ax >> 13) & 1u)) >> 13));
}

/* Which activation format a weight type consumes. */
enum { TQ_ACT_F32 = 0, TQ_ACT_Q8K = 1, TQ_ACT_Q8B = 2 };

/* gemm over a tile: weight rows [0, n_w) (row stride w_stride bytes) against activation
 * rows [0, n_x) (quantized rows of x_stride bytes, or float rows), y[j * ldy + r]. */
typedef void (*tq_gemm_fn)(const uint8_t *w, size_t w_stride, int n_w, const void *x,
                           size_t x_stride, int n_x, int64_t k, float *y, size_t ldy);
/* dequantize n_rows weight rows of k elements into float rows (stride k) */
typedef void (*tq_dequant_fn)(const uint8_t *w, size_t w_stride, int n_rows, int64_t k, float *out);
/* quantize one float row of k elements into activation blocks */
typedef void (*tq_quant_fn)(const float *x, void *out, int64_t k);
/* rewrite n_rows weight rows of nb blocks each into a variant's repacked order (same bytes) */
typedef void (*tq_repack_fn)(const uint8_t *src, size_t src_stride, int n_rows, int nb, uint8_t *dst,
                             size_t dst_stride);

/* Where a KV head's cached rows live (paged KV): position s is row s % rows of block table[s / rows],
 * blocks k_block / v_block elements apart in the key / value pool (the head's offset is in the row
 * pointer the kernels get). The contiguous cache (Hkv, capacity, d) is a pool of one block: table {0},
 * rows >= every position, so one loop serves both and reads the rows in the same order. */
typedef struct {
    const int32_t *table;
    int rows;
    size_t k_block, v_block;
} tq_kv_blocks;

/* The element offset of position s's row in a pool (block stride bs, row stride rs) */
static inline size_t tq_kv_row(const tq_kv_blocks *b, size_t bs, size_t rs, int64_t s) {
    return (size_t)b->table[s / b->rows] * bs + (size_t)(s % b->rows) * rs;
}

/* The one walk over a head's cached rows, for positions 0 .. n - 1 in increasing order: the blocks in
 * table order, each cut in spans of at most `span` consecutive rows; per span R (const ET *) is its
 * first row, s0 its first position, len its rows (so a paged cache is summed exactly as the contiguous
 * one, whose one block is spans of the whole cache). base: the head's rows in block 0's place; rs, bs:
 * row and block strides in elements. The statement after the macro is the body; R, s0 and len are
 * declared here. */
#define TQ_KV_SPANS(ET, R, s0, len, base, rs, bs, blocks, n, span)                                        \
    for (int tq_b_ = 0, s0 = 0, len = 0, tq_e_; s0 < (n); ++tq_b_)                                          \
        for (const ET *R = (tq_e_ = (n) - s0 < (blocks)->rows ? (n) : s0 + (blocks)->rows,                   \
                            (base) + (size_t)(blocks)->table[tq_b_] * (bs));                                 \
             s0 < tq_e_ && ((len = tq_e_ - s0 < (span) ? tq_e_ - s0 : (span)), 1);                           \
             s0 += len, R += (size_t)len * (rs))

/* Inside TQ_KV_SPANS (same arguments): the first row of the next span, NULL after the last: the rows a
 * kernel prefetches while it works on this span (a block's successor is elsewhere in the pool, where
 * the hardware's stream prefetch does not follow) */
#define TQ_KV_NEXT_SPAN(ET, R, s0, len, base, rs, bs, blocks, n)                                           \
    (s0 + len < tq_e_ ? R + (size_t)len * (rs)                                                              \
                      : tq_e_ < (n) ? (base) + (size_t)(blocks)->table[tq_b_ + 1] * (bs) : (const ET *)0)
#if defined(__GNUC__) || defined(__clang__)
#define TQ_PREFETCH(p) __builtin_prefetch((const void *)(p))
#else
#define TQ_PREFETCH(p) ((void)(p))
#endif

/* The element-wise kernels (vec.inc), at the variant's vector width: */
/* decode attention (one query row) of one KV group: its n_rep heads' rows q (d floats each) against
 * keys k + s * ks (d floats), values v + s * vs (dv floats), s < n_keys; out: n_rep rows of dv floats;
 * scores: 4 * n_pad + 4 * dv floats (the scores, then the value sums), n_pad a multiple of TQ_ATT_PAD
 * past n_keys */
typedef void (*tq_attn_decode_fn)(const float *q, int n_rep, int d, const float *k, size_t ks, const float *v,
                                  size_t vs, const tq_kv_blocks *kvb, int dv, int n_keys, int n_pad, float scale,
                                  float *out, float *scores);
/* prefill attention, one query row of a KV group (as above) against its keys transposed: kt holds d
 * rows of n_pad floats, zero past n_keys; scores: n_rep * n_pad + 4 * dv floats */
typedef void (*tq_attn_row_fn)(const float *q, int n_rep, int d, const float *kt, int n_pad, const float *v,
                               size_t vs, const tq_kv_blocks *kvb, int dv, int n_keys, float scale, float *out,
                               float *scores);
/* the same two over a float16 cache (keys and values binary16, converted to float32 as loaded; the
 * prefill row's transposed keys are float32, converted when transposed) */
typedef void (*tq_attn_decode_f16_fn)(const float *q, int n_rep, int d, const uint16_t *k, size_t ks,
                                      const uint16_t *v, size_t vs, const tq_kv_blocks *kvb, int dv, int n_keys,
                                      int n_pad, float scale, float *out, float *scores);
typedef void (*tq_attn_row_f16_fn)(const float *q, int n_rep, int d, const float *kt, int n_pad, const uint16_t *v,
                                   size_t vs, const tq_kv_blocks *kvb, int dv, int n_keys, float scale, float *out,
                                   float *scores);
/* out = silu(g) * u over n floats */
typedef void (*tq_swiglu_fn)(const float *g, const float *u, float *out, int64_t n);
/* the first index of the largest of n floats (as torch.argmax); *has_nan: whether any is NaN */
typedef int64_t (*tq_argmax_fn)(const float *x, int64_t n, int *has_nan);
#define TQ_ATT_PAD 64 /* attention's score rows are padded to a multiple of this (2 W for every W) */

typedef struct {
    const char *name;
    /* x86: the features this variant is compiled for, exactly its `#pragma GCC target` list;
     * it runs only where the probe (arch/x86/features.h) answers yes to each. NULL: no check. */
    const char *target;
    tq_attn_decode_fn attn_decode;
    tq_attn_row_fn attn_prefill_row;
    tq_attn_decode_f16_fn attn_decode_f16;
    tq_attn_row_f16_fn attn_prefill_row_f16;
    tq_swiglu_fn swiglu_row;
    tq_argmax_fn argmax;
    tq_quant_fn quant_q8k;
    tq_quant_fn quant_q8b;
    tq_gemm_fn gemm[TQ_NTYPES];
    tq_dequant_fn dequant[TQ_NTYPES];
    /* prefill (TQ_WIDE_MIN_ROWS+ activation rows), where a variant has it: activations quantized by
     * quant_wide[t] into a lane-transposed order that gemm_wide[t] expects (NULL: use gemm) */
    tq_gemm_fn gemm_wide[TQ_NTYPES];
    tq_quant_fn quant_wide[TQ_NTYPES];
    /* decode (fewer than TQ_WIDE_MIN_ROWS rows) of a type that has its own narrow tile (the
     * repacked types; the AVX2 builds' Q4_K, Q5_K, Q6_K, Q8_0), with its activation quantizer (NULL: gemm) */
    tq_gemm_fn gemm_narrow[TQ_NTYPES];
    tq_quant_fn quant_narrow[TQ_NTYPES];
    /* 1: gemm_narrow also takes up to TQ_NARROW_MAX_ROWS activation rows (one weight pass per 8) */
    unsigned char narrow_many[TQ_NTYPES];
    /* [repacked type]: file rows -> that type's rows (n_rows, nb blocks each), where the variant
     * runs them (TQ_Q4_K_R from Q4_K, TQ_Q6_K_R from Q6_K; NULL: not repacked here) */
    tq_repack_fn repack[TQ_NTYPES];
} tq_kernels;

extern const tq_kernels tq_kernels_generic;
#if defined(__x86_64__) || defined(_M_X64)
extern const tq_kernels tq_kernels_avx2;
extern const tq_kernels tq_kernels_avxvnni;
extern const tq_kernels tq_kernels_avx512;
#endif
/* NEON variants: little-endian aarch64 with GCC or clang (elsewhere, MSVC included: generic) */
#if defined(__aarch64__) && !defined(__AARCH64EB__) && (defined(__GNUC__) || defined(__clang__))
#define TQ_HAVE_NEON_VARIANTS 1
extern const tq_kernels tq_kernels_neon;
extern const tq_kernels tq_kernels_neondot;
#endif

/* Type geometry (shared by all variants). */
static inline int tq_block_elems(int t) {
    switch (t) {
    case TQ_F32: case TQ_F16: case TQ_BF16: return 1;
    case TQ_Q4_0: case TQ_Q4_1: case TQ_Q5_0: case TQ_Q5_1: case TQ_Q8_0: case TQ_IQ4_NL: return 32;
    case TQ_Q2_K: case TQ_Q3_K: case TQ_Q4_K: case TQ_Q5_K: case TQ_Q6_K: case TQ_IQ4_XS: case TQ_Q4_K_R:
    case TQ_Q6_K_R:
        return 256;
    default: return 0;
    }
}
static inline int tq_block_bytes(int t) {
    switch (t) {
    case TQ_F32: return 4;
    case TQ_F16: case TQ_BF16: return 2;
    case TQ_Q4_0: return 18; case TQ_Q4_1: return 20; case TQ_Q5_0: return 22;
    case TQ_Q5_1: return 24; case TQ_Q8_0: return 34; case TQ_IQ4_NL: return 18;
    case TQ_Q2_K: return 84; case TQ_Q3_K: return 110; case TQ_Q4_K: case TQ_Q4_K_R: return 144;
    case TQ_Q5_K: return 176; case TQ_Q6_K: case TQ_Q6_K_R: return 210; case TQ_IQ4_XS: return 136;
    default: return 0;
    }
}
static inline int tq_act_kind(int t) {
    switch (t) {
    case TQ_F32: case TQ_F16: case TQ_BF16: return TQ_ACT_F32;
    case TQ_Q4_0: case TQ_Q4_1: case TQ_Q5_0: case TQ_Q5_1: case TQ_Q8_0: case TQ_IQ4_NL: return TQ_ACT_Q8B;
    default: return TQ_ACT_Q8K;
    }
}

/* the repacked type a file type is rewritten to (-1: none) */
static inline int tq_repacked_of(int t) { return t == TQ_Q4_K ? TQ_Q4_K_R : t == TQ_Q6_K ? TQ_Q6_K_R : -1; }

/* portable IEEE half -> float */
static inline float tq_fp16_to_fp32_soft(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal */
            int e = -1;
            do { ++e; man <<= 1; } while (!(man & 0x400));
            man &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float tq_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t tq_rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t tq_rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

static const int8_t tq_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                           1, 13, 25, 38, 53, 69, 89, 113};

#endif
