/* Thresholds of alpha-entmax for any power q = 1 / (alpha - 1) > 1 (alpha in (1, 2)) by Newton
 * steps on the q-norm, float32 rows.
 *
 * The native CPU form of nmt.sparse._threshold._newton_norm's inexact loop (a float alpha other
 * than 1.5 / 2, or one alpha per row: learned heads). The torch loop makes some twenty operations
 * a step, most on (R,) tensors, plus a pow over the whole input: on attention-sized inputs the
 * operations' overhead, not the arithmetic, sets its time. Here every step makes one pass over a
 * row in cache that forms both sums.
 *
 * Row z (n entries, maximum 0, -inf allowed: the caller shifts and scales), power q > 1 (one for
 * all rows, or one per row), lower bound tau of the threshold (f(tau) >= 0,
 * f(t) = sum [z - t]_+^q - 1). With d = [z - tau]_+ and w = d^(q - 1) on the support (0 elsewhere),
 * sums in double:
 *   hq = sum w d = ||d||_q^q,  ws = sum w,  h = hq^(1/q),
 *   step = (h - 1) (hq / h) / ws       (Newton on the convex h(t) = ||d||_q - 1),
 * from below the iterates increase monotonically to the root. The loop stops when a step is at
 * most rtol * max(1, |tau|) (rtol: the caller's tolerance, float32's eps for the mappings), or
 * after max_iter steps, and returns the last tau reached (the step that settled it is not taken),
 * as the torch loop does. Rows without an entry above tau (no finite entry) or holding NaN: tau
 * as given (the caller masks such rows).
 *
 * The powers: a^b = exp2(b log2 a) in doubles, lane by lane in vectors (GCC / Clang vector
 * extensions; two lanes, four with AVX2, eight with AVX-512, chosen at run time as in
 * _newton_threshold.c), by polynomials: log2 from the exponent and the series of
 * atanh((m - 1) / (m + 1)) of the mantissa m in [sqrt(1/2), sqrt(2)) (seven terms), exp2 from the
 * nearest integer and the Taylor series of e^t, |t| <= ln(2) / 2 (degree 10): relative error
 * about 1e-12 (1e-11 where |b log2 a| reaches 1000), far below the float32 rounding the loop stops
 * at (float64 rows keep the torch loop). exp2 below 2^-1022 gives 0.
 * Short rows (at most POWER_BLOCK_MAX_N entries) are solved a block of rows at a time, one row a
 * lane: a row's pass is one polynomial chain after another, each waiting on the last, where the
 * lanes of a block are independent (3-4x faster at 20 entries); longer rows are vectorised along the
 * row. For short rows nmt_power_probs_f32 also does what the torch forward does around the
 * threshold: the row maxima, the shift z = (alpha - 1) (x - max), and the output p = r^q / sum r^q
 * with r = [z - tau]_+ (r too where the backward needs it), all in one call.
 * No branch per entry. Nothing is allocated (a short-row block sits on the stack). Built with
 * OpenMP, a call splits its rows over the threads it is given.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_cpu_dispatch.h"

#define POW_SQRT2 1.4142135623730951
#define POW_LOG2E 1.4426950408889634
#define POW_LN2 0.6931471805599453
#define POW_ROUND 6755399441055744.0 /* 1.5 * 2^52: (y + POW_ROUND) - POW_ROUND rounds y to an integer */

