/* Exact sorted thresholds of sparsemax (q = 1) and 1.5-entmax (q = 2).
 *
 * The native CPU form of nmt.sparse._threshold._numpy_sorted_shifted_threshold: for each row z
 * (n entries) it returns zmax (the row maximum) and tau_rel, the threshold of
 * v = scale * (z - zmax) with p = [v - tau_rel]_+^q summing to 1. The arithmetic is that of the
 * NumPy / torch paths, operation by operation in the row's type (no contraction into FMAs: build
 * with -ffp-contract=off), prefix sums accumulated in double, so the results are the same bits:
 *
 *   v_k sorted descending, clamped at -2;  cs_k, c2_k: prefix sums of v and v^2;
 *   q = 1: k = #{k : cs_k - k v_k < 1},  tau = (cs_k - 1) / k;
 *   q = 2: k = #{k : c2_k - 2 v_k (cs_k - k v_k / 2) < 1},
 *          tau = mean - sqrt(max((1 - c2_k) / k + mean^2, 0)),  mean = cs_k / k;  (k >= 1)
 *
 * Only entries that may pass the test are sorted and counted: v > -1.5 (q = 1; below it the test
 * value is at least 1.5) or v > -1.25 (q = 2; at least 1.5625). Two ways, the same bits:
 * - Groups of rows with at most NET_MAX such candidates each, none holding NaN or +inf and
 *   none without a finite entry (the attention shapes): the rows side by side in vectors (GCC /
 *   Clang vector extensions: SSE / AVX / NEON as the target has them, no flags needed), each
 *   row's candidates compacted without a branch and sorted by a bitonic network of
 *   compare-exchanges (no data-dependent branch: per-row sorting of random rows was bound by
 *   mispredicted branches, ~200-850 ns a row of 16-50 entries), then the prefix sums and the
 *   count, the NumPy solve's steps. Groups of LANES = 4 rows in 128-bit vectors everywhere; on
 *   x86-64 first groups of 16 float (8 double) rows in 512-bit vectors where the processor has
 *   AVX-512, else 8 (4) in 256-bit ones where it has AVX2 (checked at run time, built without -m
 *   flags; -DNMT_NO_AVX512 / -DNMT_NO_AVX2 leave them out). Each lane does the same operations:
 *   the same bits on every path. The row maximum is taken by four running maxima (one was a
 *   chain of dependent comparisons), the zero of a row whose maximum is 0 being its first one
 *   (-0.0 or 0.0), as the row-by-row solve keeps it.
 * - Any other row: one at a time, an insertion and merge sort of its candidates.
 * Rows without a finite entry: tau = +inf, zmax = -0.0 (the other paths negate 0). Rows holding
 * NaN: zmax = NaN, tau of the other entries (NaN sorts last there); rows holding +inf, and rows
 * of only NaN: both NaN.
 * Rows are independent; nothing is allocated but the caller's scratch (2 n entries a thread) and
 * the vector path's stack buffers. The threshold's entry splits its rows over `threads` threads
 * (FOR_THREADS: large batches of attention rows); the mappings below run on one.
 *
 * Also the mappings around the threshold, for the inputs the threshold serves (one call instead of
 * a handful of tensor operations, which cost more than the arithmetic on attention-sized rows):
 *   NAME_probs: sparsemax p = [(z - zmax) - tau]_+ (q = 1, scale 1) or 1.5-entmax
 *     r = [(-zmax/2 + z/2) - tau]_+, p = r^2 (q = 2, scale 1/2), operation by operation as the
 *     torch forward computes them (halving is exact: the same bits);
 *   NAME_backward: J^T g = s (g - <s, g> / sum s) per row, s = r (1.5-entmax) or the support
 *     indicator p > 0 (sparsemax, as torch's sign(p): 0 at NaN; sum s clamped at 1), the sums
 *     in double.
 * NaN propagates as in torch (a NaN row stays NaN; clamping keeps NaN).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_cpu_dispatch.h"

#define LANES 4
#define NET_MAX 64

#define DEFINE_ROW(NAME, T)                                                                     \
static void NAME##_sort_desc(T *a, T *tmp, int64_t m)                                           \
{                                                                                               \
    /* insertion sort of runs of 16, then bottom-up merges (descending) */                    \
    const int64_t run = 16;                                                                     \
    for (int64_t lo = 0; lo < m; lo += run) {                                                   \
        int64_t hi = lo + run < m ? lo + run : m;                                               \
        for (int64_t i = lo + 1; i < hi; i++) {                                                 \
            T x = a[i];                                                                         \
            int64_t j = i - 1;                                                                  \
            while (j >= lo && a[j] < x) { a[j + 1] = a[j]; j--; }                               \
            a[j + 1] = x;                                                                       \
        }                                                                                       \
    }                                                                                           \
    for (int64_t width = run; width < m; width *= 2) {                                          \
        for (int64_t lo = 0; lo < m; lo += 2 * width) {                                         \
            int64_t mid = lo + width < m ? lo + width : m;                                      \
            int64_t hi = lo + 2 * width < m ? lo + 2 * width : m;                               \
            int64_t i = lo, j = mid, o = lo;                                                    \
            while (i < mid && j < hi) tmp[o++] = a[i] >= a[j] ? a[i++] : a[j++];                \
            while (i < mid) tmp[o++] = a[i++];                                                  \
            while (j < hi) tmp[o++] = a[j++];                                                   \
        }                                                                                       \
        for (int64_t i = 0; i < m; i++) a[i] = tmp[i];                                          \
    }                                                                                           \
}                                                                                               \
                                                                                                \
