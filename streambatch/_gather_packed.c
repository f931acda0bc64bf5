/* Gather packed rows into their final arrays: the packed mode's emission kernel (streambatch._row_gather.Gatherer).
 *
 * The rule is streambatch.items.pack._pack_gather.gather_segments (its numpy fallback,
 * which tests/items/test_rows.py checks this kernel against): row r of the packing
 * holds, left to right from position 0, either one full piece (r < full_rows:
 * the r-th full piece in document order) or the tails tails[offsets[p]:offsets[p+1]] of
 * packed row p = r - full_rows (a tail of document d starts at
 * (L - 1) - (L - 1) % T and has (L - 1) % T targets), then padding to T.  The
 * gatherer resolves the packing once when it is made (resolve_packing: each full
 * row's piece, each piece's and each tail's place in the tokens, checked there),
 * so a batch's row costs two reads before its copy.
 *
 * Per position it writes inputs and targets (the document's own tokens; pad_id
 * at padding), segment_ids (0, 1, ... per row; -1 at padding), position_ids (0
 * at a segment's or the padding's first position, +1 along: copied from a
 * template), loss_mask (0 at padding); per sequence (every segment, then each
 * padded row's padding) cu_seqlens over the flattened w * T positions; per
 * segment its provenance (row in the batch, document, start, targets).  Ids
 * are int16 when T < 2**15, else int32 (_pack_gather.id_dtype).  Passes: ask
 * for every row's first look-up at once (0); check and count the segments, asking for the pieces (1); locate
 * each (2: its provenance, first token and sequence in cu_seqlens); copy every segment's inputs and targets
 * through the stream cursor shared with the window gather (3: 1 KB chunks, the
 * sources asked for 6 KB ahead; a masked source's targets counted after each
 * copy; the next batch's look-ups and first segments asked for along it when given); write mask and ids (5,
 * the full gather and `columns` only).  The batch's arrays
 * are made here (numpy's C API: no Python call per array); scratch: one int64
 * per row (on the stack for small batches); the GIL is released while filling
 * large batches.  With uint16 tokens a packed batch writes 9 bytes per
 * position (4 for the tokens, 2 + 2 for the ids, 1 for the mask) where a
 * window batch writes 4.
 *
 * Gatherer(tokens, starts, lengths, full_docs, full_ends, offsets, tails, T, full_rows, pad_id[, bits])
 *     holds read-only buffers of the source and the packing (made once per packing); bits (uint8, or None) is
 *     the source's loss mask, one bit per token of `tokens` (little-endian in each byte, as
 *     streambatch.model.mask packs it): loss_mask is then also False at every target whose bit is clear, and
 *     target_count counts only the set ones (the numpy path: streambatch.items.pack.packed_batch.mask_pieces);
 * Gatherer.gather(rows[, next])
 *     returns (inputs, targets, segment_ids, position_ids, loss_mask, cu_seqlens, provenance,
 *     target_count, max_seqlen): provenance is int64 (4, segments).  next (int64, or None): the next batch's
 *     rows, a hint only (asked for along this copy, never read for the result nor checked: any next gives the
 *     same arrays; gather_tokens and columns take it too).
 * Gatherer.gather(rows, kinds, sources)
 *     the same for a mixture of packed rows: row i is row rows[i] of source kinds[i] (uint8, one per row),
 *     read by the Gatherer sources[kinds[i]] (a tuple of 1 to 256 Gatherers sharing this one's T, token size
 *     and pad id: checked); the same passes over the batch, each row (and each segment) read through its
 *     own source's views; provenance's documents are each row's source's.
 * Gatherer.gather_tokens(rows[, next] | rows, kinds, sources)
 *     the same tuple with None for segment_ids, position_ids and loss_mask: the emission's pass (tokens, cu_seqlens,
 *     provenance, target_count counting each segment's set mask bits in place), writing 4 bytes per position with
 *     uint16 tokens, as a window batch does; the batch builds the rest on demand with
 * Gatherer.columns(rows[, kinds, sources])
 *     the same tuple with None for inputs and targets (no token is read).
 * Gatherer.row_counts(rows[, kinds, sources]), Gatherer.use_row_counts(counts)
 *     each row's counted targets (uint32: passes 0-2, then each segment's set bits; no array of the batch); held
 *     for every row of the packing (uint32, row order), gather_tokens sums the batch's rows' entries where every
 *     row's source holds one, and its token pass reads no mask bit.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_buffers.h"
#include "_gather.h"

enum { TOKENS, STARTS, LENGTHS, FULL_DOCS, FULL_ENDS, OFFSETS, TAILS, HELD };

/* The packing resolved once, when the gatherer is made (resolve_packing): a row's look-up in a batch is then two
 * reads (row_piece, then its piece; offsets, then its tails' pieces) where the packing's own arrays took a chain
 * of five (bucket, ends, full_docs, then the document's start and length), and every bound was checked per
 * segment of every batch.  What fails its check is kept, marked (a piece's rows past `fits`, a tail's targets 0),
 * and refused when a batch asks for it, with the message the per-batch check gave. */
typedef struct {
    int64_t at;    /* its document's first token: full row r's is at + (r - first) * T */
    int64_t first; /* its first full row: row r starts (r - first) * T into the document */
    int64_t doc;   /* its document */
    int64_t fits;  /* its rows from first on that lie inside the document and the tokens (the rest are refused) */
} full_piece;

typedef struct {
    int64_t at;      /* its first token in the flat tokens */
    int64_t start;   /* its first token in its document: (L - 1) - (L - 1) % T */
    uint32_t doc;    /* its document (tails' own entry) */
    int32_t targets; /* (L - 1) % T; 0: the tail lies outside its document or the tokens */
} tail_piece;

#define NO_PIECE UINT32_MAX