/* log2 of the positive, normal lanes of d (vectors of doubles DT with integer lanes IT) */
#define VLOG2(DT, IT, d, out)                                                                   \
    do {                                                                                        \
        const IT bits_ = (IT)(d);                                                               \
        /* the exponent as a double without an int64 conversion (none in AVX2): 2^52 + biased */ \
        DT ex_ = (DT)((bits_ >> 52) | 0x4330000000000000LL) - (4503599627370496.0 + 1023.0);   \
        DT m_ = (DT)((bits_ & 0x000FFFFFFFFFFFFFLL) | 0x3FF0000000000000LL); /* [1, 2) */       \
        const IT big_ = m_ > POW_SQRT2;                                                         \
        m_ = (DT)(((IT)(m_ * 0.5) & big_) | ((IT)m_ & ~big_));                                  \
        ex_ += (DT)((IT)((DT){0} + 1.0) & big_); /* m halved: one more */                     \
        const DT s_ = (m_ - 1.0) / (m_ + 1.0), s2_ = s_ * s_;                                   \
        /* 1 + u/3 + u^2/5 + ... + u^6/13, u = s^2, by Estrin's scheme (short dependency chains) */ \
        const DT u2_ = s2_ * s2_, u4_ = u2_ * u2_;                                              \
        const DT p_ = ((s2_ * (1.0 / 3.0) + 1.0) + u2_ * (s2_ * (1.0 / 7.0) + 1.0 / 5.0))       \
                      + u4_ * ((s2_ * (1.0 / 11.0) + 1.0 / 9.0) + u2_ * (1.0 / 13.0));          \
        (out) = ex_ + (2.0 * POW_LOG2E) * (s_ * p_);                                            \
    } while (0)

/* 2^y lane by lane, 0 where y < -1022 */
#define VEXP2(DT, IT, y, out)                                                                   \
    do {                                                                                        \
        const IT under_ = (y) < -1022.0;                                                        \
        const DT yc_ = (DT)(((IT)(DT){0} & under_) | ((IT)(y) & ~under_)); /* under: 2^0 */     \
        const DT r_ = yc_ + POW_ROUND;                                                          \
        const DT n_ = r_ - POW_ROUND;                                                           \
        const IT ni_ = (IT)r_ - (IT)((DT){0} + POW_ROUND);                                      \
        const DT t_ = (yc_ - n_) * POW_LN2;                                                     \
        /* sum_{k <= 10} t^k / k! by Estrin's scheme */                                          \
        const DT t2_ = t_ * t_, t4_ = t2_ * t2_, t8_ = t4_ * t4_;                               \
        const DT e_ = ((t_ + 1.0) + t2_ * (t_ * (1.0 / 6.0) + 0.5))                             \
                      + t4_ * ((t_ * (1.0 / 120.0) + 1.0 / 24.0) + t2_ * (t_ * (1.0 / 5040.0) + 1.0 / 720.0)) \
                      + t8_ * ((t_ * (1.0 / 362880.0) + 1.0 / 40320.0) + t2_ * (1.0 / 3628800.0)); \
        const DT scale_ = (DT)((ni_ + 1023) << 52);                                             \
        (out) = (DT)((IT)(e_ * scale_) & ~under_);                                              \
    } while (0)

/* hq = sum w d and ws = sum w, w = d^e on d = [x - tau]_+ > 0, over the row x[0 .. n): LANES entries
   at a time (float rows VT converted to doubles DT), the last ones padded with -inf */
