/* What the gathers of streambatch._row_gather share: one extension compiled from four files.
 *
 *   _row_gather.c      the module: its functions and types, the CPU features chosen at import
 *   _gather_packed.c   the packed mode's gather (Gatherer)
 *   _gather_windows.c  the window mode's gather (WindowGatherer)
 *   _mask_bits.c       the window mode's loss-mask bits (window_mask, window_counts)
 *
 * Here: the numpy C API shared by the files, the CPU features chosen at import, the buffer helpers, the mask bits'
 * loops (unpack_bits, count_bits, count_rows; their AVX2 and POPCNT variants) and the stream of bytes both gathers
 * copy through (copy_piece, with its AVX-512 variant for packed segments).  Every loop is static here, so each file
 * compiles and inlines it into its own loops as the single file did.  Include after <Python.h> and "_buffers.h".
 */
#ifndef STREAMBATCH_GATHER_H
#define STREAMBATCH_GATHER_H

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL streambatch_row_gather_ARRAY_API /* one numpy API table for the four files */
#ifndef SB_GATHER_MODULE
#define NO_IMPORT_ARRAY /* _row_gather.c imports it */
#endif
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(hidden) /* the files' shared functions and flags stay inside the extension */
#endif

/* The CPU features in use, set at import (_row_gather.c): the CPU has them and STREAMBATCH_DISABLE_CPU_FEATURES
 * leaves them on. */
extern int use_avx2;      /* AVX2: spread32_avx2 */
extern int use_popcnt;    /* POPCNT: count_bits_popcnt */
extern int use_pair512;   /* AVX-512BW and BMI2: copy_pair512 */
extern int use_rep_movsb; /* FSRM (fast short rep movsb): copy_chunk */

#define ARRAY_DATA(object) PyArray_DATA((PyArrayObject *)(object))
#define GIL_POSITIONS 65536 /* the GIL is released while filling batches of at least this many positions */
#ifndef MASK_AHEAD
#define MASK_AHEAD 4 /* segments (rows): a segment's mask bits are asked for while the ones before it are unpacked */
#endif
#ifndef STREAM_CHUNK
#define STREAM_CHUNK 1024
#endif
#ifndef STREAM_AHEAD
#define STREAM_AHEAD 6144 /* ~96 lines in flight: a VM's memory latency needs that many to stream (see copy_piece) */
#endif

/* Release *view* where *held* says it is held, and clear *held*: what every release and error path does. */
static inline void release_held(Py_buffer *view, int *held) {
    if (*held) {
        PyBuffer_Release(view);
        *held = 0;
    }
}

static inline int kind_is(const Py_buffer *view, const char *kinds, Py_ssize_t itemsize) {
    return sb_buffer_is(view, kinds, itemsize);
}

/* A new C-contiguous numpy array of `type` and shape (d0) or (d0, d1) (d1 < 0: one dimension). */
static inline PyObject *new_array(npy_intp d0, npy_intp d1, int type) {
    npy_intp dims[2] = {d0, d1};
    return PyArray_SimpleNew(d1 < 0 ? 1 : 2, dims, type);
}

/* A 1-D C-contiguous vector of `count` entries of numpy type `type` (buffer formats `formats`, itemsize bytes):
 * a numpy array is read in place; anything else through the buffer protocol (*viewed set: release view). */
int vector_of(PyObject *object, int type, const char *formats, Py_ssize_t itemsize, const char *what, Py_buffer *view,
              int *viewed, const void **data, int64_t *count); /* _row_gather.c */

/* The module's parts, each in its own file. */
extern PyTypeObject GathererType;       /* _gather_packed.c */
extern PyTypeObject WindowGathererType; /* _gather_windows.c */
PyObject *window_mask(PyObject *module, PyObject *const *args, Py_ssize_t nargs);   /* _mask_bits.c */
PyObject *window_counts(PyObject *module, PyObject *const *args, Py_ssize_t nargs); /* _mask_bits.c */

/* The module glue every part ends with: a method of the fast-call convention (a function of self or module, an
 * array of arguments and their count), and a gatherer's type object, streambatch._row_gather.NAME, made by
 * PyType_GenericNew, then INIT (its constructor's arguments, DOC); DEALLOC releases what it holds. */
