/* The window mode's gather: whole T-token rows of one token buffer (the rule: the numpy path of
 * streambatch.items.windows.gather.RowGather, which tests/items/test_window_gather.py checks this kernel against).
 *
 * WindowGatherer(tokens, T[, bits])
 *     holds a read-only view of the tokens (uint16 or uint32, C-contiguous; made once per store and T), and of
 *     the store's loss-mask bits (uint8, one bit per token) when given;
 * WindowGatherer.gather_counted(rows[, next])
 *     (inputs, targets, count): gather's arrays and the set bits of every row's targets (copy_windows: each long row
 *     counted after its copy, short rows in a pass before): a masked batch's token_count, its mask made on first use;
 * WindowGatherer.gather(rows[, next])
 *     returns (inputs, targets), new C-contiguous (w, T) arrays in the tokens' dtype: row i of inputs is
 *     tokens[p : p + T] and of targets tokens[p + 1 : p + T + 1], p = rows[i] (int64).  Every p is checked first
 *     (0 <= p < len(tokens) - T, else IndexError naming the row; nothing is read).  One pass: per row (per 1 KB
 *     chunk of a longer row) two memcpy (the targets' source is in L1 after the inputs' copy), the sources asked
 *     for ahead (copy_windows), and on into next (int64, or None: the next batch's rows, a hint only: asked
 *     for as this copy ends, ignored where any lies outside the window starts, never read for the result); the
 *     GIL is released while filling large batches.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_buffers.h"
#include "_gather.h"

#ifndef WINDOW_AHEAD
#define WINDOW_AHEAD 16 /* rows: a row's tokens are read from memory while the ones before it are copied */
#endif

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int held;
    Py_buffer bits;    /* the loss mask, one bit per token (held when has_bits): gather_counted counts its targets */
    int has_bits;
    int type;          /* NPY_UINT16 or NPY_UINT32: the arrays made */
    size_t itemsize;   /* 2 or 4 */
    int64_t T;
    int64_t records;   /* positions with T + 1 tokens from them: len(tokens) - T (0 when shorter) */
} WindowGatherer;

static void window_release(WindowGatherer *self) {
    release_held(&self->view, &self->held);
    release_held(&self->bits, &self->has_bits);
}

