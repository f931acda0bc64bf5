/* Best-fit decreasing bin packing of integer sizes into bins of one capacity.
 *
 * The rule (streambatch.items.pack.pack's specification, and its Python fallback):
 * items of size 0 are ignored; the others are taken by size, largest first, ties
 * by item index; each goes into the open bin with the smallest remaining
 * capacity that still holds it, ties to the lowest bin number; when none holds
 * it a new bin is opened (bins are numbered in opening order).  Items are never
 * split.  Deterministic.
 *
 * Cost: O(n + capacity) for the counting sort (stable, so ties keep item
 * order), then per item O(log_64 capacity) to find the best remaining capacity
 * (a bitset of non-empty capacities with 64-ary summary levels) and amortized
 * O(log bins) to take the lowest-numbered bin of that capacity: bins of equal
 * remaining capacity are kept in a pairing heap keyed by bin number (two uint32
 * links per bin, no other allocation).
 *
 * Scratch: 8 bytes per item (sorted order, bin of each step) and 8 per bin,
 * from PyMem_RawMalloc so that tracemalloc sees it; outputs are two bytearrays.
 * The GIL is released while packing.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NONE UINT32_MAX
#define MAX_LEVELS 8

#if defined(__GNUC__) || defined(__clang__)
#define CTZ64(x) ((uint64_t)__builtin_ctzll(x))
#else
static inline uint64_t CTZ64(uint64_t x) {
    uint64_t n = 0;
    while (!(x & 1)) {
        x >>= 1;
        n++;
    }
    return n;
}
#endif

/* The set of remaining capacities that have at least one open bin. */
typedef struct {
    uint64_t *words[MAX_LEVELS];
    uint64_t count[MAX_LEVELS]; /* words per level; the top level has one */
    int depth;
} capacity_set;

static void capacity_set_free(capacity_set *set) {
    int k;
    for (k = 0; k < set->depth; k++) {
        PyMem_RawFree(set->words[k]);
        set->words[k] = NULL;
    }
}

static int capacity_set_init(capacity_set *set, uint64_t bits) {
    uint64_t words = (bits + 63) / 64;
    set->depth = 0;
    for (;;) {
        if (set->depth == MAX_LEVELS) {
            capacity_set_free(set);
            return -1;
        }
        set->words[set->depth] = (uint64_t *)PyMem_RawCalloc((size_t)words, sizeof(uint64_t));
        if (set->words[set->depth] == NULL) {
            capacity_set_free(set);
            return -1;
        }
        set->count[set->depth] = words;
        set->depth++;
        if (words == 1) {
            return 0;
        }
        words = (words + 63) / 64;
    }
}

static inline void capacity_set_add(capacity_set *set, uint64_t bit) {
    int k;
    for (k = 0; k < set->depth; k++) {
        uint64_t *word = &set->words[k][bit >> 6];
        uint64_t was = *word;
        *word = was | (UINT64_C(1) << (bit & 63));
        if (was) {
            return; /* the levels above already know this word is non-empty */
        }
        bit >>= 6;
    }
}

static inline void capacity_set_remove(capacity_set *set, uint64_t bit) {
    int k;
    for (k = 0; k < set->depth; k++) {
        uint64_t *word = &set->words[k][bit >> 6];
        *word &= ~(UINT64_C(1) << (bit & 63));
        if (*word) {
            return;
        }
        bit >>= 6;
    }
}

/* The smallest member >= bit, or UINT64_MAX when there is none. */
static inline uint64_t capacity_set_next(const capacity_set *set, uint64_t bit) {
    int k = 0;
    for (;;) {
        uint64_t at = bit >> 6;
        if (at < set->count[k]) {
            uint64_t word = set->words[k][at] & (~UINT64_C(0) << (bit & 63));
            if (word) {
                bit = (at << 6) | CTZ64(word);
                break;
            }
        }
        bit = at + 1; /* the next word of this level: the next bit of the level above */
        k++;
        if (k == set->depth) {
            return UINT64_MAX;
        }
    }
    while (k > 0) {
        k--;
        bit = (bit << 6) | CTZ64(set->words[k][bit]);
    }
    return bit;
}

/* Pairing heaps of bin numbers (min at the root), linked through child/sibling. */
static inline uint32_t meld(uint32_t a, uint32_t b, uint32_t *child, uint32_t *sibling) {
    if (a == NONE) {
        return b;
    }
    if (b == NONE) {
        return a;
    }
    if (b < a) {
        uint32_t t = a;
        a = b;
        b = t;
    }
    sibling[b] = child[a];
    child[a] = b;
    return a;
}

