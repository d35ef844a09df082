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
 * everywhere, four where an x86-64 processor has AVX2, eight where it has AVX-512, chosen at run
 * time, no -m flags; -DNMT_NO_AVX512 / -DNMT_NO_AVX2 leave the wide ones out; a plain
 * loop where they are missing or with -DNMT_ROWS_ONLY), without a branch: a comparison per entry
 * was mispredicted on broad rows and left the loop scalar (70 ms where torch takes 25 for 896 rows
 * of 3,963 entries; 13 ms with AVX2, 5 ms on two threads, which the caller runs).
 * Rows are independent; nothing is allocated. Built with OpenMP, a call splits its rows over the
 * threads it is given (FOR_THREADS below).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_cpu_dispatch.h"

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
#if NMT_VECTORS
DEFINE_NEWTON(newton_f32_v, float, (double)FLT_EPSILON, NO_ATTR, VECTOR_SUMS(float, nmt_f32x2, nmt_f64x2, nmt_i64x2, 2))
DEFINE_NEWTON(newton_f64_v, double, DBL_EPSILON, NO_ATTR, VECTOR_SUMS(double, nmt_f64x2, nmt_f64x2, nmt_i64x2, 2))
#else
DEFINE_NEWTON(newton_f32_v, float, (double)FLT_EPSILON, NO_ATTR, SCALAR_SUMS(float))
DEFINE_NEWTON(newton_f64_v, double, DBL_EPSILON, NO_ATTR, SCALAR_SUMS(double))
#endif

#if NMT_VECTORS && defined(NMT_WIDE_AVX2)
/* 256-bit vectors where the processor has AVX2 (_cpu_dispatch.h) */
DEFINE_NEWTON(newton_f32_avx2, float, (double)FLT_EPSILON, AVX2, VECTOR_SUMS(float, nmt_f32x4, nmt_f64x4, nmt_i64x4, 4))
DEFINE_NEWTON(newton_f64_avx2, double, DBL_EPSILON, AVX2, VECTOR_SUMS(double, nmt_f64x4, nmt_f64x4, nmt_i64x4, 4))
#define HAVE_AVX2() CPU_HAS_AVX2()
#if defined(NMT_WIDE_AVX512)
/* 512-bit vectors (eight doubles) where the processor has AVX-512 */
DEFINE_NEWTON(newton_f32_avx512, float, (double)FLT_EPSILON, AVX512, VECTOR_SUMS(float, nmt_f32x8, nmt_f64x8, nmt_i64x8, 8))
DEFINE_NEWTON(newton_f64_avx512, double, DBL_EPSILON, AVX512, VECTOR_SUMS(double, nmt_f64x8, nmt_f64x8, nmt_i64x8, 8))
#define HAVE_AVX512() CPU_HAS_AVX512()
#endif
#else
#define newton_f32_avx2 newton_f32_v
#define newton_f64_avx2 newton_f64_v
#define HAVE_AVX2() 0
#endif
#ifndef HAVE_AVX512
#define newton_f32_avx512 newton_f32_v
#define newton_f64_avx512 newton_f64_v
#define HAVE_AVX512() 0
#endif

/* Long rows: the candidates above the maximum's bound, then the Newton loop on them alone.
 * For v = scale (z - max) (rounded as the torch shift rounds it) the threshold is at least -1 (the
 * maximum's p = (-tau)^q <= 1), so every entry with v <= BOUND_V = -1 - 2^-10 is zero whatever the
 * threshold: one pass finds the maximum, one compacts the others into the caller's scratch (n
 * entries), and the Newton loop above runs from -1 on those alone (the iterates stay above -1:
 * the entries left out add nothing to its sums), its closed form verified on them; a threshold
 * at most BOUND_V (rounding only) is flagged like an unverified one. Instead of the block
 * maxima, masks, selections and counts of the torch pruning (several passes over the whole
 * input): two passes over each row, in cache. Rows holding NaN or +inf: zmax NaN, tau -1 (where
 * the loop starts); rows without a finite entry: tau +inf, zmax 0; both ok. */
#define BOUND_V (-1.0 - 1.0 / 1024.0)
/* the candidates of x[i_ .. n): L entries at a time, a chunk without one skipped; v as the torch\
   shift rounds it (one multiplication of x, exact for a power-of-two scale, then the shift) */ \