typedef struct {
    PyObject_HEAD
    Py_buffer views[HELD];
    int held;
    Py_ssize_t itemsize; /* 2 or 4 */
    int64_t T, full_rows, pad;
    int64_t counts[HELD]; /* entries of each buffer */
    int32_t *iota;        /* 0, 1, ..., iota_size - 1: int32 position ids are copied from it */
    int16_t *iota16;      /* the same as int16 (T < 2**15): int16 position ids are copied from it */
    int64_t iota_size;
    uint32_t *row_piece;  /* per full row: its full piece (NO_PIECE: none; resolve_packing) */
    full_piece *pieces;   /* per full piece: where its rows' tokens are, its document (resolve_packing) */
    tail_piece *tail_pieces; /* per entry of tails: where that tail's tokens are (resolve_packing) */
    Py_buffer bits;       /* the loss mask, one bit per token (held when has_bits) */
    int has_bits;
    Py_buffer row_counts; /* uint32, one per row of the packing: its counted targets (held when has_row_counts) */
    int has_row_counts;
} Gatherer;

#define IOTA_LIMIT (1 << 16)

static void gatherer_release(Gatherer *self) {
    int k;
    for (k = 0; k < self->held; k++) {
        PyBuffer_Release(&self->views[k]);
    }
    self->held = 0;
    release_held(&self->bits, &self->has_bits);
    release_held(&self->row_counts, &self->has_row_counts);
}

/* The tables the gatherer made itself (position templates, resolve_packing's), freed and cleared. */
static void gatherer_free_tables(Gatherer *self) {
    PyMem_Free(self->iota);
    PyMem_Free(self->iota16);
    PyMem_Free(self->row_piece);
    PyMem_Free(self->pieces);
    PyMem_Free(self->tail_pieces);
    self->iota = NULL;
    self->iota16 = NULL;
    self->row_piece = NULL;
    self->pieces = NULL;
    self->tail_pieces = NULL;
}