#define FASTCALL_METHOD(NAME, FUNCTION, DOC) {NAME, (PyCFunction)(void (*)(void))(FUNCTION), METH_FASTCALL, DOC}
#define GATHERER_TYPE(TYPE, NAME, STRUCT, DOC, INIT, DEALLOC, METHODS)             \
    PyTypeObject TYPE = {                                                         \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "streambatch._row_gather." NAME, \
        .tp_basicsize = sizeof(STRUCT),                                           \
        .tp_flags = Py_TPFLAGS_DEFAULT,                                           \
        .tp_doc = DOC,                                                            \
        .tp_new = PyType_GenericNew,                                              \
        .tp_init = (initproc)(INIT),                                              \
        .tp_dealloc = (destructor)(DEALLOC),                                      \
        .tp_methods = METHODS,                                                    \
    }

/* ---- mask bits ------------------------------------------------------------------------------------------------ */

/* 8 mask bits (a byte, lowest bit first) as 8 bytes of 0/1: the byte copied into each byte lane by one multiply
 * (no carries: b < 256), each lane keeping its own bit, then that bit moved to the lane's bit 0 by adding 0x7f (a
 * lane holding its bit overflows into bit 7, no lane carries out).  Stored lane j = bit j on little-endian
 * hosts; a big-endian host reverses the lanes first. */
static inline uint64_t spread8(uint8_t b) {
    uint64_t x = ((uint64_t)b * 0x0101010101010101ULL) & 0x8040201008040201ULL;
    x = ((x + 0x7f7f7f7f7f7f7f7fULL) >> 7) & 0x0101010101010101ULL;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    x = __builtin_bswap64(x);
#endif
    return x;
}

#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SPREAD32 1
/* `words` steps of 32 positions from whole bytes of bits at `from` (each step 4 bytes): 0/1 bytes to `out`, their
 * count added to *total when `count`; returns the positions written.  SSE2 (every x86-64): each of the 4 bytes copied
 * into an 8-byte lane by three unpacks, each lane byte keeping its own bit (and, compare, and 1); the count sums the
 * bytes (psadbw).  AVX2 (chosen at import when the CPU has it): one shuffle spreads the 4 bytes over 32 lanes. */
static inline int64_t spread32_sse2(const uint8_t *from, int64_t words, uint8_t *out, int count, int64_t *total) {
    const __m128i select = _mm_set_epi8((char)0x80, 64, 32, 16, 8, 4, 2, 1, (char)0x80, 64, 32, 16, 8, 4, 2, 1);
    const __m128i one = _mm_set1_epi8(1), zero = _mm_setzero_si128();
    __m128i sums = zero;
    int64_t k;
    for (k = 0; k < words; k++, out += 32) {
        uint32_t word;
        __m128i v, w, pairs, quads;
        memcpy(&word, from + 4 * k, 4);
        v = _mm_cvtsi32_si128((int)word);
        pairs = _mm_unpacklo_epi8(v, v);
        quads = _mm_unpacklo_epi16(pairs, pairs);
        v = _mm_unpacklo_epi32(quads, quads);
        v = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, select), select), one);
        w = _mm_unpackhi_epi32(quads, quads);
        w = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(w, select), select), one);
        _mm_storeu_si128((__m128i *)out, v);
        _mm_storeu_si128((__m128i *)(out + 16), w);
        if (count) {
            sums = _mm_add_epi64(sums, _mm_sad_epu8(_mm_add_epi8(v, w), zero));
        }
    }
    if (count) {
        *total += (int64_t)_mm_cvtsi128_si64(sums) + (int64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(sums, sums));
    }
    return 32 * words;
}

__attribute__((target("avx2"))) static inline int64_t spread32_avx2(const uint8_t *from, int64_t words, uint8_t *out,
                                                                     int count, int64_t *total) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                            3, 3, 3, 3, 3, 3);
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i one = _mm256_set1_epi8(1), zero = _mm256_setzero_si256();
    __m256i sums = zero;
    int64_t k;
    for (k = 0; k < words; k++, out += 32) {
        uint32_t word;
        __m256i v;
        memcpy(&word, from + 4 * k, 4);
        v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)word), spread); /* lane byte j: bits byte j / 8 */
        v = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, select), select), one);
        _mm256_storeu_si256((__m256i *)out, v);
        if (count) {
            sums = _mm256_add_epi64(sums, _mm256_sad_epu8(v, zero));
        }
    }
    if (count) {
        __m128i half = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
        *total += (int64_t)_mm_cvtsi128_si64(half) + (int64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(half, half));
    }
    return 32 * words;
}
#else
#define HAVE_SPREAD32 0
#endif

/* out[0..n) = bits p .. p + n - 1 of `bits` (0/1 bytes); returns how many are set when `count` (else 0).  Whole
 * bytes of bits become 8 positions at a time (spread8); the unaligned head and the tail go bit by bit.  The count
 * sums the 8 lanes of each spread word (at most 8 each: a multiply adds them into the top lane). */
