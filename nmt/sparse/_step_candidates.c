/* What a beam search step reads from its log-probabilities, in one pass: support statistics per row
 * and the best candidates per group of rows.
 *
 * For rows lp (groups * slots rows of v entries; row j belongs to group j / slots) and one
 * offset per row (the score of the prefix the row extends):
 *   support[j] = number of finite entries of row j (NaN and +-inf not counted);
 *   unknown[j] = 1 where row j holds a NaN or +inf (an unknown log-probability), else 0;
 *   top_value[g, 0 .. width), top_index[g, 0 .. width) = the `width` largest candidates of group g
 *     and their indices into its concatenated rows (slots * v entries, index s * v + i), where a
 *     candidate is c = offset[j] + lp[j, i], computed in the rows' type, and -inf where that sum is
 *     not finite (NaN, +inf, -inf: exactly as torch's add followed by nan_to_num(nan=-inf,
 *     posinf=-inf, neginf=-inf) makes them). Values in descending order; among equal values the
 *     lower index first, so every index points at an entry holding its value (-inf entries
 *     included when fewer than `width` candidates are finite). width <= min(slots * v,
 *     NMT_MAX_WIDTH).
 * The candidates are read in index order: the first `width` fill the list, later ones enter only
 * when larger than its last value (a comparison per entry, several entries at a time in vectors:
 * 128 bits everywhere through the compiler's vector extensions, 256-bit AVX2 and 512-bit AVX-512
 * where an x86-64 processor has them, chosen at run time; a plain loop where they are missing or with
 * -DNMT_ROWS_ONLY) and are placed by insertion, rarely after the first entries of a row. Groups
 * are independent: built with OpenMP, a call splits them over the threads it is given. Nothing is
 * allocated. The same results on every path.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_cpu_dispatch.h"

#define NMT_MAX_WIDTH 256

/* Candidate (c, index) enters the list tv/ti of `filled` entries (capacity width): after every
   entry at least as large, the last one dropping out when the list is full. */
#define DEFINE_INSERT(NAME, T)                                                                  \
static inline int64_t NAME(T *tv, int64_t *ti, int64_t filled, int64_t width, T c, int64_t index) \
{                                                                                               \
    int64_t p = filled < width ? filled : width - 1;                                            \
    while (p > 0 && tv[p - 1] < c) {                                                            \
        tv[p] = tv[p - 1];                                                                      \
        ti[p] = ti[p - 1];                                                                      \
        p--;                                                                                    \
    }                                                                                           \
    tv[p] = c;                                                                                  \
    ti[p] = index;                                                                              \
    return filled < width ? filled + 1 : filled;                                                \
}
DEFINE_INSERT(insert_f32, float)
DEFINE_INSERT(insert_f64, double)

/* entry x[i]: the row's count and flags, and the candidate into the list when it enters */
#define SCALAR_ENTRY(T, INSERT)                                                                 \
    do {                                                                                        \
        const T e = x[i];                                                                       \
        const int finite = e - e == 0; /* false for NaN and +-inf */                          \
        count += finite;                                                                        \
        bad |= (e != e) | (e > 0 && !finite);                                                   \
        T c = off + e;                                                                          \
        c = c - c == 0 ? c : neg_inf;                                                           \
        if (filled < width || c > tv[width - 1])                                                \
            filled = INSERT(tv, ti, filled, width, c, base + i);                                \
    } while (0)

/* lanes x[i .. i + LANES) after a vector found one of them larger than the list's last value */
#define LANE_ENTRIES(T, INSERT, LANES)                                                          \
    do {                                                                                        \
        for (int64_t l_ = i; l_ < i + LANES; l_++) {                                            \
            T c = off + x[l_];                                                                  \
            c = c - c == 0 ? c : neg_inf;                                                       \
            if (c > tv[width - 1])                                                              \
                filled = INSERT(tv, ti, filled, width, c, base + l_);                           \
        }                                                                                       \
    } while (0)

#if NMT_VECTORS
/* LANES entries at a time once the list is full: counts and flags in vectors, the candidates
   compared with the list's last value (broadcast again after each insertion) */