#define COMPACT_LANES(T, VT, IT, L)                                                             \
    do {                                                                                        \
        for (; i_ + L <= n; i_ += L) {                                                          \
            VT xv, v;                                                                           \
            memcpy(&xv, x + i_, sizeof xv);                                                     \
            v = exact_scale ? m + s * xv : (xv - top) * s;                                      \
            IT c = v > bound;                                                                   \
            IT any = c;                                                                         \
            for (int l = 1; l < L; l++) any[0] |= c[l];                                         \
            if (any[0])                                                                         \
                for (int l = 0; l < L; l++) {                                                   \
                    cand[k] = v[l];                                                             \
                    k += c[l] != 0;                                                             \
                }                                                                               \
        }                                                                                       \
    } while (0)
/* the same with AVX-512's compressing stores: the candidates of 16 (8) entries in one instruction */\
#define COMPACT_512(T, VEC, MASK, SUF, L)                                                       \
    do {                                                                                        \
        const VEC sv = _mm512_set1_##SUF(s), mv = _mm512_set1_##SUF(m), tv = _mm512_set1_##SUF(top);\
        const VEC bv = _mm512_set1_##SUF(bound);                                                \
        for (; i_ + L <= n; i_ += L) {                                                          \
            const VEC xv = _mm512_loadu_##SUF(x + i_);                                          \
            const VEC v = exact_scale ? _mm512_add_##SUF(mv, _mm512_mul_##SUF(sv, xv))          \
                                      : _mm512_mul_##SUF(_mm512_sub_##SUF(xv, tv), sv);         \
            const MASK c = _mm512_cmp_##SUF##_mask(v, bv, _CMP_GT_OQ);                          \
            _mm512_mask_compressstoreu_##SUF(cand + k, c, v);                                   \
            k += __builtin_popcount((unsigned)c);                                               \
        }                                                                                       \
    } while (0)
/* The mapping's output of row r, operation by operation as the torch forward computes it:
   q = 2, 1.5-entmax (scale 1/2): r = [(-zmax/2 + x/2) - tau]_+ (NaN kept), p = r * r, root (if
   given) r; q = 1, sparsemax (scale 1): p = [(x - zmax) - tau]_+. psum (if given): the row's sum
   of p^alpha, alpha = 1 + 1/q (r p = p^1.5; p p = p^2), in double. VECTORS first (L lanes at a
   time), then one by one. */                                                                   \
#define OUTPUT_ROW(T, VECTORS)                                                                  \
    do {                                                                                        \
        const T zm = zmax_out[r], hm = (T)(-0.5 * zm), t = tau_out[r];                          \
        const T *xr = z + r * n;                                                                \
        T *pr = p + r * n, *rr = root ? root + r * n : 0;                                       \
        double sum = 0.0;                                                                       \
        int64_t j = 0;                                                                          \
        VECTORS;                                                                                \
        if (q == 2)                                                                             \
            for (; j < n; j++) {                                                                \
                T v = (T)((T)(hm + (T)(0.5 * xr[j])) - t);                                      \
                v = v < 0 ? (T)0 : v;                                                           \
                pr[j] = (T)(v * v);                                                             \
                if (rr) rr[j] = v;                                                              \
                sum += (double)(T)(v * pr[j]);                                                  \
            }                                                                                   \
        else                                                                                    \
            for (; j < n; j++) {                                                                \
                T v = (T)((T)(xr[j] - zm) - t);                                                 \
                v = v < 0 ? (T)0 : v;                                                           \
                pr[j] = v;                                                                      \
                sum += (double)(T)(v * v);                                                      \
            }                                                                                   \
        if (psum) psum[r] = (T)sum;                                                             \
    } while (0)