static void gatherer_dealloc(Gatherer *self) {
    gatherer_release(self);
    gatherer_free_tables(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Resolve the packing (the tables of full_piece and tail_piece): each full piece's and each tail's place in the
 * tokens, checked once against its document and the tokens, and each full row's piece (the first piece whose
 * running count passes the row, as a search of full_ends finds it).  O(full rows + documents) once; it holds
 * 4 bytes per full row, 32 per full piece and 24 per tail.  Returns -1 (MemoryError or ValueError set). */
static int resolve_packing(Gatherer *self) {
    const int64_t *starts = (const int64_t *)self->views[STARTS].buf, *lengths = (const int64_t *)self->views[LENGTHS].buf;
    const int64_t *full_docs = (const int64_t *)self->views[FULL_DOCS].buf, *ends = (const int64_t *)self->views[FULL_ENDS].buf;
    const uint32_t *tails = (const uint32_t *)self->views[TAILS].buf;
    int64_t pieces = self->counts[FULL_ENDS], count = self->counts[TAILS], documents = self->counts[LENGTHS];
    int64_t tokens = self->counts[TOKENS], T = self->T, rows = self->full_rows, covered = 0, q;
    if (pieces >= (int64_t)NO_PIECE) {
        PyErr_SetString(PyExc_ValueError, "Gatherer: more than 2**32 - 2 full pieces");
        return -1;
    }
    self->row_piece = (uint32_t *)PyMem_Malloc((size_t)(rows + 1) * sizeof(uint32_t));
    self->pieces = (full_piece *)PyMem_Malloc((size_t)(pieces + 1) * sizeof(full_piece));
    self->tail_pieces = (tail_piece *)PyMem_Malloc((size_t)(count + 1) * sizeof(tail_piece));
    if (self->row_piece == NULL || self->pieces == NULL || self->tail_pieces == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (q = 0; q < pieces; q++) {
        int64_t first = q > 0 ? ends[q - 1] : 0, end = ends[q], d = full_docs[q], fits = 0;
        full_piece *piece = self->pieces + q;
        if (d >= 0 && d < documents && first >= 0 && end > first && lengths[d] >= 1 && starts[d] >= 0 &&
            starts[d] < tokens) { /* row first + j lies inside while (j + 1) * T < L and < tokens - starts[d] */
            int64_t in_doc = (lengths[d] - 1) / T, in_tokens = (tokens - starts[d] - 1) / T;
            fits = end - first < in_doc ? end - first : in_doc;
            fits = fits < in_tokens ? fits : in_tokens;
        }
        piece->first = first;
        piece->doc = d;
        piece->fits = fits;
        piece->at = fits > 0 ? starts[d] : 0;
        for (; covered < first && covered < rows; covered++) { /* rows before it that no piece holds */
            self->row_piece[covered] = NO_PIECE;
        }
        for (; covered < end && covered < rows; covered++) { /* its rows (those an earlier piece holds stay its) */
            self->row_piece[covered] = (uint32_t)q;
        }
    }
    for (; covered < rows; covered++) {
        self->row_piece[covered] = NO_PIECE;
    }
    for (q = 0; q < count; q++) {
        int64_t d = (int64_t)tails[q], before, n;
        tail_piece *tail = self->tail_pieces + q;
        int inside = d < documents && lengths[d] >= 2 && (n = (before = lengths[d] - 1) % T) >= 1 &&
                     starts[d] >= 0 && starts[d] < tokens && before < tokens - starts[d];
        tail->doc = (uint32_t)d;
        tail->targets = inside ? (int32_t)n : 0;
        tail->start = inside ? before - n : 0;
        tail->at = inside ? starts[d] + before - n : 0;
    }
    return 0;
}

static int gatherer_init(Gatherer *self, PyObject *args, PyObject *kwargs) {
    static const char *names[HELD] = {"tokens", "starts", "lengths", "full_docs", "full_ends", "offsets", "tails"};
    PyObject *objects[HELD], *bits = Py_None;
    long long T, full_rows, pad;
    int64_t k;
    (void)kwargs;
    gatherer_release(self);
    if (!PyArg_ParseTuple(args, "OOOOOOOLLL|O", &objects[0], &objects[1], &objects[2], &objects[3], &objects[4],
                          &objects[5], &objects[6], &T, &full_rows, &pad, &bits)) {
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
    if (bits != Py_None) {
        if (PyObject_GetBuffer(bits, &self->bits, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            gatherer_release(self);
            return -1;
        }
        self->has_bits = 1;
        if (!kind_is(&self->bits, "B", 1) || self->bits.len * 8 < self->counts[TOKENS]) {
            PyErr_SetString(PyExc_ValueError, "Gatherer: bits must be uint8 with one bit per token");
            gatherer_release(self);
            return -1;
        }
    }
    self->T = T;
    self->full_rows = full_rows;
    self->pad = pad;
    gatherer_free_tables(self);
    self->iota_size = T < IOTA_LIMIT ? T : IOTA_LIMIT;
    self->iota = (int32_t *)PyMem_Malloc((size_t)self->iota_size * sizeof(int32_t));
    self->iota16 = (int16_t *)PyMem_Malloc((size_t)self->iota_size * sizeof(int16_t));
    if (self->iota == NULL || self->iota16 == NULL) {
        gatherer_release(self);
        PyErr_NoMemory();
        return -1;
    }
    if (resolve_packing(self) < 0) {
        gatherer_release(self);
        return -1;
    }
    for (k = 0; k < self->iota_size; k++) {
        self->iota[k] = (int32_t)k;
        self->iota16[k] = (int16_t)k; /* used only when T < 2**15 */
    }
    return 0;
}

typedef struct {
    const char *message;
    int64_t row;
} failure;

#define MAX_SOURCES 256

/* What a batch reads: one gatherer (kinds NULL), or a mixture's, row i read by gs[kinds[i]]; all share T, token
 * size and pad id, so gs[0] answers for those. */
typedef struct {
    Gatherer *const *gs;
    const uint8_t *kinds;
} sources_t;

static inline const Gatherer *source_of(const sources_t *s, int64_t row) {
    return s->gs[s->kinds ? s->kinds[row] : 0];
}

/* Ask for the cache line holding `at` (a hint; nothing is read now). */
static inline void ask_line(const void *at) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(at, 0, 3);
#else
    (void)at;
#endif
}

/* The two kinds of row, as every pass reads them (the batch's passes, and ask_next's hints for the next batch). */

/* Whether full row r lies inside its piece's document and the tokens (fits > 0: 0 <= first <= r). */
static inline int row_fits(const full_piece *piece, int64_t r) {
    return piece->fits > 0 && r - piece->first < piece->fits;
}

/* Row r of the packing as a row of tails: 1 with its tails [*lo, *hi) when its offsets lie inside the tails, 0
 * when they do not (or it has none), -1 when r is no row of tails (a full row, or out of range). */
static inline int tail_range(const Gatherer *g, int64_t r, int64_t *lo, int64_t *hi) {
    const int64_t *offsets = (const int64_t *)g->views[OFFSETS].buf;
    if (r < g->full_rows || r >= g->full_rows + g->counts[OFFSETS] - 1) {
        return -1;
    }
    *lo = offsets[r - g->full_rows];
    *hi = offsets[r - g->full_rows + 1];
    return *lo >= 0 && *hi > *lo && *hi <= g->counts[TAILS];
}

/* Pass 0: every row's look-ups asked for in two waves over the batch: its first link (row_piece[r], or its packed
 * row's offsets: ask_links), then the piece it names (the full piece, or the first and last of its tails' pieces:
 * count_pieces, pass 1).  Each link is a likely miss in a shuffled batch; a wave asks for one link of every row at
 * once, so the misses of the whole batch overlap.  The same waves ask for the next batch's look-ups along this
 * batch's copy (ask_next), so its passes find them in cache. */
static void ask_links(const sources_t *s, const int64_t *rows, int64_t width) {
    int64_t i;
    for (i = 0; i < width; i++) {
        const Gatherer *g = source_of(s, i);
        int64_t r = rows[i];
        if (r >= 0 && r < g->full_rows) {
            ask_line(g->row_piece + r);
        } else if (r >= g->full_rows && r < g->full_rows + g->counts[OFFSETS] - 1) {
            ask_line((const int64_t *)g->views[OFFSETS].buf + (r - g->full_rows));
        }
    }
}

/* Pass 1: the second wave, and the segments of the batch (one per full row, its tails for a packed row): each
 * row's link read (asked for by ask_links), checked, counted, and the piece it names asked for; used[i] then holds
 * row i's full piece or first tail (-1: no piece, which locate reports).  Returns the segments, or -1 (and *fail)
 * for a row out of range or a packed row without segments.  With fail NULL (the next batch's hint: used NULL too)
 * a bad row is skipped, nothing is reported. */
static int64_t count_pieces(const sources_t *s, const int64_t *rows, int64_t width, int64_t *used, failure *fail) {
    int64_t segments = 0, i;
    for (i = 0; i < width; i++) {
        const Gatherer *g = source_of(s, i);
        int64_t r = rows[i], found = -1, lo = 0, hi = 0;
        int tails = -1;
        if (r >= 0 && r < g->full_rows) {
            uint32_t q = g->row_piece[r];
            if (q != NO_PIECE) {
                found = (int64_t)q;
                ask_line(g->pieces + q);
            }
            segments += 1;
        } else if ((tails = tail_range(g, r, &lo, &hi)) > 0) {
            found = lo;
            ask_line(g->tail_pieces + lo);
            ask_line(g->tail_pieces + hi - 1);
            segments += hi - lo;
        } else if (fail != NULL) {
            fail->message = tails == 0 ? "a packed row without segments, or offsets outside the tails"
                                       : "row number out of range for this packing";
            fail->row = i;
            return -1;
        }
        if (used != NULL) {
            used[i] = found;
        }
    }
    return segments;
}

/* Pass 2: every segment into the provenance (row in the batch, document, start, targets) and its first token in
 * its source's tokens (at), from the resolved pieces (resolve_packing checked each against its document and the
 * tokens; a marked one is refused here); used[i]: the positions row i fills; cu: the sequence boundaries (every
 * segment, then each padded row's padding, over the flattened w * T positions) and *longest the longest sequence.
 * Returns the sequences, or -1 (and *fail).  On entry used[i] is pass 1's piece or first tail of row i. */
static int64_t locate(const sources_t *s, const int64_t *rows, int64_t width, failure *fail, int64_t *const *provenance,
                      int64_t *at, int64_t *used, int32_t *cu, int64_t *longest) {
    int64_t T = s->gs[0]->T, sequences = 0, k = 0, i, j, most = 0;
    cu[0] = 0;
    for (i = 0; i < width; i++) {
        const Gatherer *g = source_of(s, i);
        int64_t r = rows[i], filled = 0, hi;
        if (r < g->full_rows) {
            const full_piece *piece = used[i] >= 0 ? g->pieces + used[i] : NULL;
            if (piece == NULL) {
                fail->message = "a full row beyond the full pieces: the packing does not belong to this source";
                fail->row = i;
                return -1;
            }
            if (!row_fits(piece, r)) {
                fail->message = "a segment outside the source's tokens: the packing does not belong to it";
                fail->row = i;
                return -1;
            }
            provenance[0][k] = i;
            provenance[1][k] = piece->doc;
            provenance[2][k] = (r - piece->first) * T;
            provenance[3][k] = T;
            at[k] = piece->at + (r - piece->first) * T;
            k++;
            used[i] = T;
            cu[++sequences] = (int32_t)((i + 1) * T);
            most = T;
            continue;
        }
        hi = ((const int64_t *)g->views[OFFSETS].buf)[r - g->full_rows + 1];
        for (j = used[i]; j < hi; j++) {
            const tail_piece *tail = g->tail_pieces + j;
            if (tail->targets < 1) {
                fail->message = "a segment outside the source's tokens: the packing does not belong to it";
                fail->row = i;
                return -1;
            }
            provenance[0][k] = i;
            provenance[1][k] = (int64_t)tail->doc;
            provenance[2][k] = tail->start;
            provenance[3][k] = tail->targets;
            at[k] = tail->at;
            k++;
            filled += tail->targets;
            cu[++sequences] = (int32_t)(i * T + filled);
            most = tail->targets > most ? tail->targets : most;
        }
        if (filled > T) {
            fail->message = "a packed row holds more than T targets";
            fail->row = i;
            return -1;
        }
        used[i] = filled;
        if (filled < T) { /* the row's padding: one sequence */
            cu[++sequences] = (int32_t)((i + 1) * T);
            most = T - filled > most ? T - filled : most;
        }
    }
    *longest = most;
    return sequences;
}

typedef struct {
    char *inputs, *targets, *segment_ids, *position_ids;
    uint8_t *mask;
    int64_t *provenance[4]; /* per segment: row in the batch, document, start in the document, targets */
    const int64_t *at;      /* per segment: its first token in its source's tokens (pass 2) */
    int64_t idsize;         /* 2 (int16 ids) or 4 (int32 ids) */
    int64_t segments, target_count, max_seqlen;
    int tabled;             /* target_count is the sum of the rows' row_counts: the token pass counts nothing */
    const int64_t *next;    /* the next batch's rows (a hint; NULL: none): asked for along the copy (ask_next) */
    int64_t next_width;
} outputs;

/* n ids equal to id from position at (ids of idsize bytes). */
static inline void put_ids(char *ids, int64_t idsize, int64_t at, int64_t n, int32_t id) {
    int64_t k;
    if (id == 0 || id == -1) { /* every byte 0x00 or 0xFF */
        memset(ids + at * idsize, id == 0 ? 0 : 0xFF, (size_t)(n * idsize));
    } else if (idsize == 2) {
        int16_t *seg = (int16_t *)ids + at;
        for (k = 0; k < n; k++) {
            seg[k] = (int16_t)id;
        }
    } else {
        int32_t *seg = (int32_t *)ids + at;
        for (k = 0; k < n; k++) {
            seg[k] = id;
        }
    }
}

/* n position ids 0, 1, ... from position at: a copy of the template (the first iota_size), then counted on. */
static inline void put_positions(const Gatherer *g, char *ids, int64_t idsize, int64_t at, int64_t n) {
    int64_t k, copied = n < g->iota_size ? n : g->iota_size;
    if (idsize == 2) {
        memcpy((int16_t *)ids + at, g->iota16, (size_t)copied * sizeof(int16_t));
        for (k = copied; k < n; k++) {
            ((int16_t *)ids)[at + k] = (int16_t)k;
        }
    } else {
        memcpy((int32_t *)ids + at, g->iota, (size_t)copied * sizeof(int32_t));
        for (k = copied; k < n; k++) {
            ((int32_t *)ids)[at + k] = (int32_t)k;
        }
    }
}

/* Pad positions [from, T) of one row of `size`-byte tokens with pad. */
static inline void put_padding(char *row, int64_t size, int64_t from, int64_t T, int64_t pad) {
    int64_t p;
    if (size == 2) {
        uint16_t *a = (uint16_t *)row, v = (uint16_t)pad;
        for (p = from; p < T; p++) {
            a[p] = v;
        }
    } else {
        uint32_t *a = (uint32_t *)row, v = (uint32_t)pad;
        for (p = from; p < T; p++) {
            a[p] = v;
        }
    }
}


/* Pass 3: the inputs and targets of every segment (its own tokens, then pad_id to T), copied in order through
 * the stream cursor (copy_piece: the sources asked for ahead as the copy goes); the segments' sources are listed
 * first (on the stack for up to STACK_PIECES, else the raw allocator: this pass may run without the GIL; where
 * that fails the copy goes on without asking ahead). */
#define STACK_PIECES 512

static inline const char *segment_source(const sources_t *s, const outputs *o, int64_t k) {
    const Gatherer *h = source_of(s, o->provenance[0][k]);
    return (const char *)h->views[TOKENS].buf + o->at[k] * h->itemsize;
}

/* The mask bits of segment k's targets: *p (their first bit) and the source's bits, or NULL (no mask). */
static inline const uint8_t *segment_bits(const sources_t *s, const outputs *o, int64_t k, int64_t *p) {
    const Gatherer *h = source_of(s, o->provenance[0][k]);
    if (!h->has_bits) {
        return NULL;
    }
    *p = o->at[k] + 1;
    return (const uint8_t *)h->bits.buf;
}

/* The next batch's look-ups and its first tokens, asked for while row i of this batch (of `width`) is copied:
 * its first links at row 0, the pieces they name at the middle row (the links are in by then), and at the last row
 * the first STREAM_AHEAD bytes of its segments, as the window stream runs on into its next batch's rows (their
 * pieces are in by then).  Hints only: nothing is
 * checked or kept, so a bad row merely asks for nothing; the next call's passes still check every row.  The next
 * batch then finds its look-ups and first tokens in cache where it would wait for three misses in a row (the link,
 * the piece, the tokens) before its first copy. */
static void ask_next(const sources_t *s, const outputs *o, int64_t i, int64_t width) {
    if (o->next == NULL || o->next_width < 1 || s->kinds != NULL) { /* a mixture's next rows: no kinds for them */
        return;
    }
    if (i == 0) {
        ask_links(s, o->next, o->next_width);
    }
    if (i == width / 2) {
        count_pieces(s, o->next, o->next_width, NULL, NULL);
    }
    if (i == width - 1) { /* the stream runs on into the next batch's first segments, STREAM_AHEAD bytes of them */
        const Gatherer *g = s->gs[0];
        const char *tokens = (const char *)g->views[TOKENS].buf;
        int64_t budget = STREAM_AHEAD, size = g->itemsize, row, j, lo = 0, hi = 0;
        for (row = 0; row < o->next_width && budget > 0; row++) {
            int64_t r = o->next[row];
            if (r >= 0 && r < g->full_rows) {
                uint32_t q = g->row_piece[r];
                const full_piece *piece = q != NO_PIECE ? g->pieces + q : NULL;
                if (piece != NULL && row_fits(piece, r)) {
                    int64_t bytes = (g->T + 1) * size;
                    prefetch_bytes(tokens + (piece->at + (r - piece->first) * g->T) * size,
                                   (size_t)(bytes < budget ? bytes : budget));
                    budget -= bytes;
                }
            } else if (tail_range(g, r, &lo, &hi) > 0) {
                for (j = lo; j < hi && budget > 0; j++) {
                    const tail_piece *tail = g->tail_pieces + j;
                    int64_t bytes = (tail->targets + 1) * size;
                    if (tail->targets > 0) {
                        prefetch_bytes(tokens + tail->at * size, (size_t)(bytes < budget ? bytes : budget));
                        budget -= bytes;
                    }
                }
            }
        }
    }
}

static void put_tokens(const sources_t *s, outputs *o, int64_t width, const int64_t *used) {
    const int64_t *lengths = o->provenance[3];
    const Gatherer *first = s->gs[0];
    int64_t T = first->T, size = first->itemsize, k, i, column, p = 0;
    const uint8_t *bits = NULL;
    int counting;
    const char *stack[STACK_PIECES], **from = stack;
    stream_ahead c = {NULL, NULL, NULL, lengths, 0, 0, (size_t)size, 0, 0, 0, 0, NULL, 0};
    if (o->segments > STACK_PIECES) {
        from = (const char **)PyMem_RawMalloc((size_t)o->segments * sizeof(*from));
    }
    if (from != NULL) {
        for (k = 0; k < o->segments; k++) {
            from[k] = segment_source(s, o, k);
        }
        c.from = from;
        c.pieces = o->segments; /* else none: nothing is asked for ahead */
    }
    k = 0;
    /* no mask pass follows (gather_tokens): each segment's targets are counted after its copy, its bits (bits, p)
     * asked for a segment ahead; nothing is counted here where the rows' tables gave the count (o->tabled) */
    counting = o->mask == NULL && !o->tabled;
    if (counting && o->segments > 0 && (bits = segment_bits(s, o, 0, &p)) != NULL) {
        prefetch_bits(bits, p, lengths[0]);
    }
    for (i = 0; i < width; i++) {
        char *inputs = o->inputs + i * T * size, *targets = o->targets + i * T * size;
        ask_next(s, o, i, width);
        for (column = 0; column < used[i]; k++) {
            int64_t n = lengths[k], next_p = 0;
            const uint8_t *next = counting && k + 1 < o->segments ? segment_bits(s, o, k + 1, &next_p) : NULL;
            if (next != NULL) {
                prefetch_bits(next, next_p, lengths[k + 1]);
            }
            copy_piece(&c, inputs + column * size, targets + column * size, from ? from[k] : segment_source(s, o, k),
                       (size_t)(n * size), n < T); /* a full row: a window's copy; a tail: copy_pair512 */
            if (counting) {
                o->target_count += bits != NULL ? count_bits(bits, p, n) : n;
            }
            bits = next;
            p = next_p;
            column += n;
        }
        if (used[i] < T) {
            put_padding(inputs, size, used[i], T, first->pad);
            put_padding(targets, size, used[i], T, first->pad);
        }
    }
    if (from != stack) {
        PyMem_RawFree(from);
    }
}

/* Pass 5: loss mask, segment and position ids, per segment then for each row's padding (cu_seqlens: locate).  A row of a
 * source with mask bits takes its targets' bits (a segment's first target is token starts[d] + start + 1). */
static void put_ids_and_masks(const sources_t *s, outputs *o, int64_t width, const int64_t *used) {
    const int64_t *in_row = o->provenance[0], *lengths = o->provenance[3];
    const Gatherer *g = s->gs[0]; /* T and the position template: every source's alike */
    int64_t T = g->T, k = 0, i, column;
    for (i = 0; i < width; i++) {
        const Gatherer *h = source_of(s, i);
        const uint8_t *bits = h->has_bits ? (const uint8_t *)h->bits.buf : NULL;
        int64_t at = i * T;
        int32_t id = 0;
        for (column = 0; column < used[i]; k++, id++) {
            int64_t n = lengths[k];
            if (k + MASK_AHEAD < o->segments) { /* the mask bits of the segment MASK_AHEAD on, asked for now */
                const Gatherer *a = source_of(s, in_row[k + MASK_AHEAD]);
                if (a->has_bits) {
                    prefetch_bits((const uint8_t *)a->bits.buf, o->at[k + MASK_AHEAD] + 1, lengths[k + MASK_AHEAD]);
                }
            }
            if (bits != NULL) {
                o->target_count += unpack_bits(bits, o->at[k] + 1, n, o->mask + at + column, 1);
            } else {
                memset(o->mask + at + column, 1, (size_t)n);
                o->target_count += n;
            }
            put_ids(o->segment_ids, o->idsize, at + column, n, id);
            put_positions(g, o->position_ids, o->idsize, at + column, n);
            column += n;
        }
        if (column < T) {
            memset(o->mask + at + column, 0, (size_t)(T - column));
            put_ids(o->segment_ids, o->idsize, at + column, T - column, -1);
            put_positions(g, o->position_ids, o->idsize, at + column, T - column);
        }
    }
}

/* The passes a call asks for: tokens (inputs, targets) when o->inputs is set; the columns (mask, ids) when o->mask
 * is (gather_tokens: no mask always comes with the tokens, whose pass counts). */
static void fill(const sources_t *s, outputs *o, int64_t width, const int64_t *used) {
    if (o->inputs != NULL) {
        put_tokens(s, o, width, used);
    }
    if (o->mask != NULL) {
        put_ids_and_masks(s, o, width, used);
    }
}

#define STACK_ROWS 256 /* scratch for batches up to this many rows lives on the stack */

/* A mixture's sources (a tuple of 1 to MAX_SOURCES Gatherers of self's T, token size and pad id) into found[];
 * every kinds[i] must name one of them.  Returns their count, or -1 with an error set. */
static Py_ssize_t mixture_sources(const Gatherer *self, PyObject *tuple, const uint8_t *kinds, int64_t width,
                                  Gatherer **found) {
    Py_ssize_t n, k;
    int64_t i;
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) < 1 || PyTuple_GET_SIZE(tuple) > MAX_SOURCES) {
        PyErr_SetString(PyExc_TypeError, "Gatherer.gather(): sources must be a tuple of 1 to 256 Gatherers");
        return -1;
    }
    n = PyTuple_GET_SIZE(tuple);
    for (k = 0; k < n; k++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, k);
        const Gatherer *g = (const Gatherer *)item;
        if (!PyObject_TypeCheck(item, &GathererType) || g->held != HELD) {
            PyErr_Format(PyExc_TypeError, "Gatherer.gather(): sources[%zd] is not an initialised Gatherer", k);
            return -1;
        }
        if (g->T != self->T || g->itemsize != self->itemsize || g->pad != self->pad) {
            PyErr_Format(PyExc_ValueError,
                         "Gatherer.gather(): sources[%zd] has T=%lld, %zd-byte tokens, pad_id=%lld but this gatherer "
                         "T=%lld, %zd-byte tokens, pad_id=%lld; a mixture's sources need the same",
                         k, (long long)g->T, g->itemsize, (long long)g->pad, (long long)self->T, self->itemsize,
                         (long long)self->pad);
            return -1;
        }
        found[k] = (Gatherer *)item;
    }
    for (i = 0; i < width; i++) {
        if ((Py_ssize_t)kinds[i] >= n) {
            PyErr_Format(PyExc_ValueError, "row %lld of the batch: source %d has no gatherer (%zd sources)", (long long)i,
                         (int)kinds[i], n);
            return -1;
        }
    }
    return n;
}

