/* Support statistics of log-probability rows and block maxima of shifted rows, in one pass.
 *
 * For rows lp (groups * slots rows of v entries; row j belongs to group j / slots) and one
 * offset per row:
 *   support[j] = number of finite entries of row j (NaN and +-inf not counted);
 *   unknown[j] = 1 where row j holds a NaN or +inf (an unknown log-probability), else 0;
 *   block_max[g, b] = maximum of c over the b-th block of `block` entries of group g's
 *     concatenated rows (slots * v entries; the last block may be shorter), where
 *     c = offset[j] + lp[j, i], computed in the rows' type, and -inf where that sum is not
 *     finite (NaN, +inf, -inf: the candidates' values of a beam search step, exactly as torch's
 *     add followed by nan_to_num(nan=-inf, posinf=-inf, neginf=-inf) makes them).
 * Blocks may straddle two rows of a group. Every entry is read once, several at a time in vectors
 * (GCC / Clang vector extensions: 128 bits everywhere, 256 bits where an x86-64 processor has
 * AVX2, chosen at run time; a plain loop where they are missing or with -DNMT_ROWS_ONLY), without a
 * data-dependent branch; nothing is allocated. The same results on every path. One thread.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_cpu_dispatch.h"

#define SCALAR_STEP(T)                                                                          \
    do {                                                                                        \
        const T e = x[i];                                                                       \
        const int finite = e - e == 0; /* false for NaN and +-inf */                          \
        count += finite;                                                                        \
        bad |= (e != e) | (e > 0 && !finite);                                                   \
        T c = off + e;                                                                          \
        c = c - c == 0 ? c : neg_inf;                                                           \
        m = c > m ? c : m;                                                                      \
    } while (0)

#if NMT_VECTORS
#define NMT_RS_VECTORS 1
typedef float nmt_rs_f32x4 __attribute__((vector_size(16)));
typedef int32_t nmt_rs_i32x4 __attribute__((vector_size(16)));
typedef double nmt_rs_f64x2 __attribute__((vector_size(16)));
typedef int64_t nmt_rs_i64x2 __attribute__((vector_size(16)));
typedef float nmt_rs_f32x8 __attribute__((vector_size(32)));
typedef int32_t nmt_rs_i32x8 __attribute__((vector_size(32)));
typedef double nmt_rs_f64x4 __attribute__((vector_size(32)));
typedef int64_t nmt_rs_i64x4 __attribute__((vector_size(32)));
/* LANES entries x[i .. i + LANES) at a time: counts, flags and the running maximum in vectors */
#define VECTOR_STEPS(T, VT, IT, LANES)                                                                 \
    do {                                                                                        \
        if (i + LANES <= end) {                                                                 \
            VT vm, voff, vneg;                                                                  \
            const VT vzero = {0};                                                               \
            IT vcount = {0}, vbad = {0};                                                        \
            for (int l = 0; l < LANES; l++) {                                                   \
                vm[l] = m;                                                                      \
                voff[l] = off;                                                                  \
                vneg[l] = neg_inf;                                                              \
            }                                                                                   \
            for (; i + LANES <= end; i += LANES) {                                              \
                VT e;                                                                           \
                memcpy(&e, x + i, sizeof e);                                                    \
                const IT finite = (e - e) == (e - e); /* all ones unless e is NaN or +-inf */   \
                vcount -= finite;                                                               \
                vbad |= (e != e) | ((e > vzero) & ~finite);                                     \
                VT c = voff + e;                                                                \
                const IT cfin = (c - c) == (c - c);                                             \
                c = (VT)(((IT)c & cfin) | ((IT)vneg & ~cfin));                                  \
                const IT gt = c > vm;                                                           \
                vm = (VT)(((IT)c & gt) | ((IT)vm & ~gt));                                       \
            }                                                                                   \
            for (int l = 0; l < LANES; l++) {                                                   \
                m = vm[l] > m ? vm[l] : m;                                                      \
                count += vcount[l];                                                             \
                bad |= vbad[l] != 0;                                                            \
            }                                                                                   \
        }                                                                                       \
    } while (0)
#else
#define NMT_RS_VECTORS 0
#endif

