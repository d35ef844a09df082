/* The backward of cross-entropy at class indices (the Shannon Fenchel-Young loss, float32 rows), in
 * one pass: out = (p - y) g per row, p = exp(logp) from the forward's log_softmax (NaN: 0, as a row
 * whose log_softmax is NaN has p = 0 in the generic function), y the target distribution:
 * y = a on the row's finite classes (the forward's mask of z > -inf; a = eps / m for label
 * smoothing eps over m finite classes, omitted without smoothing) plus 1 - eps at the target t, g
 * the row's gradient (0 for an ignored row: its row is zeros without reading it). Where torch makes
 * four passes over (R, V) (exp, nan_to_num, the smoothing's where, the product with g), this reads
 * logp (and the mask's bytes with smoothing) once and writes out once.
 *
 * exp(logp) by VEXPF (_float_math.h: the argument reduced with ln 2 in two parts, then a degree-7
 * polynomial): within 1.5 float ulps (e^-126 and below: 0). Vectors of floats (GCC / Clang vector
 * extensions: four lanes, eight with AVX2, sixteen with AVX-512, chosen at run time as in the other
 * files), the last entries of a row by libm's expf. Rows split over the threads asked for (OpenMP).
 *
 * The forward's label smoothing needs per row m, the number of finite classes (z > -inf), the sum
 * of logp over them, and (for the backward) the mask of them: nmt_xent_smoothing_f32 takes all
 * three in one pass over z and logp (torch: a comparison, a count, a where and a sum), the sum in
 * double.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_cpu_dispatch.h"
#include "_float_math.h"

/* a row's (p - y) g over its first `vec` entries (a multiple of L): p from logp, y's smoothing mass
   a where the mask (given with smoothing: bytes 0 / 1, as L lanes of U8T) is set */
#define XENT_VECTORS(FT, FI, U8T, L)                                                            \
    do {                                                                                        \
        const FT ga = (FT){0} + gr, aa = (FT){0} + ar;                                          \
        for (int64_t j = 0; j < vec; j += L) {                                                  \
            FT lv, pv;                                                                          \
            memcpy(&lv, lp + j, sizeof lv);                                                     \
            VEXPF(FT, FI, lv, pv);                                                              \
            pv = (FT)((FI)pv & (FI)(lv == lv)); /* NaN: 0 */                                     \
            if (fr) {                                                                           \
                U8T fv;                                                                         \
                memcpy(&fv, fr + j, sizeof fv);                                                 \
                pv -= (FT)((FI)aa & (__builtin_convertvector(fv, FI) != 0));                    \
            }                                                                                   \
            pv *= ga;                                                                           \
            memcpy(o + j, &pv, sizeof pv);                                                      \
        }                                                                                       \
    } while (0)

#define DEFINE_XENT(NAME, ATTR, FT, FI, U8T, L)                                                 \
ATTR static void NAME(const float *logp, const uint8_t *finite, int64_t rows, int64_t n,       \
                      const int64_t *target, const float *a, float at, const float *g, float *out) \
{                                                                                               \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const float *lp = logp + r * n;                                                         \
        const uint8_t *fr = finite ? finite + r * n : 0;                                        \
        float *o = out + r * n;                                                                 \
        const float gr = g[r], ar = a ? a[r] : 0.0f;                                            \
        if (gr == 0.0f) { /* an ignored row (or a zero gradient) */                             \
            memset(o, 0, (size_t)n * sizeof(float));                                            \
            continue;                                                                           \
        }                                                                                       \
        const int64_t vec = n / L * L;                                                          \
        XENT_VECTORS(FT, FI, U8T, L);                                                           \
        for (int64_t j = vec; j < n; j++) {                                                     \
            float pv = lp[j] == lp[j] ? expf(lp[j]) : 0.0f;                                     \
            if (fr && fr[j])                                                                    \
                pv -= ar;                                                                       \
            o[j] = pv * gr;                                                                     \
        }                                                                                       \
        o[target[r]] -= at * gr;                                                                \
    }                                                                                           \
}

/* m[r] = #{j: z[r, j] > -inf}, sums[r] = the sum of logp[r, j] over those j (in double, L lanes of
   floats HT converted to two vectors DT of L / 2 doubles; a NaN there makes it NaN) and
   finite[r, j] = z[r, j] > -inf (bytes 0 / 1, L lanes of U8T at a time) */