#define WANT_TOKENS 1  /* inputs and targets */
#define WANT_COLUMNS 2 /* segment and position ids, loss mask */

#define WANT_ROW_COUNTS 4 /* no arrays: each row's counted targets (row_counts) */

/* Each row's counted targets (uint32, one per row), from pass 2's provenance: its segments' set mask bits, or
 * every target where the segment's source has no bits.  The table `use_row_counts` takes, made once per packing
 * in row order (the bits then read in order, not a few lines from a random place per segment of every batch). */
static PyObject *counts_of_rows(const sources_t *s, const outputs *o, int64_t width) {
    PyObject *out = new_array((npy_intp)width, -1, NPY_UINT32);
    uint32_t *counts;
    int64_t k, p = 0;
    if (out == NULL) {
        return NULL;
    }
    counts = (uint32_t *)ARRAY_DATA(out);
    memset(counts, 0, (size_t)width * sizeof(uint32_t));
    for (k = 0; k < o->segments; k++) {
        const uint8_t *bits = segment_bits(s, o, k, &p);
        int64_t n = o->provenance[3][k];
        counts[o->provenance[0][k]] += (uint32_t)(bits != NULL ? count_bits(bits, p, n) : n);
    }
    return out;
}

/* The arrays of a call: inputs, targets, segment_ids, position_ids, loss_mask, cu_seqlens, provenance (4, segments);
 * those not wanted are None. */
