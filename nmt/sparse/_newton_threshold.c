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
 * k. A verified t is the exact threshold (the support it implies reproduces it). Where the check
 * fails and the step was more than 2 eps |tau| (the stop is wide where |tau| < 1: on broad rows
 * of 32,000 entries some 5% held an entry between tau and the root), the loop steps on until its
 * steps are at most 2 eps |tau|, and checks again. ok[r] = 0 marks a row that failed (ties within
 * rounding of the threshold; rare): the caller solves it by sorting. A start above the root is
 * allowed: the first step is then negative and lands below the root (h is convex), and the loop
 * goes on from there. Rows without a positive d (no finite entry) or holding NaN: tau is returned as found
 * (the caller masks such rows), ok = 1.
 * The sums of a step are taken in vectors of doubles (GCC / Clang vector extensions: two lanes
 * everywhere, four where an x86-64 processor has AVX2, eight where it has AVX-512, chosen at run
 * time, no -m flags; -DNMT_NO_AVX512 / -DNMT_NO_AVX2 leave the wide ones out; a plain
 * loop where they are missing or with -DNMT_ROWS_ONLY), without a branch: a comparison per entry
 * was mispredicted on broad rows and left the loop scalar (70 ms where torch takes 25 for 896 rows
 * of 3,963 entries; 13 ms with AVX2, 5 ms on two threads, which the caller runs). With AVX-512 the
 * sums are written with intrinsics (SUMS_512: the vector extensions widened eight floats by four
 * conversions and four shuffles, the pass's bottleneck), and the verification's count of the
 * entries at or above t goes by vectors too (COUNT_LANES; one by one it cost as much as two steps).
 * With AVX2 alone the long rows' compaction of float rows moves a chunk's candidates to the front by
 * one permutation from a table (COMPACT_256_F32; entry by entry, with a lane-by-lane test of the
 * chunk, it took half the time) and their moments go by four-double vectors (MOMENTS_256_F32):
 * 1.5-entmax forward on 1,024 rows of 8,000 normal scores of deviation 0.01-0.3, one thread, some
 * 25 / 20 / 16 -> 11 / 9 / 8 ms (torch's softmax with its AVX2 kernels: 7.7 ms).
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
/* VECTOR_SUMS with AVX-512 intrinsics, eight doubles a vector (float rows: eight floats widened by
   one conversion; the vector extensions' widening of eight floats compiled to four conversions and
   four shuffles, the pass's bottleneck), two vectors an iteration into two sets of masked sums;
   the count is summed in doubles (exact below 2^53) */
#define SUMS_512_STEP(d, s1, s2, sk)                                                            \
    do {                                                                                        \
        const __mmask8 m_ = _mm512_cmp_pd_mask(d, zero, _CMP_GT_OQ);                            \
        s1 = _mm512_mask_add_pd(s1, m_, s1, d);                                                 \
        s2 = _mm512_mask_add_pd(s2, m_, s2, _mm512_mul_pd(d, d));                               \
        sk = _mm512_mask_add_pd(sk, m_, sk, one);                                               \
    } while (0)
#define SUMS_512(T)                                                                             \
    do {                                                                                        \
        __m512d a1 = _mm512_setzero_pd(), a2 = a1, ak = a1, b1 = a1, b2 = a1, bk = a1;          \
        __m512d c1 = a1, c2 = a1, ck = a1, e1 = a1, e2 = a1, ek = a1;                           \
        const __m512d vt = _mm512_set1_pd(tau), zero = a1, one = _mm512_set1_pd(1.0);           \
        int64_t i_ = 0;                                                                         \
        for (; i_ + 32 <= n; i_ += 32) {                                                        \
            const __m512d d0 = _mm512_sub_pd(LOAD8_##T(x + i_), vt);                            \
            const __m512d d1 = _mm512_sub_pd(LOAD8_##T(x + i_ + 8), vt);                        \
            const __m512d d2 = _mm512_sub_pd(LOAD8_##T(x + i_ + 16), vt);                       \
            const __m512d d3 = _mm512_sub_pd(LOAD8_##T(x + i_ + 24), vt);                       \
            SUMS_512_STEP(d0, a1, a2, ak);                                                      \
            SUMS_512_STEP(d1, b1, b2, bk);                                                      \
            SUMS_512_STEP(d2, c1, c2, ck);                                                      \
            SUMS_512_STEP(d3, e1, e2, ek);                                                      \
        }                                                                                       \
        for (; i_ + 8 <= n; i_ += 8) {                                                          \
            const __m512d d0 = _mm512_sub_pd(LOAD8_##T(x + i_), vt);                            \
            SUMS_512_STEP(d0, a1, a2, ak);                                                      \
        }                                                                                       \
        a1 = _mm512_add_pd(_mm512_add_pd(a1, b1), _mm512_add_pd(c1, e1));                       \
        a2 = _mm512_add_pd(_mm512_add_pd(a2, b2), _mm512_add_pd(c2, e2));                       \
        ak = _mm512_add_pd(_mm512_add_pd(ak, bk), _mm512_add_pd(ck, ek));                       \
        double l1[8], l2[8], lk[8];                                                             \
        _mm512_storeu_pd(l1, a1);                                                               \
        _mm512_storeu_pd(l2, a2);                                                               \
        _mm512_storeu_pd(lk, ak);                                                               \
        double r1 = 0.0, r2 = 0.0, rkd = 0.0;                                                   \
        for (int l = 0; l < 8; l++) {                                                           \
            r1 += l1[l];                                                                        \
            r2 += l2[l];                                                                        \
            rkd += lk[l];                                                                       \
        }                                                                                       \
        int64_t rk = (int64_t)rkd;                                                              \
        TAIL_SUMS;                                                                              \
    } while (0)
/* above += #{x[i_ ..] >= tt} by vectors VT of L lanes (integer lanes IT of T's width, summed into
   above every 2^21 vectors: no lane overflows); i_ ends at the first entry not counted */
#define COUNT_LANES(VT, IT, L)                                                                  \
    do {                                                                                        \
        VT tv_;                                                                                 \
        for (int l_ = 0; l_ < L; l_++) tv_[l_] = tt;                                            \
        while (i_ + L <= n) {                                                                   \
            IT c0_ = {0}, c1_ = {0};                                                            \
            const int64_t e_ = n - i_ > ((int64_t)L << 21) ? i_ + ((int64_t)L << 21) : n;       \
            for (; i_ + 2 * L <= e_; i_ += 2 * L) {                                             \
                VT v0_, v1_;                                                                    \
                memcpy(&v0_, x + i_, sizeof v0_);                                               \
                memcpy(&v1_, x + i_ + L, sizeof v1_);                                           \
                c0_ -= (IT)(v0_ >= tv_);                                                        \
                c1_ -= (IT)(v1_ >= tv_);                                                        \
            }                                                                                   \
            for (; i_ + L <= e_; i_ += L) {                                                     \
                VT v0_;                                                                         \
                memcpy(&v0_, x + i_, sizeof v0_);                                               \
                c0_ -= (IT)(v0_ >= tv_);                                                        \
            }                                                                                   \
            for (int l_ = 0; l_ < L; l_++) above += (int64_t)c0_[l_] + (int64_t)c1_[l_];        \
        }                                                                                       \
    } while (0)
#define LOAD8_float(p) _mm512_cvtps_pd(_mm256_loadu_ps(p))
#define LOAD8_double(p) _mm512_loadu_pd(p)
#define SCALAR_SUMS(T)                                                                          \
    do {                                                                                        \
        double r1 = 0.0, r2 = 0.0;                                                              \
        int64_t rk = 0, i_ = 0;                                                                 \
        TAIL_SUMS;                                                                              \
    } while (0)

#define DEFINE_NEWTON(NAME, T, EPS, ATTR, SUMS, COUNT)                                           \
ATTR static void NAME(const T *z, int64_t rows, int64_t n, int q, const T *lo, int64_t max_iter, \
                      T *tau_out, int32_t *ok)                                                  \
{                                                                                               \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const T *x = z + r * n;                                                                 \
        double tau = (double)lo[r];                                                             \
        double s1 = 0.0, s2 = 0.0, k = 0.0;                                                     \
        int64_t it = 0;                                                                         \
        int checked = 0, strict = 0, good = 0;                                                  \
        T tt = (T)0;                                                                            \
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
            const double tol = 2.0 * (EPS) * (strict || fabs(tau) > 1.0 ? fabs(tau) : 1.0);     \
            if (step > tol || (it == 0 && step < -tol)) { /* a start above the root: its step   \
                                     lands below it (h is convex), the loop goes on from there */ \
                tau += step;                                                                    \
                it++;                                                                           \
                continue;                                                                       \
            }                                                                                   \
            /* settled (a step <= 0 from rounding included): the closed form on S, verified */  \
            double t;                                                                           \
            int valid = 1;                                                                      \
            if (q == 1) {                                                                       \
                t = tau + (s1 - 1.0) / k;                                                       \
            } else {                                                                            \
                const double disc = s1 * s1 - k * (s2 - 1.0);                                   \
                valid = disc >= 0.0;                                                            \
                t = tau + (s1 - sqrt(disc > 0.0 ? disc : 0.0)) / k;                             \
            }                                                                                   \
            tt = (T)t;                                                                          \
            int64_t above = 0, i_ = 0;                                                          \
            COUNT; /* the entries x >= tt: x[0 .. i_) by vectors, the rest one by one */        \
            for (; i_ < n; i_++)                                                                \
                above += x[i_] >= tt;                                                           \
            checked = 1;                                                                        \
            good = valid && (double)above == k;                                                 \
            if (good || strict || !(fabs(step) > 2.0 * (EPS) * fabs(tau)))                      \
                break;                                                                          \
            /* an entry between tau and the root (the stop, 2 eps max(1, |tau|), is wide where  \
               |tau| < 1: some 5% of broad rows of 32,000 entries; or a start just above the    \
               root): steps on (from above: lands below), until they are at most 2 eps |tau| */ \
            strict = 1;                                                                         \
            tau += step;                                                                        \
            it++;                                                                               \
        }                                                                                       \
        if (!(s1 > 0.0) || !checked) {                                                          \
            tau_out[r] = (T)tau;                                                                \
            ok[r] = s1 > 0.0 ? 0 : 1; /* the cap: not verified; empty / NaN: the caller's */    \
            continue;                                                                           \
        }                                                                                       \
        tau_out[r] = tt;                                                                        \
        ok[r] = good;                                                                           \
    }                                                                                           \
}

#define NO_ATTR
#if NMT_VECTORS
DEFINE_NEWTON(newton_f32_v, float, (double)FLT_EPSILON, NO_ATTR, VECTOR_SUMS(float, nmt_f32x2, nmt_f64x2, nmt_i64x2, 2),
              COUNT_LANES(nmt_f32x4, nmt_i32x4, 4))
DEFINE_NEWTON(newton_f64_v, double, DBL_EPSILON, NO_ATTR, VECTOR_SUMS(double, nmt_f64x2, nmt_f64x2, nmt_i64x2, 2),
              COUNT_LANES(nmt_f64x2, nmt_i64x2, 2))
#else
DEFINE_NEWTON(newton_f32_v, float, (double)FLT_EPSILON, NO_ATTR, SCALAR_SUMS(float), (void)0)
DEFINE_NEWTON(newton_f64_v, double, DBL_EPSILON, NO_ATTR, SCALAR_SUMS(double), (void)0)
#endif

#if NMT_VECTORS && defined(NMT_WIDE_AVX2)
/* 256-bit vectors where the processor has AVX2 (_cpu_dispatch.h) */
DEFINE_NEWTON(newton_f32_avx2, float, (double)FLT_EPSILON, AVX2, VECTOR_SUMS(float, nmt_f32x4, nmt_f64x4, nmt_i64x4, 4),
              COUNT_LANES(nmt_f32x8, nmt_i32x8, 8))
DEFINE_NEWTON(newton_f64_avx2, double, DBL_EPSILON, AVX2, VECTOR_SUMS(double, nmt_f64x4, nmt_f64x4, nmt_i64x4, 4),
              COUNT_LANES(nmt_f64x4, nmt_i64x4, 4))
#define HAVE_AVX2() CPU_HAS_AVX2()
#if defined(NMT_WIDE_AVX512)
/* 512-bit vectors (eight doubles) where the processor has AVX-512 */
DEFINE_NEWTON(newton_f32_avx512, float, (double)FLT_EPSILON, AVX512, SUMS_512(float),
              COUNT_LANES(nmt_f32x16, nmt_i32x16, 16))
DEFINE_NEWTON(newton_f64_avx512, double, DBL_EPSILON, AVX512, SUMS_512(double),
              COUNT_LANES(nmt_f64x8, nmt_i64x8, 8))
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

/* Long rows: the candidates above a lower bound of the threshold, then the Newton loop on them
 * alone. For v = scale (z - max) (rounded as the torch shift rounds it) the threshold is at least
 * -1 (the maximum's p = (-tau)^q <= 1), so every entry with v <= BOUND_V = -1 - 2^-10 is zero
 * whatever the threshold. Per row:
 * 1. one pass: the maximum, NaN / +inf, and the maxima of the lanes of m_acc segments
 *    (SEGMENT_MAXIMA: about BOUND_BLOCK entries a maximum, at most BOUND_MAX_SEG segments);
 * 2. a lower bound lo: the exact threshold of those maxima's v (entries of the row: their f is at
 *    most the row's everywhere) by the Newton loop above from -1, verified (else -1), less a
 *    margin for its closed form's rounding;
 * 3. one pass compacts the entries with v above the cut (two ulps of T below lo, at least
 *    BOUND_V: none below it can be in the support) into the caller's scratch (n entries);
 * 4. on a broad row (more than a quarter of its entries candidates) one pass takes the
 *    candidates' moments about the maxima's mean c0 (sum d, sum d^2, d = v - c0, in doubles) and
 *    their minimum: (a) float rows: the closed form on all k of them (the smaller root of
 *    k u^2 - 2 u sum d + sum d^2 - 1 = 0, t = c0 + u; q = 1: k u = sum d - 1), accepted where
 *    verified (every candidate at or above t, t above the cut: the support is all k, and t its
 *    closed form): the row's threshold without a Newton step (normal scores of deviation up to
 *    0.003 at 8,000 entries). Float64 rows go on (the moments' cancellation costs digits that a
 *    float threshold does not show); (b) the mean bound mean - k^(-1/q) (sum [v - t]_+^q >=
 *    k (mean - t)^q there: at least 1) where higher than lo; (c) q = 2: the threshold of k normal
 *    scores of that mean and variance (gauss_guess), not a bound;
 * 5. the Newton loop above on the candidates alone (the entries left out add nothing to its
 *    sums), from lo rounded down to T, or from the guess where higher (its first step goes down
 *    where the guess is above the threshold and lands below it); its closed form verified on them.
 *    A threshold at or below the cut (rounding only) is flagged like an unverified one; an
 *    unverified row returns the cut, a lower bound of its threshold, so the caller's sort needs
 *    only the entries above it.
 * Where the maximum's bound alone left every entry of a broad row (output layers early in
 * training: scores within 1 of each other) the loop ran from -1 on the whole row: 9 steps for
 * sparsemax on standard normal scores times 0.1 (8,000 entries, 32 in the support), where the
 * maxima's bound leaves some 40 candidates. Rows holding NaN or +inf: zmax NaN, tau -1; rows
 * without a finite entry: tau +inf, zmax 0; both ok. */
#define BOUND_V (-1.0 - 1.0 / 1024.0)
#define BOUND_BLOCK 64
#define BOUND_MAX_SEG 32
/* the candidates of x[i_ .. n): L entries at a time, a chunk without one skipped; v as the torch\
   shift rounds it (one multiplication of x, exact for a power-of-two scale, then the shift) */ \
#define COMPACT_LANES_BY(T, VT, IT, L, ANY)                                                     \
    do {                                                                                        \
        for (; i_ + L <= n; i_ += L) {                                                          \
            VT xv, v;                                                                           \
            memcpy(&xv, x + i_, sizeof xv);                                                     \
            v = exact_scale ? m + s * xv : (xv - top) * s;                                      \
            const IT c = v > cut;                                                               \
            if (ANY(c))                                                                         \
                for (int l = 0; l < L; l++) {                                                   \
                    cand[k] = v[l];                                                             \
                    k += c[l] != 0;                                                             \
                }                                                                               \
        }                                                                                       \
    } while (0)
#define COMPACT_LANES(T, VT, IT, L) COMPACT_LANES_BY(T, VT, IT, L, ANY_WORDS)
/* the same with AVX-512: the candidates of 16 (8) entries compressed in a register and stored
   whole at k <= i_ (within the scratch's n entries; a compressing store to memory is slow on some
   processors) */                                                                               \
#define COMPACT_512(T, VEC, MASK, SUF, L)                                                       \
    do {                                                                                        \
        const VEC sv = _mm512_set1_##SUF(s), mv = _mm512_set1_##SUF(m), tv = _mm512_set1_##SUF(top);\
        const VEC bv = _mm512_set1_##SUF(cut);                                                  \
        for (; i_ + L <= n; i_ += L) {                                                          \
            const VEC xv = _mm512_loadu_##SUF(x + i_);                                          \
            const VEC v = exact_scale ? _mm512_add_##SUF(mv, _mm512_mul_##SUF(sv, xv))          \
                                      : _mm512_mul_##SUF(_mm512_sub_##SUF(xv, tv), sv);         \
            const MASK c = _mm512_cmp_##SUF##_mask(v, bv, _CMP_GT_OQ);                          \
            _mm512_storeu_##SUF(cand + k, _mm512_maskz_compress_##SUF(c, v));                   \
            k += __builtin_popcount((unsigned)c);                                               \
        }                                                                                       \
    } while (0)
/* the same for float rows in the AVX2 functions: the candidates of eight entries moved to the
   front of a register (LEFTPACK8_PS) and stored whole at k <= i_ (the lanes after them overwritten
   later or unread); a chunk without one skipped after one comparison (one by one, each lane's
   extraction and the count's dependent add cost a quarter of 1.5-entmax's time on broad rows) */
#define COMPACT_256_F32(T, VT, IT, L)                                                           \
    do {                                                                                        \
        const __m256 sv = _mm256_set1_ps(s), mv = _mm256_set1_ps(m), tv = _mm256_set1_ps(top);  \
        const __m256 bv = _mm256_set1_ps(cut);                                                  \
        for (; i_ + 8 <= n; i_ += 8) {                                                          \
            const __m256 xv = _mm256_loadu_ps(x + i_);                                          \
            const __m256 v = exact_scale ? _mm256_add_ps(mv, _mm256_mul_ps(sv, xv))             \
                                         : _mm256_mul_ps(_mm256_sub_ps(xv, tv), sv);            \
            const unsigned c = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, bv, _CMP_GT_OQ));  \
            if (c) {                                                                            \
                _mm256_storeu_ps(cand + k, LEFTPACK8_PS(v, c));                                 \
                k += __builtin_popcount(c);                                                     \
            }                                                                                   \
        }                                                                                       \
    } while (0)
/* the maxima of the row's m_acc segments (L = 1: no vectors), as SEGMENT_MAXIMA */
#define SEGMENT_MAXIMA_ROWS(T, VT, IT, L, x, n, m_acc, seg, bm, top, bad)                       \
    do {                                                                                        \
        for (int64_t b_ = 0; b_ < (m_acc); b_++) {                                              \
            const int64_t e_ = b_ + 1 < (m_acc) ? (b_ + 1) * (seg) : (n);                       \
            T mx_ = -INFINITY;                                                                  \
            for (int64_t j_ = b_ * (seg); j_ < e_; j_++) {                                      \
                const T v_ = (x)[j_];                                                           \
                (bad) |= (v_ != v_) | (v_ == (T)INFINITY);                                      \
                mx_ = v_ > mx_ ? v_ : mx_;                                                      \
            }                                                                                   \
            (bm)[b_] = mx_;                                                                     \
            (top) = mx_ > (top) ? mx_ : (top);                                                  \
        }                                                                                       \
    } while (0)
/* the largest T at most v, less two ulps of T (an entry at or below it is below v's neighbourhood) */
#define T_BELOW(T, v, out)                                                                      \
    do {                                                                                        \
        T t_ = (T)(v);                                                                          \
        if ((double)t_ > (v))                                                                   \
            t_ = nextafter##T##_(t_);                                                           \
        (out) = nextafter##T##_(nextafter##T##_(t_));                                           \
    } while (0)
static inline float nextafterfloat_(float v) { return nextafterf(v, -INFINITY); }
static inline double nextafterdouble_(double v) { return nextafter(v, -INFINITY); }
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
/* A guess of the 1.5-entmax threshold (q = 2) of k scores of the given mean and variance, were
   they normal: t = mean - a sd with k var G(a) = 1, G(a) = E[(Z + a)_+^2] = (a^2 + 1) Phi(a) +
   a phi(a) (Newton steps on a from sqrt(max(1 / (k var) - 1, 0)), a within 1e-4 or six steps),
   at most -1/sqrt(k) (the threshold is: sum [v - t]_+^2 <= k (0 - t)^2 for entries v <= 0).
   Not a bound: the Newton loop started there takes a first step down where it is above the
   threshold (its steps land below the root from either side). On broad rows of normal scores it
   saves one or two of the loop's passes over the mean bound (simulated, 8,000 and 32,000 entries,
   deviations 0.003-0.1; skewed, heavy-tailed, uniform and bimodal rows: one pass more in 1 of 48
   settings, fewer or as many in the others). */
static double gauss_guess(double k, double mean, double var)
{
    const double target = 1.0 / (k * var);
    double a = target > 1.0 ? sqrt(target - 1.0) : 0.0;
    for (int i = 0; i < 6; i++) {
        const double cdf = 0.5 * erfc(-a * 0.7071067811865476), pdf = 0.3989422804014327 * exp(-0.5 * a * a);
        const double da = ((a * a + 1.0) * cdf + a * pdf - target) / (2.0 * (a * cdf + pdf));
        a -= da;
        a = a > -6.0 ? a : -6.0;
        if (!(fabs(da) > 1e-4))
            break;
    }
    const double t = mean - a * sqrt(var), top = -1.0 / sqrt(k);
    return t < top ? t : top;
}
#define DEFINE_BOUND(NAME, T, ATTR, NEWTON, VT, IT, DT, L, SEGMAX, COMPACT, VECTORS, MOMENTS)\
ATTR static void NAME(const T *z, int64_t rows, int64_t n, int q, double scale, int exact_scale,\
                      int64_t max_iter, T *tau_out, T *zmax_out, int32_t *ok, T *cand, T *p,    \
                      T *root, T *psum)                                                         \
{                                                                                               \
    const T s = (T)scale, bound = (T)BOUND_V;                                                   \
    int64_t m_acc = n / (BOUND_BLOCK * L);                                                      \
    m_acc = m_acc < 1 ? 1 : m_acc > BOUND_MAX_SEG ? BOUND_MAX_SEG : m_acc;                      \
    const int64_t seg = (n / (m_acc * L)) * L; /* entries a segment (the last: to the end) */  \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const T *x = z + r * n;                                                                 \
        T top = -INFINITY, bm[BOUND_MAX_SEG * L];                                               \
        int bad = 0;                                                                            \
        SEGMAX(T, VT, IT, L, x, n, m_acc, seg, bm, top, bad); /* 1. */                          \
        if (bad || top == -INFINITY) { /* NaN or +inf: all NaN (the row maximum NaN, tau -1);   \
                                          no finite entry: all zeros (tau +inf, zmax 0) */      \
            tau_out[r] = bad ? (T)-1 : (T)INFINITY;                                             \
            zmax_out[r] = bad ? (T)NAN : (T)0;                                                  \
            ok[r] = 1;                                                                          \
            if (p) OUTPUT_ROW(T, VECTORS(T, VT, IT, L));                                        \
            continue;                                                                           \
        }                                                                                       \
        const T m = (T)(-top * s);                                                              \
        int64_t k = 0; /* 2. the maxima's exact threshold (a lower bound), where verified */    \
        for (int64_t i = 0; i < m_acc * L; i++) {                                               \
            const T v = exact_scale ? (T)(m + (T)(s * bm[i])) : (T)((T)(bm[i] - top) * s);      \
            bm[k] = v;                                                                          \
            k += v > bound;                                                                     \
        }                                                                                       \
        const int64_t kb = k; /* the maxima above the bound, bm[0 .. kb): at least the maximum */ \
        T tau;                                                                                  \
        int32_t verified;                                                                       \
        const T minus1 = (T)-1;                                                                 \
        NEWTON(bm, 1, k, q, &minus1, max_iter, &tau, &verified);                                \
        double lo = verified ? (double)tau : -1.0; /* within half an ulp of T of the root */    \
        lo -= 1e-9 * (fabs(lo) > 1.0 ? fabs(lo) : 1.0); /* the closed form's rounding */        \
        T cut;                                                                                  \
        T_BELOW(T, lo, cut);                                                                    \
        cut = cut > bound ? cut : bound;                                                        \
        int64_t i_ = 0; /* 3. the candidates v > cut, compacted into cand */                    \
        k = 0;                                                                                  \
        COMPACT(T, VT, IT, L);                                                                  \
        for (; i_ < n; i_++) {                                                                  \
            const T v = exact_scale ? (T)(m + (T)(s * x[i_])) : (T)((T)(x[i_] - top) * s);      \
            cand[k] = v;                                                                        \
            k += v > cut;                                                                       \
        }                                                                                       \
        int dense = 0;                                                                          \
        double guess = -INFINITY;                                                               \
        if (k > n / 4) { /* a broad row: the candidates' moments about the maxima's mean c0 */  \
            double c0 = 0.0, m1 = 0.0, m2 = 0.0;                                                \
            for (int64_t i = 0; i < kb; i++)                                                    \
                c0 += (double)bm[i];                                                            \
            c0 /= (double)kb;                                                                   \
            T cmin = (T)INFINITY;                                                               \
            int64_t i = 0;                                                                      \
            MOMENTS(T, VT, IT, DT, L);                                                              \
            for (; i < k; i++) {                                                                \
                const double d = (double)cand[i] - c0;                                          \
                m1 += d;                                                                        \
                m2 += d * d;                                                                    \
                cmin = cand[i] < cmin ? cand[i] : cmin;                                         \
            }                                                                                   \
            const double kd = (double)k;                                                        \
            /* the mean bound, often the closer: sum [v - t]_+^q >= k (mean - t)^q >= 1 */     \
            double mb = c0 + m1 / kd - (q == 1 ? 1.0 / kd : 1.0 / sqrt(kd));                    \
            mb -= 1e-9 * (fabs(mb) > 1.0 ? fabs(mb) : 1.0); /* the sum's rounding */            \
            lo = mb > lo ? mb : lo;                                                             \
            const double var = m2 / kd - (m1 / kd) * (m1 / kd);                                 \
            if (q == 2 && var > 0.0)                                                            \
                guess = gauss_guess(kd, c0 + m1 / kd, var);                                     \
            if (sizeof(T) == sizeof(float)) { /* every candidate in the support? */             \
                /* the closed form on all k (u = t - c0: k u^2 - 2 u m1 + m2 - 1 = 0, the      \
                   smaller root; q = 1: k u = m1 - 1), verified as the loop's: v >= t for      \
                   every candidate (cmin), none left out (below the cut, which t exceeds) */    \
                const double disc = m1 * m1 - kd * (m2 - 1.0);                                  \
                const double u = q == 1 ? (m1 - 1.0) / kd : (m1 - sqrt(disc > 0.0 ? disc : 0.0)) / kd; \
                const T tt = (T)(c0 + u);                                                       \
                if ((q == 1 || disc >= 0.0) && tt > cut && cmin >= tt) {                        \
                    tau = tt;                                                                   \
                    dense = 1;                                                                  \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        if (dense) {                                                                            \
            ok[r] = 1;                                                                          \
            tau_out[r] = tau;                                                                   \
            zmax_out[r] = top;                                                                  \
            if (p) OUTPUT_ROW(T, VECTORS(T, VT, IT, L));                                        \
            continue;                                                                           \
        }                                                                                       \
        T start; /* 5. the threshold, from lo rounded down (or a broad row's guess) */          \
        T_BELOW(T, lo, start);                                                                  \
        if (guess > lo)                                                                         \
            start = (T)guess;                                                                   \
        NEWTON(cand, 1, k, q, &start, max_iter, &tau, &verified);                               \
        ok[r] = verified && tau > cut; /* then no entry left out reaches the threshold */       \
        tau_out[r] = ok[r] ? tau : cut; /* unverified: a lower bound (the caller sorts above it) */\
        zmax_out[r] = top;                                                                      \
        if (p && ok[r]) OUTPUT_ROW(T, VECTORS(T, VT, IT, L));                                   \
    }                                                                                           \
}
/* m1 += sum (cand - c0), m2 += sum (cand - c0)^2 in doubles (two chains), cmin = min(cmin, cand)
   over cand[0 .. k) by L lanes at a time (the vector extensions: L of 2 to 8), from i = 0; i ends at
   the first entry not taken */
#define MOMENTS_LANES(T, VT, IT, DT, L)                                                         \
    do {                                                                                        \
        DT a1 = {0}, a2 = {0}, b1 = {0}, b2 = {0}, cv;                                          \
        VT mn, mn1;                                                                             \
        for (int l = 0; l < L; l++) {                                                           \
            cv[l] = c0;                                                                         \
            mn[l] = mn1[l] = (T)INFINITY;                                                       \
        }                                                                                       \
        for (; i + 2 * L <= k; i += 2 * L) {                                                    \
            VT v0, v1;                                                                          \
            memcpy(&v0, cand + i, sizeof v0);                                                   \
            memcpy(&v1, cand + i + L, sizeof v1);                                               \
            const IT l0 = v0 < mn, l1 = v1 < mn1;                                               \
            mn = (VT)(((IT)v0 & l0) | ((IT)mn & ~l0));                                          \
            mn1 = (VT)(((IT)v1 & l1) | ((IT)mn1 & ~l1));                                        \
            const DT d0 = __builtin_convertvector(v0, DT) - cv;                                 \
            const DT d1 = __builtin_convertvector(v1, DT) - cv;                                 \
            a1 += d0;                                                                           \
            a2 += d0 * d0;                                                                      \
            b1 += d1;                                                                           \
            b2 += d1 * d1;                                                                      \
        }                                                                                       \
        a1 += b1;                                                                               \
        a2 += b2;                                                                               \
        for (int l = 0; l < L; l++) {                                                           \
            m1 += a1[l];                                                                        \
            m2 += a2[l];                                                                        \
            cmin = mn[l] < cmin ? mn[l] : cmin;                                                 \
            cmin = mn1[l] < cmin ? mn1[l] : cmin;                                               \
        }                                                                                       \
    } while (0)
/* the same with AVX-512 intrinsics, eight doubles a vector (float candidates widened eight at a
   time: the vector extensions' sixteen-double vectors spilled to the stack) */
#define MOMENTS_512(T, VT, IT, DT, L)                                                           \
    do {                                                                                        \
        __m512d a1 = _mm512_setzero_pd(), a2 = a1, b1 = a1, b2 = a1;                            \
        const __m512d cv = _mm512_set1_pd(c0);                                                  \
        __m512d mn = _mm512_set1_pd(INFINITY), mn1 = mn;                                        \
        for (; i + 16 <= k; i += 16) {                                                          \
            const __m512d w0 = LOAD8_##T(cand + i), w1 = LOAD8_##T(cand + i + 8);               \
            mn = _mm512_min_pd(mn, w0);                                                         \
            mn1 = _mm512_min_pd(mn1, w1);                                                       \
            const __m512d d0 = _mm512_sub_pd(w0, cv), d1 = _mm512_sub_pd(w1, cv);               \
            a1 = _mm512_add_pd(a1, d0);                                                         \
            a2 = _mm512_add_pd(a2, _mm512_mul_pd(d0, d0));                                      \
            b1 = _mm512_add_pd(b1, d1);                                                         \
            b2 = _mm512_add_pd(b2, _mm512_mul_pd(d1, d1));                                      \
        }                                                                                       \
        double l1[8], l2[8], lm[8];                                                             \
        _mm512_storeu_pd(l1, _mm512_add_pd(a1, b1));                                            \
        _mm512_storeu_pd(l2, _mm512_add_pd(a2, b2));                                            \
        _mm512_storeu_pd(lm, _mm512_min_pd(mn, mn1));                                           \
        for (int l = 0; l < 8; l++) {                                                           \
            m1 += l1[l];                                                                        \
            m2 += l2[l];                                                                        \
            cmin = lm[l] < (double)cmin ? (T)lm[l] : cmin; /* widened exactly: the same T */    \
        }                                                                                       \
    } while (0)
/* the same for float candidates in the AVX2 functions: four doubles a vector (the vector
   extensions' eight-double vectors spilled to the stack there) */
#define MOMENTS_256_F32(T, VT, IT, DT, L)                                                       \
    do {                                                                                        \
        __m256d a1 = _mm256_setzero_pd(), a2 = a1, b1 = a1, b2 = a1;                            \
        const __m256d cv = _mm256_set1_pd(c0);                                                  \
        __m256 mn = _mm256_set1_ps(INFINITY);                                                   \
        for (; i + 8 <= k; i += 8) {                                                            \
            const __m256 v = _mm256_loadu_ps(cand + i);                                         \
            mn = _mm256_min_ps(mn, v);                                                          \
            const __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), cv);   \
            const __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), cv); \
            a1 = _mm256_add_pd(a1, d0);                                                         \
            a2 = _mm256_add_pd(a2, _mm256_mul_pd(d0, d0));                                      \
            b1 = _mm256_add_pd(b1, d1);                                                         \
            b2 = _mm256_add_pd(b2, _mm256_mul_pd(d1, d1));                                      \
        }                                                                                       \
        double l1[4], l2[4];                                                                    \
        float lm[8];                                                                            \
        _mm256_storeu_pd(l1, _mm256_add_pd(a1, b1));                                            \
        _mm256_storeu_pd(l2, _mm256_add_pd(a2, b2));                                            \
        _mm256_storeu_ps(lm, mn);                                                               \
        for (int l = 0; l < 4; l++) {                                                           \
            m1 += l1[l];                                                                        \
            m2 += l2[l];                                                                        \
        }                                                                                       \
        for (int l = 0; l < 8; l++)                                                             \
            cmin = lm[l] < cmin ? lm[l] : cmin;                                                 \
    } while (0)
#define MOMENTS_ROWS(T, VT, IT, DT, L) ((void)0)

#define NOTHING(T, VT, IT, L, ...) ((void)0)
#if NMT_VECTORS
DEFINE_BOUND(bound_f32_v, float, NO_ATTR, newton_f32_v, nmt_f32x4, nmt_i32x4, nmt_f64x4, 4, SEGMENT_MAXIMA, COMPACT_LANES, OUTPUT_VECTORS, MOMENTS_LANES)
DEFINE_BOUND(bound_f64_v, double, NO_ATTR, newton_f64_v, nmt_f64x2, nmt_i64x2, nmt_f64x2, 2, SEGMENT_MAXIMA, COMPACT_LANES, OUTPUT_VECTORS, MOMENTS_LANES)
#else /* no vectors: entry by entry */
DEFINE_BOUND(bound_f32_v, float, NO_ATTR, newton_f32_v, float, int32_t, double, 1, SEGMENT_MAXIMA_ROWS, NOTHING, NOTHING, MOMENTS_ROWS)
DEFINE_BOUND(bound_f64_v, double, NO_ATTR, newton_f64_v, double, int64_t, double, 1, SEGMENT_MAXIMA_ROWS, NOTHING, NOTHING, MOMENTS_ROWS)
#endif
#ifdef newton_f32_avx2 /* no AVX2 build: the aliases */
#define bound_f32_avx2 bound_f32_v
#define bound_f64_avx2 bound_f64_v
#else
#define COMPACT_LANES_256(T, VT, IT, L) COMPACT_LANES_BY(T, VT, IT, L, ANY_256)
DEFINE_BOUND(bound_f32_avx2, float, AVX2, newton_f32_avx2, nmt_f32x8, nmt_i32x8, nmt_f64x8, 8, SEGMENT_MAXIMA, COMPACT_256_F32, OUTPUT_VECTORS, MOMENTS_256_F32)
DEFINE_BOUND(bound_f64_avx2, double, AVX2, newton_f64_avx2, nmt_f64x4, nmt_i64x4, nmt_f64x4, 4, SEGMENT_MAXIMA, COMPACT_LANES_256, OUTPUT_VECTORS, MOMENTS_LANES)
#endif
#ifdef newton_f32_avx512 /* no AVX-512 build: the aliases */
#define bound_f32_avx512 bound_f32_v
#define bound_f64_avx512 bound_f64_v
#else
#define COMPACT_512_F32(T, VT, IT, L) COMPACT_512(float, __m512, __mmask16, ps, 16)
#define COMPACT_512_F64(T, VT, IT, L) COMPACT_512(double, __m512d, __mmask8, pd, 8)
DEFINE_BOUND(bound_f32_avx512, float, AVX512, newton_f32_avx512, nmt_f32x16, nmt_i32x16, nmt_f64x16, 16, SEGMENT_MAXIMA, COMPACT_512_F32, OUTPUT_VECTORS, MOMENTS_512)
DEFINE_BOUND(bound_f64_avx512, double, AVX512, newton_f64_avx512, nmt_f64x8, nmt_i64x8, nmt_f64x8, 8, SEGMENT_MAXIMA, COMPACT_512_F64, OUTPUT_VECTORS, MOMENTS_512)
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
