/* tramontane.kernels._resample: OpenCV's INTER_CUBIC resize of a uint8 image into float32
 * planes, optionally normalised, in one pass (engine/mistral3/image.py is the caller and keeps
 * the torch path that this must equal bit for bit).
 *
 * The arithmetic is the torch path's, value by value: each horizontal value is
 * (((0 + p0*w0) + p1*w1) + p2*w2) + p3*w3 in float32 with p the uint8 pixel, each output value
 * the same sum over four horizontal values, then ((v / 255) - mean) / std. setup.py compiles
 * with -ffp-contract=off, so no product is fused into an add and the roundings stay those.
 * Horizontal rows are made once, when an output row first needs them, into a ring of four
 * (an output row reads four consecutive picked rows, and the rows only move forward), so the
 * working memory is 4 rows of the output's width whatever the source's size.
 * Pointers come as Python ints (tensor.data_ptr()); the Python wrapper checks shapes; the
 * indices are checked here, since a bad one would read outside the source.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* x86-64 Linux: an AVX2 and an AVX-512 copy of the loops beside the baseline one, picked at
 * load by the CPU (same arithmetic in each: contraction is off, so no FMA). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define VARIANTS __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define VARIANTS
#endif
#if defined(__GNUC__)
typedef float v4f __attribute__((vector_size(16)));
#endif

/* one source row -> ch planes of `width` horizontal values; `row_f` is scratch for the row
 * as float32 (src_w * ch + 1 values) */
VARIANTS
static void horizontal_row(const uint8_t *row, int64_t src_w, int ch, int64_t width, const int32_t *x_idx,
                           const float *x_w, float *row_f, float *dst) {
#if defined(__GNUC__)
    if (ch == 3) {  /* the common case: a pixel's 3 channels as the first lanes of a 4-float vector */
        for (int64_t j = 0; j < 3 * src_w; j++) row_f[j] = (float)row[j];
        row_f[3 * src_w] = 0.0f;  /* the 4th lane of the last pixel */
        float *d0 = dst, *d1 = dst + width, *d2 = dst + 2 * width;
        for (int64_t dx = 0; dx < width; dx++) {
            const int32_t *i = x_idx + 4 * dx;
            const float *w = x_w + 4 * dx;
            v4f p0, p1, p2, p3;
            memcpy(&p0, row_f + 3 * (int64_t)i[0], 16);
            memcpy(&p1, row_f + 3 * (int64_t)i[1], 16);
            memcpy(&p2, row_f + 3 * (int64_t)i[2], 16);
            memcpy(&p3, row_f + 3 * (int64_t)i[3], 16);
            v4f s = {0.0f, 0.0f, 0.0f, 0.0f};
            s += p0 * w[0];
            s += p1 * w[1];
            s += p2 * w[2];
            s += p3 * w[3];
            d0[dx] = s[0]; d1[dx] = s[1]; d2[dx] = s[2];
        }
        return;
    }
#else
    (void)row_f; (void)src_w;
#endif
    for (int c = 0; c < ch; c++) {
        float *d = dst + c * width;
        for (int64_t dx = 0; dx < width; dx++) {
            const int32_t *i = x_idx + 4 * dx;
            const float *w = x_w + 4 * dx;
            float s = 0.0f;
            for (int k = 0; k < 4; k++) s += (float)row[(int64_t)ch * i[k] + c] * w[k];
            d[dx] = s;
        }
    }
}

/* one output plane row: the four horizontal rows' weighted sum, then normalised if m/q given */
VARIANTS
static void vertical_row(const float *a, const float *b, const float *e, const float *f, float w0, float w1,
                         float w2, float w3, int64_t width, const float *m, const float *q, float *d) {
    if (m) {  /* normalised in the same loop: one pass over the row */
        const float mv = *m, qv = *q;
        for (int64_t dx = 0; dx < width; dx++) {
            float v = 0.0f;
            v += a[dx] * w0;
            v += b[dx] * w1;
            v += e[dx] * w2;
            v += f[dx] * w3;
            d[dx] = (v / 255.0f - mv) / qv;
        }
        return;
    }
    for (int64_t dx = 0; dx < width; dx++) {
        float v = 0.0f;
        v += a[dx] * w0;
        v += b[dx] * w1;
        v += e[dx] * w2;
        v += f[dx] * w3;
        d[dx] = v;
    }
}

/* A same-size axis: its taps weigh (0, 1, 0, 0) with the middle one at the position itself,
 * so the sum above is exactly the value it reads ((0 + v*0) + v*1 + ... = v: the sums never
 * make -0), and the loops can copy instead. */