/* the closed form on the support of size k >= 1 from its prefix sums */                       \
static T NAME##_closed_form(int q, int64_t k, T cs_last, T c2_last)                             \
{                                                                                               \
    const T kf = (T)k;                                                                          \
    if (q == 1) return (T)((T)(cs_last - (T)1) / kf);                                           \
    T mean = (T)(cs_last / kf);                                                                 \
    T rad = (T)((T)((T)((T)1 - c2_last) / kf) + (T)(mean * mean));                              \
    return (T)(mean - (T)sqrt(rad > 0 ? (double)rad : 0.0));                                    \
}                                                                                               \
                                                                                                \
static void NAME##_row(const T *row, int64_t n, int q, T neg_scale, T *tau, T *zmax,           \
                       T *cand, T *tmp)                                                         \
{                                                                                               \
    const T bound = q == 1 ? (T)-1.5 : (T)-1.25;                                                \
    T top = -INFINITY;                                                                          \
    int64_t n_nan = 0;                                                                          \
    int has_posinf = 0;                                                                         \
    for (int64_t i = 0; i < n; i++) {                                                           \
        T x = row[i];                                                                           \
        if (x != x) n_nan++;                                                                    \
        else if (x == INFINITY) has_posinf = 1;                                                 \
        else if (x > top) top = x;                                                              \
    }                                                                                           \
    const int has_nan = n_nan > 0;                                                              \
    if (has_posinf || n_nan == n) { *tau = NAN; *zmax = NAN; return; }                          \
    if (top == -INFINITY) { *tau = INFINITY; *zmax = has_nan ? NAN : (T)-0.0; return; }         \
    /* v = (-z - (-zmax)) * (-scale), as the other paths round it */                            \
    const T neg_max = -top;                                                                     \
    int64_t m = 0;                                                                              \
    for (int64_t i = 0; i < n; i++) {                                                           \
        T x = row[i];                                                                           \
        if (x != x) continue;                                                                   \
        T v = (T)((T)(-x - neg_max) * neg_scale);                                               \
        if (v > bound) cand[m++] = v;                                                           \
    }                                                                                           \
    NAME##_sort_desc(cand, tmp, m);                                                             \
    /* the support count over the sorted candidates; then the prefix sums at k = max(count, 1)   \
       again (the same additions in the same order: the same values) */                          \
    double s = 0.0, s2 = 0.0;                                                                   \
    int64_t count = 0;                                                                          \
    for (int64_t k = 1; k <= m; k++) {                                                          \
        T v = cand[k - 1];                                                                      \
        s += (double)v;                                                                         \
        T cs_k = (T)s;                                                                          \
        T test = (T)((T)k * v);                                                                 \
        if (q == 1) {                                                                           \
            test = (T)(cs_k - test);                                                            \
        } else {                                                                                \
            s2 += (double)(T)(v * v);                                                           \
            test = (T)(test * (T)-0.5);                                                         \
            test = (T)(test + cs_k);                                                            \
            test = (T)(test * v);                                                               \
            test = (T)(test * (T)-2);                                                           \
            test = (T)(test + (T)s2);                                                           \
        }                                                                                       \
        count += test < 1;                                                                      \
    }                                                                                           \
    const int64_t k = count > 0 ? count : 1; /* <= m: the maximum (v = 0) is a candidate */     \
    s = 0.0;                                                                                    \
    s2 = 0.0;                                                                                   \
    for (int64_t j = 0; j < k; j++) {                                                           \
        s += (double)cand[j];                                                                   \
        s2 += (double)(T)(cand[j] * cand[j]);                                                   \
    }                                                                                           \
    *tau = NAME##_closed_form(q, k, (T)s, (T)s2);                                               \
    *zmax = has_nan ? (T)NAN : top;                                                             \
}

