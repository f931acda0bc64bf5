/* Best-fit decreasing bin packing of integer sizes into bins of one capacity.
 *
 * The rule (streambatch.items.pack.pack's specification, and its Python fallback):
 * items of size 0 are ignored; the others are taken by size, largest first, ties
 * by item index; each goes into the open bin with the smallest remaining
 * capacity that still holds it, ties to the lowest bin number; when none holds
 * it a new bin is opened (bins are numbered in opening order).  Items are never
 * split.  Deterministic.
 *
 * Memory follows the items, never the capacity: nothing here is sized by the
 * capacity (T), so packing a hundred short documents at T = 2**30 costs bytes,
 * not gigabytes.
 *
 * Cost: a stable LSD radix sort (two 16-bit passes, one when every size is below
 * 2**16), then per item O(log_64 D) to find the best bucket and amortized
 * O(log bins) to take its best bin, D being the number of distinct sizes.  Open
 * bins are kept in D buckets, one per distinct size d_k (increasing): bucket k
 * holds the bins whose remaining capacity r has d_k <= r < d_(k+1).  Every bin
 * that holds an item of size d_k lies in a bucket >= k, and every bin of a later
 * bucket has more room than every bin of an earlier one, so the best bin is the
 * least (r, bin number) of the first non-empty bucket >= k: a bitset of the
 * non-empty buckets (64-ary summary levels) finds that bucket, and each bucket is
 * a pairing heap ordered by (r, bin number) (two uint32 links per bin).  A bin
 * whose room is below the smallest size can take nothing more and is dropped.
 *
 * Scratch: 20 bytes per item (sorted order, bin of each step, and per bin its
 * room and two links), 12 per distinct size, and 256 KiB of radix counts, from
 * PyMem_RawMalloc so that tracemalloc sees it; outputs are two bytearrays.  The
 * GIL is released while packing.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_buffers.h"
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

/* The set of non-empty buckets. */
typedef struct {
    uint64_t *words[MAX_LEVELS];
    uint64_t count[MAX_LEVELS]; /* words per level; the top level has one */
    int depth;
} bucket_set;

static void bucket_set_free(bucket_set *set) {
    int k;
    for (k = 0; k < set->depth; k++) {
        PyMem_RawFree(set->words[k]);
        set->words[k] = NULL;
    }
    set->depth = 0;
}