static int is_identity(const int32_t *idx, const float *w, int64_t n, int64_t src_len) {
    if (n != src_len) return 0;
    for (int64_t d = 0; d < n; d++)
        if (idx[4 * d + 1] != d || w[4 * d] != 0.0f || w[4 * d + 1] != 1.0f || w[4 * d + 2] != 0.0f ||
            w[4 * d + 3] != 0.0f)
            return 0;
    return 1;
}

/* a same-width row: the pixels as float32 planes */
VARIANTS
static void identity_row(const uint8_t *row, int ch, int64_t width, float *dst) {
    for (int c = 0; c < ch; c++)
        for (int64_t dx = 0; dx < width; dx++) dst[c * width + dx] = (float)row[dx * ch + c];
}

/* a same-height output row: the horizontal row itself, normalised if m/q given */
VARIANTS
static void copy_row(const float *a, int64_t width, const float *m, const float *q, float *d) {
    if (m) {
        const float mv = *m, qv = *q;
        for (int64_t dx = 0; dx < width; dx++) d[dx] = (a[dx] / 255.0f - mv) / qv;
        return;
    }
    memcpy(d, a, sizeof(float) * (size_t)width);
}

static int check_indices(const int32_t *idx, int64_t n, int64_t limit) {
    for (int64_t j = 0; j < n; j++)
        if (idx[j] < 0 || idx[j] >= limit) return -1;
    return 0;
}

static int get_ptr(PyObject *o, void **p) {
    *p = PyLong_AsVoidPtr(o);
    return (*p == NULL && PyErr_Occurred()) ? -1 : 0;
}

static int get_i64(PyObject *o, int64_t *v) {
    long long x = PyLong_AsLongLong(o);
    if (x == -1 && PyErr_Occurred()) return -1;
    *v = x;
    return 0;
}

/* OpenCV's INTER_CUBIC taps on one axis, as engine/mistral3/image.py's _cubic_taps computes
 * them with numpy (the same float32 operations in the same order); returns 1 when the taps
 * read every source position. */
static int cubic_taps(int64_t src_len, int64_t dst_len, int32_t *idx, float *w) {
    const float A = -0.75f;  /* Keys' a, cv2's INTER_CUBIC */
    const double scale = 1.0 / ((double)dst_len / (double)src_len);
    int all_used = 1;
    int64_t next = 0;  /* the first source position no tap has read yet */
    for (int64_t d = 0; d < dst_len; d++) {
        float fx = (float)(((double)d + 0.5) * scale - 0.5);
        float sx = floorf(fx);
        float x = fx - sx;
        float xp = x + 1.0f, xm = 1.0f - x;
        float c0 = ((A * xp - 5.0f * A) * xp + 8.0f * A) * xp - 4.0f * A;
        float c1 = ((A + 2.0f) * x - (A + 3.0f)) * x * x + 1.0f;
        float c2 = ((A + 2.0f) * xm - (A + 3.0f)) * xm * xm + 1.0f;
        float c3 = 1.0f - c0 - c1 - c2;
        w[4 * d] = c0; w[4 * d + 1] = c1; w[4 * d + 2] = c2; w[4 * d + 3] = c3;
        int64_t base = (int64_t)sx - 1;
        for (int k = 0; k < 4; k++) {
            int64_t i = base + k;
            i = i < 0 ? 0 : (i > src_len - 1 ? src_len - 1 : i);
            idx[4 * d + k] = (int32_t)i;
            if (i > next) all_used = 0;
            if (i == next) next = i + 1;
        }
    }
    return all_used && next == src_len;
}

PyDoc_STRVAR(taps_doc,
"taps(src_len, dst_len, idx, w) -> bool\n\n"
"Fills idx (int32 (dst_len, 4)) and w (float32 (dst_len, 4)) with INTER_CUBIC's source\n"
"positions and weights; True when every source position is read.");

static PyObject *py_taps(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "taps() takes 4 arguments");
        return NULL;
    }
    int64_t src_len, dst_len;
    void *idx, *w;
    if (get_i64(args[0], &src_len) || get_i64(args[1], &dst_len) || get_ptr(args[2], &idx) || get_ptr(args[3], &w))
        return NULL;
    if (src_len < 1 || dst_len < 1 || src_len > INT32_MAX || !idx || !w) {
        PyErr_SetString(PyExc_ValueError, "taps(): bad sizes or null pointers");
        return NULL;
    }
    return PyBool_FromLong(cubic_taps(src_len, dst_len, idx, w));
}