/* LANES rows side by side: VT holds entry i of each row (IT: the comparison masks, DT: the
   double accumulators). Each row's candidates (v > bound, as in the row-by-row solve) are
   compacted to the front of its lane, the rest of the lane padded with -2 (never in the support,
   test value >= 2), and the first M entries (M: the most candidates of a row; the other entries'
   test values are >= 1.5, never counted) sorted by a bitonic network of size pow2 >= M and
   counted. Returns 0, having written nothing, when a row holds NaN or +inf, has no finite entry
   or more than NET_MAX candidates (the row-by-row solve takes the group). */
#define SELECT(IT, VT, mask, a, b) ((VT)((((IT)(a)) & (mask)) | (((IT)(b)) & ~(mask))))
#define DEFINE_GROUP(NAME, FN, L, ATTR, T, VT, IT, DT)                                         \
static ATTR int FN(const T *z, int64_t n, int q, T neg_scale, T *tau, T *zmax)                  \
{                                                                                               \
    VT v[NET_MAX + 1], cs[NET_MAX], c2[NET_MAX], fill;                                          \
    T top[L];                                                                                   \
    int64_t size = 1, most = 0, cap = 1;                                                        \
    const T bound = q == 1 ? (T)-1.5 : (T)-1.25;                                                \
    for (int w = 0; w < L; w++) fill[w] = (T)-2;                                                \
    while (cap < n && cap < NET_MAX) cap *= 2;                                                  \
    /* entries past a row's candidates are -2 (never in the support, test value >= 2): filled   \
       first, up to the largest network a group of rows of n entries can need */                \
    for (int64_t i = 0; i <= cap; i++) v[i] = fill;                                             \
    for (int w = 0; w < L; w++) {  /* branch-free: max and flags, then the candidates */        \
        const T *row = z + w * n;                                                               \
        /* four maxima in turn: no chain of one maximum through every entry */                  \
        T t0 = -INFINITY, t1 = -INFINITY, t2 = -INFINITY, t3 = -INFINITY;                       \
        int bad = 0;                                                                            \
        int64_t i = 0;                                                                          \
        for (; i + 4 <= n; i += 4) {                                                            \
            T x0 = row[i], x1 = row[i + 1], x2 = row[i + 2], x3 = row[i + 3];                   \
            bad |= (x0 != x0) | (x0 == INFINITY) | (x1 != x1) | (x1 == INFINITY)                \
                   | (x2 != x2) | (x2 == INFINITY) | (x3 != x3) | (x3 == INFINITY);             \
            t0 = x0 > t0 ? x0 : t0;                                                             \
            t1 = x1 > t1 ? x1 : t1;                                                             \
            t2 = x2 > t2 ? x2 : t2;                                                             \
            t3 = x3 > t3 ? x3 : t3;                                                             \
        }                                                                                       \
        for (; i < n; i++) {                                                                    \
            T x = row[i];                                                                       \
            bad |= (x != x) | (x == INFINITY);                                                  \
            t0 = x > t0 ? x : t0;                                                               \
        }                                                                                       \
        t0 = t1 > t0 ? t1 : t0;                                                                 \
        t2 = t3 > t2 ? t3 : t2;                                                                 \
        T t = t2 > t0 ? t2 : t0;                                                                \
        if (bad || t == -INFINITY) return 0;                                                    \
        if (t == 0) /* the first zero of the row, as the row-by-row solve keeps it: -0.0 or 0.0 */\
            for (i = 0; i < n; i++)                                                             \
                if (row[i] == 0) { t = row[i]; break; }                                         \
        const T neg_max = -t;                                                                   \
        int64_t pos = 0;                                                                        \
        if (n <= NET_MAX) /* pos <= n: every slot is in the buffer */                           \
            for (i = 0; i < n; i++) {                                                           \
                T x = (T)((T)(-row[i] - neg_max) * neg_scale); /* as the row-by-row solve */    \
                v[pos][w] = x;                                                                  \
                pos += x > bound;                                                               \
            }                                                                                   \
        else                                                                                    \
            for (i = 0; i < n; i++) {                                                           \
                T x = (T)((T)(-row[i] - neg_max) * neg_scale);                                  \
                v[pos < NET_MAX ? pos : NET_MAX][w] = x;                                        \
                pos += x > bound;                                                               \
            }                                                                                   \
        if (pos > NET_MAX) return 0;                                                            \
        v[pos][w] = (T)-2; /* the slot written last held a non-candidate */                     \
        top[w] = t;                                                                             \
        most = pos > most ? pos : most;                                                         \
    }                                                                                           \
    while (size < most) size *= 2;                                                              \
    /* bitonic network, descending: compare-exchanges of whole vectors, no data branch; the      \
       blocks of one stage are independent (a block of blk entries ends descending or ascending) */\
    for (int64_t blk = 2; blk <= size; blk *= 2)                                                \
        for (int64_t b0 = 0; b0 < size; b0 += blk) {                                            \
            const int desc = (b0 & blk) == 0;                                                   \
            for (int64_t j = blk / 2; j > 0; j /= 2)                                            \
                for (int64_t base = b0; base < b0 + blk; base += 2 * j)                         \
                    for (int64_t i = base; i < base + j; i++) {                                 \
                        VT a = v[i], b = v[i + j];                                              \
                        IT gt = a > b, keep = desc ? gt : ~gt; /* already in order */           \
                        v[i] = SELECT(IT, VT, keep, a, b);                                      \
                        v[i + j] = SELECT(IT, VT, keep, b, a);                                  \
                    }                                                                           \
        }                                                                                       \
    DT s, s2;                                                                                   \
    IT count;                                                                                   \
    for (int w = 0; w < L; w++) { s[w] = 0.0; s2[w] = 0.0; count[w] = 0; }                  \
    for (int64_t k = 1; k <= most; k++) {                                                       \
        VT x = v[k - 1];                                                                        \
        s += __builtin_convertvector(x, DT);                                                    \
        VT cs_k = __builtin_convertvector(s, VT);                                               \
        VT test = (T)k * x;                                                                     \
        if (q == 1) {                                                                           \
            test = cs_k - test;                                                                 \
        } else {                                                                                \
            s2 += __builtin_convertvector(x * x, DT);                                           \
            VT c2_k = __builtin_convertvector(s2, VT);                                          \
            test = test * (T)-0.5;                                                              \
            test = test + cs_k;                                                                 \
            test = test * x;                                                                    \
            test = test * (T)-2;                                                                \
            test = test + c2_k;                                                                 \
            c2[k - 1] = c2_k;                                                                   \
        }                                                                                       \
        cs[k - 1] = cs_k;                                                                       \
        count -= test < 1; /* a true comparison is -1 */                                        \
    }                                                                                           \
    for (int w = 0; w < L; w++) {                                                           \
        int64_t k = count[w] > 0 ? (int64_t)count[w] : 1;                                       \
        tau[w] = NAME##_closed_form(q, k, cs[k - 1][w], q == 1 ? (T)0 : c2[k - 1][w]);          \
        zmax[w] = top[w];                                                                       \
    }                                                                                           \
    return 1;                                                                                   \
}