static inline int64_t unpack_bits(const uint8_t *bits, int64_t p, int64_t n, uint8_t *out, int count) {
    int64_t total = 0;
    while (n > 0 && (p & 7)) {
        uint8_t bit = (uint8_t)((bits[p >> 3] >> (p & 7)) & 1);
        *out++ = bit;
        total += bit;
        p++;
        n--;
    }
#if HAVE_SPREAD32
    if (n >= 32) {
        int64_t done = (use_avx2 ? spread32_avx2 : spread32_sse2)(bits + (p >> 3), n >> 5, out, count, &total);
        out += done;
        p += done;
        n -= done;
    }
#endif
    {
        const uint8_t *from = bits + (p >> 3);
        int64_t whole = n >> 3, j;
        if (count) {
            for (j = 0; j < whole; j++) {
                uint64_t x = spread8(from[j]);
                memcpy(out + 8 * j, &x, 8);
                total += (int64_t)((x * 0x0101010101010101ULL) >> 56);
            }
        } else {
            for (j = 0; j < whole; j++) {
                uint64_t x = spread8(from[j]);
                memcpy(out + 8 * j, &x, 8);
            }
        }
        out += 8 * whole;
        p += 8 * whole;
        n -= 8 * whole;
    }
    while (n > 0) {
        uint8_t bit = (uint8_t)((bits[p >> 3] >> (p & 7)) & 1);
        *out++ = bit;
        total += bit;
        p++;
        n--;
    }
    return count ? total : 0;
}

/* Ask for the cache lines of bits [p, p + n) (a hint). */
static inline void prefetch_bits(const uint8_t *bits, int64_t p, int64_t n) {
#if defined(__GNUC__) || defined(__clang__)
    const uint8_t *begin = bits + (p >> 3), *end = bits + ((p + n + 7) >> 3);
    for (; begin < end; begin += 64) {
        __builtin_prefetch(begin, 0, 1);
    }
#else
    (void)bits;
    (void)p;
    (void)n;
#endif
}

/* A 64-bit word's set bits (SWAR: no popcnt instruction assumed). */
static inline int64_t ones64(uint64_t x) {
    x = x - ((x >> 1) & 0x5555555555555555ULL);
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
    return (int64_t)((x * 0x0101010101010101ULL) >> 56);
}

/* How many of bits p .. p + n - 1 of `bits` are set.  Reads only the bytes holding those bits (first .. last),
 * 8 at a time: the first word with the bits below p masked off, whole words, and a last word ending at the last
 * byte with the bits counted before and those from p + n masked off; spans under 8 bytes byte by byte.  The
 * popcnt instruction where the CPU has it (chosen at import), else SWAR.  No per-bit loop: every row of a
 * shuffled batch starts at a random bit. */
#define COUNT_BITS_BODY(POP)                                                                                  \
    int64_t first, span, q, e, total;                                                                         \
    uint64_t word;                                                                                            \
    if (n <= 0) {                                                                                             \
        return 0;                                                                                             \
    }                                                                                                         \
    first = p >> 3;                                                                                           \
    span = ((p + n - 1) >> 3) - first + 1; /* bytes holding the bits */                                      \
    e = p + n - 8 * first;                 /* one past the last bit, from bit 0 of byte first */             \
    bits += first;                                                                                            \
    if (span < 8) {                                                                                           \
        word = load_le64(bits, (size_t)span);                                                                 \
        word &= ~0ULL << (p & 7);                                                                             \
        word &= e >= 64 ? ~0ULL : (1ULL << e) - 1;                                                            \
        return POP(word);                                                                                     \
    }                                                                                                         \
    word = load_le64(bits, 8);                                                                                 \
    total = POP(word & (~0ULL << (p & 7)));                                                                   \
    for (q = 8; q + 8 <= span; q += 8) {                                                                      \
        word = load_le64(bits + q, 8);                                                                         \
        total += POP(word);                                                                                   \
    }                                                                                                         \
    if (q < span) { /* bytes q .. span - 1 left: the word of the last 8 bytes, its first (q - (span - 8)) done */ \
        word = load_le64(bits + span - 8, 8);                                                                  \
        word &= ~0ULL << (8 * (q - (span - 8)));                                                              \
        e -= 8 * (span - 8);                                                                                  \
        word &= e >= 64 ? ~0ULL : (1ULL << e) - 1;                                                            \
        total += POP(word);                                                                                   \
    } else {                                                                                                  \
        /* the last whole word held bits from p + n on: take them back */                                     \
        e -= 8 * (span - 8);                                                                                  \
        word = load_le64(bits + span - 8, 8);                                                                  \
        total -= e >= 64 ? 0 : POP(word & (~0ULL << e));                                                      \
    }                                                                                                         \
    return total;