#define POWER_SUMS(T, VT, DT, IT, LANES)                                                        \
    do {                                                                                        \
        DT aq = {0}, aw = {0}, vt, ve, zero = {0}, one = zero + 1.0;                            \
        for (int l = 0; l < LANES; l++) {                                                       \
            vt[l] = tau;                                                                        \
            ve[l] = e;                                                                          \
        }                                                                                       \
        for (int64_t i_ = 0; i_ < n; i_ += LANES) {                                             \
            VT v;                                                                               \
            if (i_ + LANES <= n) {                                                              \
                memcpy(&v, x + i_, sizeof v);                                                   \
            } else { /* the last entries, the other lanes -inf (outside every support) */       \
                for (int l = 0; l < LANES; l++)                                                 \
                    v[l] = i_ + l < n ? x[i_ + l] : (T)-INFINITY;                               \
            }                                                                                   \
            const DT d = __builtin_convertvector(v, DT) - vt;                                   \
            const IT m = d > zero; /* NaN: false here; the row's NaN is caught below */         \
            const DT dd = (DT)(((IT)d & m) | ((IT)one & ~m));                                   \
            DT lg, w;                                                                           \
            VLOG2(DT, IT, dd, lg);                                                              \
            VEXP2(DT, IT, ve * lg, w);                                                          \
            w = (DT)((IT)w & m);                                                                \
            aw += w;                                                                            \
            aq += w * (DT)((IT)d & m);                                                          \
            nan_ |= (IT)(d != d);                                                               \
        }                                                                                       \
        hq = 0.0;                                                                               \
        ws = 0.0;                                                                               \
        for (int l = 0; l < LANES; l++) {                                                       \
            hq += aq[l];                                                                        \
            ws += aw[l];                                                                        \
            bad |= nan_[l] != 0;                                                                \
        }                                                                                       \
    } while (0)
/* the same sums entry by entry (no vector extensions: libm's pow) */
#define SCALAR_POWER_SUMS(T)                                                                    \
    do {                                                                                        \
        hq = 0.0;                                                                               \
        ws = 0.0;                                                                               \
        for (int64_t i_ = 0; i_ < n; i_++) {                                                    \
            const double d = (double)x[i_] - tau;                                               \
            bad |= d != d;                                                                      \
            if (d > 0.0) {                                                                      \
                const double w = pow(d, e);                                                     \
                ws += w;                                                                        \
                hq += w * d;                                                                    \
            }                                                                                   \
        }                                                                                       \
    } while (0)

#define DEFINE_POWER(NAME, T, ATTR, IT, SUMS, ROOT)                                                   \
ATTR static void NAME(const T *z, int64_t rows, int64_t n, const double *q, int64_t q_stride,   \
                      const T *lo, int64_t max_iter, double rtol, T *tau_out)                   \
{                                                                                               \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const T *x = z + r * n;                                                                 \
        const double qr = q[r * q_stride], e = qr - 1.0;                                        \
        double tau = (double)lo[r];                                                             \
        int64_t it = 0;                                                                         \
        for (;;) {                                                                              \
            double hq, ws;                                                                      \
            int bad = 0;                                                                        \
            IT nan_ = {0};                                                                      \
            (void)nan_;                                                                         \
            SUMS;                                                                               \
            if (bad || !(ws > 0.0) || it >= max_iter)                                           \
                break; /* NaN, no entry above tau (no finite entry), or the cap */              \
            const double h = ROOT(hq, 1.0 / qr);                                                \
            const double step = (h - 1.0) * (hq / h) / ws;                                      \
            const double scale = fabs(tau) > 1.0 ? fabs(tau) : 1.0;                             \
            if (!(step > rtol * scale))                                                         \
                break; /* settled (a step <= 0 from rounding included) */                       \
            tau += step;                                                                        \
            it++;                                                                               \
        }                                                                                       \
        tau_out[r] = (T)tau;                                                                    \
    }                                                                                           \
}

#define SEL(IT, DT, m, a, b) ((DT)(((IT)(a) & (m)) | ((IT)(b) & ~(m))))

#if NMT_VECTORS
/* a^b for a > 0 (normal), b > 0 by the polynomials above, in one two-lane vector */
static inline double vpow_2(double a, double b)
{
    const nmt_f64x2 av = {a, a}, bv = {b, b};
    nmt_f64x2 lg, out;
    VLOG2(nmt_f64x2, nmt_i64x2, av, lg);
    VEXP2(nmt_f64x2, nmt_i64x2, bv * lg, out);
    return out[0];
}

#define POWER_BLOCK_MAX_N 256 /* _native.POWER_PROBS_MAX_N */
/* Entry j of a block's lanes (col[j * L + l]): d = col - vt, m = d > 0 and w = d^e on m (0 off it),
   declared here */
