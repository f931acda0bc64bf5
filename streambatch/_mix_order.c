/* Tijdeman's chairman-assignment order of a mixture, in exact integer arithmetic.
 *
 * k >= 2 sources with positive integer weights a (normalised weights w = a / D,
 * D = sum a) and mu = 1 / M, M = 2k - 2.  At step n (1-based), with counts c
 * before the step, the scaled deficit of source s is d_s = a_s n - D c_s, and
 *
 *   s is eligible       <=>  c_s <= w_s n - mu           <=>  M d_s >= D  <=>  d_s >= ceil(D / M)
 *   s's deadline           (c_s + 1 - mu) / w_s  =  n + X_s / (M a_s),  X_s = D (M - 1) - M d_s
 *
 * so the item goes to the eligible source with the smallest X_s / a_s (compared as
 * X_s a_t < X_t a_s), ties to the lowest index.  Tijdeman (1980) keeps every prefix
 * within 1 - mu of each share, so before a step d_s lies in (-D, 2D) and
 * |X_s| < 3 M D.  The loop runs at the narrowest width that holds it exactly:
 * 64-bit state with 128-bit products while 3 M D < 2**62 (float weights within a
 * ratio of about 2**4 of each other, k small: D ~ 2**55), 128-bit state and
 * products while 3 M D**2 < 2**126, else 128-bit state with 256-bit products up
 * to D < 2**116.  Larger weights are refused here (the Python caller runs its
 * exact fallback instead).
 *
 * Output: one uint8 source id per item, and the per-source counts before every
 * multiple of `block` items (rows 0 .. length / block), for random access.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_buffers.h"
#include <stdint.h>
#include <string.h>

typedef __int128 i128;
typedef unsigned __int128 u128;

#define MAX_SOURCES 255
#define WIDE_BITS 116

/* (hi, lo) = x * y, unsigned 128 x 128 -> 256 bits. */
static inline void mul_256(u128 x, u128 y, u128 *hi, u128 *lo) {
    u128 x0 = (uint64_t)x, x1 = x >> 64, y0 = (uint64_t)y, y1 = y >> 64;
    u128 p00 = x0 * y0, p01 = x0 * y1, p10 = x1 * y0, p11 = x1 * y1;
    u128 mid = (p00 >> 64) + (uint64_t)p01 + (uint64_t)p10;
    *lo = (mid << 64) | (uint64_t)p00;
    *hi = p11 + (p01 >> 64) + (p10 >> 64) + (mid >> 64);
}

/* x * a < y * b for signed x, y and positive a, b, exactly (256-bit products). */
static inline int less_wide(i128 x, u128 a, i128 y, u128 b) {
    int x_negative = x < 0, y_negative = y < 0;
    u128 left_hi, left_lo, right_hi, right_lo;
    int magnitude_less;
    if (x_negative != y_negative) {
        return x_negative;
    }
    mul_256(x_negative ? (u128)(-x) : (u128)x, a, &left_hi, &left_lo);
    mul_256(y_negative ? (u128)(-y) : (u128)y, b, &right_hi, &right_lo);
    if (left_hi == right_hi && left_lo == right_lo) {
        return 0;
    }
    magnitude_less = left_hi < right_hi || (left_hi == right_hi && left_lo < right_lo);
    return x_negative ? !magnitude_less : magnitude_less;
}

/* One step loop per state width.  STATE holds deficits and keys; LESS(x, a, y, b)
 * decides x * a < y * b exactly.  Returns 0, or -1 when no source was eligible or
 * a deficit left its proven range (impossible by Tijdeman's theorem: a guard
 * against a broken build). */
#define DEFINE_ORDER(NAME, STATE, LESS)                                                                  \
    static int NAME(const u128 *weights, int k, uint8_t *out, int64_t length, int64_t *checkpoints,      \
                    int64_t block) {                                                                     \
        STATE deficit[MAX_SOURCES], a[MAX_SOURCES];                                                      \
        int64_t counts[MAX_SOURCES];                                                                     \
        STATE total = 0, threshold, scale, m = 2 * k - 2;                                                \
        int64_t position = 0, row = 0;                                                                   \
        int s;                                                                                           \
        for (s = 0; s < k; s++) {                                                                        \
            a[s] = (STATE)weights[s];                                                                    \
            total += a[s];                                                                               \
            deficit[s] = 0;                                                                              \
            counts[s] = 0;                                                                               \
        }                                                                                                \
        threshold = (total + m - 1) / m;                                                                 \
        scale = total * (m - 1);                                                                         \
        for (;;) {                                                                                       \
            int64_t stop = position + block < length ? position + block : length;                        \
            memcpy(checkpoints + row * k, counts, sizeof(int64_t) * (size_t)k);                          \
            row++;                                                                                       \
            if (position >= length) {                                                                    \
                break;                                                                                   \
            }                                                                                            \
            for (; position < stop; position++) {                                                        \
                int best = -1;                                                                           \
                STATE best_x = 0;                                                                        \
                for (s = 0; s < k; s++) {                                                                \
                    STATE d = (deficit[s] += a[s]);                                                      \
                    if (d >= threshold) {                                                                \
                        STATE x = scale - m * d;                                                         \
                        if (best < 0 || LESS(x, a[best], best_x, a[s])) {                                \
                            best = s;                                                                    \
                            best_x = x;                                                                  \
                        }                                                                                \
                    }                                                                                    \
                }                                                                                        \
                if (best < 0 || deficit[best] >= 2 * total) {                                            \
                    return -1;                                                                           \
                }                                                                                        \
                deficit[best] -= total;                                                                  \
                counts[best]++;                                                                          \
                out[position] = (uint8_t)best;                                                           \
            }                                                                                            \
            if (position >= length && length % block != 0) {                                             \
                break;                                                                                   \
            }                                                                                            \
        }                                                                                                \
        return 0;                                                                                        \
    }