/* Groups of LANES rows by the 128-bit vector path (a group holding a row it cannot take is solved
   row by row), the remainder row by row. */
#define DEFINE_GROUPS_OF_4(NAME, T)                                                             \
static void NAME##_groups_of_4(const T *z, int64_t rows, int64_t n, int q, T neg_scale, T *tau, \
                               T *zmax, T *scratch)                                             \
{                                                                                               \
    int64_t r = 0;                                                                              \
    for (; r + LANES <= rows; r += LANES)                                                       \
        if (!NAME##_group(z + r * n, n, q, neg_scale, tau + r, zmax + r))                       \
            for (int64_t j = r; j < r + LANES; j++)                                             \
                NAME##_row(z + j * n, n, q, neg_scale, tau + j, zmax + j, scratch, scratch + n);\
    for (; r < rows; r++)                                                                       \
        NAME##_row(z + r * n, n, q, neg_scale, tau + r, zmax + r, scratch, scratch + n);        \
}

/* Where the processor has AVX-512 (or AVX2), groups of 16 (8) float rows or 8 (4) double rows in
   512-bit (256-bit) vectors first: the same operations lane by lane, the same bits, a quarter (a
   half) of the network's instructions per row. A wide group that fails goes to groups of four. */
#define DEFINE_SOLVE(NAME, T, SUFFIX, L512, L2)                                                 \
static void NAME##_range(const T *z, int64_t rows, int64_t n, int q, double scale, T *tau,       \
                         T *zmax, T *scratch)                                                   \
{                                                                                               \
    const T neg_scale = (T)(-scale);                                                            \
    int (*wide)(const T *, int64_t, int, T, T *, T *) = 0;                                      \
    int64_t lanes = 0, r = 0;                                                                   \
    if (HAVE_AVX512()) { wide = SUFFIX##_group_avx512; lanes = L512; }                          \
    else if (HAVE_AVX2()) { wide = SUFFIX##_group_avx2; lanes = L2; }                           \
    if (wide)                                                                                   \
        for (; r + lanes <= rows; r += lanes)                                                   \
            if (!wide(z + r * n, n, q, neg_scale, tau + r, zmax + r))                           \
                NAME##_groups_of_4(z + r * n, lanes, n, q, neg_scale, tau + r, zmax + r, scratch); \
    NAME##_groups_of_4(z + r * n, rows - r, n, q, neg_scale, tau + r, zmax + r, scratch);       \
}                                                                                               \
                                                                                                \
void NAME(const T *z, int64_t rows, int64_t n, int q, double scale, T *tau, T *zmax, T *scratch,\
          int threads)                                                                          \
{                                                                                               \
    FOR_THREADS(threads, rows, NAME##_range(z + FIRST * n, LAST - FIRST, n, q, scale, tau + FIRST, \
                                            zmax + FIRST, scratch + t_ * 2 * n));              \
}

DEFINE_ROW(nmt_sorted_threshold_f32, float)
DEFINE_ROW(nmt_sorted_threshold_f64, double)

#define NO_ATTR
#if NMT_VECTORS
typedef float nmt_f32v __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t nmt_i32v __attribute__((vector_size(LANES * sizeof(int32_t))));
typedef double nmt_f64v __attribute__((vector_size(LANES * sizeof(double))));
typedef int64_t nmt_i64v __attribute__((vector_size(LANES * sizeof(int64_t))));
DEFINE_GROUP(nmt_sorted_threshold_f32, nmt_sorted_threshold_f32_group, LANES, NO_ATTR, float, nmt_f32v,
             nmt_i32v, nmt_f64v)
DEFINE_GROUP(nmt_sorted_threshold_f64, nmt_sorted_threshold_f64_group, LANES, NO_ATTR, double, nmt_f64v,
             nmt_i64v, nmt_f64v)
#else /* no vector extensions: every row by itself */
static int nmt_sorted_threshold_f32_group(const float *z, int64_t n, int q, float s, float *t, float *m)
{ (void)z; (void)n; (void)q; (void)s; (void)t; (void)m; return 0; }
static int nmt_sorted_threshold_f64_group(const double *z, int64_t n, int q, double s, double *t, double *m)
{ (void)z; (void)n; (void)q; (void)s; (void)t; (void)m; return 0; }
#endif

#if NMT_VECTORS && defined(NMT_WIDE_AVX2)
/* wider vectors where the processor has them (_cpu_dispatch.h, which has their types) */
DEFINE_GROUP(nmt_sorted_threshold_f32, f32_group_avx2, 8, AVX2, float, nmt_f32x8, nmt_i32x8, nmt_f64x8)
DEFINE_GROUP(nmt_sorted_threshold_f64, f64_group_avx2, 4, AVX2, double, nmt_f64v, nmt_i64v, nmt_f64v)
#define HAVE_AVX2() CPU_HAS_AVX2()
#if defined(NMT_WIDE_AVX512)
DEFINE_GROUP(nmt_sorted_threshold_f32, f32_group_avx512, 16, AVX512, float, nmt_f32x16, nmt_i32x16, nmt_f64x16)
DEFINE_GROUP(nmt_sorted_threshold_f64, f64_group_avx512, 8, AVX512, double, nmt_f64x8, nmt_i64x8, nmt_f64x8)
#define HAVE_AVX512() CPU_HAS_AVX512()
#endif
#endif
#ifndef HAVE_AVX2
#define HAVE_AVX2() 0
#define f32_group_avx2 nmt_sorted_threshold_f32_group
#define f64_group_avx2 nmt_sorted_threshold_f64_group
#endif
#ifndef HAVE_AVX512
#define HAVE_AVX512() 0
#define f32_group_avx512 nmt_sorted_threshold_f32_group
#define f64_group_avx512 nmt_sorted_threshold_f64_group
#endif

DEFINE_GROUPS_OF_4(nmt_sorted_threshold_f32, float)
DEFINE_GROUPS_OF_4(nmt_sorted_threshold_f64, double)
DEFINE_SOLVE(nmt_sorted_threshold_f32, float, f32, 16, 8)
DEFINE_SOLVE(nmt_sorted_threshold_f64, double, f64, 8, 4)

/* clamp at 0 keeping NaN (as torch's clamp_(min=0)), without a branch (a comparison and a jump
   per entry were mispredicted half of the time): the bits of x cleared where 0 > x */
#define DEFINE_CLAMP0(T, U)                                                                     \
static inline T clamp0_##T(T x)                                                                 \
{                                                                                               \
    U bits;                                                                                     \
    memcpy(&bits, &x, sizeof bits);                                                             \
    bits &= (U)((U)(0 > x) - 1); /* all ones unless 0 > x */                                    \
    memcpy(&x, &bits, sizeof bits);                                                             \
    return x;                                                                                   \
}
/* the support indicator of a probability p: 1 where p > 0, else 0 (NaN included, as torch's
   sign(p) gives it), without a branch */
#define SUPPORT(T, p) ((T)((p) > 0))
DEFINE_CLAMP0(float, uint32_t)
DEFINE_CLAMP0(double, uint64_t)

#define DEFINE_MAPPING(NAME, T)                                                                 \
void NAME##_probs(const T *z, int64_t rows, int64_t n, int q, T *tau, T *zmax, T *scratch,      \
                  T *p, T *r)                                                                   \
{                                                                                               \
    NAME(z, rows, n, q, q == 1 ? 1.0 : 0.5, tau, zmax, scratch, 1);                             \
    for (int64_t row = 0; row < rows; row++) {                                                  \
        const T *x = z + row * n;                                                               \
        T *out = p + row * n, *root = r ? r + row * n : 0;                                      \
        const T t = tau[row], m = zmax[row], half_m = (T)(-0.5 * m);                            \
        if (q == 1) {                                                                           \
            for (int64_t i = 0; i < n; i++) {                                                   \
                T v = (T)((T)(x[i] - m) - t);                                                   \
                out[i] = clamp0_##T(v);                                                         \
            }                                                                                   \
        } else {                                                                                \
            for (int64_t i = 0; i < n; i++) {                                                   \
                T v = (T)((T)(half_m + (T)(0.5 * x[i])) - t);                                   \
                v = clamp0_##T(v);                                                              \
                out[i] = (T)(v * v);                                                            \
                if (root) root[i] = v;                                                          \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
}                                                                                               \
                                                                                                \
void NAME##_backward(const T *s, const T *g, int64_t rows, int64_t n, int indicator, T *out)    \
{                                                                                               \
    for (int64_t row = 0; row < rows; row++) {                                                  \
        const T *sr = s + row * n, *gr = g + row * n;                                           \
        T *o = out + row * n;                                                                   \
        /* four accumulators each: independent additions (one chain was latency-bound) */       \
        double sum[4] = {0.0, 0.0, 0.0, 0.0}, dot[4] = {0.0, 0.0, 0.0, 0.0};                    \
        int64_t i = 0;                                                                          \
        for (; i + 4 <= n; i += 4)                                                              \
            for (int k = 0; k < 4; k++) {                                                       \
                T w = indicator ? SUPPORT(T, sr[i + k]) : sr[i + k];                            \
                sum[k] += (double)w;                                                            \
                dot[k] += (double)w * (double)gr[i + k];                                        \
            }                                                                                   \
        for (; i < n; i++) {                                                                    \
            T w = indicator ? SUPPORT(T, sr[i]) : sr[i];                                        \
            sum[0] += (double)w;                                                                \
            dot[0] += (double)w * (double)gr[i];                                                \
        }                                                                                       \
        const double total = (sum[0] + sum[1]) + (sum[2] + sum[3]);                             \
        const double floor = indicator ? 1.0 : (double)TINY_##T;                                \
        const T coef = (T)(((dot[0] + dot[1]) + (dot[2] + dot[3]))                              \
                           / (total > floor || total != total ? total : floor));                \
        for (i = 0; i < n; i++) {                                                               \
            T w = indicator ? SUPPORT(T, sr[i]) : sr[i];                                        \
            o[i] = (T)((T)(gr[i] - coef) * w);                                                  \
        }                                                                                       \
    }                                                                                           \
}

#define TINY_float FLT_MIN
#define TINY_double DBL_MIN
DEFINE_MAPPING(nmt_sorted_threshold_f32, float)
DEFINE_MAPPING(nmt_sorted_threshold_f64, double)