enum { INPUTS, TARGETS, SEGMENT_IDS, POSITION_IDS, LOSS_MASK, CU_SEQLENS, PROVENANCE, ARRAYS };

/* A call's arguments, viewed: rows (int64), and the next batch's rows (a hint) or a mixture's kinds (uint8). */
typedef struct {
    Py_buffer rows_view, kinds_view, next_view;
    int rows_viewed, kinds_viewed, next_viewed;
    const int64_t *rows;
    int64_t width;
} call_args;

static void call_release(call_args *c) {
    release_held(&c->rows_view, &c->rows_viewed);
    release_held(&c->kinds_view, &c->kinds_viewed);
    release_held(&c->next_view, &c->next_viewed);
}

/* (rows[, next]) or (rows, kinds, sources) into c, o's next (a hint) and s (a mixture's sources, found in many);
 * 0, or -1 with an error set (c is released by the caller either way). */
static int call_open(const Gatherer *self, PyObject *const *args, Py_ssize_t nargs, call_args *c, sources_t *s,
                     Gatherer **many, outputs *o) {
    const void *data = NULL;
    int64_t kinds_count, next_width = 0;
    o->next = NULL;
    o->next_width = 0;
    if (nargs == 2 && args[1] != Py_None) { /* the next batch's rows: a hint, asked for along this batch's copy */
        if (vector_of(args[1], NPY_INT64, "qlQL", 8, "next must be int64", &c->next_view, &c->next_viewed, &data,
                      &next_width) < 0) {
            return -1;
        }
        o->next = (const int64_t *)data;
        o->next_width = next_width;
    }
    if (vector_of(args[0], NPY_INT64, "qlQL", 8, "rows must be int64", &c->rows_view, &c->rows_viewed, &data,
                  &c->width) < 0) {
        return -1;
    }
    c->rows = (const int64_t *)data;
    if (nargs == 3) { /* a mixture: kinds (uint8, one per row) pick each row's gatherer among the sources */
        if (vector_of(args[1], NPY_UINT8, "B", 1, "kinds must be uint8", &c->kinds_view, &c->kinds_viewed, &data,
                      &kinds_count) < 0) {
            return -1;
        }
        if (kinds_count != c->width) {
            PyErr_Format(PyExc_ValueError, "Gatherer.gather(): %lld kinds for %lld rows; pass one per row",
                         (long long)kinds_count, (long long)c->width);
            return -1;
        }
        s->kinds = (const uint8_t *)data;
        if (mixture_sources(self, args[2], s->kinds, c->width, many) < 0) {
            return -1;
        }
        s->gs = many;
    }
    return 0;
}