#define COLUMN_POWER(DT, IT, L, e, d, m, w)                                                     \
    DT d, w;                                                                                    \
    IT m;                                                                                       \
    do {                                                                                        \
        DT xv_, lg_;                                                                            \
        memcpy(&xv_, col + j * L, sizeof xv_);                                                  \
        d = xv_ - vt;                                                                           \
        m = d > zero;                                                                           \
        VLOG2(DT, IT, SEL(IT, DT, m, d, one), lg_);                                             \
        VEXP2(DT, IT, (e) * lg_, w);                                                            \
        w = (DT)((IT)w & m);                                                                    \
    } while (0)

/* The Newton loop on a block's entries col[j * L + l] (one row a lane, vectors DT of doubles with
   integer lanes IT): from vt, a lane steps until it settles (a step at most rtol max(1, |tau|)),
   stops before a step on NaN, without an entry above tau or at max_iter steps, as a row alone
   does; ve = q - 1, vi = 1 / q per lane; zero, one, none and magnitude from the caller. */
#define BLOCK_NEWTON(DT, IT, L)                                                                 \
    do {                                                                                        \
        for (int64_t it = 0;; it++) {                                                           \
            DT aq = zero, aw = zero;                                                            \
            IT nan = none;                                                                      \
            for (int64_t j = 0; j < n; j++) {                                                   \
                COLUMN_POWER(DT, IT, L, ve, d, m, w);                                           \
                aw += w;                                                                        \
                aq += w * (DT)((IT)d & m);                                                      \
                nan |= (IT)(d != d);                                                            \
            }                                                                                   \
            /* a lane stops before a step on NaN, without an entry above tau, or at the cap */  \
            live &= ~nan & (IT)(aw > zero);                                                     \
            if (it >= max_iter)                                                                 \
                break;                                                                          \
            const DT hq = SEL(IT, DT, live, aq, one), ws = SEL(IT, DT, live, aw, one);          \
            DT lg, h;                                                                           \
            VLOG2(DT, IT, hq, lg);                                                              \
            VEXP2(DT, IT, vi * lg, h);                                                          \
            const DT step = (h - 1.0) * (hq / h) / ws;                                          \
            const DT at = (DT)((IT)vt & magnitude);                                             \
            live &= (IT)(step > rtol * SEL(IT, DT, (IT)(at > one), at, one));                   \
            vt += (DT)((IT)step & live);                                                        \
            int64_t any = 0;                                                                    \
            for (int l = 0; l < L; l++)                                                         \
                any |= live[l];                                                                 \
            if (!any)                                                                           \
                break;                                                                          \
        }                                                                                       \
    } while (0)

/* Rows of at most POWER_BLOCK_MAX_N entries, L at a time, one a lane (vectors of doubles DT with
   integer lanes IT): the block's entries copied entry-major (col[j * L + l], -inf past the last
   row), then the loop above in every lane at once; a lane stops as a row does, the others go on. */
#define DEFINE_POWER_BLOCK(NAME, T, ATTR, DT, IT, L)                                            \
ATTR static void NAME(const T *z, int64_t rows, int64_t n, const double *q, int64_t q_stride,   \
                      const T *lo, int64_t max_iter, double rtol, T *tau_out)                   \
{                                                                                               \
    double col[POWER_BLOCK_MAX_N * L];                                                          \
    const DT zero = {0}, one = zero + 1.0;                                                      \
    const IT none = {0}, magnitude = none + 0x7FFFFFFFFFFFFFFFLL;                               \
    for (int64_t r0 = 0; r0 < rows; r0 += L) {                                                  \
        DT vt, ve, vi;                                                                          \
        IT live;                                                                                \
        for (int l = 0; l < L; l++) {                                                           \
            const int real = r0 + l < rows;                                                     \
            const int64_t r = real ? r0 + l : r0;                                               \
            const double qr = q[r * q_stride];                                                  \
            vt[l] = (double)lo[r];                                                              \
            ve[l] = qr - 1.0;                                                                   \
            vi[l] = 1.0 / qr;                                                                   \
            live[l] = real ? -1 : 0;                                                            \
            for (int64_t j = 0; j < n; j++)                                                     \
                col[j * L + l] = real ? (double)z[r * n + j] : -INFINITY;                       \
        }                                                                                       \
        BLOCK_NEWTON(DT, IT, L);                                                                \
        for (int l = 0; l < L && r0 + l < rows; l++)                                            \
            tau_out[r0 + l] = (T)vt[l];                                                         \
    }                                                                                           \
}
#endif

