/* streambatch._row_gather: the gathers in C, one extension compiled from four files (their parts: _gather.h).
 *
 *   _gather_packed.c   Gatherer: packed rows into inputs, targets, ids, masks and cu_seqlens in one pass
 *   _gather_windows.c  WindowGatherer: window rows into inputs and targets
 *   _mask_bits.c       window_mask, window_counts: the window mode's loss-mask bits
 *   this file          the module, and the CPU features its loops use
 *
 * cpu_features()
 *     {name: in use} for AVX2, AVX512F, AVX512BW, BMI2, POPCNT and FSRM: the loops that need them (spread32_avx2,
 *     copy_pair512, count_bits_popcnt, the `rep movsb` copy) run where the CPU has them, chosen once at import, and
 *     STREAMBATCH_DISABLE_CPU_FEATURES (names separated by spaces or commas, any case; "all": every one), read at
 *     import as numpy reads NPY_DISABLE_CPU_FEATURES, turns them off: the baseline loops then run (SSE2, SWAR,
 *     memcpy), giving the same arrays.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_buffers.h"
#define SB_GATHER_MODULE /* this file imports numpy's C API for the four */
#include "_gather.h"
#include <ctype.h>
#include <stdlib.h>
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <cpuid.h>
#endif

int use_avx2, use_popcnt, use_pair512, use_rep_movsb; /* set at import (PyInit__row_gather) */

#define DISABLE_VARIABLE "STREAMBATCH_DISABLE_CPU_FEATURES"

/* A 1-D C-contiguous vector of `count` entries of numpy type `type` (buffer formats `formats`, itemsize bytes):
 * a numpy array is read in place; anything else through the buffer protocol (*viewed set: release view). */
int vector_of(PyObject *object, int type, const char *formats, Py_ssize_t itemsize, const char *what,
              Py_buffer *view, int *viewed, const void **data, int64_t *count) {
    if (PyArray_Check(object) && PyArray_TYPE((PyArrayObject *)object) == type && PyArray_NDIM((PyArrayObject *)object) == 1 &&
        PyArray_IS_C_CONTIGUOUS((PyArrayObject *)object)) {
        *data = PyArray_DATA((PyArrayObject *)object);
        *count = (int64_t)PyArray_DIM((PyArrayObject *)object, 0);
        return 0;
    }
    if (PyObject_GetBuffer(object, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    *viewed = 1;
    if (!kind_is(view, formats, itemsize)) {
        PyErr_Format(PyExc_TypeError, "gather(): %s", what);
        return -1;
    }
    *data = view->buf;
    *count = (int64_t)(view->len / itemsize);
    return 0;
}


/* Whether the k characters at `token` spell `word` (upper case) in any case. */
static int token_is(const char *token, size_t k, const char *word) {
    size_t j;
    if (strlen(word) != k) {
        return 0;
    }
    for (j = 0; j < k; j++) {
        if (toupper((unsigned char)token[j]) != word[j]) {
            return 0;
        }
    }
    return 1;
}

/* Whether `list` (the value of DISABLE_VARIABLE, or NULL) names feature `name` or "all": names separated by white
 * space or commas, in any case. */
static int disabled(const char *list, const char *name) {
    size_t k;
    while (list != NULL && *list != '\0') {
        while (*list != '\0' && (isspace((unsigned char)*list) || *list == ',')) {
            list++;
        }
        for (k = 0; list[k] != '\0' && !isspace((unsigned char)list[k]) && list[k] != ','; k++) {
        }
        if (k > 0 && (token_is(list, k, name) || token_is(list, k, "ALL"))) {
            return 1;
        }
        list += k;
    }
    return 0;
}

/* The CPU features the loops use: what the CPU has, less what DISABLE_VARIABLE turns off. */
static void choose_features(void) {
    const char *off = getenv(DISABLE_VARIABLE);
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
#if HAVE_SPREAD32
    use_avx2 = __builtin_cpu_supports("avx2") != 0 && !disabled(off, "AVX2");
#endif
#if HAVE_POPCNT_TARGET
    use_popcnt = __builtin_cpu_supports("popcnt") != 0 && !disabled(off, "POPCNT");
#endif
#if HAVE_PAIR512
    use_pair512 = __builtin_cpu_supports("avx512bw") != 0 && __builtin_cpu_supports("bmi2") != 0 &&
                  !disabled(off, "AVX512F") && !disabled(off, "AVX512BW") && !disabled(off, "BMI2");
#endif
#endif
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
    {
        unsigned int a = 0, b = 0, c = 0, d = 0;
        use_rep_movsb = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 4)) != 0 /* leaf 7: EDX bit 4, FSRM */
                        && !disabled(off, "FSRM");
    }
#endif
    (void)off;
}

/* cpu_features(): see the top of this file. */
static PyObject *cpu_features(PyObject *module, PyObject *unused) {
    const char *names[] = {"AVX2", "AVX512F", "AVX512BW", "BMI2", "POPCNT", "FSRM"};
    int used[] = {use_avx2, use_pair512, use_pair512, use_pair512, use_popcnt, use_rep_movsb};
    PyObject *found = PyDict_New();
    size_t k;
    (void)module;
    (void)unused;
    for (k = 0; found != NULL && k < sizeof(used) / sizeof(used[0]); k++) {
        if (PyDict_SetItemString(found, names[k], used[k] ? Py_True : Py_False) < 0) {
            Py_CLEAR(found);
        }
    }
    return found;
}

static PyMethodDef module_methods[] = {
    FASTCALL_METHOD("window_mask", window_mask,
        "window_mask(bits, T, positions) -> (n, T) bool: row i holds bits positions[i] + 1 .. positions[i] + T of bits"),
    FASTCALL_METHOD("window_counts", window_counts,
        "window_counts(bits, T, positions) -> int: the set bits of bits positions[i] + 1 .. positions[i] + T, every row"),
    {"cpu_features", cpu_features, METH_NOARGS,
     "cpu_features() -> dict: each CPU feature the loops dispatch on, True where it is in use (the CPU has it and "
     DISABLE_VARIABLE " leaves it on)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "streambatch._row_gather",
    "The gathers in C: packed rows into inputs, targets, ids, masks and cu_seqlens in one pass; windows into inputs and targets; window loss masks.",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

/* *type* into *module* as *name* (the module holds a reference): 0, or -1 with the error set. */
static int add_type(PyObject *module, const char *name, PyTypeObject *type) {
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__row_gather(void) {
    PyObject *module;
    import_array();
    choose_features();
    if (PyType_Ready(&GathererType) < 0 || PyType_Ready(&WindowGathererType) < 0) {
        return NULL;
    }
    module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (add_type(module, "Gatherer", &GathererType) < 0 || add_type(module, "WindowGatherer", &WindowGathererType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