#define VECTOR_ENTRIES(T, VT, IT, LANES, INSERT, ANY)                                           \
    do {                                                                                        \
        if (filled == width && i + LANES <= v) {                                                \
            VT voff, vneg, vlast;                                                               \
            const VT vzero = {0};                                                               \
            IT vcount = {0}, vbad = {0};                                                        \
            for (int l = 0; l < LANES; l++) {                                                   \
                voff[l] = off;                                                                  \
                vneg[l] = neg_inf;                                                              \
                vlast[l] = tv[width - 1];                                                       \
            }                                                                                   \
            for (; i + LANES <= v; i += LANES) {                                                \
                VT e;                                                                           \
                memcpy(&e, x + i, sizeof e);                                                    \
                const IT finite = (e - e) == (e - e); /* all ones unless e is NaN or +-inf */   \
                vcount -= finite;                                                               \
                vbad |= (e != e) | ((e > vzero) & ~finite);                                     \
                VT c = voff + e;                                                                \
                const IT cfin = (c - c) == (c - c);                                             \
                c = (VT)(((IT)c & cfin) | ((IT)vneg & ~cfin));                                  \
                const IT gt = c > vlast;                                                        \
                if (ANY(gt)) {                                                                  \
                    LANE_ENTRIES(T, INSERT, LANES);                                             \
                    for (int l = 0; l < LANES; l++)                                             \
                        vlast[l] = tv[width - 1];                                               \
                }                                                                               \
            }                                                                                   \
            for (int l = 0; l < LANES; l++) {                                                   \
                count += vcount[l];                                                             \
                bad |= vbad[l] != 0;                                                            \
            }                                                                                   \
        }                                                                                       \
    } while (0)
#endif

/* The groups [0, groups) of the arguments (the caller offsets the pointers to its share). */
#define DEFINE_CANDIDATES(NAME, T, ATTR, INSERT, VSTEPS)                                        \
ATTR static void NAME(const T *lp, const T *offset, int64_t groups, int64_t slots, int64_t v,  \
                      int64_t width, int32_t *support, uint8_t *unknown, T *top_value,         \
                      int64_t *top_index)                                                       \
{                                                                                               \
    const T neg_inf = -(T)INFINITY;                                                             \
    for (int64_t g = 0; g < groups; g++) {                                                      \
        T *tv = top_value + g * width;                                                          \
        int64_t *ti = top_index + g * width;                                                    \
        int64_t filled = 0;                                                                     \
        for (int64_t s = 0; s < slots; s++) {                                                   \
            const int64_t j = g * slots + s, base = s * v;                                      \
            const T *x = lp + j * v;                                                            \
            const T off = offset[j];                                                            \
            int64_t count = 0;                                                                  \
            int bad = 0;                                                                        \
            int64_t i = 0;                                                                      \
            for (; i < v && filled < width; i++)                                                \
                SCALAR_ENTRY(T, INSERT);                                                        \
            VSTEPS;                                                                             \
            for (; i < v; i++)                                                                  \
                SCALAR_ENTRY(T, INSERT);                                                        \
            support[j] = (int32_t)count;                                                        \
            unknown[j] = (uint8_t)bad;                                                          \
        }                                                                                       \
    }                                                                                           \
}

#define NO_STEPS do { } while (0)
#define NO_ATTR

#if NMT_VECTORS
/* 128-bit vectors: every target with vector extensions (SSE2 on x86-64, NEON) */
DEFINE_CANDIDATES(candidates_f32_v, float, NO_ATTR, insert_f32, VECTOR_ENTRIES(float, nmt_f32x4, nmt_i32x4, 4, insert_f32, ANY_WORDS))
DEFINE_CANDIDATES(candidates_f64_v, double, NO_ATTR, insert_f64, VECTOR_ENTRIES(double, nmt_f64x2, nmt_i64x2, 2, insert_f64, ANY_WORDS))
#else
DEFINE_CANDIDATES(candidates_f32_v, float, NO_ATTR, insert_f32, NO_STEPS)
DEFINE_CANDIDATES(candidates_f64_v, double, NO_ATTR, insert_f64, NO_STEPS)
#endif