PyDoc_STRVAR(cubic_doc,
"cubic(src, src_h, src_w, ch, x_idx, x_w, width, y_idx, y_w, height, out, mean, std)\n\n"
"src: uint8 (src_h, src_w, ch); x_idx/x_w: int32/float32 (width, 4) column taps; y_idx/y_w:\n"
"(height, 4) row taps; out: float32 (ch, height, width); mean, std: float32 (ch,) or 0 for\n"
"no normalisation. All pointers (data_ptr()) to C-contiguous memory.");

static PyObject *py_cubic(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "cubic() takes 13 arguments");
        return NULL;
    }
    void *src, *x_idx, *x_w, *y_idx, *y_w, *out, *mean, *std;
    int64_t src_h, src_w, ch, width, height;
    if (get_ptr(args[0], &src) || get_i64(args[1], &src_h) || get_i64(args[2], &src_w) ||
        get_i64(args[3], &ch) || get_ptr(args[4], &x_idx) || get_ptr(args[5], &x_w) ||
        get_i64(args[6], &width) || get_ptr(args[7], &y_idx) || get_ptr(args[8], &y_w) ||
        get_i64(args[9], &height) || get_ptr(args[10], &out))
        return NULL;
    mean = PyLong_AsVoidPtr(args[11]);
    if (PyErr_Occurred()) return NULL;
    std = PyLong_AsVoidPtr(args[12]);
    if (PyErr_Occurred()) return NULL;
    if (src_h < 1 || src_w < 1 || ch < 1 || ch > 4 || width < 1 || height < 1 || !src || !x_idx ||
        !x_w || !y_idx || !y_w || !out || (mean == NULL) != (std == NULL)) {
        PyErr_SetString(PyExc_ValueError, "cubic(): bad sizes or null pointers");
        return NULL;
    }
    if (check_indices(x_idx, 4 * width, src_w) || check_indices(y_idx, 4 * height, src_h)) {
        PyErr_SetString(PyExc_ValueError, "cubic(): a tap index is outside the source");
        return NULL;
    }
    float *ring = malloc(sizeof(float) * 4 * (size_t)ch * (size_t)width);
    float *row_f = malloc(sizeof(float) * ((size_t)src_w * (size_t)ch + 1));
    if (!ring || !row_f) {
        free(ring);
        free(row_f);
        return PyErr_NoMemory();
    }
    int64_t tag[4] = {-1, -1, -1, -1};  /* the source row each ring slot holds */
    const uint8_t *s = src;
    const int32_t *yi = y_idx;
    const float *yw = y_w, *mn = mean, *sd = std;
    float *o = out;
    int c_n = (int)ch;
    const int same_w = is_identity(x_idx, x_w, width, src_w), same_h = is_identity(y_idx, y_w, height, src_h);

    Py_BEGIN_ALLOW_THREADS
    for (int64_t dy = 0; dy < height; dy++) {
        const float *h[4];
        for (int k = 0; k < 4; k++) {
            int64_t r = yi[4 * dy + k];
            float *slot = ring + (size_t)(r & 3) * (size_t)ch * (size_t)width;
            if (tag[r & 3] != r) {
                if (same_w)
                    identity_row(s + r * src_w * ch, c_n, width, slot);
                else
                    horizontal_row(s + r * src_w * ch, src_w, c_n, width, x_idx, x_w, row_f, slot);
                tag[r & 3] = r;
            }
            h[k] = slot;
        }
        const float *w = yw + 4 * dy;
        if (same_h) {  /* h[1] is row dy */
            for (int c = 0; c < c_n; c++)
                copy_row(h[1] + c * width, width, mn ? mn + c : NULL, mn ? sd + c : NULL,
                         o + ((int64_t)c * height + dy) * width);
            continue;
        }
        for (int c = 0; c < c_n; c++)
            vertical_row(h[0] + c * width, h[1] + c * width, h[2] + c * width, h[3] + c * width, w[0], w[1],
                         w[2], w[3], width, mn ? mn + c : NULL, mn ? sd + c : NULL,
                         o + ((int64_t)c * height + dy) * width);
    }
    Py_END_ALLOW_THREADS
    free(ring);
    free(row_f);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"cubic", (PyCFunction)(void (*)(void))py_cubic, METH_FASTCALL, cubic_doc},
    {"taps", (PyCFunction)(void (*)(void))py_taps, METH_FASTCALL, taps_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_resample",
                                    "OpenCV INTER_CUBIC resize of uint8 images into float32 planes.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__resample(void) { return PyModule_Create(&module); }
