/* What a packed tail row's copy costs, with no streambatch code around it: rows of T uint16 tokens copied into
 * inputs and targets (one token on), each row either one piece from one random place (a window row) or two
 * pieces from two random places split at column c, by five copy methods.
 *
 *     gcc -O2 -o /tmp/bench_split_copy scripts/bench_split_copy.c && /tmp/bench_split_copy [tokens] [ahead]
 *
 * tokens: the source's size (default 5e7 tokens, 100 MB: past every cache); ahead: rows whose pieces are asked
 * for (prefetcht2) before the current row is copied (default 3, about 6 KB at T = 1024, as the gathers ask).
 * Splits: "whole" (c = T: one piece), "halves" (c = T/2), "random" (c uniform in [1, T)), "adjacent" (random c,
 * the second piece right after the first's T - c + 1 tokens: one contiguous source), "aligned" (random c rounded
 * to 32 tokens: both pieces' destinations 64-byte aligned).  Methods: rep movsb; glibc memcpy; an AVX2 loop of
 * 32-byte steps (inputs and targets in one loop); an AVX-512 loop aligned to the destination with masked head
 * and tail; a branch-free loop of fixed 64-byte blocks that blends the two pieces at the split (the x86-64
 * methods beyond memcpy run where the CPU has them).  Prints ns per position, best of 5 passes, and the rate of
 * the fastest method's whole rows against each: docs/scale.md ("Packed vs window emission") quotes a run.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { T = 1024, B = 32, BATCHES = 3000, ROWS = B * BATCHES };

typedef void (*row_copy)(uint16_t *in, uint16_t *tg, const uint16_t *s1, const uint16_t *s2, int c);

static void by_rep_movsb_piece(char *to, const char *from, size_t n) {
    __asm__ volatile("rep movsb" : "+D"(to), "+S"(from), "+c"(n) : : "memory");
}

static void rep_movsb(uint16_t *in, uint16_t *tg, const uint16_t *s1, const uint16_t *s2, int c) {
    by_rep_movsb_piece((char *)in, (const char *)s1, (size_t)c * 2);
    by_rep_movsb_piece((char *)tg, (const char *)(s1 + 1), (size_t)c * 2);
    if (c < T) {
        by_rep_movsb_piece((char *)(in + c), (const char *)s2, (size_t)(T - c) * 2);
        by_rep_movsb_piece((char *)(tg + c), (const char *)(s2 + 1), (size_t)(T - c) * 2);
    }
}

static void glibc_memcpy(uint16_t *in, uint16_t *tg, const uint16_t *s1, const uint16_t *s2, int c) {
    memcpy(in, s1, (size_t)c * 2);
    memcpy(tg, s1 + 1, (size_t)c * 2);
    if (c < T) {
        memcpy(in + c, s2, (size_t)(T - c) * 2);
        memcpy(tg + c, s2 + 1, (size_t)(T - c) * 2);
    }
}

/* 32-byte steps, overshooting the piece's end by up to 31 bytes (the destinations have slack; a later piece or
 * row overwrites it). */
__attribute__((target("avx2"))) static void avx2_piece(char *in, char *tg, const char *from, size_t n) {
    size_t j;
    for (j = 0; j < n; j += 32) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(from + j)), b = _mm256_loadu_si256((const __m256i *)(from + j + 2));
        _mm256_storeu_si256((__m256i *)(in + j), a);
        _mm256_storeu_si256((__m256i *)(tg + j), b);
    }
}

__attribute__((target("avx2"))) static void avx2_loop(uint16_t *in, uint16_t *tg, const uint16_t *s1, const uint16_t *s2, int c) {
    avx2_piece((char *)in, (char *)tg, (const char *)s1, (size_t)c * 2);
    if (c < T) {
        avx2_piece((char *)(in + c), (char *)(tg + c), (const char *)s2, (size_t)(T - c) * 2);
    }
}

/* A masked head up to the destination's next 64-byte boundary, aligned 64-byte stores, a masked tail. */
__attribute__((target("avx512f,avx512bw,bmi2"))) static void aligned_piece(char *in, char *tg, const char *from, size_t n) {
    size_t head = (64 - ((uintptr_t)in & 63)) & 63, j;
    if (head > n) {
        head = n;
    }
    if (head) {
        __mmask64 m = _bzhi_u64(~0ULL, (unsigned)head);
        _mm512_mask_storeu_epi8(in, m, _mm512_maskz_loadu_epi8(m, from));
        _mm512_mask_storeu_epi8(tg, m, _mm512_maskz_loadu_epi8(m, from + 2));
    }
    for (j = head; j + 64 <= n; j += 64) {
        _mm512_store_si512((void *)(in + j), _mm512_loadu_si512((const void *)(from + j)));
        _mm512_store_si512((void *)(tg + j), _mm512_loadu_si512((const void *)(from + j + 2)));
    }
    if (j < n) {
        __mmask64 m = _bzhi_u64(~0ULL, (unsigned)(n - j));
        _mm512_mask_storeu_epi8(in + j, m, _mm512_maskz_loadu_epi8(m, from + j));
        _mm512_mask_storeu_epi8(tg + j, m, _mm512_maskz_loadu_epi8(m, from + j + 2));
    }
}

__attribute__((target("avx512f,avx512bw,bmi2"))) static void avx512_aligned(uint16_t *in, uint16_t *tg, const uint16_t *s1,
                                                                       const uint16_t *s2, int c) {
    aligned_piece((char *)in, (char *)tg, (const char *)s1, (size_t)c * 2);
    if (c < T) {
        aligned_piece((char *)(in + c), (char *)(tg + c), (const char *)s2, (size_t)(T - c) * 2);
    }
}

