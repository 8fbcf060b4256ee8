/* tramontane.kernels._cpu: quantized matmuls on GGUF blocks for the CPU.
 *
 * - kernel variant chosen once at import from the CPU's features: x86-64 (cpuid) avx512vnni,
 *   avx2, generic; aarch64 (the OS's hwcaps) neondot, neon (generic is never needed there);
 *   use_variant() overrides (TRAMONTANE_CPU_VARIANT through kernels/cpu_native.py; tests run them all).
 * - a persistent thread pool: workers spin briefly between calls (decode issues ~60 matmuls
 *   per token back to back), then sleep on a condition variable.
 * - every call releases the GIL; calls from several Python threads are serialized here.
 * Pointers are passed as Python ints (tensor.data_ptr()); the Python wrapper checks shapes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>
#if defined(__linux__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "runtime.h"

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

/* the optional last argument of the KV-cache calls: the caches' element size, 4 (float32, the
 * default) or 2 (binary16) -> *f16; -1 with an exception set otherwise */
static int get_kv_f16(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t base, const char *name, int *f16) {
    Py_ssize_t size = 4;
    if (nargs > base && get_ssize(args[base], &size)) return -1;
    if (size != 4 && size != 2) {
        PyErr_Format(PyExc_ValueError, "%s: KV element size must be 4 (float32) or 2 (float16), got %zd", name, size);
        return -1;
    }
    *f16 = size == 2;
    return 0;
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

/* The paged tail of the KV-cache calls: table_ptr (int32), table_len, block_rows, k_block, v_block (the
 * pools' block strides in elements), n_blocks -> *b. Absent (nargs == base): the contiguous cache, which
 * is a pool of one block. -1 with an exception set when the sizes do not fit. */
static int get_blocks(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t base, const char *name, tq_kv_blocks *b,
                      Py_ssize_t *table_len, Py_ssize_t *n_blocks) {
    *b = TQ_ONE_BLOCK;
    *table_len = 1;
    *n_blocks = 1;
    if (nargs <= base) return 0;
    void *t;
    Py_ssize_t s[5];
    if (get_ptr(args[base], &t)) return -1;
    for (int i = 0; i < 5; ++i)
        if (get_ssize(args[base + 1 + i], &s[i])) return -1;
    if (!t || s[0] < 1 || s[1] < 1 || s[1] > INT32_MAX || s[2] < 0 || s[3] < 0 || s[4] < 1 || s[4] > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: null block table or inconsistent block sizes", name);
        return -1;
    }
    b->table = (const int32_t *)t;
    b->rows = (int)s[1];
    b->k_block = (size_t)s[2];
    b->v_block = (size_t)s[3];
    *table_len = s[0];
    *n_blocks = s[4];
    return 0;
}

/* positions [0, n_pos) of a table: within it, and every entry they use a block of the pool (the kernels
 * trust the table); -1 with ValueError otherwise */
static int check_table(const tq_kv_blocks *b, Py_ssize_t table_len, Py_ssize_t n_blocks, Py_ssize_t n_pos,
                       const char *name) {
    if (n_pos <= 0) return 0;
    const Py_ssize_t used = (n_pos - 1) / b->rows + 1;
    if (used > table_len) {
        PyErr_Format(PyExc_ValueError, "%s: position %zd is past a block table of %zd blocks of %d", name, n_pos - 1,
                     table_len, b->rows);
        return -1;
    }
    for (Py_ssize_t i = 0; i < used; ++i)
        if (b->table[i] < 0 || b->table[i] >= n_blocks) {
            PyErr_Format(PyExc_ValueError, "%s: block table entry %zd is %d, not a block of the pool's %zd", name, i,
                         (int)b->table[i], n_blocks);
            return -1;
        }
    return 0;
}

PyDoc_STRVAR(rope_kv_doc,
             "rope_kv(q, k, v, cos_q, sin_q, cos_k, sin_k, k_cache, v_cache, T, Hq, Hkv, d, dv, pos, q_row, k_row, "
             "v_row, kc_head, kc_row, vc_head, vc_row[, kv_elem_size[, table, table_len, block_rows, k_block, "
             "v_block, n_blocks]])\n"
             "Pointers then sizes, strides in floats. For each row t < T: q[t] (Hq heads of d) rotated in place with "
             "tables row t (as rope_pairs); k[t] rotated into k_cache[h, pos + t]; v[t] copied to v_cache[h, pos + t]. "
             "kv_elem_size 4 (default): float32 caches; 2: float16 caches (rounded to nearest even), cache strides in "
             "elements. The paged tail: the caches are pools of blocks (strides k_block / v_block), position p at row "
             "p % block_rows of block table[p // block_rows] (int32).");

/* rope_kv's 22 arguments (and its optional tail from 22 on) into its job; -1 with an exception set when
 * they do not fit */
static int parse_rope_kv(PyObject *const *args, Py_ssize_t nargs, rkv_job *J) {
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
                 (const float *)p[5], (const float *)p[6], p[7], p[8], (int)s[0], (int)s[1],
                 (int)s[2], (int)s[3], (int)s[4], 1, (size_t)s[6], (size_t)s[7], (size_t)s[8], (size_t)s[9],
                 (size_t)s[10], (size_t)s[11], (size_t)s[12], s[5], 0, TQ_ONE_BLOCK, NULL, 0};
    j.n_units = pool_units(j.T, (Py_ssize_t)(j.hq + 2 * j.hkv) * j.d);
    Py_ssize_t table_len, n_blocks;
    if (get_kv_f16(args, nargs, 22, "rope_kv", &j.kv_f16) ||
        get_blocks(args, nargs, 23, "rope_kv", &j.blocks, &table_len, &n_blocks) ||
        check_table(&j.blocks, table_len, n_blocks, j.pos + j.T, "rope_kv"))
        return -1;
    *J = j;
    return 0;
}