static inline uint32_t merge_children(uint32_t first, uint32_t *child, uint32_t *sibling) {
    uint32_t stack = NONE, a = first, acc = NONE;
    while (a != NONE) { /* pass 1, left to right: meld pairs, stack the results */
        uint32_t b = sibling[a], next, m;
        if (b == NONE) {
            sibling[a] = stack;
            stack = a;
            break;
        }
        next = sibling[b];
        sibling[a] = NONE;
        sibling[b] = NONE;
        m = meld(a, b, child, sibling);
        sibling[m] = stack;
        stack = m;
        a = next;
    }
    while (stack != NONE) { /* pass 2, right to left: meld into one heap */
        uint32_t next = sibling[stack];
        sibling[stack] = NONE;
        acc = meld(acc, stack, child, sibling);
        stack = next;
    }
    return acc;
}

typedef struct {
    const uint32_t *sizes;
    uint64_t length;   /* entries of sizes */
    uint64_t capacity; /* every size <= capacity */
    uint64_t items;    /* entries of non-zero size */
    uint32_t *order;   /* items, largest first, ties by index */
    uint32_t *bin_of;  /* bin of the j-th placed item */
    uint32_t *child;   /* per bin */
    uint32_t *sibling; /* per bin */
    uint32_t *heads;   /* per capacity: the heap of bins with that remaining capacity */
    uint64_t bins;
} packing;

static void packing_free(packing *p) {
    PyMem_RawFree(p->order);
    PyMem_RawFree(p->bin_of);
    PyMem_RawFree(p->child);
    PyMem_RawFree(p->sibling);
    PyMem_RawFree(p->heads);
    p->order = p->bin_of = p->child = p->sibling = p->heads = NULL;
}

/* Sort and place; 0 on success, -1 when out of memory. */
static int place(packing *p) {
    uint64_t *starts = NULL, i, j, s;
    capacity_set set;
    uint64_t capacity = p->capacity;
    starts = (uint64_t *)PyMem_RawCalloc((size_t)(capacity + 2), sizeof(uint64_t));
    if (starts == NULL) {
        return -1;
    }
    for (i = 0; i < p->length; i++) { /* counting sort, largest size first, stable */
        starts[capacity - p->sizes[i]]++;
    }
    p->items = p->length - starts[capacity]; /* size 0 sorts last: ignored */
    {
        uint64_t total = 0, c;
        for (s = 0; s <= capacity; s++) {
            c = starts[s];
            starts[s] = total;
            total += c;
        }
    }
    p->order = (uint32_t *)PyMem_RawMalloc((size_t)(p->items ? p->items : 1) * sizeof(uint32_t));
    p->bin_of = (uint32_t *)PyMem_RawMalloc((size_t)(p->items ? p->items : 1) * sizeof(uint32_t));
    p->child = (uint32_t *)PyMem_RawMalloc((size_t)(p->items ? p->items : 1) * sizeof(uint32_t));
    p->sibling = (uint32_t *)PyMem_RawMalloc((size_t)(p->items ? p->items : 1) * sizeof(uint32_t));
    p->heads = (uint32_t *)PyMem_RawMalloc((size_t)(capacity + 1) * sizeof(uint32_t));
    if (p->order == NULL || p->bin_of == NULL || p->child == NULL || p->sibling == NULL || p->heads == NULL ||
        capacity_set_init(&set, capacity + 1) < 0) {
        PyMem_RawFree(starts);
        return -1;
    }
    for (i = 0; i < p->length; i++) {
        uint32_t size = p->sizes[i];
        if (size) {
            p->order[starts[capacity - size]++] = (uint32_t)i;
        }
    }
    PyMem_RawFree(starts);
    for (s = 0; s <= capacity; s++) {
        p->heads[s] = NONE;
    }
    p->bins = 0;
    for (j = 0; j < p->items; j++) {
        uint64_t size = p->sizes[p->order[j]];
        uint64_t best = capacity_set_next(&set, size);
        uint64_t left;
        uint32_t bin;
        if (best == UINT64_MAX) { /* nothing open holds it: a new bin */
            bin = (uint32_t)p->bins++;
            left = capacity - size;
        } else { /* the lowest-numbered bin of the tightest capacity that fits */
            bin = p->heads[best];
            p->heads[best] = merge_children(p->child[bin], p->child, p->sibling);
            if (p->heads[best] == NONE) {
                capacity_set_remove(&set, best);
            }
            left = best - size;
        }
        p->bin_of[j] = bin;
        if (left) {
            p->child[bin] = NONE;
            p->sibling[bin] = NONE;
            if (p->heads[left] == NONE) {
                capacity_set_add(&set, left);
            }
            p->heads[left] = meld(p->heads[left], bin, p->child, p->sibling);
        }
    }
    capacity_set_free(&set);
    PyMem_RawFree(p->heads);
    p->heads = NULL;
    return 0;
}