#define OUTPUT_VECTORS(T, VT, IT, L)                                                            \
    do {                                                                                        \
        VT acc = {0};                                                                           \
        if (q == 2)                                                                             \
            for (; j + L <= n; j += L) {                                                        \
                VT xv;                                                                          \
                memcpy(&xv, xr + j, sizeof xv);                                                 \
                VT v = (hm + (T)0.5 * xv) - t;                                                  \
                v = (VT)((IT)v & ~(IT)(v < 0)); /* clamp at 0, NaN kept */                      \
                VT pv = v * v;                                                                  \
                memcpy(pr + j, &pv, sizeof pv);                                                 \
                if (rr) memcpy(rr + j, &v, sizeof v);                                           \
                acc += v * pv;                                                                  \
            }                                                                                   \
        else                                                                                    \
            for (; j + L <= n; j += L) {                                                        \
                VT xv;                                                                          \
                memcpy(&xv, xr + j, sizeof xv);                                                 \
                VT v = (xv - zm) - t;                                                           \
                v = (VT)((IT)v & ~(IT)(v < 0)); /* clamp at 0, NaN kept */                      \
                memcpy(pr + j, &v, sizeof v);                                                   \
                acc += v * v;                                                                   \
            }                                                                                   \
        for (int l = 0; l < L; l++) sum += (double)acc[l];                                      \
    } while (0)
#define DEFINE_BOUND(NAME, T, ATTR, NEWTON, VT, IT, L, MAXPASS, COMPACT, VECTORS)            \
ATTR static void NAME(const T *z, int64_t rows, int64_t n, int q, double scale, int exact_scale,\
                      int64_t max_iter, T *tau_out, T *zmax_out, int32_t *ok, T *cand, T *p,    \
                      T *root, T *psum)                                                         \
{                                                                                               \
    const T s = (T)scale, bound = (T)BOUND_V, lo = (T)-1;                                       \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const T *x = z + r * n;                                                                 \
        T top = -INFINITY;                                                                      \
        int bad = 0;                                                                            \
        int64_t i_ = 0;                                                                         \
        MAXPASS(T, VT, IT, L, x, n);                                                            \
        for (; i_ < n; i_++) {                                                                  \
            const T xi = x[i_];                                                                 \
            bad |= (xi != xi) | (xi == INFINITY);                                               \
            top = xi > top ? xi : top;                                                          \
        }                                                                                       \
        if (bad || top == -INFINITY) { /* NaN or +inf: all NaN (the row maximum NaN, tau as it  \
                                          starts); no finite entry: all zeros (tau +inf, zmax 0) */\
            tau_out[r] = bad ? lo : (T)INFINITY;                                                \
            zmax_out[r] = bad ? (T)NAN : (T)0;                                                  \
            ok[r] = 1;                                                                          \
            if (p) OUTPUT_ROW(T, VECTORS(T, VT, IT, L));                                                                      \
            continue;                                                                           \
        }                                                                                       \
        /* the candidates v = scale (z - max) > BOUND_V, compacted into cand */                 \
        const T m = (T)(-top * s);                                                              \
        int64_t k = 0;                                                                          \
        i_ = 0;                                                                                 \
        COMPACT(T, VT, IT, L);                                                                  \
        for (; i_ < n; i_++) {                                                                  \
            const T v = exact_scale ? (T)(m + (T)(s * x[i_])) : (T)((T)(x[i_] - top) * s);      \
            cand[k] = v;                                                                        \
            k += v > bound;                                                                     \
        }                                                                                       \
        T tau;                                                                                  \
        int32_t verified;                                                                       \
        NEWTON(cand, 1, k, q, &lo, max_iter, &tau, &verified);                                  \
        tau_out[r] = tau;                                                                       \
        zmax_out[r] = top;                                                                      \
        ok[r] = verified && tau > bound; /* then no entry left out reaches the threshold */     \
        if (p && ok[r]) OUTPUT_ROW(T, VECTORS(T, VT, IT, L));                                                                 \
    }                                                                                           \
}

