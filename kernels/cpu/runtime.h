/* What the module's C files share (the per-variant kernels see only common.h): the selected
 * variant, the thread pool and its call lock, and the jobs of the matmuls, the attention and the
 * element-wise ops that the Python binding (module.c) and the decode step (decode.c) run. */
#ifndef TQ_RUNTIME_H
#define TQ_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#ifndef _WIN32
#define TQ_THREADS 1
#include <pthread.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(hidden) /* shared by the module's files, exported by none */
#endif

/* ------------------------------------------------------------------------------ dispatch.c */
extern const tq_kernels *K; /* the variant every call runs */
extern const tq_kernels *all_variants[]; /* best first, NULL-terminated */
int variant_supported(const tq_kernels *k);
int select_variant(const char *name);
void select_startup_variant(void);
int cpu_has(const char *name, size_t len);

/* ------------------------------------------------------------------------------ pool.c */
typedef void (*unit_fn)(void *arg, int unit);
extern int n_threads;
void pool_for(unit_fn fn, void *arg, int n_units);
int pool_units(ptrdiff_t rows, ptrdiff_t row_elems);
int set_pool_threads(int n);
#ifdef TQ_THREADS
extern pthread_mutex_t call_mu;
#define LOCK_CALLS() pthread_mutex_lock(&call_mu)
#define UNLOCK_CALLS() pthread_mutex_unlock(&call_mu)
#else
#define LOCK_CALLS() ((void)0)
#define UNLOCK_CALLS() ((void)0)
#endif

/* ------------------------------------------------------------------------------ matmul.c */
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
int run_matmul(mm_job *J);

typedef struct {
    int type;
    const uint8_t *w;
    size_t w_stride;
    int n_rows;
    int64_t k;
    float *out;
} dq_job;

#define DQ_ROWS 16
void unit_dequant(void *arg, int u);
float *get_temp(size_t n_floats);
void release_temp(void);
int run_norm_matmuls(const float *x, const float *nw, float eps, int n_x, int64_t k, mm_job *jobs, int n_w,
                     size_t extra);

/* ------------------------------------------------------------------------------ ops.c */
void rms_norm_pool(const float *x, const float *w, float *o, ptrdiff_t rows, ptrdiff_t n, float eps);
typedef struct {
    const float *g, *u;
    float *out;
    int64_t rows, n;
    size_t g_row, u_row, out_row;
    int n_units;
} sw_job;
void unit_swiglu(void *arg, int unit);

typedef struct {
    int type;
    const uint8_t *w;
    size_t w_stride;
    const int64_t *ids;
    int64_t k;
    float *out;
    int n_ids, n_units;
} gather_job;
void unit_gather(void *arg, int u);

/* ------------------------------------------------------------------------------ attention.c */
/* The caches are pools of blocks (tq_kv_blocks, common.h): kc/vc + block * k_block/v_block + head * kh/vh
 * + row * kr/vr; the contiguous cache (Hkv, capacity, d) is one block (table {0}, rows >= capacity). */
typedef struct {
    float *q;
    const float *k, *v, *cq, *sq, *ck, *sk;
    void *kc, *vc; /* float32, or binary16 where kv_f16 */
    int T, hq, hkv, d, dv, n_units;
    size_t q_row, k_row, v_row, kh, kr, vh, vr; /* strides in elements (floats; the caches' in their own) */
    ptrdiff_t pos;
    int kv_f16; /* 1: the caches hold binary16, written rounded to nearest even */
    tq_kv_blocks blocks; /* blocks.table: the sequence's; with positions, T tables table_row ints apart */
    const int32_t *positions; /* NULL: row t at pos + t; else row t (its own sequence) at positions[t], none if < 0 */
    size_t table_row;
} rkv_job;
void unit_rope_kv(void *arg, int u);

typedef struct {
    const float *q;
    const void *k, *v; /* the caches: float32, or binary16 where kv_f16 */
    float *out;
    int T, n_kv, n_rep, d, dv;
    size_t q_row, out_row, kh, kr, vh, vr;
    ptrdiff_t start;
    float scale;
    int failed; /* a unit could not allocate its scores */
    int kv_f16;
    tq_kv_blocks blocks; /* blocks.table: the sequence's; in a decode of n_seqs rows, row r's is r * table_row on */
    const int32_t *positions; /* decode (T = 1): row r at positions[r] (< 0: a padding row, zeros); NULL: start */
    size_t table_row;
    int n_seqs; /* decode rows (T = 1); 1 otherwise */
} ac_job;
/* the blocks of a contiguous cache: one block of every row */
extern const int32_t tq_one_block[1];
#define TQ_ONE_BLOCK ((tq_kv_blocks){tq_one_block, INT32_MAX, 0, 0})
void run_attend(ac_job *J);

/* ------------------------------------------------------------------------------ decode.c */
/* ------------------------------------------------------------------------------ a decode step's layers
 * One token through a run of layers in one call: per layer the same kernels, in the same order,
 * as norm_matmuls (q, k, v), rope_kv_attend, matmul_add (W_o), norm_swiglu and matmul_add (W_down)
 * (so bit for bit the same hidden row), without a Python round trip between them. The layers'
 * pointers and sizes come from a table of int64 rows that Python builds once per (weights, KV
 * cache) and checks then (cpu_native.DecodeLayers); DL_FIELDS int64 per layer: */
enum {
    DL_ATTN_NORM, DL_FFN_NORM,
    DL_W, /* 7 weights (q, k, v, o, gate, up, down) of 4: ggml type, pointer, row bytes, rows */
    DL_KC = DL_W + 28, DL_VC, DL_KH, DL_KR, DL_VH, DL_VR, /* caches: pointers, head and row strides (elements) */
    DL_KB, DL_VB, /* the caches' block strides (elements; 0 for a contiguous cache) */
    DL_FIELDS
};
/* blocks: the sequence's block table and rows per block (every layer's pools alike; the block strides
 * come from each layer's row), TQ_ONE_BLOCK for contiguous caches */
int run_decode_layers(const int64_t *table, int n_layers, float *x, ptrdiff_t pos, const float *tab[4],
                      int hidden, int hq, int hkv, int d, int dv, int ffn, float eps, float scale, int kv_f16,
                      tq_kv_blocks blocks);

/* ------------------------------------------------------------------------------ repack.c */
void repack_rows(tq_repack_fn fn, const uint8_t *src, size_t src_stride, int n_rows, int nb, uint8_t *dst,
                 size_t dst_stride);

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif
#endif