#define DEFINE_XENT_SMOOTHING(NAME, ATTR, FT, FI, HT, DT, U8T, L)                               \
ATTR static void NAME(const float *z, const float *logp, int64_t rows, int64_t n, float *m, float *sums, \
                      uint8_t *finite)                                                          \
{                                                                                               \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const float *zr = z + r * n, *lp = logp + r * n;                                        \
        uint8_t *fr = finite + r * n;                                                           \
        FI cnt = {0};                                                                           \
        DT s0 = {0}, s1 = {0};                                                                  \
        int64_t j = 0;                                                                          \
        for (; j + L <= n; j += L) {                                                            \
            FT zv, lv;                                                                          \
            memcpy(&zv, zr + j, sizeof zv);                                                     \
            memcpy(&lv, lp + j, sizeof lv);                                                     \
            const FI f = zv > -INFINITY;                                                        \
            cnt -= f; /* (true is -1) */                                                        \
            const U8T fb = __builtin_convertvector(f & 1, U8T);                                 \
            memcpy(fr + j, &fb, sizeof fb);                                                     \
            lv = (FT)((FI)lv & f);                                                              \
            HT lo, hi;                                                                          \
            memcpy(&lo, &lv, sizeof lo);                                                        \
            memcpy(&hi, (const char *)&lv + sizeof lo, sizeof hi);                              \
            s0 += __builtin_convertvector(lo, DT);                                              \
            s1 += __builtin_convertvector(hi, DT);                                              \
        }                                                                                       \
        int64_t count = 0;                                                                      \
        double sum = 0.0;                                                                       \
        for (int l = 0; l < L / 2; l++)                                                         \
            sum += s0[l] + s1[l];                                                               \
        for (int l = 0; l < L; l++)                                                             \
            count += cnt[l];                                                                    \
        for (; j < n; j++) {                                                                    \
            const int f = zr[j] > -INFINITY;                                                    \
            fr[j] = (uint8_t)f;                                                                 \
            count += f;                                                                         \
            sum += f ? (double)lp[j] : 0.0;                                                     \
        }                                                                                       \
        m[r] = (float)count;                                                                    \
        sums[r] = (float)sum;                                                                   \
    }                                                                                           \
}

#if NMT_VECTORS
typedef uint8_t xent_u8x4 __attribute__((vector_size(4)));
typedef uint8_t xent_u8x8 __attribute__((vector_size(8)));
typedef uint8_t xent_u8x16 __attribute__((vector_size(16)));
DEFINE_XENT(xent_v, , nmt_f32x4, nmt_i32x4, xent_u8x4, 4)
DEFINE_XENT_SMOOTHING(xent_smoothing_v, , nmt_f32x4, nmt_i32x4, nmt_f32x2, nmt_f64x2, xent_u8x4, 4)
#if defined(NMT_WIDE_AVX2)
DEFINE_XENT(xent_avx2, AVX2, nmt_f32x8, nmt_i32x8, xent_u8x8, 8)
DEFINE_XENT_SMOOTHING(xent_smoothing_avx2, AVX2, nmt_f32x8, nmt_i32x8, nmt_f32x4, nmt_f64x4, xent_u8x8, 8)
#if defined(NMT_WIDE_AVX512)
DEFINE_XENT(xent_avx512, AVX512, nmt_f32x16, nmt_i32x16, xent_u8x16, 16)
DEFINE_XENT_SMOOTHING(xent_smoothing_avx512, AVX512, nmt_f32x16, nmt_i32x16, nmt_f32x8, nmt_f64x8, xent_u8x16, 16)
#endif
#endif
/* the function NAME_v, _avx2 or _avx512 for this processor */
#if defined(NMT_WIDE_AVX512)
#define XENT_PICK(NAME) (CPU_HAS_AVX512() ? NAME##_avx512 : CPU_HAS_AVX2() ? NAME##_avx2 : NAME##_v)
#elif defined(NMT_WIDE_AVX2)
#define XENT_PICK(NAME) (CPU_HAS_AVX2() ? NAME##_avx2 : NAME##_v)
#else
#define XENT_PICK(NAME) NAME##_v
#endif
#endif

/* The entry point: logp, out (R, n) float32; finite (R, n) bytes 0 / 1 with smoothing (a given: R
   floats), else NULL; target (R,) int64 in [0, n) (an ignored row's any valid index, with g = 0
   there), at = 1 - eps, g (R,). Rows split over `threads` threads. Returns 0 without writing
   anything in a build without vectors (the caller computes it otherwise). */
int nmt_xent_backward_f32(const float *logp, const uint8_t *finite, int64_t rows, int64_t n, const int64_t *target,
                          const float *a, float at, const float *g, float *out, int threads)
{
#if NMT_VECTORS
    FOR_THREADS(threads, rows,
                XENT_PICK(xent)(logp + FIRST * n, finite ? finite + FIRST * n : 0, LAST - FIRST, n, target + FIRST,
                                a ? a + FIRST : 0, at, g + FIRST, out + FIRST * n));
    return 1;
#else
    (void)logp; (void)finite; (void)rows; (void)n; (void)target; (void)a; (void)at; (void)g; (void)out; (void)threads;
    return 0;
#endif
}


/* The label smoothing's per-row statistics (see above) of z, logp (R, n) float32 into m, sums (R,)
   float32 and the mask finite (R, n) bytes; rows split over `threads` threads. Returns 0 without
   writing anything in a build without vectors. */
int nmt_xent_smoothing_f32(const float *z, const float *logp, int64_t rows, int64_t n, float *m, float *sums,
                           uint8_t *finite, int threads)
{
#if NMT_VECTORS
    FOR_THREADS(threads, rows, XENT_PICK(xent_smoothing)(z + FIRST * n, logp + FIRST * n, LAST - FIRST, n, m + FIRST,
                                                         sums + FIRST, finite + FIRST * n));
    return 1;
#else
    (void)z; (void)logp; (void)rows; (void)n; (void)m; (void)sums; (void)finite; (void)threads;
    return 0;
#endif
}
