/* Exact thresholds of sparsemax (q = 1) and 1.5-entmax (q = 2) by Newton steps on whole rows.
 *
 * The native CPU form of the Newton loop of nmt.sparse._threshold (_newton for q = 1, _newton_norm
 * for q = 2) with its verified closed-form finish, for rows that pruning cannot shorten (broad
 * rows: output layers early in training, near-uniform scores). Each row z (n entries, maximum 0,
 * -inf allowed: the caller shifts and scales) stays in cache while every step makes one pass that
 * forms all its sums (torch makes two to four passes a step, each over the whole batch).
 *
 * From a lower bound tau of the threshold (f(tau) >= 0, f(t) = sum [z - t]_+^q - 1), with
 * d = [z - tau]_+, s1 = sum d, s2 = sum d^2, k = #{d > 0} (sums in double):
 *   q = 1: Newton on the convex, piecewise linear f: step = (s1 - 1) / k;
 *   q = 2: Newton on the convex h(t) = ||d||_2 - 1: step = h (h - 1) / s1, h = sqrt(s2);
 * from below the iterates increase monotonically to the root. The loop stops when a step is at
 * most 2 eps (of the row's type) times max(1, |tau|), or after max_iter steps. Then the closed
 * form on S = {d > 0}, relative to tau: t = tau + (s1 - 1) / k (q = 1) or
 * t = tau + (s1 - sqrt(max(s1^2 - k (s2 - 1), 0))) / k (q = 2), rounded to the row's type, is
 * accepted only if *verified*: s1^2 - k (s2 - 1) >= 0 (q = 2) and the entries z >= t are exactly
 * k. A verified t is the exact threshold (the support it implies reproduces it). ok[r] = 0 marks
 * a row that failed (ties within rounding of the threshold; rare): the caller solves it by
 * sorting. Rows without a positive d (no finite entry) or holding NaN: tau is returned as found
 * (the caller masks such rows), ok = 1.
 * The sums of a step are taken in vectors of doubles (GCC / Clang vector extensions: two lanes
 * everywhere, four where an x86-64 processor has AVX2, chosen at run time, no -m flags; a plain
 * loop where they are missing or with -DNMT_ROWS_ONLY), without a branch: a comparison per entry
 * was mispredicted on broad rows and left the loop scalar (70 ms where torch takes 25 for 896 rows
 * of 3,963 entries; 13 ms with AVX2, 5 ms on two threads, which the caller runs).
 * Rows are independent; nothing is allocated. One thread per call.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* s1, s2, k of d = [x - tau]_+ over the row x[0 .. n), LANES entries at a time in vectors of doubles */
#define VECTOR_SUMS(T, VT, DT, IT, LANES)                                                       \
    do {                                                                                        \
        DT a1 = {0}, a2 = {0};                                                                  \
        IT ak = {0};                                                                            \
        DT vt, zero = {0};                                                                      \
        for (int l = 0; l < LANES; l++)                                                         \
            vt[l] = tau;                                                                        \
        int64_t i_ = 0;                                                                         \
        for (; i_ + LANES <= n; i_ += LANES) {                                                  \
            VT v;                                                                               \
            memcpy(&v, x + i_, sizeof v);                                                       \
            DT d = __builtin_convertvector(v, DT) - vt;                                         \
            IT m = d > zero;                                                                    \
            d = (DT)((IT)d & m);                                                                \
            a1 += d;                                                                            \
            a2 += d * d;                                                                        \
            ak -= m;                                                                            \
        }                                                                                       \
        double r1 = 0.0, r2 = 0.0;                                                              \
        int64_t rk = 0;                                                                         \
        for (int l = 0; l < LANES; l++) {                                                       \
            r1 += a1[l];                                                                        \
            r2 += a2[l];                                                                        \
            rk += ak[l];                                                                        \
        }                                                                                       \
        TAIL_SUMS;                                                                              \
    } while (0)
/* the entries x[i_ .. n) one at a time into r1, r2, rk, then the step's sums s1, s2, k */
#define TAIL_SUMS                                                                               \
    do {                                                                                        \
        for (; i_ < n; i_++) {                                                                  \
            double d = (double)x[i_] - tau;                                                     \
            d = d > 0.0 ? d : 0.0;                                                              \
            r1 += d;                                                                            \
            r2 += d * d;                                                                        \
            rk += d > 0.0;                                                                      \
        }                                                                                       \
        s1 = r1;                                                                                \
        s2 = r2;                                                                                \
        k = (double)rk;                                                                         \
    } while (0)
#define SCALAR_SUMS(T)                                                                          \
    do {                                                                                        \
        double r1 = 0.0, r2 = 0.0;                                                              \
        int64_t rk = 0, i_ = 0;                                                                 \
        TAIL_SUMS;                                                                              \
    } while (0)

#if !defined(NMT_ROWS_ONLY) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 9))
#define NMT_NT_VECTORS 1
typedef float nmt_nt_f32x2 __attribute__((vector_size(8)));
typedef double nmt_nt_f64x2 __attribute__((vector_size(16)));
typedef int64_t nmt_nt_i64x2 __attribute__((vector_size(16)));
typedef float nmt_nt_f32x4 __attribute__((vector_size(16)));
typedef double nmt_nt_f64x4 __attribute__((vector_size(32)));
typedef int64_t nmt_nt_i64x4 __attribute__((vector_size(32)));
#else
#define NMT_NT_VECTORS 0
#endif