#if NMT_VECTORS && defined(NMT_WIDE_AVX2)
/* 256-bit vectors where the processor has AVX2 (_cpu_dispatch.h); a true lane found by vptest */
DEFINE_CANDIDATES(candidates_f32_avx2, float, AVX2, insert_f32, VECTOR_ENTRIES(float, nmt_f32x8, nmt_i32x8, 8, insert_f32, ANY_256))
DEFINE_CANDIDATES(candidates_f64_avx2, double, AVX2, insert_f64, VECTOR_ENTRIES(double, nmt_f64x4, nmt_i64x4, 4, insert_f64, ANY_256))
#define HAVE_AVX2() CPU_HAS_AVX2()
#else
#define candidates_f32_avx2 candidates_f32_v
#define candidates_f64_avx2 candidates_f64_v
#define HAVE_AVX2() 0
#endif

#if NMT_VECTORS && defined(NMT_WIDE_AVX512)
/* 512-bit vectors where the processor has AVX-512: the class tests (AVX512DQ's fpclass: 0x99 =
   NaN or +-inf, 0x89 = NaN or +inf) and the comparison give masks, the count a popcount */
#define VECTOR_512(T, VEC, SUF, LANES, INSERT)                                            \
    do {                                                                                        \
        if (filled == width && i + LANES <= v) {                                                \
            const VEC voff = _mm512_set1_##SUF(off), vneg = _mm512_set1_##SUF(neg_inf);         \
            VEC vlast = _mm512_set1_##SUF(tv[width - 1]);                                       \
            int64_t nonfinite = 0;                                                              \
            unsigned badm = 0;                                                                  \
            const int64_t start_ = i;                                                           \
            for (; i + LANES <= v; i += LANES) {                                                \
                const VEC e = _mm512_loadu_##SUF(x + i);                                        \
                nonfinite += __builtin_popcount((unsigned)_mm512_fpclass_##SUF##_mask(e, 0x99));  \
                badm |= (unsigned)_mm512_fpclass_##SUF##_mask(e, 0x89);                         \
                VEC c = _mm512_add_##SUF(voff, e);                                              \
                c = _mm512_mask_mov_##SUF(c, _mm512_fpclass_##SUF##_mask(c, 0x99), vneg);        \
                if (_mm512_cmp_##SUF##_mask(c, vlast, _CMP_GT_OQ)) {                            \
                    LANE_ENTRIES(T, INSERT, LANES);                                             \
                    vlast = _mm512_set1_##SUF(tv[width - 1]);                                   \
                }                                                                               \
            }                                                                                   \
            count += (i - start_) - nonfinite;                                                  \
            bad |= badm != 0;                                                                   \
        }                                                                                       \
    } while (0)
DEFINE_CANDIDATES(candidates_f32_avx512, float, AVX512, insert_f32, VECTOR_512(float, __m512, ps, 16, insert_f32))
DEFINE_CANDIDATES(candidates_f64_avx512, double, AVX512, insert_f64, VECTOR_512(double, __m512d, pd, 8, insert_f64))
#define HAVE_AVX512() CPU_HAS_AVX512()
#else
#define candidates_f32_avx512 candidates_f32_avx2
#define candidates_f64_avx512 candidates_f64_avx2
#define HAVE_AVX512() 0
#endif

/* groups split over `threads` threads (FOR_THREADS, _cpu_dispatch.h); returns 0, or -1 when width
   is out of range (nothing written) */
#define DEFINE_ENTRY(NAME, T, SUFFIX)                                                           \
int NAME(const T *lp, const T *offset, int64_t groups, int64_t slots, int64_t v, int64_t width, \
         int32_t *support, uint8_t *unknown, T *top_value, int64_t *top_index, int threads)    \
{                                                                                               \
    if (width < 1 || width > NMT_MAX_WIDTH || width > slots * v)                                \
        return -1;                                                                              \
    void (*run)(const T *, const T *, int64_t, int64_t, int64_t, int64_t, int32_t *, uint8_t *, \
                T *, int64_t *) =                                                               \
        HAVE_AVX512() ? candidates_##SUFFIX##_avx512                                            \
                      : HAVE_AVX2() ? candidates_##SUFFIX##_avx2 : candidates_##SUFFIX##_v;     \
    FOR_THREADS(threads, groups,                                                                \
                run(lp + FIRST * slots * v, offset + FIRST * slots, LAST - FIRST, slots, v,     \
                    width, support + FIRST * slots, unknown + FIRST * slots,                    \
                    top_value + FIRST * width, top_index + FIRST * width));                      \
    return 0;                                                                                   \
}

DEFINE_ENTRY(nmt_step_candidates_f32, float, f32)
DEFINE_ENTRY(nmt_step_candidates_f64, double, f64)
