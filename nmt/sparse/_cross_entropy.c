/* The backward of cross-entropy at class indices (the Shannon Fenchel-Young loss, float32 rows), in
 * one pass: out = (p - y) g per row, p = exp(logp) from the forward's log_softmax (NaN: 0, as a row
 * whose log_softmax is NaN has p = 0 in the generic function), y the target distribution:
 * y = a on the row's finite classes (z > -inf; a = eps / m for label smoothing eps over m finite
 * classes, omitted without smoothing) plus 1 - eps at the target t, g the row's gradient (0 for an
 * ignored row: its row is zeros without reading it). Where torch makes four passes over (R, V)
 * (exp, nan_to_num, the smoothing's where, the product with g), this reads logp (and z with
 * smoothing) once and writes out once.
 *
 * exp(logp) = 2^(logp log2 e) by VEXP2F (_float_math.h): logp <= 0 here, so the product's rounding
 * moves p by at most p |ln p| 6e-8 <= 2.2e-8 absolutely, the polynomial by 5e-9 relatively (2^-126
 * and below: 0). Vectors of floats (GCC / Clang vector extensions: four lanes, eight with AVX2,
 * sixteen with AVX-512, chosen at run time as in the other files), the last entries of a row by
 * libm's expf. Rows split over the threads asked for (OpenMP).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_cpu_dispatch.h"
#include "_float_math.h"

/* a row's (p - y) g over its first `vec` entries (a multiple of L): p from logp, y's smoothing mass
   a where z (given with smoothing) is finite */
#define XENT_VECTORS(FT, FI, L)                                                                 \
    do {                                                                                        \
        const FT ga = (FT){0} + gr, aa = (FT){0} + ar;                                          \
        for (int64_t j = 0; j < vec; j += L) {                                                  \
            FT lv, pv;                                                                          \
            memcpy(&lv, lp + j, sizeof lv);                                                     \
            VEXP2F(FT, FI, lv * (float)FM_LOG2E, pv);                                           \
            pv = (FT)((FI)pv & (FI)(lv == lv)); /* NaN: 0 */                                     \
            if (zr) {                                                                           \
                FT zv;                                                                          \
                memcpy(&zv, zr + j, sizeof zv);                                                 \
                pv -= (FT)((FI)aa & (FI)(zv > -INFINITY));                                      \
            }                                                                                   \
            pv *= ga;                                                                           \
            memcpy(o + j, &pv, sizeof pv);                                                      \
        }                                                                                       \
    } while (0)

#define DEFINE_XENT(NAME, ATTR, FT, FI, L)                                                      \
ATTR static void NAME(const float *logp, const float *z, int64_t rows, int64_t n, const int64_t *target, \
                      const float *a, float at, const float *g, float *out)                    \
{                                                                                               \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const float *lp = logp + r * n, *zr = z ? z + r * n : 0;                                \
        float *o = out + r * n;                                                                 \
        const float gr = g[r], ar = a ? a[r] : 0.0f;                                            \
        if (gr == 0.0f) { /* an ignored row (or a zero gradient) */                             \
            memset(o, 0, (size_t)n * sizeof(float));                                            \
            continue;                                                                           \
        }                                                                                       \
        const int64_t vec = n / L * L;                                                          \
        XENT_VECTORS(FT, FI, L);                                                                \
        for (int64_t j = vec; j < n; j++) {                                                     \
            float pv = lp[j] == lp[j] ? expf(lp[j]) : 0.0f;                                     \
            if (zr && zr[j] > -INFINITY)                                                        \
                pv -= ar;                                                                       \
            o[j] = pv * gr;                                                                     \
        }                                                                                       \
        o[target[r]] -= at * gr;                                                                \
    }                                                                                           \
}

/* m[r] = #{j: z[r, j] > -inf} and sums[r] = the sum of logp[r, j] over those j (in double, L lanes
   of floats HT converted to two vectors DT of L / 2 doubles; a NaN there makes it NaN) */