/* Every 32-token block of the row from the piece holding its first token, blended with the second piece where
 * the split falls inside it: a fixed trip count, no branch on c (the selects compile to conditional moves). */
__attribute__((target("avx512f,avx512bw,bmi2"))) static void branch_free(uint16_t *in, uint16_t *tg, const uint16_t *s1,
                                                                    const uint16_t *s2, int c) {
    const uint16_t *second = s2 - c; /* block b of the second piece reads second + b (in bounds: see main) */
    int b;
    for (b = 0; b < T; b += 32) {
        int lo = c - b < 0 ? 0 : c - b > 32 ? 32 : c - b;
        __mmask32 first = (__mmask32)_bzhi_u32(~0u, (unsigned)lo);
        const uint16_t *p = b < c ? s1 + b : second + b;
        const uint16_t *q = (b < c && c < b + 32) ? second + b : p;
        __m512i x = _mm512_mask_blend_epi16(first, _mm512_loadu_si512((const void *)q), _mm512_loadu_si512((const void *)p));
        __m512i y = _mm512_mask_blend_epi16(first, _mm512_loadu_si512((const void *)(q + 1)),
                                            _mm512_loadu_si512((const void *)(p + 1)));
        _mm512_store_si512((void *)(in + b), x);
        _mm512_store_si512((void *)(tg + b), y);
    }
}

static void ask(const uint16_t *from, size_t tokens) {
    const char *p = (const char *)from, *end = p + tokens * 2 + 2;
    for (; p < end; p += 64) {
        __builtin_prefetch(p, 0, 1);
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ns per position of `copy` over every batch, best of 5 passes; each batch's arrays made anew (as a gather's). */
static double run(row_copy copy, const uint16_t *src, const int64_t *at, const int *cut, int ahead) {
    double best = 1e9;
    int pass, batch, r;
    for (pass = 0; pass < 5; pass++) {
        double start = now();
        for (batch = 0; batch < BATCHES; batch++) {
            uint16_t *in = aligned_alloc(64, T * B * 2 + 128), *tg = aligned_alloc(64, T * B * 2 + 128);
            for (r = 0; r < B; r++) {
                int k = batch * B + r, c = cut[k];
                if (ahead > 0 && k + ahead < ROWS) {
                    int far = k + ahead;
                    ask(src + at[2 * far], (size_t)cut[far]);
                    if (cut[far] < T) {
                        ask(src + at[2 * far + 1], (size_t)(T - cut[far]));
                    }
                }
                copy(in + r * T, tg + r * T, src + at[2 * k], src + at[2 * k + 1], c);
            }
            free(in);
            free(tg);
        }
        double ns = (now() - start) / ((double)ROWS * T) * 1e9;
        best = ns < best ? ns : best;
    }
    return best;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? (size_t)atof(argv[1]) : 50000000u, i;
    int ahead = argc > 2 ? atoi(argv[2]) : 3, split, method;
    static const char *splits[] = {"whole", "halves", "random", "adjacent", "aligned"};
    static const char *names[] = {"rep movsb", "glibc memcpy", "AVX2 loop", "AVX-512 aligned", "branch-free blocks"};
    row_copy methods[] = {rep_movsb, glibc_memcpy, avx2_loop, avx512_aligned, branch_free};
    int usable[] = {1, 1, 0, 0, 0};
    uint16_t *src = malloc(n * 2);
    int64_t *at = malloc(sizeof(int64_t) * ROWS * 2);
    int *cut = malloc(sizeof(int) * ROWS);
    if (src == NULL || at == NULL || cut == NULL || n < 8 * T) {
        fprintf(stderr, "bench_split_copy: out of memory, or fewer than %d tokens\n", 8 * T);
        return 2;
    }
    __builtin_cpu_init();
    usable[2] = __builtin_cpu_supports("avx2");
    usable[3] = usable[4] = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("bmi2");
    for (i = 0; i < n; i++) {
        src[i] = (uint16_t)(i * 2654435761u);
    }
    double ns[5][5], best_whole = 1e9;
    for (method = 0; method < 5; method++) {
        for (split = 0; split < 5 && usable[method]; split++) {
            srand(1); /* the same places and splits for every method */
            for (i = 0; i < (size_t)ROWS; i++) {
                int c = 1 + rand() % (T - 1);
                c = split == 0 ? T : split == 1 ? T / 2 : split == 4 ? (c / 32 + 1) * 32 : c;
                cut[i] = c > T ? T : c;
                /* places at least 2T from either end: the branch-free loop reads up to T before a second piece */
                at[2 * i] = 2 * T + (((int64_t)rand() << 20) ^ rand()) % (int64_t)(n - 5 * T);
                at[2 * i + 1] = split == 3 ? at[2 * i] + cut[i] + 1 : 2 * T + (((int64_t)rand() << 20) ^ rand()) % (int64_t)(n - 5 * T);
            }
            ns[method][split] = run(methods[method], src, at, cut, ahead);
        }
        if (usable[method] && ns[method][0] < best_whole) {
            best_whole = ns[method][0];
        }
    }
    printf("T=%d B=%d, %d rows, source %zu tokens, pieces asked for %d rows ahead\n", T, B, ROWS, n, ahead);
    printf("ns per position (and the best method's whole rows' rate against it)\n%20s", "");
    for (split = 0; split < 5; split++) {
        printf(" | %16s", splits[split]);
    }
    printf("\n");
    for (method = 0; method < 5; method++) {
        printf("%20s", names[method]);
        for (split = 0; split < 5 && usable[method]; split++) {
            printf(" | %7.3f (%.2fx)", ns[method][split], best_whole / ns[method][split]);
        }
        printf(usable[method] ? "\n" : " | not on this CPU\n");
    }
    return 0;
}
