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

#include <stdint.h>
#include <stdlib.h>

/* one source row -> ch planes of `width` horizontal values */
static void horizontal_row(const uint8_t *row, int ch, int64_t width, const int32_t *x_idx,
                           const float *x_w, float *dst) {
    if (ch == 3) {  /* the common case, with the channel loop unrolled */
        float *d0 = dst, *d1 = dst + width, *d2 = dst + 2 * width;
        for (int64_t dx = 0; dx < width; dx++) {
            const int32_t *i = x_idx + 4 * dx;
            const float *w = x_w + 4 * dx;
            const uint8_t *p0 = row + 3 * (int64_t)i[0], *p1 = row + 3 * (int64_t)i[1];
            const uint8_t *p2 = row + 3 * (int64_t)i[2], *p3 = row + 3 * (int64_t)i[3];
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f;
            s0 += (float)p0[0] * w[0]; s1 += (float)p0[1] * w[0]; s2 += (float)p0[2] * w[0];
            s0 += (float)p1[0] * w[1]; s1 += (float)p1[1] * w[1]; s2 += (float)p1[2] * w[1];
            s0 += (float)p2[0] * w[2]; s1 += (float)p2[1] * w[2]; s2 += (float)p2[2] * w[2];
            s0 += (float)p3[0] * w[3]; s1 += (float)p3[1] * w[3]; s2 += (float)p3[2] * w[3];
            d0[dx] = s0; d1[dx] = s1; d2[dx] = s2;
        }
        return;
    }
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
    if (!ring) return PyErr_NoMemory();
    int64_t tag[4] = {-1, -1, -1, -1};  /* the source row each ring slot holds */
    const uint8_t *s = src;
    const int32_t *yi = y_idx;
    const float *yw = y_w, *mn = mean, *sd = std;
    float *o = out;
    int c_n = (int)ch;

    Py_BEGIN_ALLOW_THREADS
    for (int64_t dy = 0; dy < height; dy++) {
        const float *h[4];
        for (int k = 0; k < 4; k++) {
            int64_t r = yi[4 * dy + k];
            float *slot = ring + (size_t)(r & 3) * (size_t)ch * (size_t)width;
            if (tag[r & 3] != r) {
                horizontal_row(s + r * src_w * ch, c_n, width, x_idx, x_w, slot);
                tag[r & 3] = r;
            }
            h[k] = slot;
        }
        const float w0 = yw[4 * dy], w1 = yw[4 * dy + 1], w2 = yw[4 * dy + 2], w3 = yw[4 * dy + 3];
        for (int c = 0; c < c_n; c++) {
            const float *a = h[0] + c * width, *b = h[1] + c * width;
            const float *e = h[2] + c * width, *f = h[3] + c * width;
            float *d = o + ((int64_t)c * height + dy) * width;
            for (int64_t dx = 0; dx < width; dx++) {
                float v = 0.0f;
                v += a[dx] * w0;
                v += b[dx] * w1;
                v += e[dx] * w2;
                v += f[dx] * w3;
                d[dx] = v;
            }
            if (mn) {
                const float m = mn[c], q = sd[c];
                for (int64_t dx = 0; dx < width; dx++) d[dx] = (d[dx] / 255.0f - m) / q;
            }
        }
    }
    Py_END_ALLOW_THREADS
    free(ring);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"cubic", (PyCFunction)(void (*)(void))py_cubic, METH_FASTCALL, cubic_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_resample",
                                    "OpenCV INTER_CUBIC resize of uint8 images into float32 planes.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__resample(void) { return PyModule_Create(&module); }