/* The mapping itself for rows of at most POWER_BLOCK_MAX_N entries, L at a time, one a lane: per
   row its maximum m (a NaN or +inf entry: the row is all NaN; no finite entry: all zeros),
   z = (alpha - 1) (x - m) in doubles, the threshold by the loop above from -1, then
   r = [z - tau]_+ and p = r^q / sum r^q, written as floats (r where asked for: the backward's). */
#define DEFINE_POWER_PROBS(NAME, ATTR, DT, IT, L)                                               \
ATTR static void NAME(const float *x, int64_t rows, int64_t n, const double *am1, int64_t a_stride, \
                      int64_t max_iter, double rtol, float *p, float *root, float *stats)       \
{                                                                                               \
    double col[POWER_BLOCK_MAX_N * L], rcol[POWER_BLOCK_MAX_N * L]; /* scores, then p; r */    \
    const DT zero = {0}, one = zero + 1.0;                                                      \
    const IT none = {0}, magnitude = none + 0x7FFFFFFFFFFFFFFFLL;                               \
    for (int64_t r0 = 0; r0 < rows; r0 += L) {                                                  \
        DT vt, ve, vq, vi, vtop;                                                                \
        IT live, nanrow = none, emptyrow = none;                                                \
        for (int l = 0; l < L; l++) {                                                           \
            const int real = r0 + l < rows;                                                     \
            const int64_t r = real ? r0 + l : r0;                                               \
            const double a = am1[r * a_stride], qr = 1.0 / a;                                   \
            const float *xr = x + r * n;                                                        \
            float top = -INFINITY;                                                              \
            int bad = 0;                                                                        \
            for (int64_t j = 0; j < n; j++) {                                                   \
                bad |= (xr[j] != xr[j]) | (xr[j] == INFINITY);                                  \
                top = xr[j] > top ? xr[j] : top;                                                \
            }                                                                                   \
            const int empty = top == -INFINITY;                                                 \
            for (int64_t j = 0; j < n; j++) /* -inf past the last row and for rows without a     \
                                               finite entry or with a NaN / +inf one */          \
                col[j * L + l] = real && !bad && !empty ? ((double)xr[j] - top) * a : -INFINITY; \
            vt[l] = -1.0;                                                                       \
            ve[l] = qr - 1.0;                                                                   \
            vq[l] = qr;                                                                         \
            vi[l] = a;                                                                          \
            live[l] = real && !bad && !empty ? -1 : 0;                                          \
            nanrow[l] = real && bad ? -1 : 0;                                                   \
            emptyrow[l] = real && !bad && empty ? -1 : 0;                                       \
            vtop[l] = top;                                                                      \
        }                                                                                       \
        BLOCK_NEWTON(DT, IT, L);                                                                \
        DT total = zero;                                                                        \
        for (int64_t j = 0; j < n; j++) { /* the powers in place of the scores: r^q, then r */  \
            COLUMN_POWER(DT, IT, L, vq, d, m, w);                                               \
            total += w;                                                                         \
            if (root) {                                                                         \
                const DT rv = (DT)((IT)d & m);                                                  \
                memcpy(rcol + j * L, &rv, sizeof rv);                                           \
            }                                                                                   \
            memcpy(col + j * L, &w, sizeof w);                                                  \
        }                                                                                       \
        const DT inv = one / SEL(IT, DT, (IT)(total > zero), total, one);                       \
        for (int l = 0; l < L && r0 + l < rows; l++) { /* each row's entries in order */        \
            float *pr = p + (r0 + l) * n, *rr = root ? root + (r0 + l) * n : 0;                 \
            for (int64_t j = 0; j < n; j++)                                                     \
                pr[j] = nanrow[l] ? NAN : (float)(col[j * L + l] * inv[l]);                     \
            if (rr)                                                                             \
                for (int64_t j = 0; j < n; j++)                                                 \
                    rr[j] = nanrow[l] ? NAN : (float)rcol[j * L + l];                           \
            if (stats) { /* tau, the row maximum, sum r^q (the losses' conjugate) */             \
                float *st = stats + 3 * (r0 + l);                                               \
                st[0] = nanrow[l] ? -1.0f : emptyrow[l] ? INFINITY : (float)vt[l];              \
                st[1] = nanrow[l] ? NAN : emptyrow[l] ? 0.0f : (float)vtop[l];                  \
                st[2] = nanrow[l] ? NAN : (float)total[l];                                      \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
}

#define NO_ATTR
#if NMT_VECTORS
DEFINE_POWER(power_f32_v, float, NO_ATTR, nmt_i64x2, POWER_SUMS(float, nmt_f32x2, nmt_f64x2, nmt_i64x2, 2), vpow_2)
DEFINE_POWER_BLOCK(power_block_f32_v, float, NO_ATTR, nmt_f64x2, nmt_i64x2, 2)
DEFINE_POWER_PROBS(power_probs_v, NO_ATTR, nmt_f64x2, nmt_i64x2, 2)
#else
DEFINE_POWER(power_f32_v, float, NO_ATTR, int64_t, SCALAR_POWER_SUMS(float), pow)
#define POWER_BLOCK_MAX_N 0 /* no vectors: every row by itself */
#define power_block_f32_v power_f32_v
#endif

#if NMT_VECTORS && defined(NMT_WIDE_AVX2)
DEFINE_POWER(power_f32_avx2, float, AVX2, nmt_i64x4, POWER_SUMS(float, nmt_f32x4, nmt_f64x4, nmt_i64x4, 4), vpow_2)
DEFINE_POWER_BLOCK(power_block_f32_avx2, float, AVX2, nmt_f64x4, nmt_i64x4, 4)
DEFINE_POWER_PROBS(power_probs_avx2, AVX2, nmt_f64x4, nmt_i64x4, 4)
#define POWER_HAVE_AVX2() CPU_HAS_AVX2()
#if defined(NMT_WIDE_AVX512)
DEFINE_POWER(power_f32_avx512, float, AVX512, nmt_i64x8, POWER_SUMS(float, nmt_f32x8, nmt_f64x8, nmt_i64x8, 8), vpow_2)
DEFINE_POWER_BLOCK(power_block_f32_avx512, float, AVX512, nmt_f64x8, nmt_i64x8, 8)
DEFINE_POWER_PROBS(power_probs_avx512, AVX512, nmt_f64x8, nmt_i64x8, 8)
#define POWER_HAVE_AVX512() CPU_HAS_AVX512()
#endif
#else
#define power_f32_avx2 power_f32_v
#define power_block_f32_avx2 power_block_f32_v
#define power_probs_avx2 power_probs_v
#define POWER_HAVE_AVX2() 0
#endif
#ifndef POWER_HAVE_AVX512
#define power_f32_avx512 power_f32_v
#define power_block_f32_avx512 power_block_f32_v
#define power_probs_avx512 power_probs_v
#define POWER_HAVE_AVX512() 0
#endif

typedef void (*power_solver)(const float *, int64_t, int64_t, const double *, int64_t, const float *,
                             int64_t, double, float *);

/* the rows of the groups of eight [first, last) */
static void solve_groups(power_solver solve, const float *z, int64_t rows, int64_t n, const double *q,
                         int64_t q_stride, const float *lo, int64_t max_iter, double rtol, float *tau_out,
                         int64_t first, int64_t last)
{
    first *= 8;
    last = last * 8 < rows ? last * 8 : rows;
    if (last > first)
        solve(z + first * n, last - first, n, q + first * q_stride, q_stride, lo + first, max_iter, rtol,
              tau_out + first);
}

/* The entry point: short rows by blocks (or, with blocks = 0, row by row: the tests compare the
   two), rows split over `threads` threads in groups of eight (whole blocks at every width). */
void nmt_power_threshold_f32(const float *z, int64_t rows, int64_t n, const double *q, int64_t q_stride,
                             const float *lo, int64_t max_iter, double rtol, float *tau_out, int blocks,
                             int threads)
{
    const int wide = POWER_HAVE_AVX512() ? 2 : POWER_HAVE_AVX2() ? 1 : 0;
    const power_solver by_row = wide == 2 ? power_f32_avx512 : wide == 1 ? power_f32_avx2 : power_f32_v;
    const power_solver by_block = wide == 2 ? power_block_f32_avx512
                                            : wide == 1 ? power_block_f32_avx2 : power_block_f32_v;
    const power_solver solve = blocks && n <= POWER_BLOCK_MAX_N ? by_block : by_row;
    FOR_THREADS(threads, (rows + 7) / 8,
                solve_groups(solve, z, rows, n, q, q_stride, lo, max_iter, rtol, tau_out, FIRST, LAST));
}

#if NMT_VECTORS
typedef void (*probs_solver)(const float *, int64_t, int64_t, const double *, int64_t, int64_t, double, float *,
                             float *, float *);

static void probs_groups(probs_solver solve, const float *x, int64_t rows, int64_t n, const double *am1,
                         int64_t a_stride, int64_t max_iter, double rtol, float *p, float *root, float *stats,
                         int64_t first, int64_t last)
{
    first *= 8;
    last = last * 8 < rows ? last * 8 : rows;
    if (last > first)
        solve(x + first * n, last - first, n, am1 + first * a_stride, a_stride, max_iter, rtol, p + first * n,
              root ? root + first * n : 0, stats ? stats + 3 * first : 0);
}
#endif

/* alpha-entmax of the rows x (float32, any values; n <= POWER_BLOCK_MAX_N) with alpha - 1 = am1 in
   (0, 1) per row (a_stride 1) or for all (0): p, where root is given r = [z - tau]_+, and where
   stats is given three floats a row: tau, the row maximum and sum r^q (rows holding NaN or +inf:
   -1, NaN, NaN; rows without a finite entry: +inf, 0, 0) (see DEFINE_POWER_PROBS). Returns 0
   without writing anything where it does not serve (longer rows, a build without vectors): the
   caller computes them otherwise. */
int nmt_power_probs_f32(const float *x, int64_t rows, int64_t n, const double *am1, int64_t a_stride,
                        int64_t max_iter, double rtol, float *p, float *root, float *stats, int threads)
{
#if NMT_VECTORS
    if (n > POWER_BLOCK_MAX_N)
        return 0;
    const probs_solver solve = POWER_HAVE_AVX512() ? power_probs_avx512
                               : POWER_HAVE_AVX2() ? power_probs_avx2 : power_probs_v;
    FOR_THREADS(threads, (rows + 7) / 8,
                probs_groups(solve, x, rows, n, am1, a_stride, max_iter, rtol, p, root, stats, FIRST, LAST));
    return 1;
#else
    (void)x; (void)rows; (void)n; (void)am1; (void)a_stride; (void)max_iter; (void)rtol; (void)p; (void)root;
    (void)stats; (void)threads;
    return 0;
#endif
}