static int bucket_set_init(bucket_set *set, uint64_t bits) {
    uint64_t words = (bits + 63) / 64;
    set->depth = 0;
    for (;;) {
        if (set->depth == MAX_LEVELS) {
            bucket_set_free(set);
            return -1;
        }
        set->words[set->depth] = (uint64_t *)PyMem_RawCalloc((size_t)words, sizeof(uint64_t));
        if (set->words[set->depth] == NULL) {
            bucket_set_free(set);
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

static inline void bucket_set_add(bucket_set *set, uint64_t bit) {
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

static inline void bucket_set_remove(bucket_set *set, uint64_t bit) {
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
static inline uint64_t bucket_set_next(const bucket_set *set, uint64_t bit) {
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

/* Pairing heaps of bins ordered by (room, bin number), min at the root, linked through child/sibling. */
typedef struct {
    uint32_t *child;
    uint32_t *sibling;
    const uint32_t *room;
} heaps;

/* In an exact bucket (one room only, the common case when sizes are dense) the bin number alone orders. */
static inline int before(const heaps *h, uint32_t a, uint32_t b, int exact) {
    if (exact) {
        return a < b;
    }
    return h->room[a] < h->room[b] || (h->room[a] == h->room[b] && a < b);
}

static inline uint32_t meld(const heaps *h, uint32_t a, uint32_t b, int exact) {
    if (a == NONE) {
        return b;
    }
    if (b == NONE) {
        return a;
    }
    if (before(h, b, a, exact)) {
        uint32_t t = a;
        a = b;
        b = t;
    }
    h->sibling[b] = h->child[a];
    h->child[a] = b;
    return a;
}

static inline uint32_t merge_children(const heaps *h, uint32_t first, int exact) {
    uint32_t stack = NONE, a = first, acc = NONE;
    uint32_t *sibling = h->sibling;
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
        m = meld(h, a, b, exact);
        sibling[m] = stack;
        stack = m;
        a = next;
    }
    while (stack != NONE) { /* pass 2, right to left: meld into one heap */
        uint32_t next = sibling[stack];
        sibling[stack] = NONE;
        acc = meld(h, acc, stack, exact);
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
    uint32_t *room;    /* per bin: its remaining capacity */
    uint32_t *sizes_up; /* the distinct sizes, increasing: bucket k holds rooms in [sizes_up[k], sizes_up[k + 1]) */
    uint32_t *runs;    /* per distinct size: its items */
    uint32_t *heads;   /* per bucket: the heap of its bins */
    uint64_t distinct;
    uint64_t bins;
} packing;

static void packing_free(packing *p) {
    PyMem_RawFree(p->order);
    PyMem_RawFree(p->bin_of);
    PyMem_RawFree(p->child);
    PyMem_RawFree(p->sibling);
    PyMem_RawFree(p->room);
    PyMem_RawFree(p->sizes_up);
    PyMem_RawFree(p->runs);
    PyMem_RawFree(p->heads);
    p->order = p->bin_of = p->child = p->sibling = p->room = p->sizes_up = p->runs = p->heads = NULL;
}

/* One stable counting pass on the 16-bit digit at shift of ~size: from[0..n) into to, their sizes into sorted. */
static void radix_pass(const uint32_t *sizes, const uint32_t *from, uint32_t *to, uint32_t *sorted, uint64_t n,
                       int shift, uint32_t *counts) {
    uint64_t i, total = 0;
    memset(counts, 0, 65536 * sizeof(uint32_t));
    for (i = 0; i < n; i++) {
        counts[((~sizes[from[i]]) >> shift) & 0xFFFF]++;
    }
    for (i = 0; i < 65536; i++) {
        uint32_t c = counts[i];
        counts[i] = (uint32_t)total;
        total += c;
    }
    for (i = 0; i < n; i++) {
        uint32_t item = from[i], size = sizes[item], at = counts[((~size) >> shift) & 0xFFFF]++;
        to[at] = item;
        sorted[at] = size;
    }
}

/* The bucket of a room: the largest k with sizes_up[k] <= room (the caller checks sizes_up[0] <= room). */
static inline uint64_t bucket_of(const packing *p, uint32_t room) {
    const uint32_t *base = p->sizes_up; /* branchless: base[0] <= room throughout */
    uint64_t len = p->distinct;
    while (len > 1) {
        uint64_t half = len / 2;
        base = base[half] <= room ? base + half : base;
        len -= half;
    }
    return (uint64_t)(base - p->sizes_up);
}

/* Whether every room of bucket k is one value: the next distinct size is one more (the last bucket ends at capacity). */
static inline int is_exact(const packing *p, uint64_t k) {
    uint64_t end = k + 1 < p->distinct ? (uint64_t)p->sizes_up[k + 1] : p->capacity + 1;
    return end - p->sizes_up[k] == 1;
}

/* Sort and place; 0 on success, -1 when out of memory. */
static int place(packing *p) {
    uint64_t i, j, k, n, slots, run;
    uint32_t *counts, *swap, largest = 0;
    bucket_set set;
    heaps h;
    for (i = 0, n = 0; i < p->length; i++) {
        n += p->sizes[i] != 0;
        if (p->sizes[i] > largest) {
            largest = p->sizes[i];
        }
    }
    p->items = n;
    p->bins = 0;
    slots = n ? n : 1;
    p->order = (uint32_t *)PyMem_RawMalloc((size_t)slots * sizeof(uint32_t));
    p->bin_of = (uint32_t *)PyMem_RawMalloc((size_t)slots * sizeof(uint32_t));
    p->child = (uint32_t *)PyMem_RawMalloc((size_t)slots * sizeof(uint32_t));
    p->sibling = (uint32_t *)PyMem_RawMalloc((size_t)slots * sizeof(uint32_t));
    p->room = (uint32_t *)PyMem_RawMalloc((size_t)slots * sizeof(uint32_t));
    counts = (uint32_t *)PyMem_RawMalloc(65536 * sizeof(uint32_t));
    if (p->order == NULL || p->bin_of == NULL || p->child == NULL || p->sibling == NULL || p->room == NULL ||
        counts == NULL) {
        PyMem_RawFree(counts);
        return -1;
    }
    if (n == 0) {
        PyMem_RawFree(counts);
        return 0;
    }
    for (i = 0, j = 0; i < p->length; i++) { /* the items in index order, into bin_of (scratch) */
        if (p->sizes[i]) {
            p->bin_of[j++] = (uint32_t)i;
        }
    }
    /* low digit, then high: stable, largest first; the sorted sizes go to child (scratch until placing) */
    radix_pass(p->sizes, p->bin_of, p->order, p->child, n, 0, counts);
    if (largest >> 16) {
        radix_pass(p->sizes, p->order, p->bin_of, p->child, n, 16, counts);
        swap = p->order;
        p->order = p->bin_of;
        p->bin_of = swap;
    }
    PyMem_RawFree(counts);
    for (j = 0, k = 0; j < n; j++) { /* count the distinct sizes */
        k += j == 0 || p->child[j] != p->child[j - 1];
    }
    p->distinct = k;
    p->sizes_up = (uint32_t *)PyMem_RawMalloc((size_t)k * sizeof(uint32_t));
    p->runs = (uint32_t *)PyMem_RawMalloc((size_t)k * sizeof(uint32_t));
    p->heads = (uint32_t *)PyMem_RawMalloc((size_t)k * sizeof(uint32_t));
    if (p->sizes_up == NULL || p->runs == NULL || p->heads == NULL || bucket_set_init(&set, k) < 0) {
        return -1;
    }
    for (j = 0; j < n; j++) { /* decreasing sizes fill sizes_up and their counts from the end */
        if (j == 0 || p->child[j] != p->child[j - 1]) {
            k--;
            p->sizes_up[k] = p->child[j];
            p->runs[k] = 0;
        }
        p->runs[k]++;
    }
    for (k = 0; k < p->distinct; k++) {
        p->heads[k] = NONE;
    }
    h.child = p->child;
    h.sibling = p->sibling;
    h.room = p->room;
    k = p->distinct; /* the bucket of the current size: decreases with it */
    for (j = 0, run = 0; j < n; j++, run--) {
        uint32_t size, left, bin;
        uint64_t best;
        if (run == 0) {
            run = p->runs[--k];
        }
        size = p->sizes_up[k];
        best = bucket_set_next(&set, k);
        if (best == UINT64_MAX) { /* nothing open holds it: a new bin */
            bin = (uint32_t)p->bins++;
            left = (uint32_t)(p->capacity - size);
        } else { /* the least (room, bin number) of the first bucket that holds it */
            int exact = is_exact(p, best);
            bin = p->heads[best];
            p->heads[best] = merge_children(&h, p->child[bin], exact);
            if (p->heads[best] == NONE) {
                bucket_set_remove(&set, best);
            }
            left = (exact ? p->sizes_up[best] : p->room[bin]) - size; /* an exact bucket's rooms are not read */
        }
        p->bin_of[j] = bin;
        if (left >= p->sizes_up[0]) { /* else it can take nothing more: dropped */
            uint64_t b = bucket_of(p, left);
            int exact = is_exact(p, b);
            if (!exact) {
                p->room[bin] = left;
            }
            p->child[bin] = NONE;
            p->sibling[bin] = NONE;
            if (p->heads[b] == NONE) {
                bucket_set_add(&set, b);
            }
            p->heads[b] = meld(&h, p->heads[b], bin, exact);
        }
    }
    bucket_set_free(&set);
    PyMem_RawFree(p->heads);
    PyMem_RawFree(p->sizes_up);
    PyMem_RawFree(p->runs);
    PyMem_RawFree(p->room);
    p->heads = p->sizes_up = p->runs = p->room = NULL;
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

static int is_uint32(const Py_buffer *view) { return sb_buffer_is(view, SB_UINT32_KINDS, 4); }

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