#define DEFINE_XENT_SMOOTHING(NAME, ATTR, FT, FI, HT, DT, L)                                    \
ATTR static void NAME(const float *z, const float *logp, int64_t rows, int64_t n, float *m, float *sums) \
{                                                                                               \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const float *zr = z + r * n, *lp = logp + r * n;                                        \
        FI cnt = {0};                                                                           \
        DT s0 = {0}, s1 = {0};                                                                  \
        int64_t j = 0;                                                                          \
        for (; j + L <= n; j += L) {                                                            \
            FT zv, lv;                                                                          \
            memcpy(&zv, zr + j, sizeof zv);                                                     \
            memcpy(&lv, lp + j, sizeof lv);                                                     \
            const FI f = zv > -INFINITY;                                                        \
            cnt -= f; /* (true is -1) */                                                        \
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
            count += f;                                                                         \
            sum += f ? (double)lp[j] : 0.0;                                                     \
        }                                                                                       \
        m[r] = (float)count;                                                                    \
        sums[r] = (float)sum;                                                                   \
    }                                                                                           \
}

#if NMT_VECTORS
DEFINE_XENT(xent_v, , nmt_f32x4, nmt_i32x4, 4)
DEFINE_XENT_SMOOTHING(xent_smoothing_v, , nmt_f32x4, nmt_i32x4, nmt_f32x2, nmt_f64x2, 4)
#if defined(NMT_WIDE_AVX2)
DEFINE_XENT(xent_avx2, AVX2, nmt_f32x8, nmt_i32x8, 8)
DEFINE_XENT_SMOOTHING(xent_smoothing_avx2, AVX2, nmt_f32x8, nmt_i32x8, nmt_f32x4, nmt_f64x4, 8)
#if defined(NMT_WIDE_AVX512)
DEFINE_XENT(xent_avx512, AVX512, nmt_f32x16, nmt_i32x16, 16)
DEFINE_XENT_SMOOTHING(xent_smoothing_avx512, AVX512, nmt_f32x16, nmt_i32x16, nmt_f32x8, nmt_f64x8, 16)
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

/* The entry point: logp, out (R, n) float32; z (R, n) with smoothing (a given: R floats), else NULL;
   target (R,) int64 in [0, n) (an ignored row's any valid index, with g = 0 there), at = 1 - eps,
   g (R,). Rows split over `threads` threads. Returns 0 without writing anything in a build without
   vectors (the caller computes it otherwise). */
int nmt_xent_backward_f32(const float *logp, const float *z, int64_t rows, int64_t n, const int64_t *target,
                          const float *a, float at, const float *g, float *out, int threads)
{
#if NMT_VECTORS
    FOR_THREADS(threads, rows,
                XENT_PICK(xent)(logp + FIRST * n, z ? z + FIRST * n : 0, LAST - FIRST, n, target + FIRST, a ? a + FIRST : 0,
                      at, g + FIRST, out + FIRST * n));
    return 1;
#else
    (void)logp; (void)z; (void)rows; (void)n; (void)target; (void)a; (void)at; (void)g; (void)out; (void)threads;
    return 0;
#endif
}


/* The label smoothing's per-row statistics (see above) of z, logp (R, n) float32 into m, sums (R,)
   float32; rows split over `threads` threads. Returns 0 without writing anything in a build without
   vectors. */
int nmt_xent_smoothing_f32(const float *z, const float *logp, int64_t rows, int64_t n, float *m, float *sums,
                           int threads)
{
#if NMT_VECTORS
    FOR_THREADS(threads, rows, XENT_PICK(xent_smoothing)(z + FIRST * n, logp + FIRST * n, LAST - FIRST, n, m + FIRST, sums + FIRST));
    return 1;
#else
    (void)z; (void)logp; (void)rows; (void)n; (void)m; (void)sums; (void)threads;
    return 0;
#endif
}