static void window_dealloc(WindowGatherer *self) {
    window_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int window_init(WindowGatherer *self, PyObject *args, PyObject *kwargs) {
    PyObject *tokens, *bits = Py_None;
    long long T;
    int64_t count;
    (void)kwargs;
    window_release(self);
    if (!PyArg_ParseTuple(args, "OL|O", &tokens, &T, &bits)) {
        return -1;
    }
    if (PyObject_GetBuffer(tokens, &self->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    self->held = 1;
    if (!kind_is(&self->view, "HIL", self->view.itemsize) || (self->view.itemsize != 2 && self->view.itemsize != 4)) {
        PyErr_SetString(PyExc_TypeError, "WindowGatherer: tokens must be uint16 or uint32");
        window_release(self);
        return -1;
    }
    if (T < 1 || T >= (1LL << 40)) {
        PyErr_SetString(PyExc_ValueError, "WindowGatherer: T must be a positive context length");
        window_release(self);
        return -1;
    }
    self->itemsize = (size_t)self->view.itemsize;
    self->type = self->itemsize == 2 ? NPY_UINT16 : NPY_UINT32;
    self->T = (int64_t)T;
    count = (int64_t)(self->view.len / self->view.itemsize);
    self->records = count > self->T ? count - self->T : 0;
    if (bits != Py_None) {
        if (PyObject_GetBuffer(bits, &self->bits, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            window_release(self);
            return -1;
        }
        self->has_bits = 1;
        if (!kind_is(&self->bits, "B", 1) || self->bits.len * 8 < count) {
            PyErr_SetString(PyExc_ValueError, "WindowGatherer: bits must be uint8 with one bit per token");
            window_release(self);
            return -1;
        }
    }
    return 0;
}

/* Copy every row; with `bits` (else NULL) count the rows' set target bits: rows under STREAM_CHUNK bytes in a pass
 * of their own first (count_rows: measured 4x cheaper there than counting each row in the copy loop, whose token
 * lines then crowd out the bits' lines), longer rows each after its copy, its bits asked for a row ahead
 * (masked / unmasked gather 0.90-0.99x at T=1024, where the pass of its own gave 0.79-0.85x: a pass of latency-
 * bound reads next to a copy that now streams).  Returns the count (0 without bits).
 *
 * Rows of at least STREAM_CHUNK bytes are copied STREAM_CHUNK bytes at a time (copy_chunk), each chunk's copy
 * after asking for the stream STREAM_AHEAD bytes beyond it: the prefetches spread along the copy keep a steady
 * few lines in flight.  Whole rows asked for WINDOW_AHEAD rows on and copied by memcpy (what shorter rows do)
 * measured 0.62-0.76x the memcpy floor at T=1024 (2 KB rows); this loop 0.88-1.0x (scripts/bench.py).  Rows
 * under 1 KB gain nothing from it (T=128: its bookkeeping and the string copy's start cost more per row). */

static int64_t copy_windows(const WindowGatherer *self, const int64_t *rows, int64_t width, char *inputs, char *targets,
                            const uint8_t *bits, const int64_t *next, int64_t next_width) {
    const char *tokens = (const char *)self->view.buf;
    size_t size = self->itemsize, bytes = (size_t)self->T * size;
    int64_t i, total = 0;
    if (bytes >= STREAM_CHUNK) { /* each row's bits asked for a row ahead, counted after its copy */
        stream_ahead c = {tokens, rows, NULL, NULL, width, 0, size, bytes, 0, 0, 0, next, next_width};
        if (bits != NULL && width > 0) {
            prefetch_bits(bits, rows[0] + 1, self->T);
        }
        for (i = 0; i < width; i++) {
            if (bits != NULL && i + 1 < width) {
                prefetch_bits(bits, rows[i + 1] + 1, self->T);
            }
            copy_piece(&c, inputs + (size_t)i * bytes, targets + (size_t)i * bytes, tokens + rows[i] * (int64_t)size, bytes,
                       0);
            if (bits != NULL) {
                total += count_bits(bits, rows[i] + 1, self->T);
            }
        }
        return total;
    }
    total = bits != NULL ? count_rows(bits, rows, width, self->T) : 0;
    for (i = 0; i < width && i < WINDOW_AHEAD; i++) {
        prefetch_bytes(tokens + rows[i] * (int64_t)size, bytes + size);
    }
    for (i = 0; i < width; i++) {
        const char *source = tokens + rows[i] * (int64_t)size;
        if (i + WINDOW_AHEAD < width) {
            prefetch_bytes(tokens + rows[i + WINDOW_AHEAD] * (int64_t)size, bytes + size);
        } else if (i + WINDOW_AHEAD - width < next_width) { /* the next batch's first rows */
            prefetch_bytes(tokens + next[i + WINDOW_AHEAD - width] * (int64_t)size, bytes + size);
        }
        memcpy(inputs + (size_t)i * bytes, source, bytes);
        memcpy(targets + (size_t)i * bytes, source + size, bytes);
    }
    return total;
}

static PyObject *window_run(WindowGatherer *self, PyObject *const *args, Py_ssize_t nargs, int counted) {
    Py_buffer rows_view, next_view;
    const void *data = NULL;
    const int64_t *rows, *next = NULL;
    int rows_viewed = 0, next_viewed = 0;
    int64_t width = 0, next_width = 0, i;
    PyObject *inputs = NULL, *targets = NULL, *result = NULL;
    const uint8_t *bits = NULL;
    int64_t total = 0;
    if (!self->held) {
        PyErr_SetString(PyExc_ValueError, "WindowGatherer.gather(): not initialised");
        return NULL;
    }
    if (counted && !self->has_bits) {
        PyErr_SetString(PyExc_ValueError, "WindowGatherer.gather_counted(): made without bits");
        return NULL;
    }
    if (counted) {
        bits = (const uint8_t *)self->bits.buf;
    }
    if (nargs != 1 && nargs != 2) {
        PyErr_Format(PyExc_TypeError, "WindowGatherer.gather() takes 1 argument (rows) or 2 (rows, next), got %zd", nargs);
        return NULL;
    }
    if (nargs == 2 && args[1] != Py_None) { /* the next batch's rows: a hint, asked for as this batch's copy ends */
        if (vector_of(args[1], NPY_INT64, "qlQL", 8, "next must be int64", &next_view, &next_viewed, &data,
                      &next_width) < 0) {
            goto done;
        }
        next = (const int64_t *)data;
        for (i = 0; i < next_width; i++) {
            if ((uint64_t)next[i] >= (uint64_t)self->records) { /* a hint outside the tokens: none */
                next_width = 0;
            }
        }
    }
    if (vector_of(args[0], NPY_INT64, "qlQL", 8, "rows must be int64", &rows_view, &rows_viewed, &data, &width) < 0) {
        goto done;
    }
    rows = (const int64_t *)data;
    for (i = 0; i < width; i++) {
        if ((uint64_t)rows[i] >= (uint64_t)self->records) { /* negative: huge */
            PyErr_Format(PyExc_IndexError, "row %lld of the batch starts at position %lld, outside the %lld window starts",
                         (long long)i, (long long)rows[i], (long long)self->records);
            goto done;
        }
    }
    inputs = new_array((npy_intp)width, (npy_intp)self->T, self->type);
    targets = inputs == NULL ? NULL : new_array((npy_intp)width, (npy_intp)self->T, self->type);
    if (targets == NULL) {
        goto done;
    }
    if (width * self->T >= GIL_POSITIONS) {
        Py_BEGIN_ALLOW_THREADS
        total = copy_windows(self, rows, width, (char *)ARRAY_DATA(inputs), (char *)ARRAY_DATA(targets), bits, next, next_width);
        Py_END_ALLOW_THREADS
    } else {
        total = copy_windows(self, rows, width, (char *)ARRAY_DATA(inputs), (char *)ARRAY_DATA(targets), bits, next, next_width);
    }
    if (counted) {
        PyObject *count = PyLong_FromLongLong((long long)total);
        result = count == NULL ? NULL : PyTuple_Pack(3, inputs, targets, count);
        Py_XDECREF(count);
    } else {
        result = PyTuple_Pack(2, inputs, targets);
    }
done:
    Py_XDECREF(inputs);
    Py_XDECREF(targets);
    release_held(&rows_view, &rows_viewed);
    release_held(&next_view, &next_viewed);
    return result;
}

static PyObject *window_gather(WindowGatherer *self, PyObject *const *args, Py_ssize_t nargs) {
    return window_run(self, args, nargs, 0);
}

static PyObject *window_gather_counted(WindowGatherer *self, PyObject *const *args, Py_ssize_t nargs) {
    return window_run(self, args, nargs, 1);
}

static PyMethodDef window_methods[] = {
    FASTCALL_METHOD("gather", window_gather,
        "gather(rows[, next]) -> (inputs, targets): (w, T) arrays of the windows starting at int64 rows (IndexError "
        "outside); next: the next batch's rows, asked for as this copy ends (a hint)"),
    FASTCALL_METHOD("gather_counted", window_gather_counted,
        "gather_counted(rows[, next]) -> (inputs, targets, count): gather's arrays and the set bits of their targets "
        "(made with bits)"),
    {NULL, NULL, 0, NULL},
};

GATHERER_TYPE(WindowGathererType, "WindowGatherer", WindowGatherer, "WindowGatherer(tokens, T)", window_init, window_dealloc,
              window_methods);