/* Count items per bin (into child) and write the prefix sums into offsets. */
static void bin_offsets(packing *p, int64_t *offsets) {
    uint64_t j, b;
    memset(p->child, 0, (size_t)(p->bins ? p->bins : 1) * sizeof(uint32_t));
    for (j = 0; j < p->items; j++) {
        p->child[p->bin_of[j]]++;
    }
    offsets[0] = 0;
    for (b = 0; b < p->bins; b++) {
        p->sibling[b] = (uint32_t)offsets[b]; /* each bin's write cursor */
        offsets[b + 1] = offsets[b] + (int64_t)p->child[b];
    }
}

/* Each bin's items in placement order. */
static void bin_items(packing *p, uint32_t *items) {
    uint64_t j;
    for (j = 0; j < p->items; j++) {
        items[p->sibling[p->bin_of[j]]++] = p->order[j];
    }
}

static int is_uint32(const Py_buffer *view) {
    const char *format = view->format;
    if (format == NULL || view->itemsize != 4) {
        return 0;
    }
    if (*format == '@' || *format == '=' || *format == (PY_LITTLE_ENDIAN ? '<' : '>')) {
        format++;
    }
    return format[0] != '\0' && format[1] == '\0' && (*format == 'I' || (*format == 'L' && sizeof(unsigned long) == 4));
}

PyDoc_STRVAR(best_fit_decreasing_doc,
             "best_fit_decreasing(sizes, capacity) -> (offsets, items)\n\n"
             "Pack the non-zero entries of sizes (a one-dimensional, C-contiguous uint32\n"
             "buffer of fewer than 2**32 entries, each <= capacity) by best-fit decreasing.\n"
             "Returns two bytearrays: offsets, int64 of bins + 1 entries, and items,\n"
             "uint32 indices into sizes; bin b holds items[offsets[b]:offsets[b + 1]] in\n"
             "placement order.  The GIL is released while packing.");

static PyObject *best_fit_decreasing(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    unsigned long long capacity;
    packing p;
    PyObject *offsets = NULL, *items = NULL, *result = NULL;
    uint64_t i, too_large = 0;
    int failed;
    (void)module;
    memset(&p, 0, sizeof(p));
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "best_fit_decreasing() takes 2 arguments (sizes, capacity), got %zd", nargs);
        return NULL;
    }
    if (!PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "best_fit_decreasing(): capacity must be an int in [1, 2**32)");
        return NULL;
    }
    capacity = PyLong_AsUnsignedLongLong(args[1]);
    if (capacity == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (capacity < 1 || capacity >= (UINT64_C(1) << 32)) {
        PyErr_SetString(PyExc_ValueError, "best_fit_decreasing(): capacity must be an int in [1, 2**32)");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (view.ndim != 1 || !is_uint32(&view)) {
        PyErr_Format(PyExc_TypeError, "best_fit_decreasing(): sizes must be one-dimensional uint32, got ndim=%d format=%s",
                     view.ndim, view.format ? view.format : "?");
        PyBuffer_Release(&view);
        return NULL;
    }
    p.sizes = (const uint32_t *)view.buf;
    p.length = (uint64_t)view.len / 4;
    p.capacity = (uint64_t)capacity;
    if (p.length >= (UINT64_C(1) << 32)) {
        PyErr_SetString(PyExc_OverflowError, "best_fit_decreasing(): 2**32 or more sizes do not fit uint32 item indices");
        PyBuffer_Release(&view);
        return NULL;
    }
    for (i = 0; i < p.length; i++) {
        too_large |= p.sizes[i] > capacity;
    }
    if (too_large) {
        PyErr_SetString(PyExc_ValueError, "best_fit_decreasing(): a size exceeds the capacity");
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    failed = place(&p);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    offsets = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)((p.bins + 1) * sizeof(int64_t)));
    items = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(p.items * sizeof(uint32_t)));
    if (offsets == NULL || items == NULL) {
        goto done;
    }
    {
        int64_t *offset_data = (int64_t *)PyByteArray_AS_STRING(offsets);
        uint32_t *item_data = (uint32_t *)PyByteArray_AS_STRING(items);
        Py_BEGIN_ALLOW_THREADS
        bin_offsets(&p, offset_data);
        bin_items(&p, item_data);
        Py_END_ALLOW_THREADS
    }
    result = PyTuple_Pack(2, offsets, items);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(items);
    packing_free(&p);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"best_fit_decreasing", (PyCFunction)(void (*)(void))best_fit_decreasing, METH_FASTCALL, best_fit_decreasing_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "streambatch._best_fit",
    "Best-fit decreasing bin packing of integer sizes in C (the packing stage's kernel).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__best_fit(void) { return PyModule_Create(&module_def); }