#define DEFINE_NEWTON(NAME, T, EPS, ATTR, SUMS)                                                 \
ATTR static void NAME(const T *z, int64_t rows, int64_t n, int q, const T *lo, int64_t max_iter, \
                      T *tau_out, int32_t *ok)                                                  \
{                                                                                               \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const T *x = z + r * n;                                                                 \
        double tau = (double)lo[r];                                                             \
        double s1 = 0.0, s2 = 0.0, k = 0.0;                                                     \
        int64_t it = 0;                                                                         \
        for (;;) {                                                                              \
            SUMS;                                                                               \
            if (!(s1 > 0.0) || it >= max_iter)                                                  \
                break; /* no entry above tau (an empty or NaN row), or the cap */               \
            double step;                                                                        \
            if (q == 1) {                                                                       \
                step = (s1 - 1.0) / k;                                                          \
            } else {                                                                            \
                const double h = sqrt(s2);                                                      \
                step = h * (h - 1.0) / s1;                                                      \
            }                                                                                   \
            const double scale = fabs(tau) > 1.0 ? fabs(tau) : 1.0;                             \
            if (!(step > 2.0 * (EPS) * scale))                                                  \
                break; /* settled (a step <= 0 from rounding included) */                       \
            tau += step;                                                                        \
            it++;                                                                               \
        }                                                                                       \
        if (!(s1 > 0.0) || it >= max_iter) {                                                    \
            tau_out[r] = (T)tau;                                                                \
            ok[r] = s1 > 0.0 ? 0 : 1; /* the cap: not verified; empty / NaN: the caller's */    \
            continue;                                                                           \
        }                                                                                       \
        double t;                                                                               \
        int valid = 1;                                                                          \
        if (q == 1) {                                                                           \
            t = tau + (s1 - 1.0) / k;                                                           \
        } else {                                                                                \
            const double disc = s1 * s1 - k * (s2 - 1.0);                                       \
            valid = disc >= 0.0;                                                                \
            t = tau + (s1 - sqrt(disc > 0.0 ? disc : 0.0)) / k;                                 \
        }                                                                                       \
        const T tt = (T)t;                                                                      \
        int64_t above = 0;                                                                      \
        for (int64_t i = 0; i < n; i++)                                                         \
            above += x[i] >= tt;                                                                \
        tau_out[r] = tt;                                                                        \
        ok[r] = valid && (double)above == k;                                                    \
    }                                                                                           \
}

#define NO_ATTR
#if NMT_NT_VECTORS
DEFINE_NEWTON(newton_f32_v, float, (double)FLT_EPSILON, NO_ATTR, VECTOR_SUMS(float, nmt_nt_f32x2, nmt_nt_f64x2, nmt_nt_i64x2, 2))
DEFINE_NEWTON(newton_f64_v, double, DBL_EPSILON, NO_ATTR, VECTOR_SUMS(double, nmt_nt_f64x2, nmt_nt_f64x2, nmt_nt_i64x2, 2))
#else
DEFINE_NEWTON(newton_f32_v, float, (double)FLT_EPSILON, NO_ATTR, SCALAR_SUMS(float))
DEFINE_NEWTON(newton_f64_v, double, DBL_EPSILON, NO_ATTR, SCALAR_SUMS(double))
#endif

#if NMT_NT_VECTORS && defined(__x86_64__) && defined(__GNUC__) && !defined(NMT_NO_AVX2)
/* 256-bit vectors where the processor has AVX2 (checked at run time; built without -m flags) */
#define AVX2 __attribute__((target("avx2")))
DEFINE_NEWTON(newton_f32_avx2, float, (double)FLT_EPSILON, AVX2, VECTOR_SUMS(float, nmt_nt_f32x4, nmt_nt_f64x4, nmt_nt_i64x4, 4))
DEFINE_NEWTON(newton_f64_avx2, double, DBL_EPSILON, AVX2, VECTOR_SUMS(double, nmt_nt_f64x4, nmt_nt_f64x4, nmt_nt_i64x4, 4))
#define HAVE_AVX2() __builtin_cpu_supports("avx2")
#else
#define newton_f32_avx2 newton_f32_v
#define newton_f64_avx2 newton_f64_v
#define HAVE_AVX2() 0
#endif

#define DEFINE_ENTRY(NAME, T, SUFFIX)                                                           \
void NAME(const T *z, int64_t rows, int64_t n, int q, const T *lo, int64_t max_iter,          \
          T *tau_out, int32_t *ok)                                                              \
{                                                                                               \
    if (HAVE_AVX2())                                                                            \
        newton_##SUFFIX##_avx2(z, rows, n, q, lo, max_iter, tau_out, ok);                       \
    else                                                                                        \
        newton_##SUFFIX##_v(z, rows, n, q, lo, max_iter, tau_out, ok);                          \
}

DEFINE_ENTRY(nmt_newton_threshold_f32, float, f32)
DEFINE_ENTRY(nmt_newton_threshold_f64, double, f64)