#define DEFINE_ROW_STATS(NAME, T, ATTR, VSTEPS)                                                  \
ATTR static void NAME(const T *lp, const T *offset, int64_t groups, int64_t slots, int64_t v,  \
                      int64_t block, int32_t *support, uint8_t *unknown, T *block_max)         \
{                                                                                               \
    const int64_t width = slots * v;                                                            \
    const int64_t n_blocks = (width + block - 1) / block;                                       \
    const T neg_inf = -(T)INFINITY;                                                             \
    for (int64_t g = 0; g < groups; g++) {                                                      \
        T *bm = block_max + g * n_blocks;                                                       \
        for (int64_t b = 0; b < n_blocks; b++)                                                  \
            bm[b] = neg_inf;                                                                    \
        for (int64_t s = 0; s < slots; s++) {                                                   \
            const int64_t j = g * slots + s;                                                    \
            const T *x = lp + j * v;                                                            \
            const T off = offset[j];                                                            \
            int64_t count = 0;                                                                  \
            int bad = 0;                                                                        \
            int64_t i = 0;                                                                      \
            while (i < v) {                                                                     \
                const int64_t b = (s * v + i) / block;                                          \
                int64_t end = (b + 1) * block - s * v; /* the block's end, in x's indices */    \
                if (end > v)                                                                    \
                    end = v;                                                                    \
                T m = bm[b];                                                                    \
                VSTEPS;                                                                         \
                for (; i < end; i++)                                                            \
                    SCALAR_STEP(T);                                                             \
                bm[b] = m;                                                                      \
            }                                                                                   \
            support[j] = (int32_t)count;                                                        \
            unknown[j] = (uint8_t)bad;                                                          \
        }                                                                                       \
    }                                                                                           \
}

#define NO_STEPS do { } while (0)
#define NO_ATTR

#if NMT_RS_VECTORS
/* 128-bit vectors: every target with vector extensions (SSE2 on x86-64, NEON) */
DEFINE_ROW_STATS(row_stats_f32_v, float, NO_ATTR, VECTOR_STEPS(float, nmt_rs_f32x4, nmt_rs_i32x4, 4))
DEFINE_ROW_STATS(row_stats_f64_v, double, NO_ATTR, VECTOR_STEPS(double, nmt_rs_f64x2, nmt_rs_i64x2, 2))
#else
DEFINE_ROW_STATS(row_stats_f32_v, float, NO_ATTR, NO_STEPS)
DEFINE_ROW_STATS(row_stats_f64_v, double, NO_ATTR, NO_STEPS)
#endif

#if NMT_RS_VECTORS && defined(NMT_WIDE_AVX2)
/* 256-bit vectors where the processor has AVX2 (_cpu_dispatch.h) */
DEFINE_ROW_STATS(row_stats_f32_avx2, float, AVX2, VECTOR_STEPS(float, nmt_rs_f32x8, nmt_rs_i32x8, 8))
DEFINE_ROW_STATS(row_stats_f64_avx2, double, AVX2, VECTOR_STEPS(double, nmt_rs_f64x4, nmt_rs_i64x4, 4))
#define HAVE_AVX2() CPU_HAS_AVX2()
#else
#define row_stats_f32_avx2 row_stats_f32_v
#define row_stats_f64_avx2 row_stats_f64_v
#define HAVE_AVX2() 0
#endif

#define DEFINE_ENTRY(NAME, T, SUFFIX)                                                           \
void NAME(const T *lp, const T *offset, int64_t groups, int64_t slots, int64_t v,             \
          int64_t block, int32_t *support, uint8_t *unknown, T *block_max)                     \
{                                                                                               \
    if (HAVE_AVX2())                                                                            \
        row_stats_##SUFFIX##_avx2(lp, offset, groups, slots, v, block, support, unknown, block_max); \
    else                                                                                        \
        row_stats_##SUFFIX##_v(lp, offset, groups, slots, v, block, support, unknown, block_max); \
}

DEFINE_ENTRY(nmt_row_stats_f32, float, f32)
DEFINE_ENTRY(nmt_row_stats_f64, double, f64)