/* 8 bytes from `at` as a word holding byte j at bits 8j .. 8j + 7 (any alignment, any host). */
static inline uint64_t load_le64(const uint8_t *at, size_t bytes) {
    uint64_t word = 0;
    memcpy(&word, at, bytes);
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    word = __builtin_bswap64(word);
#endif
    return word;
}

#define POP_SWAR(x) ones64(x)
static inline int64_t count_bits_swar(const uint8_t *bits, int64_t p, int64_t n) {
    COUNT_BITS_BODY(POP_SWAR)
}

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_POPCNT_TARGET 1
#define POP_INSN(x) ((int64_t)__builtin_popcountll(x))
__attribute__((target("popcnt"))) static inline int64_t count_bits_popcnt(const uint8_t *bits, int64_t p, int64_t n) {
    COUNT_BITS_BODY(POP_INSN)
}
#else
#define HAVE_POPCNT_TARGET 0
#define count_bits_popcnt count_bits_swar
#endif

static inline int64_t count_bits(const uint8_t *bits, int64_t p, int64_t n) {
    return use_popcnt ? count_bits_popcnt(bits, p, n) : count_bits_swar(bits, p, n);
}

/* The set target bits (rows[i] + 1 .. rows[i] + T) of every row (_mask_bits.c). */
int64_t count_rows(const uint8_t *bits, const int64_t *rows, int64_t width, int64_t T);

/* ---- the stream both gathers copy through ----------------------------------------------------------------------- */

/* Ask for the cache lines of tokens [src, src + n) ahead of their copy (a hint; nothing is read now).  Locality 1
 * (prefetcht2: the outer caches, not L1) emits ~15% faster than locality 0 (prefetchnta) or 3 (prefetcht0) at
 * T=1024 B=32 and T=2048 B=8: an L1-bound prefetch holds one of L1's few miss buffers until its line arrives, so
 * the loop of prefetches stalled the copies; the lines reach L1 on their copy, from L2. */
static inline void prefetch_bytes(const char *begin, size_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
    const char *end = begin + bytes;
    for (; begin < end; begin += 64) {
        __builtin_prefetch(begin, 0, 1); /* low locality (prefetcht2): into L2, not L1 (see below) */
    }
#else
    (void)begin;
    (void)bytes;
#endif
}

/* Copy n bytes (a chunk of a window row: 1 KB or less) with the string instruction `rep movsb` where the CPU
 * says short string copies are fast (FSRM, chosen at import: Zen 3 and Ice Lake on), else memcpy.  At T=1024 (2 KB rows from random places) it measured
 * 0.88-1.0x the memcpy floor where glibc's memcpy (vector loops below its own rep-movsb threshold) gave 0.78-0.80x.
 * The targets' source is one token on from the inputs': unaligned, which the string copy takes in its stride. */
static inline void copy_chunk(char *to, const char *from, size_t n) {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
    if (use_rep_movsb) {
        __asm__ volatile("rep movsb" : "+D"(to), "+S"(from), "+c"(n) : : "memory");
        return;
    }
#endif
    memcpy(to, from, n);
}

/* The stream of bytes a batch's pieces (window rows, packed segments) are copied from, in copy order, asked for
 * ahead of the copy.  A piece's source is tokens + rows[k] * size (windows: rows given) or from[k] (segments), its
 * bytes `fixed` or count[k] * size; each piece also reads one token more (its targets' last), asked for with its
 * last bytes.  `copy_piece` copies the next piece's inputs and targets 1 KB at a time (STREAM_CHUNK), asking
 * first for the stream up to STREAM_AHEAD bytes beyond the chunk: the prefetches spread along the copy keep a
 * steady stream of lines in flight, where asking for a whole piece a few pieces on sent bursts (33 lines for a 2 KB
 * row) that filled the miss buffers and stalled the copy.  How far ahead is the memory's latency times the copy's
 * rate: on this project's 2-core KVM guest (AMD EPYC, Zen 5) 6 KB ahead emitted windows 1.26-1.37x faster than 2 KB
 * (T=1024 B=32: 0.69-0.74x the memcpy floor became 0.95-0.97x; 4 KB 1.20x, 8 KB 1.31x, 12 KB 1.29x, 16 KB 1.15x:
 * scripts/bench.py --same-process).  A window batch's stream runs on into the next batch's rows when the caller
 * names them (`then`), so the next call starts on lines already asked for. */
