/* The window mode's loss-mask bits (streambatch._row_gather.window_mask, window_counts); the loops over the bits,
 * which the packed gather shares, are in _gather.h.
 *
 * window_mask(bits, T, positions)
 *     the window mode's mask: (n, T) bool, row i holding bits [positions[i] + 1, positions[i] + T + 1) of bits
 *     (the targets of the window at flat position positions[i]; numpy: streambatch.model.mask.target_mask).
 * window_counts(bits, T, positions)
 *     the number of set bits among those rows' bits (the mask's sum, no mask made).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_buffers.h"
#include "_gather.h"

/* The set target bits (rows[i] + 1 .. rows[i] + T) of every row, each row's bits asked for MASK_AHEAD rows on. */
int64_t count_rows(const uint8_t *bits, const int64_t *rows, int64_t width, int64_t T) {
    int64_t i, total = 0;
    for (i = 0; i < width && i < MASK_AHEAD; i++) {
        prefetch_bits(bits, rows[i] + 1, T);
    }
    for (i = 0; i < width; i++) {
        if (i + MASK_AHEAD < width) {
            prefetch_bits(bits, rows[i + MASK_AHEAD] + 1, T);
        }
        total += count_bits(bits, rows[i] + 1, T);
    }
    return total;
}

/* Rows of window_mask: each row unpacked while the bits of the row MASK_AHEAD on are fetched (asking for every
 * row's bits first measured slower: the lines were evicted again before their row was unpacked). */
static void unpack_rows(const uint8_t *bits, const int64_t *rows, int64_t width, int64_t T, uint8_t *mask) {
    int64_t i;
    for (i = 0; i < width; i++) {
        if (i + MASK_AHEAD < width) { /* the bits MASK_AHEAD rows on, asked for now */
            prefetch_bits(bits, rows[i + MASK_AHEAD] + 1, T);
        }
        unpack_bits(bits, rows[i] + 1, T, mask + i * T, 0);
    }
}

/* The arguments of window_mask and window_counts, (bits, T, positions), viewed and checked: bits uint8, T >= 0,
 * positions int64 with every row's targets, bits positions[i] + 1 .. positions[i] + T, inside the bits. */
typedef struct {
    Py_buffer bits, rows_view;
    int rows_viewed;
    const int64_t *rows;
    int64_t width, T;
} bit_rows;

static void bit_rows_close(bit_rows *b) {
    release_held(&b->rows_view, &b->rows_viewed);
    PyBuffer_Release(&b->bits);
}

/* 0, or -1 with an error set (and nothing held); `name` names the function in the messages. */
static int bit_rows_open(bit_rows *b, PyObject *const *args, Py_ssize_t nargs, const char *name) {
    const void *data = NULL;
    int64_t i;
    b->rows_viewed = 0;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes 3 arguments (bits, T, positions), got %zd", name, nargs);
        return -1;
    }
    b->T = (int64_t)PyLong_AsLongLong(args[1]);
    if (b->T == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (b->T < 0) {
        PyErr_Format(PyExc_ValueError, "%s(): T must be >= 0", name);
        return -1;
    }
    if (PyObject_GetBuffer(args[0], &b->bits, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (!kind_is(&b->bits, "B", 1)) {
        PyErr_Format(PyExc_TypeError, "%s(): bits must be uint8", name);
        bit_rows_close(b);
        return -1;
    }
    if (vector_of(args[2], NPY_INT64, "qlQL", 8, "positions must be int64", &b->rows_view, &b->rows_viewed, &data,
                  &b->width) < 0) {
        bit_rows_close(b);
        return -1;
    }
    b->rows = (const int64_t *)data;
    for (i = 0; i < b->width; i++) {
        if (b->rows[i] < 0 || b->rows[i] + 1 + b->T > (int64_t)b->bits.len * 8) {
            PyErr_Format(PyExc_ValueError, "%s(): row %lld at position %lld reads past the mask's %lld bits", name,
                         (long long)i, (long long)b->rows[i], (long long)b->bits.len * 8);
            bit_rows_close(b);
            return -1;
        }
    }
    return 0;
}

/* window_mask(bits, T, positions): see the top of this file. */
PyObject *window_mask(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    bit_rows b;
    PyObject *out;
    (void)module;
    if (bit_rows_open(&b, args, nargs, "window_mask") < 0) {
        return NULL;
    }
    out = new_array((npy_intp)b.width, (npy_intp)b.T, NPY_BOOL);
    if (out != NULL) {
        const uint8_t *bits = (const uint8_t *)b.bits.buf;
        uint8_t *mask = (uint8_t *)ARRAY_DATA(out);
        if (b.width * b.T >= GIL_POSITIONS) {
            Py_BEGIN_ALLOW_THREADS
            unpack_rows(bits, b.rows, b.width, b.T, mask);
            Py_END_ALLOW_THREADS
        } else {
            unpack_rows(bits, b.rows, b.width, b.T, mask);
        }
    }
    bit_rows_close(&b);
    return out;
}

/* window_counts(bits, T, positions): the set bits of every row's targets, bits positions[i] + 1 .. positions[i] + T
 * (what sum(window_mask(bits, T, positions)) counts, without making the mask). */
PyObject *window_counts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    bit_rows b;
    int64_t total;
    (void)module;
    if (bit_rows_open(&b, args, nargs, "window_counts") < 0) {
        return NULL;
    }
    total = count_rows((const uint8_t *)b.bits.buf, b.rows, b.width, b.T);
    bit_rows_close(&b);
    return PyLong_FromLongLong((long long)total);
}
