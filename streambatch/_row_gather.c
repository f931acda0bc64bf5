/* Gather packed rows into their final arrays in one pass: the packed mode's emission kernel.
 *
 * The rule is streambatch.stages._pack_gather.gather_segments (its numpy fallback,
 * which tests/test_pack_gather.py checks this kernel against): row r of the
 * packing holds, left to right from position 0, either one full piece (r <
 * full_rows: the r-th full piece in document order, found by a binary search on
 * the running count of full pieces) or the tails tails[offsets[p]:offsets[p+1]]
 * of packed row p = r - full_rows (a tail of document d starts at
 * (L - 1) - (L - 1) % T and has (L - 1) % T targets), then padding to T.
 *
 * Per position it writes inputs and targets (the document's own tokens; pad_id
 * at padding), segment_ids (0, 1, ... per row; -1 at padding), position_ids (0
 * at a segment's or the padding's first position, +1 along), loss_mask (0 at
 * padding), and per sequence (every segment, then each padded row's padding)
 * cu_seqlens over the flattened w * T positions.  A first pass checks every row
 * and finds each full row's source (a branchless binary search: mispredicted
 * jumps cost more than the copy); then each row is filled while the sources
 * of the rows two ahead are prefetched, so the memory reads overlap the writes.
 * Scratch: one int64 per row; the GIL is released while filling.  A packed batch writes 13 bytes per position with uint16
 * tokens (4 for the tokens, 9 for ids and mask) where a window batch writes 4.
 *
 * Gatherer(tokens, starts, lengths, full_docs, full_ends, offsets, tails, T, full_rows, pad_id)
 *     holds read-only buffers of the source and the packing (made once per packing);
 * Gatherer.gather(rows, inputs, targets, segment_ids, position_ids, loss_mask)
 *     fills the five preallocated C-contiguous outputs and returns
 *     (cu_seqlens as a bytearray of int32, target_count, max_seqlen).
 * Gatherer.gather(rows, ..., loss_mask, kinds, sources)
 *     the same for a mixture of packed rows: row i is row rows[i] of source kinds[i] (uint8), read by the
 *     Gatherer sources[kinds[i]] (a tuple of Gatherers of one T, token size and pad id): one pass, as for one source.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { TOKENS, STARTS, LENGTHS, FULL_DOCS, FULL_ENDS, OFFSETS, TAILS, HELD };

typedef struct {
    PyObject_HEAD
    Py_buffer views[HELD];
    int held;
    Py_ssize_t itemsize; /* 2 or 4 */
    int64_t T, full_rows, pad;
    int64_t counts[HELD]; /* entries of each buffer */
    int32_t *iota;        /* 0, 1, ..., iota_size - 1: position ids are copied from it */
    int64_t iota_size;
} Gatherer;

#define IOTA_LIMIT (1 << 16)

static int kind_is(const Py_buffer *view, const char *kinds, Py_ssize_t itemsize) {
    const char *format = view->format ? view->format : "B";
    if (*format == '<' || *format == '=' || *format == '@') {
        format++;
    }
    return view->itemsize == itemsize && format[0] != '\0' && format[1] == '\0' && strchr(kinds, format[0]) != NULL;
}

static void gatherer_release(Gatherer *self) {
    int k;
    for (k = 0; k < self->held; k++) {
        PyBuffer_Release(&self->views[k]);
    }
    self->held = 0;
}