/* A call's scratch: on the stack for batches of up to STACK_ROWS rows and STACK_PIECES segments, else allocated. */
typedef struct {
    int64_t *used; /* per row: the positions its segments fill */
    int64_t *at;   /* per segment: its first token (pass 2) */
    int32_t *cu;   /* cu_seqlens (pass 2): segments + rows + 1 */
    int64_t stack_used[STACK_ROWS], stack_at[STACK_PIECES];
    int32_t stack_cu[STACK_PIECES + STACK_ROWS + 1];
} scratch_t;

static void scratch_init(scratch_t *sc) {
    sc->used = sc->stack_used;
    sc->at = sc->stack_at;
    sc->cu = sc->stack_cu;
}

static void scratch_free(scratch_t *sc) {
    if (sc->used != sc->stack_used) {
        PyMem_Free(sc->used);
    }
    if (sc->at != sc->stack_at) {
        PyMem_Free(sc->at);
    }
    if (sc->cu != sc->stack_cu) {
        PyMem_Free(sc->cu);
    }
}

/* The per-row scratch for `width` rows; 0, or -1 with MemoryError set. */
static int scratch_rows(scratch_t *sc, int64_t width) {
    if (width > STACK_ROWS) {
        sc->used = (int64_t *)PyMem_Malloc((size_t)width * sizeof(int64_t));
        if (sc->used == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* The per-segment scratch for `segments` segments (-1: pass 1 failed) of `width` rows; 0, or -1 with MemoryError. */
static int scratch_segments(scratch_t *sc, int64_t segments, int64_t width) {
    if (segments > STACK_PIECES) {
        sc->at = (int64_t *)PyMem_Malloc((size_t)segments * sizeof(int64_t));
        if (sc->at == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (segments > STACK_PIECES || width > STACK_ROWS) {
        sc->cu = (int32_t *)PyMem_Malloc((size_t)(segments + width + 1) * sizeof(int32_t));
        if (sc->cu == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* The call's arrays but provenance into arrays[]: the (width, T) ones `want` asks for (the others None) and
 * cu_seqlens of `sequences` + 1; 0, or -1 with an error set. */
static int make_arrays(const Gatherer *self, int want, int64_t width, int64_t sequences, int64_t idsize,
                       PyObject **arrays) {
    int token_type = self->itemsize == 2 ? NPY_UINT16 : NPY_UINT32, id_type = idsize == 2 ? NPY_INT16 : NPY_INT32;
    int types[5] = {token_type, token_type, id_type, id_type, NPY_BOOL};
    int k;
    for (k = 0; k < 5; k++) {
        int wanted = (k <= TARGETS ? want & WANT_TOKENS : want & WANT_COLUMNS) != 0;
        if (wanted) {
            arrays[k] = new_array((npy_intp)width, (npy_intp)self->T, types[k]);
        } else {
            Py_INCREF(Py_None);
            arrays[k] = Py_None;
        }
    }
    arrays[CU_SEQLENS] = new_array((npy_intp)(sequences + 1), -1, NPY_INT32);
    for (k = 0; k < ARRAYS; k++) {
        if (arrays[k] == NULL) {
            return -1;
        }
    }
    return 0;
}

/* o->tabled and o->target_count before the fill: the token pass alone (no columns) sums the rows' row_counts where
 * every row's source holds them, and then counts nothing itself. */
static void count_from_tables(const sources_t *s, outputs *o, const int64_t *rows, int64_t width, int want) {
    int64_t k;
    o->target_count = 0;
    o->tabled = !(want & WANT_COLUMNS);
    for (k = 0; o->tabled && k < width; k++) {
        const Gatherer *h = source_of(s, k);
        if (h->has_row_counts) {
            o->target_count += ((const uint32_t *)h->row_counts.buf)[rows[k]];
        } else {
            o->tabled = 0;
            o->target_count = 0;
        }
    }
}

/* The call's result, (arrays..., target_count, max_seqlen), taking every reference of arrays[] (cleared); NULL
 * with an error set. */
static PyObject *result_tuple(PyObject **arrays, const outputs *o) {
    PyObject *result = PyTuple_New(ARRAYS + 2);
    int k;
    if (result == NULL) {
        return NULL;
    }
    for (k = 0; k < ARRAYS; k++) { /* the tuple takes every reference */
        PyTuple_SET_ITEM(result, k, arrays[k]);
        arrays[k] = NULL;
    }
    PyTuple_SET_ITEM(result, ARRAYS, PyLong_FromLongLong((long long)o->target_count));
    PyTuple_SET_ITEM(result, ARRAYS + 1, PyLong_FromLongLong((long long)o->max_seqlen));
    if (PyTuple_GET_ITEM(result, ARRAYS) == NULL || PyTuple_GET_ITEM(result, ARRAYS + 1) == NULL) {
        Py_CLEAR(result);
    }
    return result;
}

/* gather, gather_tokens, columns and row_counts: the arguments read (call_open), passes 0-2 (ask_links,
 * count_pieces, locate), then the arrays `want` asks for made and filled (fill), or each row's count. */
static PyObject *gatherer_run(Gatherer *self, PyObject *const *args, Py_ssize_t nargs, int want) {
    call_args c;
    scratch_t sc;
    failure fail = {NULL, 0};
    outputs o;
    PyObject *arrays[ARRAYS] = {NULL};
    PyObject *result = NULL;
    int64_t segments, sequences, longest = 0, idsize = self->T < (1 << 15) ? 2 : 4;
    Gatherer *alone[1], *many[MAX_SOURCES];
    sources_t s;
    int k;
    alone[0] = self;
    s.gs = alone;
    s.kinds = NULL;
    c.rows_viewed = c.kinds_viewed = c.next_viewed = 0;
    c.width = 0;
    scratch_init(&sc);
    if (self->held != HELD) {
        PyErr_SetString(PyExc_ValueError, "Gatherer.gather(): not initialised");
        return NULL;
    }
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "Gatherer.gather() (and gather_tokens, columns) takes 1 argument (rows), 2 (rows, next) or 3 (rows, kinds, sources), got %zd", nargs);
        return NULL;
    }
    if (call_open(self, args, nargs, &c, &s, many, &o) < 0 || scratch_rows(&sc, c.width) < 0) {
        goto done;
    }
    ask_links(&s, c.rows, c.width);
    segments = count_pieces(&s, c.rows, c.width, sc.used, &fail);
    if (segments >= 0) {
        arrays[PROVENANCE] = new_array(4, (npy_intp)segments, NPY_INT64);
        if (arrays[PROVENANCE] == NULL) {
            goto done;
        }
        for (k = 0; k < 4; k++) {
            o.provenance[k] = (int64_t *)ARRAY_DATA(arrays[PROVENANCE]) + k * segments;
        }
    }
    if (scratch_segments(&sc, segments, c.width) < 0) {
        goto done;
    }
    o.at = sc.at;
    sequences = segments < 0 ? -1 : locate(&s, c.rows, c.width, &fail, o.provenance, sc.at, sc.used, sc.cu, &longest);
    if (sequences < 0) {
        PyErr_Format(PyExc_ValueError, "row %lld of the batch: %s", (long long)fail.row, fail.message);
        goto done;
    }
    if (want & WANT_ROW_COUNTS) {
        o.segments = segments;
        result = counts_of_rows(&s, &o, c.width);
        goto done;
    }
    if (make_arrays(self, want, c.width, sequences, idsize, arrays) < 0) {
        goto done;
    }
    o.inputs = want & WANT_TOKENS ? (char *)ARRAY_DATA(arrays[INPUTS]) : NULL;
    o.targets = want & WANT_TOKENS ? (char *)ARRAY_DATA(arrays[TARGETS]) : NULL;
    o.segment_ids = want & WANT_COLUMNS ? (char *)ARRAY_DATA(arrays[SEGMENT_IDS]) : NULL;
    o.position_ids = want & WANT_COLUMNS ? (char *)ARRAY_DATA(arrays[POSITION_IDS]) : NULL;
    o.mask = want & WANT_COLUMNS ? (uint8_t *)ARRAY_DATA(arrays[LOSS_MASK]) : NULL;
    memcpy(ARRAY_DATA(arrays[CU_SEQLENS]), sc.cu, (size_t)(sequences + 1) * sizeof(int32_t));
    o.idsize = idsize;
    o.segments = segments;
    o.max_seqlen = longest;
    count_from_tables(&s, &o, c.rows, c.width, want);
    if (c.width * self->T >= GIL_POSITIONS) {
        Py_BEGIN_ALLOW_THREADS
        fill(&s, &o, c.width, sc.used);
        Py_END_ALLOW_THREADS
    } else {
        fill(&s, &o, c.width, sc.used);
    }
    result = result_tuple(arrays, &o);
done:
    scratch_free(&sc);
    for (k = 0; k < ARRAYS; k++) {
        Py_XDECREF(arrays[k]);
    }
    call_release(&c);
    return result;
}

static PyObject *gatherer_gather(Gatherer *self, PyObject *const *args, Py_ssize_t nargs) {
    return gatherer_run(self, args, nargs, WANT_TOKENS | WANT_COLUMNS);
}

static PyObject *gatherer_gather_tokens(Gatherer *self, PyObject *const *args, Py_ssize_t nargs) {
    return gatherer_run(self, args, nargs, WANT_TOKENS);
}

static PyObject *gatherer_columns(Gatherer *self, PyObject *const *args, Py_ssize_t nargs) {
    return gatherer_run(self, args, nargs, WANT_COLUMNS);
}

static PyObject *gatherer_row_counts(Gatherer *self, PyObject *const *args, Py_ssize_t nargs) {
    return gatherer_run(self, args, nargs, WANT_ROW_COUNTS);
}

/* Hold `counts` (uint32, one per row of the packing: row_counts over every row, in row order; None: drop it):
 * gather_tokens then sums the batch's rows' entries instead of counting their mask bits as it copies. */
static PyObject *gatherer_use_row_counts(Gatherer *self, PyObject *counts) {
    Py_buffer view;
    int64_t rows;
    if (self->held != HELD) {
        PyErr_SetString(PyExc_ValueError, "Gatherer.use_row_counts(): not initialised");
        return NULL;
    }
    rows = self->full_rows + self->counts[OFFSETS] - 1;
    if (counts == Py_None) {
        release_held(&self->row_counts, &self->has_row_counts);
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(counts, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (!kind_is(&view, "IL", 4) || view.len / 4 != rows) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "Gatherer.use_row_counts(): counts must be uint32, one per row of the packing (%lld)",
                     (long long)rows);
        return NULL;
    }
    release_held(&self->row_counts, &self->has_row_counts);
    self->row_counts = view;
    self->has_row_counts = 1;
    Py_RETURN_NONE;
}


static PyMethodDef gatherer_methods[] = {
    FASTCALL_METHOD("gather", gatherer_gather,
        "gather(rows[, kinds, sources]) -> (inputs, targets, segment_ids, position_ids, loss_mask, cu_seqlens, provenance, "
        "target_count, max_seqlen); provenance: int64 (4, segments): row in the batch, document, start, targets; a "
        "mixture's row i is read by sources[kinds[i]]"),
    FASTCALL_METHOD("gather_tokens", gatherer_gather_tokens,
        "gather_tokens(rows[, kinds, sources]) -> gather's tuple with None for segment_ids, position_ids and loss_mask "
        "(target_count still counts the masked targets)"),
    FASTCALL_METHOD("columns", gatherer_columns,
        "columns(rows[, kinds, sources]) -> gather's tuple with None for inputs and targets: a batch's columns on demand"),
    FASTCALL_METHOD("row_counts", gatherer_row_counts,
        "row_counts(rows[, kinds, sources]) -> uint32 array: each row's counted targets (no array of the batch is made)"),
    {"use_row_counts", (PyCFunction)gatherer_use_row_counts, METH_O,
     "use_row_counts(counts) -> None: hold row_counts of every row (uint32, row order; None drops it); gather_tokens "
     "then sums them instead of counting mask bits"},
    {NULL, NULL, 0, NULL},
};

GATHERER_TYPE(GathererType, "Gatherer", Gatherer,
              "Gatherer(tokens, starts, lengths, full_docs, full_ends, offsets, tails, T, full_rows, pad_id[, bits])",
              gatherer_init, gatherer_dealloc, gatherer_methods);