#define NOTHING(T, VT, IT, L, ...) ((void)0)
#if NMT_VECTORS
DEFINE_BOUND(bound_f32_v, float, NO_ATTR, newton_f32_v, nmt_f32x4, nmt_i32x4, 4, MAXPASS_LANES, COMPACT_LANES, OUTPUT_VECTORS)
DEFINE_BOUND(bound_f64_v, double, NO_ATTR, newton_f64_v, nmt_f64x2, nmt_i64x2, 2, MAXPASS_LANES, COMPACT_LANES, OUTPUT_VECTORS)
#else /* no vectors: entry by entry */
DEFINE_BOUND(bound_f32_v, float, NO_ATTR, newton_f32_v, float, int32_t, 1, NOTHING, NOTHING, NOTHING)
DEFINE_BOUND(bound_f64_v, double, NO_ATTR, newton_f64_v, double, int64_t, 1, NOTHING, NOTHING, NOTHING)
#endif
#ifdef newton_f32_avx2 /* no AVX2 build: the aliases */
#define bound_f32_avx2 bound_f32_v
#define bound_f64_avx2 bound_f64_v
#else
DEFINE_BOUND(bound_f32_avx2, float, AVX2, newton_f32_avx2, nmt_f32x8, nmt_i32x8, 8, MAXPASS_LANES, COMPACT_LANES, OUTPUT_VECTORS)
DEFINE_BOUND(bound_f64_avx2, double, AVX2, newton_f64_avx2, nmt_f64x4, nmt_i64x4, 4, MAXPASS_LANES, COMPACT_LANES, OUTPUT_VECTORS)
#endif
#ifdef newton_f32_avx512 /* no AVX-512 build: the aliases */
#define bound_f32_avx512 bound_f32_v
#define bound_f64_avx512 bound_f64_v
#else
#define COMPACT_512_F32(T, VT, IT, L) COMPACT_512(float, __m512, __mmask16, ps, 16)
#define COMPACT_512_F64(T, VT, IT, L) COMPACT_512(double, __m512d, __mmask8, pd, 8)
DEFINE_BOUND(bound_f32_avx512, float, AVX512, newton_f32_avx512, nmt_f32x16, nmt_i32x16, 16, MAXPASS_LANES, COMPACT_512_F32, OUTPUT_VECTORS)
DEFINE_BOUND(bound_f64_avx512, double, AVX512, newton_f64_avx512, nmt_f64x8, nmt_i64x8, 8, MAXPASS_LANES, COMPACT_512_F64, OUTPUT_VECTORS)
#endif

#define DEFINE_ENTRY(NAME, T, SUFFIX)                                                           \
void NAME(const T *z, int64_t rows, int64_t n, int q, const T *lo, int64_t max_iter,          \
          T *tau_out, int32_t *ok, int threads)                                                 \
{                                                                                               \
    void (*solve)(const T *, int64_t, int64_t, int, const T *, int64_t, T *, int32_t *) =      \
        HAVE_AVX512() ? newton_##SUFFIX##_avx512 : HAVE_AVX2() ? newton_##SUFFIX##_avx2         \
                                                               : newton_##SUFFIX##_v;           \
    FOR_THREADS(threads, rows,                                                                  \
                solve(z + FIRST * n, LAST - FIRST, n, q, lo + FIRST, max_iter, tau_out + FIRST, \
                      ok + FIRST));                                                             \
}

DEFINE_ENTRY(nmt_newton_threshold_f32, float, f32)
DEFINE_ENTRY(nmt_newton_threshold_f64, double, f64)

#define AT(ptr, row) ((ptr) ? (ptr) + (row) : 0)
#define DEFINE_BOUND_ENTRY(NAME, T, SUFFIX)                                                     \
void NAME(const T *z, int64_t rows, int64_t n, int q, double scale, int exact_scale,            \
          int64_t max_iter, T *tau_out, T *zmax_out, int32_t *ok, T *scratch, T *p, T *root,    \
          T *psum, int threads)                                                                 \
{                                                                                               \
    void (*solve)(const T *, int64_t, int64_t, int, double, int, int64_t, T *, T *, int32_t *,  \
                  T *, T *, T *, T *) =                                                         \
        HAVE_AVX512() ? bound_##SUFFIX##_avx512 : HAVE_AVX2() ? bound_##SUFFIX##_avx2           \
                                                              : bound_##SUFFIX##_v;             \
    FOR_THREADS(threads, rows,                                                                  \
                solve(z + FIRST * n, LAST - FIRST, n, q, scale, exact_scale, max_iter,          \
                      tau_out + FIRST, zmax_out + FIRST, ok + FIRST, scratch + t_ * n,          \
                      AT(p, FIRST * n), AT(root, FIRST * n), AT(psum, FIRST)));                 \
}

DEFINE_BOUND_ENTRY(nmt_bound_threshold_f32, float, f32)
DEFINE_BOUND_ENTRY(nmt_bound_threshold_f64, double, f64)