#define LESS_128(x, a, y, b) ((i128)(x) * (i128)(a) < (i128)(y) * (i128)(b))
#define LESS_256(x, a, y, b) less_wide((x), (u128)(a), (y), (u128)(b))

DEFINE_ORDER(order_64, int64_t, LESS_128)
DEFINE_ORDER(order_128, i128, LESS_128)
DEFINE_ORDER(order_256, i128, LESS_256)

PyDoc_STRVAR(tijdeman_doc,
             "tijdeman(out, checkpoints, block, weights) -> None\n\n"
             "Write Tijdeman's order of len(out) items into the writable uint8 buffer out,\n"
             "and the per-source counts before items 0, block, 2*block, ... (len(out) // block\n"
             "+ 1 rows of k int64) into checkpoints.  weights: k (2 to 255) positive integers,\n"
             "each 16 little-endian bytes, concatenated; their sum must be below 2**116.\n"
             "The GIL is released while ordering.");

static PyObject *tijdeman(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer out, checkpoints, packed;
    u128 weights[MAX_SOURCES];
    u128 total = 0;
    long long block;
    int64_t length;
    int k, s, status, bits, spread;
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "tijdeman() takes 4 arguments (out, checkpoints, block, weights), got %zd", nargs);
        return NULL;
    }
    block = PyLong_AsLongLong(args[2]);
    if (block == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (block < 1) {
        PyErr_SetString(PyExc_ValueError, "tijdeman(): block must be positive");
        return NULL;
    }
    if (PyObject_GetBuffer(args[3], &packed, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    k = (int)(packed.len / 16);
    if (packed.len % 16 != 0 || k < 2 || k > MAX_SOURCES) {
        PyBuffer_Release(&packed);
        PyErr_SetString(PyExc_ValueError, "tijdeman(): weights must be 2 to 255 integers of 16 bytes each");
        return NULL;
    }
    for (s = 0; s < k; s++) {
        const unsigned char *bytes = (const unsigned char *)packed.buf + 16 * s;
        u128 value = 0;
        int i;
        for (i = 15; i >= 0; i--) {
            value = (value << 8) | bytes[i];
        }
        weights[s] = value;
        total += value;
        if (value == 0 || (value >> WIDE_BITS) != 0 || (total >> WIDE_BITS) != 0) {
            PyBuffer_Release(&packed);
            PyErr_SetString(PyExc_ValueError, "tijdeman(): weights must be positive with a sum below 2**116");
            return NULL;
        }
    }
    PyBuffer_Release(&packed);
    /* |x| < 3 M D and a <= D: the narrowest width that holds the state and the products */
    for (bits = 0; bits < 128 && (total >> bits) != 0; bits++) {
    }
    for (spread = 0; ((u128)(6 * k - 6) >> spread) != 0; spread++) { /* 3 M < 2**spread */
    }
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &checkpoints, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    length = (int64_t)out.len;
    if (out.itemsize != 1 || checkpoints.itemsize != 8 ||
        checkpoints.len != (Py_ssize_t)(8 * k * (length / block + 1))) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&checkpoints);
        PyErr_SetString(PyExc_ValueError,
                        "tijdeman(): out must hold 1-byte items and checkpoints (len(out) // block + 1) * k int64");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (bits + spread <= 62) { /* |x| < 2**62, products below 2**(62 + 62) */
        status = order_64(weights, k, (uint8_t *)out.buf, length, (int64_t *)checkpoints.buf, (int64_t)block);
    } else if (2 * bits + spread <= 126) { /* products below 2**126 */
        status = order_128(weights, k, (uint8_t *)out.buf, length, (int64_t *)checkpoints.buf, (int64_t)block);
    } else {
        status = order_256(weights, k, (uint8_t *)out.buf, length, (int64_t *)checkpoints.buf, (int64_t)block);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    PyBuffer_Release(&checkpoints);
    if (status != 0) {
        PyErr_SetString(PyExc_RuntimeError, "tijdeman(): a deficit left Tijdeman's bound; the extension is miscompiled");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"tijdeman", (PyCFunction)(void (*)(void))tijdeman, METH_FASTCALL, tijdeman_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "streambatch._mix_order",
    "Tijdeman's chairman-assignment order of a mixture in C, exact integer arithmetic.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__mix_order(void) { return PyModule_Create(&module_def); }