static void gatherer_dealloc(Gatherer *self) {
    gatherer_release(self);
    PyMem_Free(self->iota);
    self->iota = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int gatherer_init(Gatherer *self, PyObject *args, PyObject *kwargs) {
    static const char *names[HELD] = {"tokens", "starts", "lengths", "full_docs", "full_ends", "offsets", "tails"};
    PyObject *objects[HELD];
    long long T, full_rows, pad;
    int64_t k;
    (void)kwargs;
    gatherer_release(self);
    if (!PyArg_ParseTuple(args, "OOOOOOOLLL", &objects[0], &objects[1], &objects[2], &objects[3], &objects[4],
                          &objects[5], &objects[6], &T, &full_rows, &pad)) {
        return -1;
    }
    for (k = 0; k < HELD; k++) {
        if (PyObject_GetBuffer(objects[k], &self->views[k], PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            gatherer_release(self);
            return -1;
        }
        self->held = (int)k + 1;
        self->counts[k] = (int64_t)(self->views[k].len / (self->views[k].itemsize ? self->views[k].itemsize : 1));
    }
    self->itemsize = self->views[TOKENS].itemsize;
    if (!kind_is(&self->views[TOKENS], "HIL", self->itemsize) || (self->itemsize != 2 && self->itemsize != 4)) {
        PyErr_SetString(PyExc_TypeError, "Gatherer: tokens must be uint16 or uint32");
        gatherer_release(self);
        return -1;
    }
    for (k = STARTS; k < TAILS; k++) {
        if (!kind_is(&self->views[k], "qlQL", 8)) {
            PyErr_Format(PyExc_TypeError, "Gatherer: %s must be int64", names[k]);
            gatherer_release(self);
            return -1;
        }
    }
    if (!kind_is(&self->views[TAILS], "IL", 4)) {
        PyErr_SetString(PyExc_TypeError, "Gatherer: tails must be uint32");
        gatherer_release(self);
        return -1;
    }
    if (T < 1 || T >= (1LL << 31) || full_rows < 0 || pad < 0 || pad >= (1LL << (8 * self->itemsize)) ||
        self->counts[STARTS] != self->counts[LENGTHS] || self->counts[FULL_DOCS] != self->counts[FULL_ENDS] ||
        self->counts[OFFSETS] < 1) {
        PyErr_SetString(PyExc_ValueError, "Gatherer: inconsistent packing (T, full_rows, pad_id or array sizes)");
        gatherer_release(self);
        return -1;
    }
    self->T = T;
    self->full_rows = full_rows;
    self->pad = pad;
    PyMem_Free(self->iota);
    self->iota_size = T < IOTA_LIMIT ? T : IOTA_LIMIT;
    self->iota = (int32_t *)PyMem_Malloc((size_t)self->iota_size * sizeof(int32_t));
    if (self->iota == NULL) {
        gatherer_release(self);
        PyErr_NoMemory();
        return -1;
    }
    for (k = 0; k < self->iota_size; k++) {
        self->iota[k] = k;
    }
    return 0;
}

typedef struct {
    const char *message;
    int64_t row;
} failure;

/* The tail of document d: its source position, written to *src; returns its targets (0 when invalid). */
static int64_t tail_of(const Gatherer *g, uint32_t d, int64_t *src) {
    const int64_t *starts = (const int64_t *)g->views[STARTS].buf;
    const int64_t *lengths = (const int64_t *)g->views[LENGTHS].buf;
    int64_t before, n;
    if ((int64_t)d >= g->counts[LENGTHS] || lengths[d] < 2) {
        return 0;
    }
    before = lengths[d] - 1;
    n = before % g->T;
    *src = starts[d] + before - n;
    return n;
}

/* The first running count of full pieces above r: a branchless binary search (no mispredicted jumps). */
static int64_t full_index(const int64_t *ends, int64_t count, int64_t r) {
    const int64_t *base = ends;
    int64_t n = count;
    while (n > 1) {
        int64_t half = n / 2;
        base = base[half - 1] <= r ? base + half : base;
        n -= half;
    }
    return (base - ends) + (*base <= r);
}

/* Pass 1: check every row, count the sequences (segments, and each padded row's padding), and put the
 * source of each full row in sources[i]. */
static int64_t count_sequences(Gatherer *const *gs, const uint8_t *kinds, const int64_t *rows, int64_t width, failure *fail,
                               int64_t *sources) {
    int64_t sequences = 0, i, j, src = 0;
    for (i = 0; i < width; i++) {
        const Gatherer *g = gs[kinds ? kinds[i] : 0];
        const int64_t *offsets = (const int64_t *)g->views[OFFSETS].buf;
        const uint32_t *tails = (const uint32_t *)g->views[TAILS].buf;
        int64_t total = g->full_rows + g->counts[OFFSETS] - 1;
        int64_t r = rows[i], used = 0, lo, hi;
        if (r < 0 || r >= total) {
            fail->message = "row number out of range for this packing";
            fail->row = i;
            return -1;
        }
        if (r < g->full_rows) {
            const int64_t *lengths = (const int64_t *)g->views[LENGTHS].buf;
            const int64_t *ends = (const int64_t *)g->views[FULL_ENDS].buf;
            int64_t at = full_index(ends, g->counts[FULL_ENDS], r), d, first;
            if (at >= g->counts[FULL_ENDS]) {
                fail->message = "a full row beyond the full pieces: the packing does not belong to this source";
                fail->row = i;
                return -1;
            }
            d = ((const int64_t *)g->views[FULL_DOCS].buf)[at];
            first = ends[at] - (lengths[d] - 1) / g->T;
            sources[i] = ((const int64_t *)g->views[STARTS].buf)[d] + (r - first) * g->T;
            if (sources[i] < 0 || sources[i] + g->T >= g->counts[TOKENS]) {
                fail->message = "a segment outside the source's tokens: the packing does not belong to it";
                fail->row = i;
                return -1;
            }
            sequences += 1;
            continue;
        }
        lo = offsets[r - g->full_rows];
        hi = offsets[r - g->full_rows + 1];
        if (lo < 0 || hi <= lo || hi > g->counts[TAILS]) {
            fail->message = "a packed row without segments, or offsets outside the tails";
            fail->row = i;
            return -1;
        }
        for (j = lo; j < hi; j++) {
            int64_t n = tail_of(g, tails[j], &src);
            if (n < 1 || src < 0 || src + n >= g->counts[TOKENS]) {
                fail->message = "a segment outside the source's tokens: the packing does not belong to it";
                fail->row = i;
                return -1;
            }
            used += n;
        }
        if (used > g->T) {
            fail->message = "a packed row holds more than T targets";
            fail->row = i;
            return -1;
        }
        sequences += (hi - lo) + (used < g->T);
    }
    return sequences;
}

typedef struct {
    char *inputs, *targets;
    int32_t *segment_ids, *position_ids, *cu;
    uint8_t *mask;
    int64_t sequence, target_count, max_seqlen;
} outputs;

/* One block of a row: a segment (src >= 0: its tokens, ids 0, 1, ... and mask set) or the padding (src < 0). */
static void put_block(const Gatherer *g, outputs *o, int64_t at, int64_t n, int64_t src, int32_t id) {
    Py_ssize_t size = g->itemsize;
    const char *tokens = (const char *)g->views[TOKENS].buf;
    int64_t k;
    if (n <= 0) {
        return;
    }
    if (src >= 0) {
        memcpy(o->inputs + at * size, tokens + src * size, (size_t)(n * size));
        memcpy(o->targets + at * size, tokens + (src + 1) * size, (size_t)(n * size));
    } else if (size == 2) {
        uint16_t *a = (uint16_t *)o->inputs + at, *b = (uint16_t *)o->targets + at, v = (uint16_t)g->pad;
        for (k = 0; k < n; k++) {
            a[k] = v;
            b[k] = v;
        }
    } else {
        uint32_t *a = (uint32_t *)o->inputs + at, *b = (uint32_t *)o->targets + at, v = (uint32_t)g->pad;
        for (k = 0; k < n; k++) {
            a[k] = v;
            b[k] = v;
        }
    }
    memset(o->mask + at, src >= 0, (size_t)n);
    if (src >= 0) {
        o->target_count += n;
    }
    if (id == 0 || id == -1) { /* every byte 0x00 or 0xFF */
        memset(o->segment_ids + at, id == 0 ? 0 : 0xFF, (size_t)n * sizeof(int32_t));
    } else {
        int32_t *seg = o->segment_ids + at;
        for (k = 0; k < n; k++) {
            seg[k] = id;
        }
    }
    if (n <= g->iota_size) {
        memcpy(o->position_ids + at, g->iota, (size_t)n * sizeof(int32_t));
    } else {
        int32_t *pos = o->position_ids + at;
        for (k = 0; k < n; k++) {
            pos[k] = (int32_t)k;
        }
    }
    o->cu[o->sequence + 1] = (int32_t)(at + n);
    o->sequence++;
    if (n > o->max_seqlen) {
        o->max_seqlen = n;
    }
}

#define PREFETCH_AHEAD 2 /* rows: a row's source is read from memory while the rows before it are copied */

/* Ask for the cache lines of tokens [src, src + n) ahead of their copy (a hint; nothing is read now). */
static inline void prefetch(const Gatherer *g, int64_t src, int64_t n) {
#if defined(__GNUC__) || defined(__clang__)
    const char *begin = (const char *)g->views[TOKENS].buf + src * g->itemsize;
    const char *end = begin + n * g->itemsize;
    for (; begin < end; begin += 64) {
        __builtin_prefetch(begin, 0, 0);
    }
#else
    (void)g;
    (void)src;
    (void)n;
#endif
}

/* Fill every row (already checked by count_sequences, which found the full rows' sources). */
static void fill(Gatherer *const *gs, const uint8_t *kinds, const int64_t *rows, int64_t width, outputs *o,
                 const int64_t *sources) {
    int64_t T = gs[0]->T, i, j, src = 0;
    for (i = 0; i < width; i++) {
        const Gatherer *g = gs[kinds ? kinds[i] : 0];
        const int64_t *offsets = (const int64_t *)g->views[OFFSETS].buf;
        const uint32_t *tails = (const uint32_t *)g->views[TAILS].buf;
        int64_t r = rows[i], at = i * T, column = 0;
        if (i + PREFETCH_AHEAD < width) {
            const Gatherer *h = gs[kinds ? kinds[i + PREFETCH_AHEAD] : 0];
            const int64_t *ahead_offsets = (const int64_t *)h->views[OFFSETS].buf;
            const uint32_t *ahead_tails = (const uint32_t *)h->views[TAILS].buf;
            int64_t ahead = rows[i + PREFETCH_AHEAD];
            if (ahead < h->full_rows) {
                prefetch(h, sources[i + PREFETCH_AHEAD], T + 1);
            } else {
                for (j = ahead_offsets[ahead - h->full_rows]; j < ahead_offsets[ahead - h->full_rows + 1]; j++) {
                    int64_t n = tail_of(h, ahead_tails[j], &src);
                    prefetch(h, src, n + 1);
                }
            }
        }
        if (r < g->full_rows) {
            put_block(g, o, at, T, sources[i], 0);
            continue;
        }
        for (j = offsets[r - g->full_rows]; j < offsets[r - g->full_rows + 1]; j++) {
            int64_t n = tail_of(g, tails[j], &src);
            put_block(g, o, at + column, n, src, (int32_t)(j - offsets[r - g->full_rows]));
            column += n;
        }
        if (column < T) {
            put_block(g, o, at + column, T - column, -1, -1);
        }
    }
}

static int writable(PyObject *object, Py_buffer *view, Py_ssize_t bytes, const char *name) {
    if (PyObject_GetBuffer(object, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->len != bytes) {
        PyErr_Format(PyExc_ValueError, "Gatherer.gather(): %s has %zd bytes, expected %zd", name, view->len, bytes);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyTypeObject GathererType;

/* The gatherers of a mixture's sources (a tuple; each row names its own by kinds[row]), checked alike: one T,
 * token size and pad id.  Returns a PyMem array of borrowed pointers (the tuple holds them), or NULL with an error. */
static Gatherer **source_gatherers(const Gatherer *self, PyObject *tuple) {
    Py_ssize_t n, k;
    Gatherer **found;
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) < 1 || PyTuple_GET_SIZE(tuple) > 256) {
        PyErr_SetString(PyExc_TypeError, "Gatherer.gather(): sources must be a tuple of 1 to 256 Gatherers");
        return NULL;
    }
    n = PyTuple_GET_SIZE(tuple);
    found = (Gatherer **)PyMem_Malloc((size_t)n * sizeof(Gatherer *));
    if (found == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (k = 0; k < n; k++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, k);
        const Gatherer *g = (const Gatherer *)item;
        if (!PyObject_TypeCheck(item, &GathererType) || g->held != HELD || g->T != self->T ||
            g->itemsize != self->itemsize || g->pad != self->pad) {
            PyErr_SetString(PyExc_ValueError, "Gatherer.gather(): the sources' gatherers differ in T, token size or pad_id");
            PyMem_Free(found);
            return NULL;
        }
        found[k] = (Gatherer *)item;
    }
    return found;
}

static PyObject *gatherer_gather(Gatherer *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *names[5] = {"inputs", "targets", "segment_ids", "position_ids", "loss_mask"};
    Py_buffer rows_view, out[5], kinds_view;
    int taken = 0, k, have_kinds = 0;
    int64_t width, sequences, i;
    failure fail = {NULL, 0};
    outputs o;
    PyObject *cu = NULL, *result = NULL;
    int64_t *sources = NULL;
    Gatherer *alone[1] = {self}, **gs = alone, **many = NULL;
    const uint8_t *kinds = NULL;
    if (self->held != HELD) {
        PyErr_SetString(PyExc_ValueError, "Gatherer.gather(): not initialised");
        return NULL;
    }
    if (nargs != 6 && nargs != 8) {
        PyErr_Format(PyExc_TypeError, "Gatherer.gather() takes 6 or 8 arguments, got %zd", nargs);
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &rows_view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (!kind_is(&rows_view, "qlQL", 8)) {
        PyErr_SetString(PyExc_TypeError, "Gatherer.gather(): rows must be int64");
        goto done;
    }
    width = (int64_t)(rows_view.len / 8);
    if (nargs == 8) { /* a mixture: kinds (uint8, one per row) pick each row's gatherer among the sources */
        many = source_gatherers(self, args[7]);
        if (many == NULL) {
            goto done;
        }
        if (PyObject_GetBuffer(args[6], &kinds_view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            goto done;
        }
        have_kinds = 1;
        if (!kind_is(&kinds_view, "B", 1) || kinds_view.len != width) {
            PyErr_SetString(PyExc_ValueError, "Gatherer.gather(): kinds must be uint8, one per row");
            goto done;
        }
        kinds = (const uint8_t *)kinds_view.buf;
        for (i = 0; i < width; i++) {
            if ((Py_ssize_t)kinds[i] >= PyTuple_GET_SIZE(args[7])) {
                PyErr_Format(PyExc_ValueError, "row %lld of the batch: source %d has no gatherer", (long long)i, (int)kinds[i]);
                goto done;
            }
        }
        gs = many;
    }
    {
        Py_ssize_t positions = (Py_ssize_t)(width * self->T);
        Py_ssize_t bytes[5] = {positions * self->itemsize, positions * self->itemsize, positions * 4, positions * 4, positions};
        for (k = 0; k < 5; k++) {
            if (writable(args[k + 1], &out[k], bytes[k], names[k]) < 0) {
                goto done;
            }
            taken = k + 1;
        }
    }
    sources = (int64_t *)PyMem_Malloc((size_t)(width > 0 ? width : 1) * sizeof(int64_t));
    if (sources == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    sequences = count_sequences(gs, kinds, (const int64_t *)rows_view.buf, width, &fail, sources);
    if (sequences < 0) {
        PyErr_Format(PyExc_ValueError, "row %lld of the batch: %s", (long long)fail.row, fail.message);
        goto done;
    }
    cu = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)((sequences + 1) * 4));
    if (cu == NULL) {
        goto done;
    }
    o.inputs = (char *)out[0].buf;
    o.targets = (char *)out[1].buf;
    o.segment_ids = (int32_t *)out[2].buf;
    o.position_ids = (int32_t *)out[3].buf;
    o.mask = (uint8_t *)out[4].buf;
    o.cu = (int32_t *)PyByteArray_AS_STRING(cu);
    o.sequence = o.target_count = o.max_seqlen = 0;
    o.cu[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    fill(gs, kinds, (const int64_t *)rows_view.buf, width, &o, sources);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(OLL)", cu, (long long)o.target_count, (long long)o.max_seqlen);
done:
    PyMem_Free(sources);
    PyMem_Free(many);
    if (have_kinds) {
        PyBuffer_Release(&kinds_view);
    }
    Py_XDECREF(cu);
    for (k = 0; k < taken; k++) {
        PyBuffer_Release(&out[k]);
    }
    PyBuffer_Release(&rows_view);
    return result;
}

static PyMethodDef gatherer_methods[] = {
    {"gather", (PyCFunction)(void (*)(void))gatherer_gather, METH_FASTCALL,
     "gather(rows, inputs, targets, segment_ids, position_ids, loss_mask[, kinds, sources]) -> (cu_seqlens bytearray, "
     "target_count, max_seqlen); a mixture's row i is read by sources[kinds[i]]"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GathererType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "streambatch._row_gather.Gatherer",
    .tp_basicsize = sizeof(Gatherer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Gatherer(tokens, starts, lengths, full_docs, full_ends, offsets, tails, T, full_rows, pad_id)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)gatherer_init,
    .tp_dealloc = (destructor)gatherer_dealloc,
    .tp_methods = gatherer_methods,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "streambatch._row_gather",
    "The packed mode's gather in C: packed rows into inputs, targets, ids, masks and cu_seqlens in one pass.",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__row_gather(void) {
    PyObject *module;
    if (PyType_Ready(&GathererType) < 0) {
        return NULL;
    }
    module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&GathererType);
    if (PyModule_AddObject(module, "Gatherer", (PyObject *)&GathererType) < 0) {
        Py_DECREF(&GathererType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