static PyObject *py_rope_kv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 22 && nargs != 23 && nargs != 29) {
        PyErr_SetString(PyExc_TypeError, "rope_kv takes 22, 23 or 29 arguments");
        return NULL;
    }
    rkv_job J;
    if (parse_rope_kv(args, nargs, &J)) return NULL;
    if (J.T == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    pool_for(unit_rope_kv, &J, J.n_units);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* the attention job of q rows (row stride q_row) over the caches: s = n_heads, n_kv, d, dv, q_row, out_row,
 * k_head, k_row, v_head, v_row; the caller sets T, start and the blocks */
static ac_job attend_job(void *const p[4], const Py_ssize_t s[10], double scale, int kv_f16) {
    ac_job J;
    memset(&J, 0, sizeof(J));
    J.q = (const float *)p[0];
    J.k = p[1];
    J.v = p[2];
    J.out = (float *)p[3];
    J.n_kv = (int)s[1];
    J.n_rep = (int)(s[0] / s[1]);
    J.d = (int)s[2];
    J.dv = (int)s[3];
    J.q_row = (size_t)s[4];
    J.out_row = (size_t)s[5];
    J.kh = (size_t)s[6];
    J.kr = (size_t)s[7];
    J.vh = (size_t)s[8];
    J.vr = (size_t)s[9];
    J.scale = (float)scale;
    J.kv_f16 = kv_f16;
    J.n_seqs = 1;
    J.blocks = TQ_ONE_BLOCK;
    return J;
}

/* args[0..3] pointers, then n_rows, the 10 sizes of attend_job around `start` when has_start, scale: -1 with
 * an exception set when they do not fit */
static int parse_attend(PyObject *const *args, int has_start, const char *name, void *p[4], Py_ssize_t *n_rows,
                        Py_ssize_t *start, Py_ssize_t s[10], double *scale) {
    Py_ssize_t v[12];
    const int n = 11 + has_start;
    for (int i = 0; i < 4; ++i)
        if (get_ptr(args[i], &p[i])) return -1;
    for (int i = 0; i < n; ++i)
        if (get_ssize(args[4 + i], &v[i])) return -1;
    *scale = PyFloat_AsDouble(args[4 + n]);
    if (*scale == -1.0 && PyErr_Occurred()) return -1;
    *n_rows = v[0];
    *start = has_start ? v[5] : 0;
    for (int i = 0, j = 1; i < 10; ++i, ++j) {
        if (has_start && j == 5) ++j;
        s[i] = v[j];
    }
    int ok = p[0] && p[1] && p[2] && p[3] && s[0] > 0 && s[1] > 0 && s[0] % s[1] == 0 && s[2] > 0 && s[3] > 0;
    for (int i = 0; i < n; ++i) ok = ok && v[i] >= 0 && v[i] <= INT32_MAX;
    if (!ok || *n_rows * s[1] > INT32_MAX || *n_rows + *start > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: inconsistent sizes or null pointers", name);
        return -1;
    }
    return 0;
}

static PyObject *run_attend_released(ac_job *J) {
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    run_attend(J);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (J->failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(attend_causal_doc,
             "attend_causal(q, k_cache, v_cache, out, T, n_heads, n_kv_heads, d, dv, start, q_row, out_row, k_head, "
             "k_row, v_head, v_row, scale[, kv_elem_size[, <rope_kv's paged tail>]])\n"
             "Causal attention of T query rows at positions start..start+T-1 over the cached keys/values "
             "[0, start + t] of each (float32, strides in floats; a row's heads contiguous): query head h reads KV "
             "head h // (n_heads / n_kv_heads). out[t]: (n_heads, dv). The decode step is T = 1. kv_elem_size 2: "
             "float16 caches (converted to float32 as read). The paged tail reads the rows through a block table.");

static PyObject *py_attend_causal(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 17 && nargs != 18 && nargs != 24) {
        PyErr_SetString(PyExc_TypeError, "attend_causal takes 17, 18 or 24 arguments");
        return NULL;
    }
    void *p[4];
    Py_ssize_t T, start, s[10], table_len, n_blocks;
    double scale;
    int kv_f16;
    if (parse_attend(args, 1, "attend_causal", p, &T, &start, s, &scale) ||
        get_kv_f16(args, nargs, 17, "attend_causal", &kv_f16))
        return NULL;
    ac_job J = attend_job(p, s, scale, kv_f16);
    J.T = (int)T;
    J.start = start;
    if (get_blocks(args, nargs, 18, "attend_causal", &J.blocks, &table_len, &n_blocks) ||
        check_table(&J.blocks, table_len, n_blocks, start + T, "attend_causal"))
        return NULL;
    if (T == 0) Py_RETURN_NONE;
    return run_attend_released(&J);
}

PyDoc_STRVAR(attend_rows_doc,
             "attend_rows(q, k_pool, v_pool, out, R, n_heads, n_kv_heads, d, dv, q_row, out_row, k_head, k_row, "
             "v_head, v_row, scale, kv_elem_size, tables, table_len, block_rows, k_block, v_block, n_blocks, "
             "positions[, k, v, cos_q, sin_q, cos_k, sin_k, k_row_in, v_row_in])\n"
             "Decode attention of R independent rows: row r (its query at q + r * q_row) at position positions[r] "
             "(int32) attends to its positions [0, positions[r]] read through its block table (tables + r * "
             "table_len, int32); a negative position is a padding row: zeros, nothing read. With the rope tail, "
             "first rope_kv of each row at its own position (q rotated in place, k/v written through its table; "
             "tables rows r of R).");

static PyObject *py_attend_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 24 && nargs != 32) {
        PyErr_SetString(PyExc_TypeError, "attend_rows takes 24 or 32 arguments");
        return NULL;
    }
    void *p[4], *pos_p, *r[6];
    Py_ssize_t R, unused, s[10], table_len, n_blocks, rows_in[2] = {0, 0};
    double scale;
    int kv_f16;
    if (parse_attend(args, 0, "attend_rows", p, &R, &unused, s, &scale) ||
        get_kv_f16(args, nargs, 16, "attend_rows", &kv_f16) || get_ptr(args[23], &pos_p))
        return NULL;
    ac_job J = attend_job(p, s, scale, kv_f16);
    if (get_blocks(args, nargs, 17, "attend_rows", &J.blocks, &table_len, &n_blocks)) return NULL;
    if (!pos_p) {
        PyErr_SetString(PyExc_ValueError, "attend_rows: null positions");
        return NULL;
    }
    J.T = 1;
    J.n_seqs = (int)R;
    J.positions = (const int32_t *)pos_p;
    J.table_row = (size_t)table_len;
    for (Py_ssize_t i = 0; i < R; ++i) {
        tq_kv_blocks b = J.blocks;
        b.table += (size_t)i * J.table_row;
        if (check_table(&b, table_len, n_blocks, (Py_ssize_t)J.positions[i] + 1, "attend_rows")) return NULL;
    }
    rkv_job W;
    const int rope = nargs == 32;
    if (rope) {
        for (int i = 0; i < 6; ++i)
            if (get_ptr(args[24 + i], &r[i])) return NULL;
        for (int i = 0; i < 2; ++i)
            if (get_ssize(args[30 + i], &rows_in[i])) return NULL;
        int ok = s[2] % 2 == 0 && rows_in[0] >= 0 && rows_in[1] >= 0;
        for (int i = 0; i < 6; ++i) ok = ok && r[i];
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "attend_rows: inconsistent rope sizes or null pointers");
            return NULL;
        }
        rkv_job w = {(float *)J.q, (const float *)r[0], (const float *)r[1], (const float *)r[2], (const float *)r[3],
                     (const float *)r[4], (const float *)r[5], (void *)J.k, (void *)J.v, (int)R,
                     J.n_kv * J.n_rep, J.n_kv, J.d, J.dv, 1, J.q_row, (size_t)rows_in[0], (size_t)rows_in[1], J.kh,
                     J.kr, J.vh, J.vr, 0, kv_f16, J.blocks, J.positions, J.table_row};
        w.n_units = pool_units(w.T, (Py_ssize_t)(w.hq + 2 * w.hkv) * w.d);
        W = w;
    }
    if (R == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    if (rope) pool_for(unit_rope_kv, &W, W.n_units);
    run_attend(&J);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (J.failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(rope_kv_attend_doc,
             "rope_kv_attend(<rope_kv's 22 arguments>, out_ptr, scale[, kv_elem_size[, <rope_kv's paged tail>]])\n"
             "rope_kv, then attend_causal of the rotated q over the caches (out: T rows of Hq * dv floats): a "
             "layer's attention before its output projection, one call.");

static PyObject *py_rope_kv_attend(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 24 && nargs != 25 && nargs != 31) {
        PyErr_SetString(PyExc_TypeError, "rope_kv_attend takes 24, 25 or 31 arguments");
        return NULL;
    }
    /* rope_kv's tail sits two arguments later here (after out_ptr and scale): parse it apart */
    PyObject *head[29];
    for (int i = 0; i < 22; ++i) head[i] = args[i];
    for (Py_ssize_t i = 24; i < nargs; ++i) head[i - 2] = args[i];
    rkv_job R;
    void *out;
    if (parse_rope_kv(head, nargs - 2, &R) || get_ptr(args[22], &out)) return NULL;
    double scale = PyFloat_AsDouble(args[23]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
    if (!out || R.hq % R.hkv) {
        PyErr_SetString(PyExc_ValueError, "rope_kv_attend: null output or heads not a multiple of the KV heads");
        return NULL;
    }
    if (R.T == 0) Py_RETURN_NONE;
    ac_job A = {R.q, R.kc, R.vc, (float *)out, R.T, R.hkv, R.hq / R.hkv, R.d, R.dv, R.q_row, (size_t)R.hq * R.dv,
                R.kh, R.kr, R.vh, R.vr, R.pos, (float)scale, 0, R.kv_f16, R.blocks, NULL, 0, 1};
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    pool_for(unit_rope_kv, &R, R.n_units);
    run_attend(&A);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    if (A.failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
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
                pool_units(rows, n)};
    if (rows == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    pool_for(unit_swiglu, &J, J.n_units);
    UNLOCK_CALLS();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
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
    idx = K->argmax((const float *)x, n, &nan);
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
        sw_job S = {jobs[0].y, jobs[1].y, (float *)out, n_x, n, (size_t)n, (size_t)n, (size_t)n, pool_units(n_x, n)};
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

PyDoc_STRVAR(decode_layers_doc,
             "decode_layers(table_ptr, n_layers, x_ptr, pos, cos_q, sin_q, cos_k, sin_k, hidden, n_heads, n_kv_heads, "
             "d, dv, ffn, eps, scale[, kv_elem_size[, block_table, table_len, block_rows, n_blocks]])\n"
             "One token's hidden row (float32, in place) through n_layers pre-norm layers whose pointers are the "
             "int64 table's rows (cpu_native.DecodeLayers builds and checks it; the kernel trusts it). Tables: the "
             "RoPE rows of position pos (d floats each). The paged tail: every layer's caches are pools of "
             "n_blocks blocks of block_rows rows (block strides in the layer rows), read and written through the "
             "sequence's int32 block table.");

static PyObject *py_decode_layers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 16 && nargs != 17 && nargs != 21) {
        PyErr_SetString(PyExc_TypeError, "decode_layers takes 16, 17 or 21 arguments");
        return NULL;
    }
    int kv_f16;
    if (get_kv_f16(args, nargs, 16, "decode_layers", &kv_f16)) return NULL;
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
    tq_kv_blocks blocks = TQ_ONE_BLOCK;
    if (nargs == 21) {
        void *t;
        Py_ssize_t b[3];
        if (get_ptr(args[17], &t)) return NULL;
        for (int i = 0; i < 3; ++i)
            if (get_ssize(args[18 + i], &b[i])) return NULL;
        if (!t || b[0] < 1 || b[1] < 1 || b[1] > INT32_MAX || b[2] < 1) {
            PyErr_SetString(PyExc_ValueError, "decode_layers: null block table or inconsistent block sizes");
            return NULL;
        }
        blocks.table = (const int32_t *)t;
        blocks.rows = (int)b[1];
        if (check_table(&blocks, b[0], b[2], pos + 1, "decode_layers")) return NULL;
    }
    const float *tab[4] = {(const float *)p[2], (const float *)p[3], (const float *)p[4], (const float *)p[5]};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    LOCK_CALLS();
    rc = run_decode_layers((const int64_t *)p[0], (int)n_layers, (float *)p[1], pos, tab, (int)s[0], (int)s[1],
                           (int)s[2], (int)s[3], (int)s[4], (int)s[5], (float)eps, (float)scale, kv_f16, blocks);
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
    rc = set_pool_threads((int)n);
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
    return PyBool_FromLong(cpu_has(name, (size_t)len));
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
    Py_BEGIN_ALLOW_THREADS LOCK_CALLS();
    repack_rows(K->repack[type], (const uint8_t *)src, (size_t)src_stride, (int)n_rows, (int)(k / 256), (uint8_t *)dst,
                (size_t)dst_stride);
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
    {"attend_rows", (PyCFunction)(void (*)(void))py_attend_rows, METH_FASTCALL, attend_rows_doc},
    {"swiglu", (PyCFunction)(void (*)(void))py_swiglu, METH_FASTCALL, swiglu_doc},
    {"dequantize_rows", (PyCFunction)(void (*)(void))py_dequantize_rows, METH_FASTCALL, dequantize_rows_doc},
    {"argmax", (PyCFunction)(void (*)(void))py_argmax, METH_FASTCALL, argmax_doc},
    {"matmuls", (PyCFunction)(void (*)(void))py_matmuls, METH_FASTCALL, matmuls_doc},
    {"norm_matmuls", (PyCFunction)(void (*)(void))py_norm_matmuls, METH_FASTCALL, norm_matmuls_doc},
    {"matmul_add", (PyCFunction)(void (*)(void))py_matmul_add, METH_FASTCALL, matmul_add_doc},
    {"norm_swiglu", (PyCFunction)(void (*)(void))py_norm_swiglu, METH_FASTCALL, norm_swiglu_doc},
    {"set_threads", py_set_threads, METH_O, "set_threads(n): worker threads (the caller included)."},
    {"threads", py_threads, METH_NOARGS, "threads(): the current thread count."},
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
    select_startup_variant();
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    PyModule_AddIntConstant(m, "Q8K_BLOCK_BYTES", (long)sizeof(tq_q8k));
    PyModule_AddIntConstant(m, "Q8B_BLOCK_BYTES", (long)sizeof(tq_q8b));
    PyModule_AddIntConstant(m, "NARROW_MAX_ROWS", TQ_NARROW_MAX_ROWS);
    return m;
}