typedef struct {
    const char *tokens;
    const int64_t *rows;       /* windows: the pieces' first tokens; NULL: from */
    const char *const *from;   /* segments: the pieces' sources */
    const int64_t *count;      /* segments: the pieces' tokens; NULL: every piece is `fixed` bytes */
    int64_t pieces, piece;     /* pieces; the next not wholly asked for */
    size_t size, fixed;        /* token size; a window row's bytes */
    size_t asked, at, done;    /* stream bytes asked for; bytes of `piece` asked for; stream bytes copied */
    const int64_t *then;       /* windows: the next batch's rows, asked for once these run out (NULL: none) */
    int64_t then_pieces;
} stream_ahead;

static inline void ask(stream_ahead *c, size_t upto) {
    while (c->asked < upto) {
        if (c->piece == c->pieces) { /* this batch all asked for: on into the next batch's rows, if given */
            if (c->then == NULL) {
                break;
            }
            c->rows = c->then;
            c->pieces = c->then_pieces;
            c->piece = 0;
            c->then = NULL;
            continue;
        }
        size_t bytes = c->count ? (size_t)c->count[c->piece] * c->size : c->fixed;
        const char *source = c->rows ? c->tokens + c->rows[c->piece] * (int64_t)c->size : c->from[c->piece];
        size_t take = bytes - c->at < upto - c->asked ? bytes - c->at : upto - c->asked;
        int last = c->at + take == bytes;
        prefetch_bytes(source + c->at, take + (last ? c->size : 0));
        c->asked += take;
        c->at += take;
        if (last) {
            c->piece++;
            c->at = 0;
        }
    }
}

/* A packed segment's n bytes to inputs and, from `shift` bytes on, to targets, in one AVX-512 loop aligned to the
 * destination (inputs and targets share their alignment: rows of one size at one column), masked head and tail:
 * a segment starts at any column and ends at any, where `rep movsb` pays for both ends of each of its two copies.
 * Chosen at import where the CPU has AVX-512BW and BMI2 (use_pair512); scripts/bench_split_copy.c measures it
 * against the string copy on rows of two pieces. */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define HAVE_PAIR512 1
__attribute__((target("avx512f,avx512bw,bmi2"))) static inline void copy_pair512(char *in, char *tg, const char *from,
                                                                            size_t n, size_t shift) {
    size_t head = (64 - ((uintptr_t)in & 63)) & 63, j;
    if (head > n) {
        head = n;
    }
    if (head > 0) {
        __mmask64 m = _bzhi_u64(~0ULL, (unsigned)head);
        _mm512_mask_storeu_epi8(in, m, _mm512_maskz_loadu_epi8(m, from));
        _mm512_mask_storeu_epi8(tg, m, _mm512_maskz_loadu_epi8(m, from + shift));
    }
    for (j = head; j + 64 <= n; j += 64) {
        _mm512_storeu_si512((void *)(in + j), _mm512_loadu_si512((const void *)(from + j)));
        _mm512_storeu_si512((void *)(tg + j), _mm512_loadu_si512((const void *)(from + j + shift)));
    }
    if (j < n) {
        __mmask64 m = _bzhi_u64(~0ULL, (unsigned)(n - j));
        _mm512_mask_storeu_epi8(in + j, m, _mm512_maskz_loadu_epi8(m, from + j));
        _mm512_mask_storeu_epi8(tg + j, m, _mm512_maskz_loadu_epi8(m, from + j + shift));
    }
}
#else
#define HAVE_PAIR512 0
#endif

/* One piece's inputs and targets, STREAM_CHUNK bytes at a time, the stream asked for ahead of each chunk; a
 * segment shorter than a row (`segment`: a tail) by copy_pair512 where the CPU has it, else (a window row, a full
 * row) by two string copies, which copy whole aligned rows faster (bench_pack.py --kernels: full rows 0.81-0.92x the
 * window rows' rate through copy_pair512, 0.98-1.03x through the string copy; tails 0.79-0.87x against 0.66-0.82x). */
static inline void copy_piece(stream_ahead *c, char *inputs, char *targets, const char *from, size_t bytes, int segment) {
    size_t off;
    for (off = 0; off < bytes; off += STREAM_CHUNK) {
        size_t n = bytes - off < STREAM_CHUNK ? bytes - off : STREAM_CHUNK;
        c->done += n;
        ask(c, c->done + STREAM_AHEAD);
#if HAVE_PAIR512
        if (segment && use_pair512) {
            copy_pair512(inputs + off, targets + off, from + off, n, c->size);
            continue;
        }
#else
        (void)segment;
#endif
        copy_chunk(inputs + off, from + off, n);
        copy_chunk(targets + off, from + off + c->size, n); /* the same lines, now in L1 */
    }
}

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif

#endif
