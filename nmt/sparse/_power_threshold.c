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
 * at (float64 rows keep the torch loop). exp2 below 2^-1022 gives 0. The long rows' loop in the
 * AVX-512 functions takes its powers from 16-entry tables in registers and shorter polynomials
 * with fused multiply-adds (POW512: about 1e-14; a pass over 8,000 candidates 1.9x faster alone,
 * 8.5 -> 5.6 ms for 512 such rows; economised polynomials, one FMA fewer in each, and the sums with
 * mask registers, LONG_SUMS_W512: some 2.9 -> 2.1 time stamp ticks an entry), and writes its output
 * eight candidates at a time.
 * Broad long rows whose every candidate is in the support start the loop from the root of their
 * moments' binomial series (power_series_root), one pass of powers then settling them (the
 * moments taken while the candidates are converted in the AVX-512 functions: LONG_CONVERT_MOMENTS,
 * no pass of their own; rows the bound keeps whole converted straight from the scores, without
 * the compaction: LONG_WHOLE_W512, some 6.5 -> 4.6 thousand ticks a row of 8,000); broad rows
 * partly out of the support, from the normal model's start, take one float Halley step (LONG_FINE,
 * the AVX-512 and AVX2 functions) and then one double pass where they took two to three (so do rows after
 * their coarse steps); the coarse
 * float passes of long rows drop the entries below their tau as they go and, in the AVX-512
 * functions, take their powers from register tables (COARSE_ACCUMULATE_W512). Where a long row's
 * start is meant to settle at once (the series' start; the float step's landing), a pass of float
 * powers with an error bound (LONG_SETTLE, the AVX-512 and AVX2 functions) decides that the double pass would
 * take no step and serves the output in its place (the double loop where the bound is too wide:
 * the same threshold bit for bit either way, but for a double step within its own rounding, some
 * 1e-14 relative, of the tolerance's edge). The AVX2 functions take the float step, the settling
 * pass, the candidates' compaction and the output by vectors of their own (W256: eight float lanes,
 * a permutation from a table where AVX-512 compresses; alpha 1.3 at deviation 0.1, 8,000 scores:
 * some 250 -> 96 thousand ticks a row; the AVX-512 functions: 52), the rest by the vector extensions (GEN). A diagnostic build
 * (NMT_POWER_COUNTS, tools/power_counts.py) counts the long rows' passes and times their phases.
 * Short rows (at most POWER_BLOCK_MAX_N entries) are solved a block of rows at a time, one row a
 * lane: a row's pass is one polynomial chain after another, each waiting on the last, where the
 * lanes of a block are independent (3-4x faster at 20 entries); longer rows are vectorised along the
 * row. nmt_power_probs_f32 also does what the torch forward does around the threshold: the row
 * maxima, the shift z = (alpha - 1) (x - max), and the output p = r^q / sum r^q with
 * r = [z - tau]_+ (r, or the backward's s = r^(q - 1), where asked for), all in one call, the
 * output's powers those of the loop's last pass. Its blocks run the loop on fewer entries: each
 * lane keeps the entries with z above -1 at the front of its column (the rest are below every
 * threshold), takes coarse steps with float sums first (BLOCK_COARSE: a float pass costs about a
 * third of a double one), keeps again the entries above the threshold reached, and the loop runs
 * on those alone, the output written at their places.
 * No branch per entry. Nothing is allocated (a short-row block sits on the stack). Built with
 * OpenMP, a call splits its rows over the threads it is given.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cpu_dispatch.h"
#include "_float_math.h" /* VLOG2F, VEXP2F: the coarse steps' powers */

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

/* the backward's lg = log2 d and w = d^ve of positive d (POWER_BACKWARD_CHUNK; ve, the caller's) of
   each width: POW512's halves in the AVX-512 functions, VLOG2 / VEXP2 elsewhere */
#define BACKWARD_POWER_GEN(DT, IT, d, lg, w) POWER_LG_GEN(DT, IT, d, ve, lg, w)
#define BACKWARD_POWER_W256 BACKWARD_POWER_GEN
#define BACKWARD_POWER_W512(DT, IT, d, lg, w) POWER_LG_W512(DT, IT, d, ve, lg, w)
/* w = d^e and lg = log2 d of the positive, normal lanes of d of each width: POW512's halves in the
   AVX-512 functions, VLOG2 / VEXP2 elsewhere */
#define POWER_LG_GEN(DT, IT, d, e, lg, w)                                                       \
    do {                                                                                        \
        VLOG2(DT, IT, d, lg);                                                                   \
        VEXP2(DT, IT, (e) * (lg), w);                                                           \
    } while (0)
#define POWER_LG_W512(DT, IT, d, e, lg, w)                                                      \
    do {                                                                                        \
        POW512_TABLES;                                                                          \
        __m512d lg_b_, w_b_;                                                                    \
        LOG2_512((__m512d)(d), lg_b_);                                                          \
        EXP2_512(_mm512_mul_pd((__m512d)(e), lg_b_), (__mmask8)0xFF, w_b_);                     \
        (lg) = (DT)lg_b_;                                                                       \
        (w) = (DT)w_b_;                                                                         \
    } while (0)
/* log2 of the positive, normal lanes of d of each width (the blocks' log2 sum r^q for dalpha):
   LOG2_512 in the AVX-512 functions, VLOG2 elsewhere */
#define LOG2_FOR_GEN(DT, IT, d, lg) VLOG2(DT, IT, d, lg)
#define LOG2_FOR_W256 LOG2_FOR_GEN
#define LOG2_FOR_W512(DT, IT, d, lg)                                                            \
    do {                                                                                        \
        LOG2_512_TABLES;                                                                        \
        __m512d lg_f_;                                                                          \
        LOG2_512((__m512d)(d), lg_f_);                                                          \
        (lg) = (DT)lg_f_;                                                                       \
    } while (0)
/* the short rows' double powers (DEFINE_POWER_PROBS's loop) of each width: POW512's tables in the
   AVX-512 functions (no division: a pass over a block some 2x faster), VLOG2 / VEXP2 elsewhere;
   where dalpha is asked for, each pass keeps its log2 d in the column's place in lcol (the last
   pass's, at the lanes' final tau, are dalpha's: no logarithm of its own, 6% of the call) */
#define POW_FOR_WITH(POWER_LG, DT, IT, d, e, out)                                               \
    do {                                                                                        \
        DT lg_k_;                                                                               \
        POWER_LG(DT, IT, d, e, lg_k_, out);                                                     \
        if (dalpha)                                                                             \
            memcpy(lcol + j * (int64_t)(sizeof lg_k_ / sizeof(double)), &lg_k_, sizeof lg_k_);  \
    } while (0)
#define POW_FOR_GEN(DT, IT, d, e, out) POW_FOR_WITH(POWER_LG_GEN, DT, IT, d, e, out)
#define POW_FOR_W256 POW_FOR_GEN
#define POW_FOR_W512(DT, IT, d, e, out) POW_FOR_WITH(POWER_LG_W512, DT, IT, d, e, out)
/* d^e lane by lane (positive, normal d) by VLOG2 and VEXP2 */
#define POW_GEN(DT, IT, d, e, out)                                                              \
    do {                                                                                        \
        DT lg_p_;                                                                               \
        POWER_LG_GEN(DT, IT, d, e, lg_p_, out);                                                 \
    } while (0)
#ifdef NMT_WIDE_AVX512
/* d^e for positive lanes of d (normal or subnormal) and any e, eight doubles, AVX-512 (inside
   functions built for it): 2^(e log2 d) by tables of 16 entries held in registers (vpermt2pd) and
   short polynomials, where VLOG2 / VEXP2 take a division and 25 more operations. log2 d: d = m 2^k
   (getexp / getmant, m in [1, 2)), m's top four mantissa bits pick c_i near m (inv_i = 1/c_i
   rounded, lc_i = -log2(inv_i)), r = m inv_i - 1 (|r| <= 1/32, one fused rounding), log2(1 + r) =
   r P(r) by a polynomial of degree 8 (P of degree 7); 2^y: y rounded to sixteenths (y = n/16 + f,
   |f| <= 1/32), 2^(n mod 16 / 16) from a table, 2^f by a polynomial of degree 6, scaled by
   2^floor(n/16) (scalef, which floors its exponent itself); 0 where y < -1022 (as VEXP2). The two polynomials are the Taylor series
   (ln(1 + r) to r^16, e^(f ln 2) to f^17) economised on |r|, |f| <= 1/32 (Chebyshev, in exact
   rationals: tests/sparse/test_power_polynomials.py derives them and their bounds): the terms dropped
   (T_9 .. T_16 of ln(1 + r) and its constant, T_7 .. T_17 of 2^f) sum to at most 1.9e-17 in log2 d
   and 7.0e-18 relative in 2^f; the Taylor tails left out, below 2e-27; the coefficients' rounding
   to doubles, some 5e-18. Against the series to r^9 and f^7 of before (truncation 1.3e-16 and 9e-21)
   one fused multiply-add fewer in each. Relative error of d^e about 1e-14 (1e-13 where
   |e log2 d| reaches 1000: the rounding of y = e log2 d, ln 2 |y| eps, sets it): below VLOG2 /
   VEXP2's. */
static const double POW512_INV[16] __attribute__((unused)) = {
    0.9696969696969697, 0.9142857142857143, 0.8648648648648649, 0.8205128205128205, 0.7804878048780488,
    0.7441860465116279, 0.7111111111111111, 0.6808510638297872, 0.6530612244897959, 0.6274509803921569,
    0.6037735849056604, 0.5818181818181818, 0.5614035087719298, 0.5423728813559322, 0.5245901639344263,
    0.5079365079365079};
static const double POW512_LC[16] __attribute__((unused)) = {
    0.044394119358453395, 0.1292830169449665, 0.2094533656289497, 0.28540221886224837, 0.3575520046180836,
    0.42626475470209796, 0.49185309632967467, 0.5545888516776374, 0.6147098441152083, 0.6724253419714956,
    0.7279204545631992, 0.7813597135246597, 0.8328900141647417, 0.8826430493618412, 0.9307373375628862,
    0.9772799234999165};
static const double POW512_T2[16] __attribute__((unused)) = {
    1.0, 1.0442737824274138, 1.0905077326652577, 1.1387886347566916, 1.189207115002721, 1.241857812073484,
    1.2968395546510096, 1.3542555469368927, 1.4142135623730951, 1.4768261459394993, 1.5422108254079407,
    1.6104903319492543, 1.681792830507429, 1.7562521603732995, 1.8340080864093424, 1.9152065613971474};
#define LOG2_512_TABLES                                                                         \
    const __m512d inv_lo_ = _mm512_loadu_pd(POW512_INV), inv_hi_ = _mm512_loadu_pd(POW512_INV + 8); \
    const __m512d lc_lo_ = _mm512_loadu_pd(POW512_LC), lc_hi_ = _mm512_loadu_pd(POW512_LC + 8)
#define POW512_TABLES                                                                           \
    LOG2_512_TABLES;                                                                            \
    const __m512d t2_lo_ = _mm512_loadu_pd(POW512_T2), t2_hi_ = _mm512_loadu_pd(POW512_T2 + 8)
#define POW512(d, e, out) POW512_MASKED(d, e, (__mmask8)0xFF, out)
/* POW512's two halves: log2 d of the positive lanes of d (LOG2_512) and 2^y on the lanes of keep,
   0 elsewhere and where y < -1022 (EXP2_512); the power is EXP2_512(e LOG2_512(d)) */
#define LOG2_512(d, lg)                                                                         \
    do {                                                                                        \
        const __m512d k_ = _mm512_getexp_pd(d);                                                 \
        const __m512d m_ = _mm512_getmant_pd(d, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);          \
        const __m512i i_ = _mm512_srli_epi64(_mm512_castpd_si512(m_), 48);                      \
        const __m512d r_ = _mm512_fmsub_pd(m_, _mm512_permutex2var_pd(inv_lo_, i_, inv_hi_),    \
                                           _mm512_set1_pd(1.0));                                \
        __m512d p_ = _mm512_set1_pd(-0.18068957407880373);                                      \
        p_ = _mm512_fmadd_pd(p_, r_, _mm512_set1_pd(0.20645194244349427));                      \
        p_ = _mm512_fmadd_pd(p_, r_, _mm512_set1_pd(-0.24044887197230908));                     \
        p_ = _mm512_fmadd_pd(p_, r_, _mm512_set1_pd(0.2885387497834289));                       \
        p_ = _mm512_fmadd_pd(p_, r_, _mm512_set1_pd(-0.36067376032742243));                     \
        p_ = _mm512_fmadd_pd(p_, r_, _mm512_set1_pd(0.48089834703309603));                      \
        p_ = _mm512_fmadd_pd(p_, r_, _mm512_set1_pd(-0.7213475204444688));                      \
        p_ = _mm512_fmadd_pd(p_, r_, _mm512_set1_pd(1.4426950408889583));                       \
        (lg) = _mm512_fmadd_pd(p_, r_, _mm512_add_pd(k_, _mm512_permutex2var_pd(lc_lo_, i_, lc_hi_))); \
    } while (0)
#define EXP2_512(y, keep, out)                                                                  \
    do {                                                                                        \
        const __mmask8 under_ = _mm512_cmp_pd_mask((y), _mm512_set1_pd(-1022.0), _CMP_LT_OQ);  \
        /* y rounded to sixteenths by adding 1.5 * 2^48 (a unit in its last place: 1/16; |y| < 2^47, \
           the others are masked or overflow as before): 16 n mod 16 in its last four bits, the \
           table's index (vpermt2pd reads an index's low four bits) */                         \
        const __m512d sh_ = _mm512_add_pd((y), _mm512_set1_pd(422212465065984.0));              \
        const __m512d n_ = _mm512_sub_pd(sh_, _mm512_set1_pd(422212465065984.0));               \
        const __m512d f_ = _mm512_sub_pd((y), n_);                                             \
        const __m512i j_ = _mm512_castpd_si512(sh_);                                            \
        __m512d x_ = _mm512_set1_pd(0.00015403788510250262);                                    \
        x_ = _mm512_fmadd_pd(x_, f_, _mm512_set1_pd(0.0013333818815449907));                    \
        x_ = _mm512_fmadd_pd(x_, f_, _mm512_set1_pd(0.009618129106053053));                     \
        x_ = _mm512_fmadd_pd(x_, f_, _mm512_set1_pd(0.05550410865209356));                      \
        x_ = _mm512_fmadd_pd(x_, f_, _mm512_set1_pd(0.24022650695910103));                      \
        x_ = _mm512_fmadd_pd(x_, f_, _mm512_set1_pd(0.6931471805599468));                       \
        x_ = _mm512_fmadd_pd(x_, f_, _mm512_set1_pd(1.0));                                      \
        x_ = _mm512_mul_pd(x_, _mm512_permutex2var_pd(t2_lo_, j_, t2_hi_));                     \
        (out) = _mm512_maskz_scalef_pd((__mmask8)((keep) & ~under_), x_, n_); /* x 2^floor(n) */ \
    } while (0)
/* POW512 on the lanes of the mask keep (0 in the others) */
#define POW512_MASKED(d, e, keep, out)                                                          \
    do {                                                                                        \
        __m512d lg_m_;                                                                          \
        LOG2_512(d, lg_m_);                                                                     \
        EXP2_512(_mm512_mul_pd((e), lg_m_), keep, out);                                         \
    } while (0)
/* the low and the high eight of sixteen floats v as doubles, and their lane sums (AVX-512 functions) */
#define F16_LO_PD(v) _mm512_cvtps_pd(_mm512_castps512_ps256(v))
#define F16_HI_PD(v) _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)))
#define F16_SUM_PD(v) _mm512_add_pd(F16_LO_PD(v), F16_HI_PD(v))
/* POW_GEN's form for eight doubles in the AVX-512 functions (DT: nmt_f64x8) */
#define POW_W512(DT, IT, d, e, out)                                                             \
    do {                                                                                        \
        POW512_TABLES;                                                                          \
        __m512d o_p_;                                                                           \
        POW512((__m512d)(d), (__m512d)(e), o_p_);                                               \
        (out) = (DT)o_p_;                                                                       \
    } while (0)
#endif

/* hq = sum w d and ws = sum w, w = d^e on d = [x - tau]_+ > 0, over the row x[0 .. n): LANES entries
   at a time (float rows VT converted to doubles DT), the last ones padded with -inf; KEEP(i, w, LANES)
   runs on each vector's w (0 off the support) from entry i (KEEP_NOTHING: nothing kept); the powers
   by POW (POW_GEN, or POW_W512 in the long rows' loop of the AVX-512 functions) */
#define KEEP_NOTHING(i, w, L) ((void)0)
#define POWER_SUMS(T, VT, DT, IT, LANES, KEEP, POW)                                             \
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
            DT w;                                                                               \
            POW(DT, IT, dd, ve, w);                                                             \
            w = (DT)((IT)w & m);                                                                \
            aw += w;                                                                            \
            aq += w * (DT)((IT)d & m);                                                          \
            nan_ |= (IT)(d != d);                                                               \
            KEEP(i_, w, LANES);                                                                 \
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

/* a row's outputs p (and r, s, da where given) of n entries filled with v (0: by memset) */
static inline void power_fill_outputs(float *p, float *r, float *s, float *da, int64_t n, float v)
{
    if (v == 0.0f) {
        memset(p, 0, (size_t)n * sizeof(float));
        if (r)
            memset(r, 0, (size_t)n * sizeof(float));
        if (s)
            memset(s, 0, (size_t)n * sizeof(float));
        if (da)
            memset(da, 0, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++)
        p[i] = v;
    for (int64_t i = 0; r && i < n; i++)
        r[i] = v;
    for (int64_t i = 0; s && i < n; i++)
        s[i] = v;
    for (int64_t i = 0; da && i < n; i++)
        da[i] = v;
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
#define POWER_STATS 5          /* _native.POWER_STATS: the floats a row of nmt_power_probs_f32's stats */
/* Entry j of a block's lanes (col[j * L + l]): d = col - vt, m = d > 0 and w = d^e on m (0 off it),
   declared here */
#define COLUMN_POWER(DT, IT, L, e, d, m, w, POW)                                                \
    DT d, w;                                                                                    \
    IT m;                                                                                       \
    do {                                                                                        \
        DT xv_;                                                                                 \
        memcpy(&xv_, col + j * L, sizeof xv_);                                                  \
        d = xv_ - vt;                                                                           \
        m = d > zero;                                                                           \
        POW(DT, IT, SEL(IT, DT, m, d, one), (e), w);                                            \
        w = (DT)((IT)w & m);                                                                    \
    } while (0)

/* The Newton loop on a block's entries col[j * L + l], j < cnt (one row a lane, vectors DT of
   doubles with integer lanes IT): from vt, a lane steps until it settles (a step at most
   rtol max(1, |tau|)), stops before a step on NaN, without an entry above tau or at max_iter
   steps, as a row alone does; ve = q - 1, vi = 1 / q per lane; zero, one, none and magnitude from the caller. KEEP(j, w)
   runs on every entry's w of every pass (the last pass's are at every lane's final tau: a lane
   stops before a step, and the loop ends after a pass in which none stepped). */
#define KEEP_W(j, w, L) memcpy(wcol + (j) * (L), &(w), sizeof(w))
#define BLOCK_NEWTON(DT, IT, L, cnt, KEEP, POW, above)                                          \
    do {                                                                                        \
        for (int64_t it = 0;; it++) {                                                           \
            DT aq = zero, aw = zero;                                                            \
            IT nan = none;                                                                      \
            for (int64_t j = 0; j < (cnt); j++) {                                               \
                COLUMN_POWER(DT, IT, L, ve, d, m, w, POW);                                      \
                aw += w;                                                                        \
                aq += w * (DT)((IT)d & m);                                                      \
                nan |= (IT)(d != d);                                                            \
                KEEP(j, w, L);                                                                  \
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
            const DT at = (DT)((IT)vt & magnitude), tol_ = rtol * SEL(IT, DT, (IT)(at > one), at, one); \
            live &= (IT)(step > tol_) | ((above) & (IT)(step < -tol_));                         \
            vt += (DT)((IT)step & live);                                                        \
            (above) = none; /* (from above: the first step lands below the root) */             \
            int64_t any = 0;                                                                    \
            for (int l = 0; l < L; l++)                                                         \
                any |= live[l];                                                                 \
            if (!any)                                                                           \
                break;                                                                          \
        }                                                                                       \
    } while (0)

/* Coarse steps before the loop above (DEFINE_POWER_PROBS, with a cap of POWER_COARSE_MIN_ITER steps
   or more: the loop run to its precision). The same Newton steps on the q-norm, from the lanes' vt,
   with the sums in floats (VLOG2F / VEXP2F of _float_math.h) over colf, the block's entries as
   floats in col's order (a vector of L2 = 2 L lanes: two entries of the L rows; -inf past an odd
   count): a float pass costs
   about a third of a double one (twice the lanes, shorter polynomials). Each step is shortened by
   POWER_COARSE_MARGIN (tau is at most 1 in magnitude there: z <= 0 and tau >= -1), far above its
   error: a float pass is an exact Newton step for a row moved by at most about 1.2e-7 an entry (the
   floats' rounding of z and tau; an entry that rounding moves across tau included), which lands at
   most that far above the root, and the relative error of the powers and of the float summation
   over at most 128 vectors (some 2e-5) moves a step by at most three times that; so the lanes stay
   below their roots (6,000 adversarial blocks: the closest 9.917e-5 below), where the double loop
   takes over (its iterates only from there, its stop and its last pass as
   before). A lane takes coarse steps while they are long: a step shorter than POWER_COARSE_STOP
   is its last (the next would be about its square), a step not longer than the margin is not taken;
   lanes with q - 1 above POWER_COARSE_MAX_E (alpha below 1.111: larger powers' errors) and lanes
   with NaN or no entry above tau take none. From -1, a random row of 50 at alpha 1.3 takes three
   coarse steps and two double passes where the loop alone takes four double passes. */
#define POWER_COARSE_MIN_ITER 20
#define POWER_COARSE_MAX_E 8.0
#define POWER_COARSE_MARGIN 1e-4
#define POWER_COARSE_STOP 1e-3
/* a block's coarse steps stop at a step shorter than this (W512, W256: BLOCK_FINE's float step
   follows) */
#define BLOCK_COARSE_STOP_GEN POWER_COARSE_STOP
#define BLOCK_COARSE_STOP_W256 1e-2
#define BLOCK_COARSE_STOP_W512 1e-2
#define POWER_COARSE_MAX_STEPS 8
/* one vector xv of entries (floats) into coarse sums at the thresholds vtf: d = xv - vtf, w = d^e
   (e: vef) on d > 0 by the float polynomials, aqf += w d, awf += w; NaN lanes marked in nanf */
#define COARSE_ACCUMULATE(FT, FI, xv, vtf, vef, aqf, awf, nanf)                                 \
    do {                                                                                        \
        const FT zero_ = {0}, one_ = zero_ + 1.0f, d_ = (xv) - (vtf);                           \
        const FI pos_ = d_ > zero_;                                                             \
        FT lg_, w_;                                                                             \
        VLOG2F(FT, FI, (FT)(((FI)d_ & pos_) | ((FI)one_ & ~pos_)), lg_);                        \
        VEXP2F(FT, FI, (vef) * lg_, w_);                                                        \
        w_ = (FT)((FI)w_ & pos_);                                                               \
        (awf) += w_;                                                                            \
        (aqf) += w_ * (FT)((FI)d_ & pos_);                                                      \
        (nanf) |= (FI)(d_ != d_);                                                               \
    } while (0)
#define BLOCK_COARSE(DT, IT, FT, FI, L, L2, cnt, V)                                             \
    do {                                                                                        \
        for (int64_t i_ = 0; i_ < (cnt) * L; i_++)                                              \
            colf[i_] = (float)col[i_];                                                          \
        for (int64_t i_ = (cnt) * L; i_ < ((cnt) + ((cnt) & 1)) * L; i_++)                      \
            colf[i_] = -INFINITY;                                                               \
        IT coarse = live & (IT)(ve <= POWER_COARSE_MAX_E);                                      \
        for (int c_ = 0; c_ < POWER_COARSE_MAX_STEPS; c_++) {                                   \
            int64_t any_ = 0;                                                                   \
            for (int l = 0; l < L; l++)                                                         \
                any_ |= coarse[l];                                                              \
            if (!any_)                                                                          \
                break;                                                                          \
            FT zf = {0}, vtf = zf, vef = zf, aqf = zf, awf = zf;                                \
            FI nanf = {0};                                                                      \
            for (int l = 0; l < L; l++) {                                                       \
                vtf[l] = vtf[l + L] = (float)vt[l];                                             \
                vef[l] = vef[l + L] = (float)ve[l];                                             \
            }                                                                                   \
            for (int64_t j = 0; j < (cnt) + ((cnt) & 1); j += 2) {                              \
                FT xv_;                                                                         \
                memcpy(&xv_, colf + j * L, sizeof xv_);                                         \
                COARSE_ACCUMULATE_##V(FT, FI, xv_, vtf, vef, aqf, awf, nanf);                   \
            }                                                                                   \
            DT hq = zero, ws = zero;                                                            \
            IT bad_ = none;                                                                     \
            for (int l = 0; l < L; l++) {                                                       \
                hq[l] = (double)aqf[l] + (double)aqf[l + L];                                    \
                ws[l] = (double)awf[l] + (double)awf[l + L];                                    \
                bad_[l] = (nanf[l] | nanf[l + L]) ? -1 : 0;                                     \
            }                                                                                   \
            coarse &= ~bad_ & (IT)(ws > zero) & (IT)(hq > zero);                                \
            hq = SEL(IT, DT, coarse, hq, one);                                                  \
            ws = SEL(IT, DT, coarse, ws, one);                                                  \
            DT lg, h;                                                                           \
            VLOG2(DT, IT, hq, lg);                                                              \
            VEXP2(DT, IT, vi * lg, h);                                                          \
            const DT step = (h - 1.0) * (hq / h) / ws;                                          \
            coarse &= (IT)(step > POWER_COARSE_MARGIN);                                         \
            vt += (DT)((IT)(step - POWER_COARSE_MARGIN) & coarse);                              \
            coarse &= (IT)(step >= BLOCK_COARSE_STOP_##V);                                      \
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
        IT above_ = none; /* (every lane from a lower bound) */                                 \
        BLOCK_NEWTON(DT, IT, L, n, KEEP_NOTHING, POW_GEN, above_);                              \
        for (int l = 0; l < L && r0 + l < rows; l++)                                            \
            tau_out[r0 + l] = (T)vt[l];                                                         \
    }                                                                                           \
}
#endif

/* After a block's coarse steps (its lanes below their roots, the entries at or below dropped; with
   this step to follow they stop at a step under BLOCK_COARSE_STOP_W512 = 1e-2, not 1e-3), one float
   step in every lane that took them, as LONG_FINE takes it on a long row (Halley's, Newton's where
   q < 2; power_fine_step's operations in all lanes at once: kept where it lands above the coarse
   bound and below 0), so that the double loop's first pass settles where it took a step and a second
   (alpha 1.3, rows of 50: 2.0 -> 1.0 double passes a block; one alpha a row in 1.1-1.6: 2.2 -> 1.4;
   with the coarse pass saved, (4096, 50) 6-7% faster). From below on the convex h, Halley's step is
   shorter than Newton's and lands below the root but for the float sums' rounding; so the landing
   is no bound (`above`): the loop's first step may be negative, landing below the root
   (BLOCK_NEWTON; not met on the rows tried, where the rounding stayed within the tolerance). W512
   (the AVX-512 functions): two entries of the eight lanes a vector of sixteen floats, d = col - tau
   formed in double and rounded, its powers by COARSE_POW512; W256 (the AVX2 functions,
   _power_avx2.h): two entries of the four lanes a vector of eight, SETTLE_POW256's powers; GEN:
   none (the double loop from the coarse bound, as before). */
#define BLOCK_FINE_GEN(DT, IT, L, cnt) ((void)0)
/* (BLOCK_FINE_W512, BLOCK_FINE_W256) the lanes that took coarse steps, took_; none (or no entry):
   the step is left out */
#define BLOCK_FINE_LANES(IT, L, cnt)                                                            \
    const IT took_ = live & (IT)(ve <= POWER_COARSE_MAX_E) & (IT)(vt > -1.0);                  \
    int64_t any_ = 0;                                                                           \
    for (int l = 0; l < L; l++)                                                                 \
        any_ |= took_[l];                                                                       \
    if (!any_ || (cnt) == 0)                                                                    \
        break
/* (BLOCK_FINE_W512, BLOCK_FINE_W256) power_fine_step in every lane of took_ at once from the lanes'
   float sums A, B, C (as doubles; its operations, one VLOG2 / VEXP2 for all): vt moved where the
   step lands above it and below 0, those lanes marked `above` */
#define BLOCK_FINE_TAKE(DT, IT, A, B, C)                                                        \
    do {                                                                                        \
        const DT hq_ = (A), ws_ = (B), cs_ = (C);                                               \
        IT ok_ = took_ & (IT)(ws_ > zero) & (IT)(hq_ > zero);                                  \
        const DT hs_ = SEL(IT, DT, ok_, hq_, one), wss_ = SEL(IT, DT, ok_, ws_, one), qv_ = one / vi; \
        DT lg_, h_;                                                                             \
        VLOG2(DT, IT, hs_, lg_);                                                                \
        VEXP2(DT, IT, vi * lg_, h_);                                                            \
        const DT newton_ = (h_ - 1.0) * (hs_ / h_) / wss_;                                      \
        const DT den_ = SEL(IT, DT, (IT)(qv_ < 2.0), one, /* (q < 2: Newton's step) */          \
                            1.0 - newton_ * (qv_ - 1.0) * (hs_ * cs_ - wss_ * wss_) / (2.0 * hs_ * wss_)); \
        const DT step_ = SEL(IT, DT, (IT)(den_ > 0.5), newton_ / den_, newton_); /* (Halley's, where sane) */ \
        const DT land_ = vt + step_;                                                            \
        ok_ &= (IT)(land_ > vt) & (IT)(land_ < zero);                                           \
        vt = SEL(IT, DT, ok_, land_, vt);                                                       \
        above = ok_;                                                                            \
    } while (0)
#ifdef NMT_WIDE_AVX512
#define BLOCK_FINE_W512(DT, IT, L, cnt)                                                         \
    do {                                                                                        \
        BLOCK_FINE_LANES(IT, L, cnt);                                                           \
        COARSE512_TABLES;                                                                       \
        const __m512d t8_ = (__m512d)vt;                                                        \
        __m512 vef_ = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps((__m512d)ve)),  \
                                         _mm512_cvtpd_ps((__m512d)ve), 1);                      \
        __m512 aq_ = _mm512_setzero_ps(), aw_ = aq_, ac_ = aq_;                                 \
        for (int64_t j_ = 0; j_ < (cnt); j_ += 2) { /* (cnt odd: the -inf column after it) */   \
            const __m512d d0_ = _mm512_sub_pd(_mm512_loadu_pd(col + j_ * L), t8_);              \
            const __m512d d1_ = j_ + 1 < (cnt) ? _mm512_sub_pd(_mm512_loadu_pd(col + (j_ + 1) * L), t8_) \
                                               : _mm512_set1_pd(-1.0);                          \
            FINE_ACCUMULATE512(d0_, d1_);                                                       \
        }                                                                                       \
        BLOCK_FINE_TAKE(DT, IT, (DT)F16_SUM_PD(aq_), (DT)F16_SUM_PD(aw_), (DT)F16_SUM_PD(ac_)); \
    } while (0)
#endif

/* A block's entries into the lanes' columns (DEFINE_POWER_PROBS): row by row (BLOCK_LANE_ENTRIES:
   the entries with z = (x - top) a above -1 at the front of the lane's column, their places
   beside), or in the AVX-512 functions after every lane's maximum (BLOCK_ENTRIES_W512; the AVX2
   ones, BLOCK_ENTRIES_W256, likewise by fours): eight entries of the eight rows at a time, z formed row by row as the lanes do (the same doubles), the
   8 x 8 block transposed in registers and stored column by column, the entries at or below -1 (and
   every entry of a lane not live) as -inf holes, the places the identity; then where no lane keeps
   more than half its row the lanes compacted as BLOCK_LANE_ENTRIES does (the coarse passes run over
   the longest lane), else every live lane keeps its row with its holes (they add nothing to a sum;
   one by one, the conversion cost a fifth of a block's time). */
#define BLOCK_LANE_ENTRIES_GEN(L)                                                               \
    do {                                                                                        \
        if (real && !bad && !empty)                                                             \
            for (int64_t j = 0; j < n; j++) {                                                   \
                const double v = ((double)xr[j] - top) * a;                                     \
                col[k * L + l] = v;                                                             \
                place[k * L + l] = (int32_t)j;                                                  \
                k += v > -1.0;                                                                  \
            }                                                                                   \
    } while (0)
#define BLOCK_ENTRIES_GEN(L) ((void)0)
/* lane l's entries col[i * L + l], i < count, above t moved to the front of its column with their
   places (in order); k (the caller's, from 0) counts them (BLOCK_ENTRIES_KEEP; DEFINE_POWER_PROBS
   after the coarse steps) */
#define BLOCK_LANE_COMPACT(L, l, count, t, k)                                                   \
    do {                                                                                        \
        const double t_ = (t);                                                                  \
        for (int64_t i_ = 0; i_ < (count); i_++) {                                              \
            const double v_ = col[i_ * L + (l)];                                                \
            col[(k) * L + (l)] = v_;                                                            \
            place[(k) * L + (l)] = place[i_ * L + (l)];                                         \
            (k) += v_ > t_;                                                                     \
        }                                                                                       \
    } while (0)
/* (BLOCK_ENTRIES_W512, BLOCK_ENTRIES_W256) from the lanes' counts cn_ of entries above -1: where no
   lane keeps more than half its row, each lane's entries compacted to the front of its column (the
   holes are -inf), else every live lane keeps its row; kc, vk and kmax set */
#define BLOCK_ENTRIES_KEEP(LANES, L)                                                            \
    do {                                                                                        \
        int64_t most_ = 0;                                                                      \
        for (int l = 0; l < LANES; l++)                                                         \
            most_ = cn_[l] > most_ ? cn_[l] : most_;                                            \
        kmax = 0;                                                                               \
        for (int l = 0; l < LANES; l++) {                                                       \
            int64_t k = 0;                                                                      \
            if (2 * most_ <= n) /* sparse lanes: compacted (their holes are -inf) */            \
                BLOCK_LANE_COMPACT(L, l, n, -1.0, k);                                           \
            else                                                                                \
                k = live[l] ? n : 0;                                                            \
            kc[l] = k;                                                                          \
            vk[l] = cn_[l] > 0 ? (double)cn_[l] : 1.0;                                          \
            kmax = k > kmax ? k : kmax;                                                         \
        }                                                                                       \
    } while (0)
#ifdef NMT_WIDE_AVX512
#define BLOCK_LANE_ENTRIES_W512(L) ((void)real) /* (BLOCK_ENTRIES_W512 after the lanes) */
#define BLOCK_ENTRIES_W512(L)                                                                   \
    do {                                                                                        \
        const float *xl_[8];                                                                    \
        int64_t cn_[8];                                                                         \
        __mmask8 lm_ = 0; /* the live lanes */                                                  \
        for (int l = 0; l < 8; l++) {                                                           \
            xl_[l] = x + rowof[l] * n;                                                          \
            lm_ |= (__mmask8)((live[l] != 0) << l);                                             \
        }                                                                                       \
        const __m512d ninf_ = _mm512_set1_pd(-INFINITY), m1_ = _mm512_set1_pd(-1.0);           \
        __m512i cnt_ = _mm512_setzero_si512();                                                  \
        int64_t j_ = 0;                                                                         \
        for (; j_ + 8 <= n; j_ += 8) {                                                          \
            __m512d r_[8], t_[8], u_[8];                                                        \
            for (int l = 0; l < 8; l++) /* z of row l, as the lane forms it */                  \
                r_[l] = _mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(xl_[l] + j_)), \
                                                    _mm512_set1_pd(vtop[l])), _mm512_set1_pd(vi[l])); \
            for (int l = 0; l < 8; l += 2) {                                                    \
                t_[l] = _mm512_unpacklo_pd(r_[l], r_[l + 1]);                                   \
                t_[l + 1] = _mm512_unpackhi_pd(r_[l], r_[l + 1]);                               \
            }                                                                                   \
            for (int h = 0; h < 8; h += 4)                                                      \
                for (int c = 0; c < 2; c++) {                                                   \
                    u_[h + c] = _mm512_shuffle_f64x2(t_[h + c], t_[h + c + 2], 0x88);           \
                    u_[h + c + 2] = _mm512_shuffle_f64x2(t_[h + c], t_[h + c + 2], 0xDD);       \
                }                                                                               \
            for (int c = 0; c < 4; c++) { /* entries j_ + c and j_ + c + 4 of the eight rows */ \
                const __m512d lo_ = _mm512_shuffle_f64x2(u_[c], u_[c + 4], 0x88);              \
                const __m512d hi_ = _mm512_shuffle_f64x2(u_[c], u_[c + 4], 0xDD);              \
                const __mmask8 il_ = lm_ & _mm512_cmp_pd_mask(lo_, m1_, _CMP_GT_OQ);            \
                const __mmask8 ih_ = lm_ & _mm512_cmp_pd_mask(hi_, m1_, _CMP_GT_OQ);            \
                _mm512_storeu_pd(col + (j_ + c) * L, _mm512_mask_blend_pd(il_, ninf_, lo_));    \
                _mm512_storeu_pd(col + (j_ + c + 4) * L, _mm512_mask_blend_pd(ih_, ninf_, hi_)); \
                cnt_ = _mm512_mask_add_epi64(cnt_, il_, cnt_, _mm512_set1_epi64(1));            \
                cnt_ = _mm512_mask_add_epi64(cnt_, ih_, cnt_, _mm512_set1_epi64(1));            \
            }                                                                                   \
            for (int c = 0; c < 8; c++)                                                         \
                _mm256_storeu_si256((__m256i *)(place + (j_ + c) * L), _mm256_set1_epi32((int32_t)(j_ + c))); \
        }                                                                                       \
        _mm512_storeu_si512((void *)cn_, cnt_);                                                 \
        for (; j_ < n; j_++) /* the last, fewer than eight */                                   \
            for (int l = 0; l < 8; l++) {                                                       \
                const double v = ((double)xl_[l][j_] - vtop[l]) * vi[l];                        \
                const int in = (lm_ >> l & 1) && v > -1.0;                                      \
                col[j_ * L + l] = in ? v : -INFINITY;                                           \
                place[j_ * L + l] = (int32_t)j_;                                                \
                cn_[l] += in;                                                                   \
            }                                                                                   \
        BLOCK_ENTRIES_KEEP(8, L);                                                               \
    } while (0)
#endif

/* The mapping itself for rows of at most POWER_BLOCK_MAX_N entries, L at a time, one a lane: per
   row its maximum m (a NaN or +inf entry: the row is all NaN; no finite entry: all zeros),
   z = (alpha - 1) (x - m) in doubles, those above -1 at the front of the lane's column with their
   places (a lane with none: past the last row, rows without a finite entry or with NaN / +inf;
   every lane's column is -inf after its entries), then (with a cap of POWER_COARSE_MIN_ITER steps
   or more) coarse steps from the higher of -1 and mean(z) - k^(-1/q) over the lane's k entries
   (a lower bound too: see below) and the entries above the threshold reached kept again, the
   threshold by the loop above on those (from -1 without coarse steps), then r = [z - tau]_+ and
   p = r^q / sum r^q at their places, 0 elsewhere, written as floats (r, and the last pass's
   s = r^(q - 1), where asked for: the backward's; dp/dalpha, BLOCK_DALPHA, in the DA instantiation).
   order (or NULL): the rows the blocks' lanes take, in turn (power_alpha_order); each row's
   outputs at its own place. The entries dropped are below every iterate
   (the iterates only grow), so the loop's sums, its iterates and the output are those of the
   loop on the whole row from the same start. */
/* the row a block's lane i takes: order[i] where the caller ordered the rows, else i */
#define POWER_ROW_AT(order, i) ((order) ? (int64_t)(order)[i] : (int64_t)(i))

/* dp/dalpha of a block's lanes (DEFINE_POWER_PROBS; alpha - 1 = a, vi): with p = r^q / sum r^q,
   ln p = ln 2 (q log2 d - log2 sum r^q), w = p (1 - a ln p) / a^2 = p (c0 - ln 2 log2 d) / a^2
   with c0 = 1 + ln 2 a log2 sum r^q, in place of the logarithms in lcol, and vs = sum w / sum s
   (s = d^(q - 1), wcol): the output dp/dalpha = w - s vs is taken in doubles from the same p and
   s (the two terms cancel to some a of their size: the forward's floats of w and s would leave
   the float's rounding of them over a^2 in the gradient) */
#define BLOCK_DALPHA(DT, IT, L, V)                                                              \
    do {                                                                                        \
        DT ltot_, wsum_ = zero, ssum_ = zero;                                                   \
        LOG2_FOR_##V(DT, IT, SEL(IT, DT, summed, total, one), ltot_);                           \
        const DT c0_ = one + POW_LN2 * vi * ltot_, ia2_ = one / (vi * vi);                      \
        for (int64_t j = 0; j < kmax; j++) {                                                    \
            DT pv_, lg_, sv_;                                                                   \
            memcpy(&pv_, col + j * L, sizeof pv_);                                              \
            memcpy(&lg_, lcol + j * L, sizeof lg_);                                             \
            memcpy(&sv_, wcol + j * L, sizeof sv_);                                             \
            pv_ *= inv;                                                                         \
            const DT wv_ = pv_ * (c0_ - POW_LN2 * lg_) * ia2_;                                  \
            wsum_ += wv_;                                                                       \
            ssum_ += sv_;                                                                       \
            memcpy(lcol + j * L, &wv_, sizeof wv_);                                             \
        }                                                                                       \
        vs = wsum_ / SEL(IT, DT, (IT)(ssum_ > zero), ssum_, one);                               \
    } while (0)
#define DEFINE_POWER_PROBS(NAME, ATTR, DT, IT, L, FT, FI, L2, V, DA)                            \
ATTR static void NAME(const float *x, int64_t rows, int64_t n, const double *am1, int64_t a_stride, \
                      int64_t max_iter, double rtol, float *p, float *root, float *weights,     \
                      float *dalpha_arg, float *stats, const int32_t *order)                    \
{                                                                                               \
    /* DA: built with dalpha's code (else its tests fold away: the other calls' loops as before; \
       kept in, they cost those 2-4%) */                                                        \
    float *const dalpha = DA ? dalpha_arg : 0;                                                  \
    double col[POWER_BLOCK_MAX_N * L], rcol[POWER_BLOCK_MAX_N * L]; /* scores, then p; r */    \
    double wcol[POWER_BLOCK_MAX_N * L]; /* the last pass's d^(q - 1) */                         \
    double lcol[POWER_BLOCK_MAX_N * L]; /* log2 d of the loop's last pass (dalpha's) */         \
    float colf[(POWER_BLOCK_MAX_N + 1) * L]; /* the scores as floats: the coarse steps' */      \
    int32_t place[POWER_BLOCK_MAX_N * L];    /* the places of the entries the loop runs on */    \
    const DT zero = {0}, one = zero + 1.0;                                                      \
    const IT none = {0}, magnitude = none + 0x7FFFFFFFFFFFFFFFLL;                               \
    for (int64_t r0 = 0; r0 < rows; r0 += L) {                                                  \
        DT vt, ve, vi, vtop;                                                                    \
        IT live, nanrow = none, emptyrow = none, above = none; /* above: from BLOCK_FINE's landing */ \
        int64_t kc[L], kmax = 0; /* each lane's entries above -1 at the front of its column */  \
        DT vsum = zero, vk;      /* their sum and count */                                      \
        int64_t rowof[L]; /* each lane's row (past the last: the block's first) */              \
        for (int l = 0; l < L; l++)                                                             \
            rowof[l] = POWER_ROW_AT(order, r0 + l < rows ? r0 + l : r0);                        \
        for (int l = 0; l < L; l++) {                                                           \
            const int real = r0 + l < rows;                                                     \
            const int64_t r = rowof[l];                                                         \
            const double a = am1[r * a_stride], qr = 1.0 / a;                                   \
            const float *xr = x + r * n;                                                        \
            float top = -INFINITY;                                                              \
            int bad = 0;                                                                        \
            int64_t i_ = 0;                                                                     \
            MAXPASS_LANES(float, FT, FI, L2, xr, n); /* the maximum, NaN / +inf; the rest: */   \
            for (int64_t j = i_; j < n; j++) {                                                  \
                bad |= (xr[j] != xr[j]) | (xr[j] == INFINITY);                                  \
                top = xr[j] > top ? xr[j] : top;                                                \
            }                                                                                   \
            const int empty = top == -INFINITY;                                                 \
            int64_t k = 0; /* the entries with z > -1 (none past the last row, in rows without \
                              a finite entry or with a NaN / +inf one), at the front */         \
            BLOCK_LANE_ENTRIES_##V(L);                                                          \
            kc[l] = k;                                                                          \
            vk[l] = k > 0 ? (double)k : 1.0;                                                    \
            kmax = k > kmax ? k : kmax;                                                         \
            vt[l] = -1.0;                                                                       \
            ve[l] = qr - 1.0;                                                                   \
            vi[l] = a;                                                                          \
            live[l] = real && !bad && !empty ? -1 : 0;                                          \
            nanrow[l] = real && bad ? -1 : 0;                                                   \
            emptyrow[l] = real && !bad && empty ? -1 : 0;                                       \
            vtop[l] = top;                                                                      \
        }                                                                                       \
        BLOCK_ENTRIES_##V(L); /* (W512, W256: the lanes' entries, by vectors) */                \
        for (int l = 0; l < L; l++) /* -inf after each lane's entries */                        \
            for (int64_t k = kc[l]; k < kmax; k++)                                              \
                col[k * L + l] = -INFINITY;                                                     \
        if (max_iter >= POWER_COARSE_MIN_ITER) {                                                \
            for (int64_t k = 0; k < kmax; k++) { /* (a sum in the loop above waited on itself) */ \
                DT v;                                                                           \
                memcpy(&v, col + k * L, sizeof v);                                              \
                vsum += (DT)((IT)v & (IT)(v > -1.0));                                           \
            }                                                                                   \
            /* from mean(z) - k^(-1/q) over the k entries above -1 where that is higher: by   \
               the power mean their sum [z - t]_+^q is at least 1 there (close on a flat row) */ \
            DT lgk, kp;                                                                         \
            VLOG2(DT, IT, vk, lgk);                                                             \
            VEXP2(DT, IT, -vi * lgk, kp);                                                       \
            const DT mb = vsum / vk - kp - 1e-9; /* less the rounding (|z| <= 1 here) */         \
            vt = SEL(IT, DT, live & (IT)(mb > vt), mb, vt);                                     \
            BLOCK_COARSE(DT, IT, FT, FI, L, L2, kmax, V);                                       \
            int64_t kmax2 = 0; /* again above the lanes' taus now */                            \
            for (int l = 0; l < L; l++) {                                                       \
                int64_t k = 0;                                                                  \
                BLOCK_LANE_COMPACT(L, l, kc[l], vt[l], k);                                      \
                kc[l] = k;                                                                      \
                kmax2 = k > kmax2 ? k : kmax2;                                                  \
            }                                                                                   \
            for (int l = 0; l < L; l++)                                                         \
                for (int64_t k = kc[l]; k < kmax2; k++)                                         \
                    col[k * L + l] = -INFINITY;                                                 \
            kmax = kmax2;                                                                       \
            BLOCK_FINE_##V(DT, IT, L, kmax);                                                    \
        }                                                                                       \
        BLOCK_NEWTON(DT, IT, L, kmax, KEEP_W, POW_FOR_##V, above);                              \
        DT total = zero;                                                                        \
        for (int64_t j = 0; j < kmax; j++) { /* r^q = d^(q - 1) d in place of the scores, then r */ \
            DT xv_, wq;                                                                         \
            memcpy(&xv_, col + j * L, sizeof xv_);                                              \
            memcpy(&wq, wcol + j * L, sizeof wq);                                               \
            const DT d = xv_ - vt;                                                              \
            const IT m = d > zero;                                                              \
            const DT w = (DT)((IT)(wq * d) & m);                                                \
            total += w;                                                                         \
            if (root || stats) {                                                                \
                const DT rv = (DT)((IT)d & m);                                                  \
                memcpy(rcol + j * L, &rv, sizeof rv);                                           \
            }                                                                                   \
            memcpy(col + j * L, &w, sizeof w);                                                  \
        }                                                                                       \
        const IT summed = (IT)(total > zero);                                                   \
        const DT inv = one / SEL(IT, DT, summed, total, one);                                   \
        DT vs = zero; /* dalpha: sum w / sum s */                                               \
        if (dalpha)                                                                             \
            BLOCK_DALPHA(DT, IT, L, V);                                                         \
        for (int l = 0; l < L && r0 + l < rows; l++) { /* each row's entries in order */        \
            const int64_t ro = rowof[l];                                                        \
            float *pr = p + ro * n, *rr = root ? root + ro * n : 0;                             \
            float *wr = weights ? weights + ro * n : 0;                                         \
            float *dr = dalpha ? dalpha + ro * n : 0;                                           \
            double psum = 0.0, prsum = 0.0;                                                     \
            /* NaN rows all NaN, the rest 0 between the entries written (s: 0 off the support) */ \
            power_fill_outputs(pr, rr, wr, dr, n, nanrow[l] ? NAN : 0.0f);                      \
            for (int64_t k = 0; k < (nanrow[l] ? 0 : kc[l]); k++) { /* at the entries' places */ \
                const int32_t j = place[k * L + l];                                             \
                pr[j] = (float)(col[k * L + l] * inv[l]);                                       \
                if (rr)                                                                         \
                    rr[j] = (float)rcol[k * L + l];                                             \
                if (wr)                                                                         \
                    wr[j] = (float)wcol[k * L + l];                                             \
                if (dr) /* dp/dalpha = w - s sum w / sum s */                                   \
                    dr[j] = (float)(lcol[k * L + l] - wcol[k * L + l] * vs[l]);                 \
                if (stats) {                                                                    \
                    psum += (double)pr[j];                                                      \
                    prsum += (double)pr[j] * (double)(float)rcol[k * L + l];                    \
                }                                                                               \
            }                                                                                   \
            if (stats) { /* tau, the row maximum, sum r^q, sum p, sum p r (the losses' conjugate) */ \
                float *st = stats + POWER_STATS * ro;                                           \
                st[0] = nanrow[l] ? -1.0f : emptyrow[l] ? INFINITY : (float)vt[l];              \
                st[1] = nanrow[l] ? NAN : emptyrow[l] ? 0.0f : (float)vtop[l];                  \
                st[2] = nanrow[l] ? NAN : (float)total[l];                                      \
                st[3] = nanrow[l] ? NAN : (float)psum;                                          \
                st[4] = nanrow[l] ? NAN : (float)prsum;                                         \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
}

/* Longer rows (more than POWER_BLOCK_MAX_N entries: output layers), row by row, pruned. Per row:
 * 1. one pass: the maximum, NaN / +inf, and the maxima of m_acc L "blocks" (entry j counts in
 *    accumulator (j / L) % m_acc, lane j % L; about POWER_LONG_BLOCK entries a block, at most
 *    POWER_LONG_MAX_ACC 8 = 256 blocks at every width). The block maxima are entries of the row, so the threshold of
 *    their z is a lower bound of the row's (its f is at most the row's f everywhere);
 * 2. that bound by the Newton loop on the block maxima (LONG_NEWTON below, tolerance
 *    POWER_LONG_BOUND_RTOL: any iterate from below is a lower bound), less a margin for the
 *    polynomials' rounding, and at least -1;
 * 3. one pass compacts the entries with z above the bound (the only ones that can be in the
 *    support) and their places into the caller's scratch: a chunk of L floats with none above the
 *    bound's float (two ulps lower) is skipped after one comparison;
 * 4. the Newton loop on the candidates from the bound (on a broad row, more than a quarter of its
 *    entries candidates, from their mean less k^(-1/q) where that is higher: by the power mean their
 *    sum [z - t]_+^q is at least 1 there, and it is close when the scores are close, as at
 *    initialisation; where every candidate is in the support, from the root of the moments' binomial
 *    series less half the tolerance, power_series_root: the first pass then settles, and where that
 *    start is above the root the first step may be negative; where the series cannot serve and
 *    nearly every entry is a candidate, from the threshold of k normal scores of their mean and
 *    deviation, POWER_NORMAL_Q, the same way and without coarse steps, and in the AVX-512 and AVX2
 *    functions from one float Halley step after it, LONG_FINE: one double pass then settles), first with coarse steps in floats (LONG_COARSE: a third of a double pass
 *    each) unless that start is already within a coarse step's stop of the root; after every
 *    step the candidates at or below the new tau are dropped (the iterates only grow: they add
 *    nothing again). The double loop's iterates are those of the loop on the whole row (other
 *    summation order). Every pass keeps its d^(q - 1) per candidate; the last pass's are at the
 *    tau returned;
 * 5. the output: zeros (none where every entry is a candidate: stored in place), then at the candidates' places p = r^q / sum r^q with r^q = d^(q - 1) d
 *    from that last pass (no power: sum r^q is the loop's last hq at that tau) and r.
 * A row of 8,000 standard normal scores at alpha 1.3 (about 210 in the support) takes some 1,000
 * powers for its threshold (blocks of 64, the bound to 1e-2; 1,400 with blocks of 32 and 1e-3)
 * where the loop on the whole row takes 6,300, and none for its output (a pass of powers over the
 * chunks holding a support entry took 1,550); broad rows (most entries in the support) take three
 * or four passes of powers over the row either way, two of them in floats where the start is far
 * (standard normal scores times 0.1 at alpha 1.3: 38 -> 28 ms for 512 rows on one thread). */
#ifdef NMT_POWER_COUNTS
/* a diagnostic build (tools/power_counts.py, one thread): what the long rows' loop does, summed over
   rows: [0] rows, [1] passes of the bound's loop (and of the normal start's pseudo-row), [2] candidates after step 3, [3] coarse passes,
   [4] entries of the coarse passes, [5] double passes of powers over the candidates, [6] their
   entries, [7] support entries at the end, [15] float Halley steps (LONG_FINE; [8 .. 14]: below),
   [16] float settling passes (LONG_SETTLE), [17] rows they settled */
double nmt_power_counts[18];
#define POWER_COUNT(i, v) (nmt_power_counts[i] += (double)(v))
#include <x86intrin.h>
/* [8 + i]: the time stamp counter's ticks from the row's start to its phase i's end (PHASE(i)) */
#define POWER_PHASE(i) (nmt_power_counts[8 + (i)] += (double)(__rdtsc() - t_row_))
#define POWER_ROW_START uint64_t t_row_ = __rdtsc()
#else
#define POWER_COUNT(i, v) ((void)0)
#define POWER_PHASE(i) ((void)0)
#define POWER_ROW_START ((void)0)
#endif

#define POWER_LONG_BLOCK 64
#define POWER_LONG_MAX_ACC 32
/* the scratch doubles a thread takes for rows of n entries (_native.power_long_scratch): the
   candidates and their powers (n + 8 each: a vector's store past the last), the block maxima, the
   candidates' indices (int32) */
#define POWER_LONG_THREAD_SCRATCH(n) (2 * ((n) + 8) + POWER_LONG_MAX_ACC * 8 + ((n) + 1) / 2)
#define POWER_LONG_BOUND_RTOL 1e-2

/* Newton on the q-norm over the candidates c[0 .. k) (doubles, z - max scaled) from tau (a lower
   bound), as DEFINE_POWER's loop (its stop, its last tau), dropping the candidates at or below tau
   after every step. Sets tau, hq (sum r^q at it), bad (NaN met). KEEP(i, w, L) as in POWER_SUMS (the
   last pass's are at the tau returned, for the c[0 .. k) left); MOVE(to, from) runs where a
   candidate moves down in the dropping (for what the caller keeps beside c). */
#define LONG_KEEP_W(i, w, L) memcpy(wk + (i), &(w), sizeof(w))
/* POWER_SUMS over doubles: by the vector extensions (GEN), or (W512, in the AVX-512 functions) by
   intrinsics: the support's and NaN's comparisons into mask registers, the power on the support's
   lanes alone (POW512_MASKED: zeros elsewhere, where POWER_SUMS masks the lanes after), hq by a
   fused multiply-add on them, the last entries by a masked load (-inf beyond n): the same sums, the
   products w d rounded once where POWER_SUMS rounded them before the sum */
#define LONG_SUMS_GEN(DT, IT, L, KEEP) POWER_SUMS(double, DT, DT, IT, L, KEEP, POW_GEN)
#ifdef NMT_WIDE_AVX512
#define LONG_SUMS_W512(DT, IT, L, KEEP)                                                         \
    do {                                                                                        \
        POW512_TABLES;                                                                          \
        const __m512d vt_ = _mm512_set1_pd(tau), ve_ = _mm512_set1_pd(e), one_ = _mm512_set1_pd(1.0); \
        const __m512d ninf_ = _mm512_set1_pd(-INFINITY);                                        \
        __m512d aq_ = _mm512_setzero_pd(), aw_ = aq_;                                           \
        __mmask8 nanm_ = 0;                                                                     \
        for (int64_t i_ = 0; i_ < n; i_ += 8) {                                                 \
            const __mmask8 ld_ = i_ + 8 <= n ? (__mmask8)0xFF : (__mmask8)((1u << (n - i_)) - 1u); \
            const __m512d dd_ = _mm512_sub_pd(_mm512_mask_loadu_pd(ninf_, ld_, x + i_), vt_);    \
            const __mmask8 sup_ = _mm512_cmp_pd_mask(dd_, _mm512_setzero_pd(), _CMP_GT_OQ);        \
            nanm_ |= _mm512_cmp_pd_mask(dd_, dd_, _CMP_UNORD_Q);                                  \
            __m512d w;                                                                          \
            POW512_MASKED(_mm512_mask_blend_pd(sup_, one_, dd_), ve_, sup_, w);                      \
            aw_ = _mm512_add_pd(aw_, w);                                                        \
            aq_ = _mm512_mask3_fmadd_pd(w, dd_, aq_, sup_);                                        \
            KEEP(i_, w, L);                                                                     \
        }                                                                                       \
        hq = _mm512_reduce_add_pd(aq_);                                                         \
        ws = _mm512_reduce_add_pd(aw_);                                                         \
        bad |= nanm_ != 0;                                                                      \
        (void)nan_;                                                                             \
    } while (0)
#endif
#define LONG_MOVE_NOTHING(to, from) ((void)0)
#define LONG_MOVE_INDEX(to, from) (idx[to] = idx_lazy_ ? (int32_t)(from) : idx[from])
/* after a drop: MOVE##_DONE; the places written (a row kept whole by LONG_WHOLE_W512 left them
   unwritten, idx_lazy_: the identity, which the drop's moves wrote from the places themselves) */
#define LONG_MOVE_NOTHING_DONE ((void)0)
#define LONG_MOVE_INDEX_DONE (idx_lazy_ = 0)
#define LONG_NEWTON(DT, IT, L, c, k, rtol_, KEEP, MOVE, V)                                      \
    do {                                                                                        \
        for (int64_t it_ = 0;; it_++) {                                                         \
            double ws;                                                                          \
            {                                                                                   \
                const double *x = (c);                                                          \
                const int64_t n = (k);                                                          \
                IT nan_ = {0};                                                                  \
                LONG_SUMS_##V(DT, IT, L, KEEP);                                                 \
            }                                                                                   \
            POWER_COUNT((c) == cand ? 5 : 1, 1);                                                \
            POWER_COUNT((c) == cand ? 6 : 0, (c) == cand ? (k) : 0);                            \
            if (bad || !(ws > 0.0) || it_ >= max_iter)                                          \
                break;                                                                          \
            const double h = vpow_2(hq, a);                                                     \
            const double step = (h - 1.0) * (hq / h) / ws;                                      \
            const double mag = fabs(tau) > 1.0 ? fabs(tau) : 1.0;                               \
            if (!(step > (rtol_) * mag) && !(from_above && step < -(rtol_) * mag))             \
                break; /* settled (from above: within |step| of the root, the step lands below it) */ \
            from_above = 0;                                                                     \
            tau += step;                                                                        \
            LONG_DROP_##V(c, k, MOVE);                                                          \
        }                                                                                       \
    } while (0)
/* the candidates c[0 .. k) above tau moved to the front (MOVE(to, from) for what the caller keeps
   beside them), k their count: entry by entry (GEN), or by compressing vectors of eight (W512, in
   the AVX-512 functions; MOVE##_8(to, from, mask) moves eight places): each stored whole at
   kept_ <= i_, so within the eight just read */
#define LONG_DROP_REST(c, k, MOVE) /* from c[i_], the kept ones to c[kept_] on */              \
    do {                                                                                        \
        for (; i_ < (k); i_++) {                                                                \
            (c)[kept_] = (c)[i_];                                                               \
            MOVE(kept_, i_);                                                                    \
            kept_ += (c)[i_] > tau;                                                             \
        }                                                                                       \
        (k) = kept_;                                                                            \
    } while (0)
#define LONG_DROP_GEN(c, k, MOVE)                                                               \
    do {                                                                                        \
        int64_t kept_ = 0, i_ = 0;                                                              \
        LONG_DROP_REST(c, k, MOVE);                                                             \
        MOVE##_DONE;                                                                            \
    } while (0)
#ifdef NMT_WIDE_AVX512
#define LONG_DROP_W512(c, k, MOVE)                                                            \
    do {                                                                                        \
        int64_t kept_ = 0, i_ = 0;                                                              \
        const __m512d tv_ = _mm512_set1_pd(tau);                                                \
        for (; i_ + 8 <= (k); i_ += 8) { /* (a store of eight at kept_ <= i_: read already) */   \
            const __m512d v_ = _mm512_loadu_pd((c) + i_);                                       \
            const __mmask8 m_ = _mm512_cmp_pd_mask(v_, tv_, _CMP_GT_OQ);                        \
            MOVE##_8(kept_, i_, m_);                                                            \
            _mm512_storeu_pd((c) + kept_, _mm512_maskz_compress_pd(m_, v_));                    \
            kept_ += __builtin_popcount((unsigned)m_);                                          \
        }                                                                                       \
        LONG_DROP_REST(c, k, MOVE);                                                             \
        MOVE##_DONE;                                                                            \
    } while (0)
#define LONG_MOVE_NOTHING_8(to, from, m) ((void)0)
#define LONG_MOVE_INDEX_8(to, from, m)                                                          \
    _mm256_storeu_si256((__m256i *)(idx + (to)), _mm256_maskz_compress_epi32((m), idx_lazy_     \
        ? _mm256_add_epi32(_mm256_set1_epi32((int32_t)(from)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) \
        : _mm256_loadu_si256((const __m256i *)(idx + (from)))))
#endif

/* a float just below the double v (two ulps: every float above it is above v's neighbourhood) */
static inline float power_float_below(double v)
{
    return nextafterf(nextafterf((float)v, -INFINITY), -INFINITY);
}

/* Step 3 below: cand[0 .. k) the z = (x - top) a of the row's entries above the float cut, idx
   their places. GEN: a chunk of L floats without one is skipped after one comparison (ANY), the
   others entry by entry, keeping those with z above lo. W512 (AVX-512): sixteen floats at a time
   compressed in registers (faster than compressing to memory) and stored whole at k <= j (within
   the row's length: the floats in wk's room, the places in idx), converted after; those up to two
   float ulps below lo are kept too (below every tau, they are dropped after the first step and add
   nothing to a sum). */
#define LONG_CANDIDATES_GEN(FT, IT32, DT, IT, L, ANY)                                             \
    do {                                                                                        \
        FT cv;                                                                                  \
        for (int l = 0; l < L; l++)                                                             \
            cv[l] = cut;                                                                        \
        k = 0;                                                                                  \
        for (j = 0; j + L <= len; j += L) {                                                     \
            memcpy(&xv, xr + j, sizeof xv);                                                     \
            const IT32 c = xv > cv;                                                             \
            if (ANY(c))                                                                         \
                for (int l = 0; l < L; l++) {                                                   \
                    cand[k] = ((double)xv[l] - top) * a;                                        \
                    idx[k] = (int32_t)(j + l);                                                  \
                    k += cand[k] > lo;                                                          \
                }                                                                               \
        }                                                                                       \
        for (; j < len; j++) {                                                                  \
            cand[k] = ((double)xr[j] - top) * a;                                                \
            idx[k] = (int32_t)j;                                                                \
            k += cand[k] > lo;                                                                  \
        }                                                                                       \
    } while (0)
/* the candidates I .. N - 1 (fewer than a vector; I advanced to N) converted from the floats SRC, each
   added to the moments' sums alone (LONG_MOMENT_FINISH, LONG_MOMENT_FINISH256) */
#define LONG_MOMENT_TAIL(I, N, SRC)                                                             \
    do {                                                                                        \
        for (; I < N; I++) {                                                                    \
            cand[I] = ((double)SRC[I] - top) * a;                                               \
            const double d1 = cand[I] - r0, d2 = d1 * d1;                                       \
            mom[1] += d1;                                                                       \
            mom[2] += d2;                                                                       \
            mom[3] += d2 * d1;                                                                  \
            mom[4] += d2 * d2;                                                                  \
            mom[5] += d2 * d2 * d1;                                                             \
            mom[6] += d2 * d2 * d2;                                                             \
            abs7 += fabs(d2 * d2 * d2 * d1);                                                    \
            dhi = fabs(d1) > dhi ? fabs(d1) : dhi;                                              \
        }                                                                                       \
    } while (0)
/* the moments' lane sums a1_ .. a7_ and the lanes' largest |d| hi_ reduced by SUM and MAX into mom[0 ..
   6] (mom[0] = N candidates), abs7 and dhi, then LONG_MOMENT_TAIL (LONG_MOMENT_FINISH: AVX-512's
   reductions; LONG_CONVERT_MOMENTS256: AVX2's) */
#define LONG_MOMENT_FINISH_BY(I, N, SRC, SUM, MAX)                                              \
    do {                                                                                        \
        mom[0] = (double)N;                                                                     \
        mom[1] = SUM(a1_);                                                                      \
        mom[2] = SUM(a2_);                                                                      \
        mom[3] = SUM(a3_);                                                                      \
        mom[4] = SUM(a4_);                                                                      \
        mom[5] = SUM(a5_);                                                                      \
        mom[6] = SUM(a6_);                                                                      \
        abs7 = SUM(a7_);                                                                        \
        dhi = MAX(hi_);                                                                         \
        LONG_MOMENT_TAIL(I, N, SRC);                                                            \
    } while (0)
#ifdef NMT_WIDE_AVX512
#define LONG_CANDIDATES_W512(FT, IT32, DT, IT, L, ANY)                                          \
    do {                                                                                        \
        float *tf = (float *)wk; /* the candidates as floats */                                 \
        const __m512 cut16 = _mm512_set1_ps(cut);                                               \
        /* the moments' sums (LONG_WHOLE_W512's, LONG_CONVERT_MOMENTS') */                      \
        __m512d a1_ = _mm512_setzero_pd(), a2_ = a1_, a3_ = a1_, a4_ = a1_, a5_ = a1_, a6_ = a1_; \
        __m512d a7_ = a1_, hi_ = a1_;                                                           \
        int64_t done_ = 0; /* the first entries, all candidates, converted with their sums */   \
        k = 0;                                                                                  \
        LONG_WHOLE_W512(DT, L); /* every entry above the cut: k = len, converted from the scores */ \
        __m512i jv = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), \
                                      _mm512_set1_epi32((int32_t)done_));                       \
        const __m512i sixteen = _mm512_set1_epi32(16);                                          \
        for (j = done_; !whole_ && j + 16 <= len; j += 16) {                                    \
            const __m512 v = _mm512_loadu_ps(xr + j);                                           \
            const __mmask16 m = _mm512_cmp_ps_mask(v, cut16, _CMP_GT_OQ);                       \
            _mm512_storeu_ps(tf + k, _mm512_maskz_compress_ps(m, v));                           \
            _mm512_storeu_si512((void *)(idx + k), _mm512_maskz_compress_epi32(m, jv));         \
            k += __builtin_popcount((unsigned)m);                                               \
            jv = _mm512_add_epi32(jv, sixteen);                                                 \
        }                                                                                       \
        for (; !whole_ && j < len; j++) {                                                       \
            tf[k] = xr[j];                                                                      \
            idx[k] = (int32_t)j;                                                                \
            k += xr[j] > cut;                                                                   \
        }                                                                                       \
        int64_t i = done_;                                                                      \
        if (whole_) {                                                                           \
        } else if (k > len / 4) { /* a broad row: its moments as the candidates are converted */ \
            LONG_CONVERT_MOMENTS(DT, IT, L);                                                    \
        } else { /* (done_ > 0: those first ones' moments not kept; LONG_MOMENTS takes them) */ \
            r0 = 0.0;                                                                           \
            for (; i + L <= k; i += L) {                                                        \
                memcpy(&xv, tf + i, sizeof xv);                                                 \
                const DT dv = (__builtin_convertvector(xv, DT) - (double)top) * a;              \
                memcpy(cand + i, &dv, sizeof dv);                                               \
            }                                                                                   \
            for (; i < k; i++)                                                                  \
                cand[i] = ((double)tf[i] - top) * a;                                            \
        }                                                                                       \
    } while (0)
/* Step 3's shortcut for rows the bound keeps whole (every entry above the cut: scores close to each
   other, an output layer's early in training), in the AVX-512 functions: the candidates converted
   straight from the scores with LONG_CONVERT_MOMENTS' sums, in its order (the same doubles, the
   same moments), no compaction to the floats tf and no places written (idx_lazy_: the identity,
   which a drop's LONG_MOVE_INDEX writes as it moves them; the output of k == len reads none).
   Taken as it goes: entries at or below the cut are kept as candidates (below every tau, never in
   the support) while they number at most POWER_WHOLE_LOWS(read, len) of the entries read and lie
   above z = -0.9 (WHOLE_KEEPS); at the first vector of sixteen past that it stops, and the
   compaction goes on
   from there (done_: the entries before it, all candidates, converted,
   their places written, their sums kept for LONG_CONVERT_MOMENTS; 0 where the stop came within the
   first 256, the centre's: the compaction then runs from the row's start). Sets whole_ (then k,
   r0, mom, abs7, dhi, moments_ as LONG_CONVERT_MOMENTS), or done_ and k, r0. */
/* (LONG_WHOLE_W512) whether the sixteen scores v may stay in a row kept whole: all above the cut, or
   all above the floor with the entries at or below the cut, counted in lows_, within the allowance:
   a broad row whose bound leaves out a few of its lowest entries (3 of 32,000 at alpha 1.3,
   deviation 0.1), or up to some 6% spread through the row (387 of 8,000 at alpha 1.25, deviation
   0.3), stays whole (in place, no compaction, no scatters; those are candidates outside the
   support, and the moments, the normal model's among them, are the whole row's). The allowance
   grows with the entries read, len / 256 + read / 16: a row with more below the bound stops early,
   having kept few of them (at most len / 256 beyond a sixteenth of those read). */
#define POWER_WHOLE_LOWS(read, len) ((len) / 256 + (read) / 16)
#define WHOLE_KEEPS(v)                                                                          \
    __extension__({                                                                             \
        const __mmask16 low_m_ = (__mmask16)~_mm512_cmp_ps_mask((v), cut16, _CMP_GT_OQ);        \
        low_m_ == 0 || (_mm512_cmp_ps_mask((v), floor16_, _CMP_GT_OQ) == (__mmask16)0xFFFF      \
                        && (lows_ += __builtin_popcount((unsigned)low_m_))                      \
                           <= POWER_WHOLE_LOWS(i_ + 16, len));                                  \
    })
#ifdef NMT_POWER_NO_WHOLE /* a diagnostic build (tests/sparse/test_power_whole_rows.py): every row compacted */
#define LONG_WHOLE_W512(DT, L) ((void)0)
#else
#define LONG_WHOLE_W512(DT, L)                                                                  \
    do {                                                                                        \
        const __m512d wt_ = _mm512_set1_pd((double)top), wa_ = _mm512_set1_pd(a);               \
        int64_t i_ = 0, lows_ = 0;                                                              \
        int ok_ = len >= 256;                                                                   \
        /* entries at or below the cut kept as candidates (below every tau: never in the support), \
           at most POWER_WHOLE_LOWS(read, len) of the first read, each above z = -0.9         \
           (floor16: no -inf, no far outlier in the moments) */                                 \
        const double floor_d_ = (double)top - 0.9 / a;                                          \
        float floor_ = (float)floor_d_;                                                         \
        floor_ = (double)floor_ < floor_d_ ? nextafterf(floor_, INFINITY) : floor_;             \
        const __m512 floor16_ = _mm512_set1_ps(floor_);                                         \
        for (; ok_ && i_ + 16 <= 256; i_ += 16) { /* the centre's candidates first */           \
            const __m512 v_ = _mm512_loadu_ps(xr + i_);                                         \
            ok_ = WHOLE_KEEPS(v_);                                                              \
            _mm512_storeu_pd(cand + i_, _mm512_mul_pd(_mm512_sub_pd(F16_LO_PD(v_), wt_), wa_)); \
            _mm512_storeu_pd(cand + i_ + 8, _mm512_mul_pd(_mm512_sub_pd(F16_HI_PD(v_), wt_), wa_)); \
        }                                                                                       \
        if (!ok_)                                                                               \
            break;                                                                              \
        for (int64_t c_ = 0; c_ < 256; c_++)                                                    \
            r0 += cand[c_];                                                                     \
        r0 /= 256.0;                                                                            \
        const __m512d r0v_ = _mm512_set1_pd(r0);                                                \
        for (int64_t c_ = 0; c_ < 256; c_ += 8) {                                               \
            const __m512d d1_ = _mm512_sub_pd(_mm512_loadu_pd(cand + c_), r0v_);                \
            LONG_MOMENT_SUMS(d1_);                                                              \
        }                                                                                       \
        for (; i_ + 16 <= len; i_ += 16) {                                                      \
            const __m512 v_ = _mm512_loadu_ps(xr + i_);                                         \
            if (!WHOLE_KEEPS(v_)) {                                                             \
                ok_ = 0;                                                                        \
                break;                                                                          \
            }                                                                                   \
            const __m512d c0_ = _mm512_mul_pd(_mm512_sub_pd(F16_LO_PD(v_), wt_), wa_);          \
            const __m512d c1_ = _mm512_mul_pd(_mm512_sub_pd(F16_HI_PD(v_), wt_), wa_);          \
            _mm512_storeu_pd(cand + i_, c0_);                                                   \
            _mm512_storeu_pd(cand + i_ + 8, c1_);                                               \
            const __m512d d0_ = _mm512_sub_pd(c0_, r0v_);                                       \
            LONG_MOMENT_SUMS(d0_);                                                              \
            const __m512d d1_ = _mm512_sub_pd(c1_, r0v_);                                       \
            LONG_MOMENT_SUMS(d1_);                                                              \
        }                                                                                       \
        for (int64_t c_ = i_; ok_ && c_ < len; c_++) /* (the last, fewer than sixteen) */       \
            ok_ = xr[c_] > cut || (xr[c_] > floor_ && ++lows_ <= POWER_WHOLE_LOWS(c_ + 1, len)); \
        if (!ok_) { /* the compaction from i_ on (a multiple of 16: LONG_CONVERT_MOMENTS' vectors) */ \
            for (int64_t c_ = 0; c_ < i_; c_++)                                                 \
                idx[c_] = (int32_t)c_;                                                          \
            done_ = k = i_;                                                                     \
            break;                                                                              \
        }                                                                                       \
        if (i_ + 8 <= len) {                                                                    \
            const __m512d c0_ = _mm512_mul_pd(_mm512_sub_pd(                                    \
                _mm512_cvtps_pd(_mm256_loadu_ps(xr + i_)), wt_), wa_);                          \
            _mm512_storeu_pd(cand + i_, c0_);                                                   \
            const __m512d d0_ = _mm512_sub_pd(c0_, r0v_);                                       \
            LONG_MOMENT_SUMS(d0_);                                                              \
            i_ += 8;                                                                            \
        }                                                                                       \
        LONG_MOMENT_FINISH(i_, len, xr); /* the last ones, as LONG_CONVERT_MOMENTS' */          \
        k = len;                                                                                \
        whole_ = 1;                                                                             \
        idx_lazy_ = 1;                                                                          \
        moments_ = 1;                                                                           \
    } while (0)
#endif
/* the candidates' conversion from the floats tf[0 .. k) with, in the same pass, what the broad
   rows' start needs (LONG_MOMENTS and LONG_MOMENTS_HIGH's sums): the centre r0 (the first
   min(k, 256) candidates' mean, converted first), mom[0 .. POWER_SERIES_ORDER], abs7 and the
   spread max |d| (as dhi, dlo left 0); moments_ set (the start then reads no candidate again). In
   the AVX-512 functions only: the sums by fused multiply-adds (one rounding where the separate
   passes took two), |d| by a mask, its maximum by vmaxpd: twelve vector operations a vector besides
   the conversion, where the two passes took some twenty and read every candidate twice more. */
#define LONG_MOMENT_SUMS(d1)                                                                    \
    do {                                                                                        \
        const __m512d ad_ = _mm512_abs_pd(d1), d2_ = _mm512_mul_pd(d1, d1);                     \
        const __m512d d3_ = _mm512_mul_pd(d2_, d1), d6_ = _mm512_mul_pd(d3_, d3_);              \
        hi_ = _mm512_max_pd(hi_, ad_);                                                          \
        a1_ = _mm512_add_pd(a1_, d1);                                                           \
        a2_ = _mm512_add_pd(a2_, d2_);                                                          \
        a3_ = _mm512_add_pd(a3_, d3_);                                                          \
        a4_ = _mm512_fmadd_pd(d2_, d2_, a4_);                                                   \
        a5_ = _mm512_fmadd_pd(d3_, d2_, a5_);                                                   \
        a6_ = _mm512_add_pd(a6_, d6_);                                                          \
        a7_ = _mm512_fmadd_pd(d6_, ad_, a7_);                                                   \
    } while (0)
/* after LONG_MOMENT_SUMS' vectors (N candidates in all): their sums reduced into mom[0 .. 6],
   abs7 and dhi, then the last candidates I .. N - 1 (fewer than a vector; I advanced to N)
   converted from the floats SRC, each added to those sums alone (LONG_WHOLE_W512 from the scores,
   LONG_CONVERT_MOMENTS from the compacted floats). */
#define LONG_MOMENT_FINISH(I, N, SRC)                                                           \
    LONG_MOMENT_FINISH_BY(I, N, SRC, _mm512_reduce_add_pd, _mm512_reduce_max_pd)
#define LONG_CONVERT_MOMENTS(DT, IT, L)                                                         \
    do {                                                                                        \
        const int64_t k0_ = k < 256 ? k : 256;                                                  \
        if (done_ == 0) { /* (else LONG_WHOLE_W512 took the first done_ >= 256, r0 and their sums) */ \
            for (i = 0; i < k0_; i++) { /* the centre's candidates first */                     \
                cand[i] = ((double)tf[i] - top) * a;                                            \
                r0 += cand[i];                                                                  \
            }                                                                                   \
            r0 /= (double)k0_;                                                                  \
        }                                                                                       \
        const __m512d r0v_ = _mm512_set1_pd(r0);                                                \
        for (i = 0; done_ == 0 && i + 8 <= k0_; i += 8) {                                       \
            const __m512d d1_ = _mm512_sub_pd(_mm512_loadu_pd(cand + i), r0v_);                 \
            LONG_MOMENT_SUMS(d1_);                                                              \
        }                                                                                       \
        i = done_ > i ? done_ : i;                                                              \
        for (; i + L <= k; i += L) { /* (i == k0_ here: 256, or k0_ == k's whole vectors) */    \
            memcpy(&xv, tf + i, sizeof xv);                                                     \
            const DT dv = (__builtin_convertvector(xv, DT) - (double)top) * a;                  \
            memcpy(cand + i, &dv, sizeof dv);                                                   \
            const __m512d d1_ = _mm512_sub_pd((__m512d)dv, r0v_);                               \
            LONG_MOMENT_SUMS(d1_);                                                              \
        }                                                                                       \
        LONG_MOMENT_FINISH(i, k, tf); /* (the last ones; those below k0_ converted already: the same value) */ \
        moments_ = 1;                                                                           \
    } while (0)
#endif

/* The start of broad rows whose every candidate lies inside the support: with d = z - r0 about a
   centre r0 (the first 256 candidates' mean) and u = r0 - t, f(t) = sum (u + d_i)^q =
   sum_j C(q, j) u^(q - j) M_j, M_j = sum d_i^j, the binomial series, which converges where every
   |d_i| < u (fast where max |d_i| / u is small: scores close to each other, as an output layer's
   early in training). Its root u in the series truncated after POWER_SERIES_ORDER, by Newton steps
   on q ln u + ln P(1/u), P(v) = sum_j C(q, j) M_j v^j (nearly linear in ln u), from the power
   mean's gap k^(-1/q); kept where max |d_i| < u (every candidate in the support at t = r0 - u) and
   the truncation's estimate below (first term left out) moves t by at most a quarter of the
   tolerance: on normal rows the start is then within 1e-10 to 1e-8 of the root (alpha 1.3,
   deviations 0.01-0.03, 8,000 and 32,000 scores; q = 4, alpha 1.25, makes the series exact). Not
   a bound: the caller starts the loop half the tolerance below it, so that the loop's first pass
   (the only one where the estimate holds) finds a step of about half the tolerance and settles;
   where it does not hold and the start is above the root, the first step is negative: at most
   the tolerance accepts the start (the root is within it: Newton's step from above on the convex
   q-norm overshoots), a longer one lands below the root and the loop goes on from there as from any
   lower bound. M: POWER_SERIES_ORDER + 1 moments (M[0] = k), abs7: sum |d_i|^7, u: the start
   (k^(-1/q)), spread: max |d_i|, tol: the loop's tolerance. Returns u, or 0 where it does not
   serve. */
#define POWER_SERIES_ORDER 6
static inline double power_series_root(const double *M, double abs7, double q, double u, double spread,
                                       double tol)
{
    double c[POWER_SERIES_ORDER + 2], b = 1.0;
    for (int j = 0; j <= POWER_SERIES_ORDER + 1; j++) {
        c[j] = b * (j <= POWER_SERIES_ORDER ? M[j] : 1.0); /* c[ORDER + 1]: C(q, ORDER + 1) alone */
        b *= (q - j) / (j + 1); /* C(q, j + 1) */
    }
    for (int it = 0; it < 30; it++) {
        const double v = 1.0 / u;
        double P = c[POWER_SERIES_ORDER], dP = 0.0;
        for (int j = POWER_SERIES_ORDER - 1; j >= 0; j--) {
            dP = dP * v + P;
            P = P * v + c[j];
        }
        if (!(P > 0.0) || !(u > 0.0))
            return 0.0;
        const double F = q * log(u) + log(P), dF = q / u - dP * v * v / P; /* d/du */
        if (!(dF > 0.0))
            return 0.0;
        const double nu = u - F / dF;
        const int done = fabs(nu - u) <= 1e-15 * u;
        u = nu;
        if (done)
            break;
    }
    if (!(u > 0.0) || !(spread < u))
        return 0.0;
    /* the truncation: about its first term left out, C(q, 7) u^(q - 7) sum d_i^7, at most
       |C(q, 7)| u^(q - 7) sum |d_i|^7 (an estimate, not a bound: the series of an entry near -u
       converges slowly; on normal rows of 32,000 scores, rho = max |d_i| / u near 0.95, it was
       some 20 times the true error); over f'(t), about q k u^(q - 1): the move of t it makes,
       kept within a quarter of the tolerance */
    const double move = fabs(c[POWER_SERIES_ORDER + 1]) * abs7 / (q * M[0] * pow(u, POWER_SERIES_ORDER));
    return move <= 0.25 * tol ? u : 0.0;
}
/* A start for a broad row that the series cannot serve (candidates partly out of the support): the
   threshold of k normal scores of the candidates' mean and deviation, as the threshold of the
   pseudo-row c (mean + sd Q_j) over the POWER_NORMAL_N midpoint quantiles Q_j = Phi^-1((j + 1/2) / N)
   (each standing for k / N scores: scaled by c = (k / N)^(1/q), its threshold is c t), found by the
   bound's Newton loop on those N entries (some four passes over 256 entries). Not a bound: the
   loop starts from it with a possible negative first step, as from the series' root. On normal rows
   of 8,000 scores it lands within some 2e-4 of the root (alpha 1.25-1.3 at deviation 0.1, 1.7 at
   0.01), where the coarse float steps end within their margin 1e-4: two double passes and no coarse
   one. Taken only where the bound left nearly every entry a candidate (k >= 15/16 of the row: a
   cut candidate set is no normal sample; alpha 1.3 at deviation 0.3 took four double passes from
   it, where three coarse and two double ones before). POWER_NORMAL_Q: the upper half of the Q_j (the lower half is their negation). */
#define POWER_NORMAL_N 256
#define POWER_NORMAL_RTOL 1e-7 /* the pseudo-row's tolerance (its start errs by some 1e-4 anyway) */
static const double POWER_NORMAL_Q[POWER_NORMAL_N / 2] = {
    0.0048957779063424529, 0.014687803133359817, 0.024481236918494055, 0.034277019351436594,
    0.044076092100220454, 0.053879399046406255, 0.06368788692413288, 0.073502505964158749,
    0.08332421054403627, 0.093153959845583292, 0.10299271852083793, 0.11284145736771416,
    0.12270115401660611, 0.13257279362922775, 0.14245736961101607, 0.15235588433847252,
    0.16226934990286976, 0.17219878887180792, 0.18214523507016814, 0.19210973438208001,
    0.20209334557559613, 0.21209714115184913, 0.22212220822055745, 0.23216964940384519,
    0.24224058377044752, 0.25233614780248953, 0.26245749639715543, 0.27260580390569994,
    0.28278226521240257, 0.29298809685623339, 0.30322453819816619, 0.31349285263727555,
    0.32379432887895426, 0.33413028225881958, 0.34450205612611962, 0.35491102329071739,
    0.36535858753802314, 0.37584618521656105, 0.38637528690319967, 0.39694739915145472,
    0.4075640663286797, 0.41822687254840912, 0.42893744370460862, 0.43969744961512003,
    0.45050860628217826, 0.46137267827851303, 0.47229148126826082, 0.48326688467267276,
    0.4943008144914709, 0.50539525629161941, 0.51655225837632135, 0.52777393514818027,
    0.53906247068171875, 0.55042012252182748, 0.56184922572625673, 0.57335219717195252,
    0.58493154014692739, 0.59658984925144531, 0.60832981563463184, 0.62015423259520741,
    0.63206600157794679, 0.64406813860069256, 0.6561637811503791, 0.66835619559057891,
    0.68064878512764648, 0.69304509838766348, 0.70554883866217555, 0.71816387388723057,
    0.73089424742762854, 0.74374418974665413, 0.7567181310510781, 0.76982071501204097,
    0.78305681367477409, 0.79643154368423297, 0.80995028396989233, 0.82361869505153307,
    0.83744274014924525, 0.85142870830557127, 0.86558323975630835, 0.87991335381968094,
    0.89442647961222388, 0.90913048994484691, 0.92403373880538786, 0.93914510289606212,
    0.95447402776744261, 0.97003057917724067, 0.98582550040506112, 1.0018702763769824,
    1.0181772056006682, 1.0347594810882446, 1.0516312816573357, 1.0688078752591983, 1.0863057362981008,
    1.1041426792922295, 1.1223380117021662, 1.140912709342313, 1.1598896185252787, 1.1792936900106505,
    1.1991522509932739, 1.2194953228462238, 1.2403559942306723, 1.2617708616359866, 1.2837805526081671,
    1.3064303511275646, 1.3297709501812092, 1.3538593640751064, 1.3787600432219229, 1.404546248158874,
    1.4313017591024757, 1.459123025021593, 1.4881218960233806, 1.518429141152591, 1.5501990407917605,
    1.5836154758017882, 1.6189001435373589, 1.6563238653408072, 1.6962225050066093, 1.7390199717299037,
    1.7852624904353231, 1.8356715369125431, 1.8912292378201079, 1.9533237077453942, 2.0240136237191582,
    2.1065540881628135, 2.2065752165371291, 2.3352330400688128, 2.5205022171903591, 2.8856349124267573
};
/* the moments mom[0 .. 2] of d = cand - r0 over cand[0 .. k) (mom[0] = k) and d's extremes dlo, dhi
   (the caller's), L doubles at a time; LONG_MOMENTS_HIGH: mom[3 .. POWER_SERIES_ORDER] and abs7 =
   sum |d|^7 (a second pass, taken only where the series may serve: max |d| below the gap) */
#define LONG_MOMENTS(DT, IT, L)                                                                 \
    do {                                                                                        \
        DT a1 = {0}, a2 = a1, lo_ = a1, hi_ = a1, v_;                                           \
        int64_t i = 0;                                                                          \
        for (; i + L <= k; i += L) {                                                            \
            memcpy(&v_, cand + i, sizeof v_);                                                   \
            const DT d1 = v_ - r0;                                                              \
            a1 += d1;                                                                           \
            a2 += d1 * d1;                                                                      \
            lo_ = (DT)(((IT)d1 & (IT)(d1 < lo_)) | ((IT)lo_ & ~(IT)(d1 < lo_)));                \
            hi_ = (DT)(((IT)d1 & (IT)(d1 > hi_)) | ((IT)hi_ & ~(IT)(d1 > hi_)));                \
        }                                                                                       \
        mom[0] = (double)k;                                                                     \
        mom[1] = mom[2] = 0.0;                                                                  \
        for (int l = 0; l < L; l++) {                                                           \
            mom[1] += a1[l];                                                                    \
            mom[2] += a2[l];                                                                    \
            dlo = lo_[l] < dlo ? lo_[l] : dlo;                                                  \
            dhi = hi_[l] > dhi ? hi_[l] : dhi;                                                  \
        }                                                                                       \
        for (; i < k; i++) {                                                                    \
            const double d1 = cand[i] - r0;                                                     \
            mom[1] += d1;                                                                       \
            mom[2] += d1 * d1;                                                                  \
            dlo = d1 < dlo ? d1 : dlo;                                                          \
            dhi = d1 > dhi ? d1 : dhi;                                                          \
        }                                                                                       \
    } while (0)
#define LONG_MOMENTS_HIGH(DT, IT, L)                                                            \
    do {                                                                                        \
        DT a3 = {0}, a4 = a3, a5 = a3, a6 = a3, a7 = a3, v_;                                    \
        const IT magnitude_ = (IT){0} + 0x7FFFFFFFFFFFFFFFLL;                                   \
        int64_t i = 0;                                                                          \
        for (; i + L <= k; i += L) {                                                            \
            memcpy(&v_, cand + i, sizeof v_);                                                   \
            const DT d1 = v_ - r0, d2 = d1 * d1, d3 = d2 * d1;                                  \
            a3 += d3;                                                                           \
            a4 += d2 * d2;                                                                      \
            a5 += d3 * d2;                                                                      \
            a6 += d3 * d3;                                                                      \
            a7 += (DT)((IT)(d3 * d3 * d1) & magnitude_);                                        \
        }                                                                                       \
        mom[3] = mom[4] = mom[5] = mom[6] = abs7 = 0.0;                                         \
        for (int l = 0; l < L; l++) {                                                           \
            mom[3] += a3[l];                                                                    \
            mom[4] += a4[l];                                                                    \
            mom[5] += a5[l];                                                                    \
            mom[6] += a6[l];                                                                    \
            abs7 += a7[l];                                                                      \
        }                                                                                       \
        for (; i < k; i++) {                                                                    \
            const double d1 = cand[i] - r0, d2 = d1 * d1;                                       \
            mom[3] += d2 * d1;                                                                  \
            mom[4] += d2 * d2;                                                                  \
            mom[5] += d2 * d2 * d1;                                                             \
            mom[6] += d2 * d2 * d2;                                                             \
            abs7 += fabs(d2 * d2 * d2 * d1);                                                    \
        }                                                                                       \
    } while (0)

/* Step 4's coarse steps on a long row's candidates (DEFINE_POWER_LONG; the uncapped loop, q - 1 at
   most POWER_COARSE_MAX_E, at least POWER_LONG_COARSE_MIN_K candidates): BLOCK_COARSE's Newton steps
   with float sums over the candidates as floats (cf, in wk's room, padded with -inf to a whole
   vector of L2 lanes), each shortened by POWER_COARSE_MARGIN, the same argument for staying below
   the root: the float sums are added in double every POWER_LONG_COARSE_CHUNK vectors, so a lane's
   float summation spans at most that many terms (a relative error of some 2e-6, against the 128
   terms of the short rows' bound). Then the candidates at or below tau are dropped. */
/* the coarse passes' entries at or below the coarse tau dropped as they are read (they add nothing to
   a later coarse sum: its taus only grow): compressed to the front of cf in the AVX-512 functions
   (sixteen floats stored whole at kept_ <= j: read already), left in place elsewhere (a scalar
   compaction costs about what the pass it saves) */
#define COARSE_KEEP_GEN(xv, vtf) ((void)0)
#define COARSE_SHRINK_GEN(L2) ((void)kept_)
#define COARSE_SHRINK_KEPT(L2) /* (W512, W256: the kept_ compressed, -inf after them) */         \
    do {                                                                                        \
        kc = kept_;                                                                             \
        for (int l = 0; l < L2; l++)                                                            \
            cf[kc + l] = -INFINITY;                                                             \
    } while (0)
#ifdef NMT_WIDE_AVX512
#define COARSE_KEEP_W512(xv, vtf)                                                               \
    do {                                                                                        \
        const __mmask16 m_ = _mm512_cmp_ps_mask((__m512)(xv), (__m512)(vtf), _CMP_GT_OQ);       \
        _mm512_storeu_ps(cf + kept_, _mm512_maskz_compress_ps(m_, (__m512)(xv)));               \
        kept_ += __builtin_popcount((unsigned)m_);                                              \
    } while (0)
#define COARSE_SHRINK_W512 COARSE_SHRINK_KEPT
#endif
/* One vector of sixteen floats into the coarse sums (COARSE_ACCUMULATE's contract) in the AVX-512
   functions: d^e = 2^(e log2 d) as POW512 takes it, in floats: log2 d from getexp / getmant, the
   mantissa's top four bits picking c_i = (33 + 2 i) / 32 (inv_i = 1 / c_i and lc_i = -log2(inv_i)
   rounded to floats, one register each, vpermps), r = m inv_i - 1 (|r| <= 1/32, one fused
   rounding), log2(1 + r) by its series to r^5 (truncation 2e-10); 2^y by sixteenths, 2^(j / 16)
   from a register, 2^f (|f| <= 1/32) by its series to degree 4 (truncation 4e-11), scalef; 0
   where y < -126 (as VEXP2F). No division (VLOG2F takes one) and fused multiply-adds: errors of
   the floats' roundings, about those of VLOG2F / VEXP2F, which the coarse margin covers. */
#define COARSE_ACCUMULATE_GEN COARSE_ACCUMULATE
#ifdef NMT_WIDE_AVX2 /* (the tables: the AVX2 functions' SETTLE_POW256 too) */
/* log2(1 + r) / r to r^4 (|r| <= 1/32: log2(1 + r) = r out to 2e-10) and 2^f (|f| <= 1/32) to f^4,
   floats, by the fused multiply-adds FMADD of vectors from SET1 (the AVX-512 and AVX2 powers) */
#define POW_LOG_SERIES(SET1, FMADD, r, out)                                                     \
    do {                                                                                        \
        (out) = SET1(0.28853902220726013f);                                                     \
        (out) = FMADD((out), (r), SET1(-0.3606737554073334f));                                  \
        (out) = FMADD((out), (r), SET1(0.48089835047721863f));                                  \
        (out) = FMADD((out), (r), SET1(-0.7213475108146667f));                                  \
        (out) = FMADD((out), (r), SET1(1.4426950216293335f));                                   \
    } while (0)
#define POW_EXP2_SERIES(SET1, FMADD, f, out)                                                    \
    do {                                                                                        \
        (out) = SET1(0.009618128649890423f);                                                    \
        (out) = FMADD((out), (f), SET1(0.05550410971045494f));                                  \
        (out) = FMADD((out), (f), SET1(0.24022650718688965f));                                  \
        (out) = FMADD((out), (f), SET1(0.6931471824645996f));                                   \
        (out) = FMADD((out), (f), SET1(1.0f));                                                  \
    } while (0)
static const float COARSE512_INV[16] __attribute__((unused)) = {
    0.9696969985961914f, 0.9142857193946838f, 0.8648648858070374f, 0.8205128312110901f, 0.7804877758026123f,
    0.7441860437393188f, 0.7111111283302307f, 0.6808510422706604f, 0.6530612111091614f, 0.6274510025978088f,
    0.6037735939025879f, 0.581818163394928f, 0.5614035129547119f, 0.5423728823661804f, 0.5245901346206665f,
    0.5079365372657776f};
static const float COARSE512_LC[16] __attribute__((unused)) = {
    0.044394075870513916f, 0.12928301095962524f, 0.20945332944393158f, 0.28540220856666565f,
    0.35755205154418945f, 0.42626476287841797f, 0.4918530583381653f, 0.5545889139175415f, 0.6147098541259766f,
    0.6724252700805664f, 0.727920413017273f, 0.7813597321510315f, 0.832889974117279f, 0.8826430439949036f,
    0.9307374358177185f, 0.9772798418998718f};
static const float COARSE512_T2[16] __attribute__((unused)) = {
    1.0f, 1.0442737340927124f, 1.0905077457427979f, 1.1387885808944702f, 1.1892070770263672f,
    1.2418577671051025f, 1.2968395948410034f, 1.3542555570602417f, 1.4142135381698608f, 1.4768261909484863f,
    1.5422108173370361f, 1.610490322113037f, 1.6817928552627563f, 1.7562521696090698f, 1.8340080976486206f,
    1.9152065515518188f};
#endif
#ifdef NMT_WIDE_AVX512
/* d^e of the lanes pos of d (sixteen floats; 0 in the others, and where y < -126), e the floats
   vef, the tables inv_, lc_, t2_ loaded (COARSE512_TABLES) */
#define COARSE512_TABLES                                                                        \
    const __m512 inv_ = _mm512_loadu_ps(COARSE512_INV), lc_ = _mm512_loadu_ps(COARSE512_LC);    \
    const __m512 t2_ = _mm512_loadu_ps(COARSE512_T2)
/* log2(1 + r) / r to r^4 (|r| <= 1/32: log2(1 + r) = r out to 2e-10), floats (COARSE_POW512,
   SETTLE_POW512) */
#define COARSE512_LOG_SERIES(r, out) POW_LOG_SERIES(_mm512_set1_ps, _mm512_fmadd_ps, r, out)
/* 2^f 2^(j mod 16 / 16): 2^f (|f| <= 1/32) by its series to f^4 times the table t2_ at j's low four
   bits, floats (COARSE_POW512, SETTLE_POW512) */
#define COARSE512_EXP2_FRACTION(f, j, out)                                                      \
    do {                                                                                        \
        POW_EXP2_SERIES(_mm512_set1_ps, _mm512_fmadd_ps, f, out);                               \
        (out) = _mm512_mul_ps((out), _mm512_permutexvar_ps((j), t2_));                          \
    } while (0)
#define COARSE_POW512(d, pos, vef, out)                                                         \
    do {                                                                                        \
        const __m512 dd_ = _mm512_mask_blend_ps(pos, _mm512_set1_ps(1.0f), d);                  \
        const __m512 k_ = _mm512_getexp_ps(dd_);                                                \
        const __m512 m_ = _mm512_getmant_ps(dd_, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);         \
        const __m512i i_ = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(m_), 19),     \
                                            _mm512_set1_epi32(15));                             \
        const __m512 r_ = _mm512_fmsub_ps(m_, _mm512_permutexvar_ps(i_, inv_), _mm512_set1_ps(1.0f)); \
        __m512 p_;                                                                              \
        COARSE512_LOG_SERIES(r_, p_);                                                           \
        const __m512 lg_ = _mm512_add_ps(_mm512_add_ps(k_, _mm512_permutexvar_ps(i_, lc_)),     \
                                         _mm512_mul_ps(p_, r_));                                \
        const __m512 y_ = _mm512_mul_ps((__m512)(vef), lg_);                                    \
        const __mmask16 under_ = _mm512_cmp_ps_mask(y_, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);   \
        const __m512 n_ = _mm512_roundscale_ps(y_, 0x40 | _MM_FROUND_TO_NEAREST_INT); /* 1/16ths */ \
        const __m512 f_ = _mm512_sub_ps(y_, n_);                                                \
        const __m512i j_ = _mm512_and_si512(_mm512_cvtps_epi32(_mm512_mul_ps(n_, _mm512_set1_ps(16.0f))), \
                                            _mm512_set1_epi32(15));                             \
        __m512 x_;                                                                              \
        COARSE512_EXP2_FRACTION(f_, j_, x_);                                                    \
        (out) = _mm512_maskz_scalef_ps((__mmask16)((pos) & ~under_), x_,                        \
                                       _mm512_roundscale_ps(n_, _MM_FROUND_TO_NEG_INF));        \
    } while (0)
#define COARSE_ACCUMULATE_W512(FT, FI, xv, vtf, vef, aqf, awf, nanf)                            \
    do {                                                                                        \
        COARSE512_TABLES;                                                                       \
        const __m512 d_ = _mm512_sub_ps((__m512)(xv), (__m512)(vtf));                           \
        const __mmask16 pos_ = _mm512_cmp_ps_mask(d_, _mm512_setzero_ps(), _CMP_GT_OQ);         \
        __m512 w_;                                                                              \
        COARSE_POW512(d_, pos_, vef, w_);                                                       \
        (awf) = (FT)_mm512_add_ps((__m512)(awf), w_);                                           \
        (aqf) = (FT)_mm512_add_ps((__m512)(aqf), _mm512_mul_ps(w_, _mm512_maskz_mov_ps(pos_, d_))); \
        (nanf) |= (FI)(((FT)d_) != ((FT)d_));                                                   \
    } while (0)
#endif
/* A broad row whose loop starts from a lower bound above the candidates' cut lo (the mean bound,
   mean(z) - k^(-1/q)) drops the candidates at or below it before its first pass of powers (no
   entry there is in the support) where the normal model puts at least this share of them there:
   a compress of doubles, some half a tick a candidate, where each float pass costs some two and a
   double one some four (alpha 1.6 at deviation 0.03, 32,000 scores: 8,800 candidates -> 5,300
   before the coarse passes) */
#define POWER_PREDROP_SHARE 0.25
#define POWER_LONG_COARSE_MIN_K 256
#define POWER_LONG_COARSE_CHUNK 32
#define LONG_COARSE(FT, FT2, FI2, L2, DT, L, V)                                                    \
    do {                                                                                        \
        float *cf = (float *)wk;                                                                \
        int64_t i = 0;                                                                          \
        for (; i + L <= k; i += L) {                                                            \
            DT dv;                                                                              \
            memcpy(&dv, cand + i, sizeof dv);                                                   \
            const FT fv = __builtin_convertvector(dv, FT);                                      \
            memcpy(cf + i, &fv, sizeof fv);                                                     \
        }                                                                                       \
        for (; i < k; i++)                                                                      \
            cf[i] = (float)cand[i];                                                             \
        for (int l = 0; l < L2; l++)                                                            \
            cf[k + l] = -INFINITY;                                                              \
        const double tau0 = tau;                                                                \
        int64_t kc = k; /* the entries of cf still above the coarse tau */                      \
        for (int c_ = 0; c_ < POWER_COARSE_MAX_STEPS; c_++) {                                   \
            FT2 zf = {0}, vtf = zf + (float)tau, vef = zf + (float)e;                           \
            FI2 nanf = {0};                                                                     \
            double hqd = 0.0, wsd = 0.0;                                                        \
            int64_t kept_ = 0;                                                                  \
            for (int64_t j0 = 0; j0 < kc; j0 += POWER_LONG_COARSE_CHUNK * L2) {                 \
                FT2 aqf = zf, awf = zf;                                                         \
                const int64_t j1 = kc - j0 > POWER_LONG_COARSE_CHUNK * L2                       \
                                   ? j0 + POWER_LONG_COARSE_CHUNK * L2 : kc;                    \
                for (int64_t j = j0; j < j1; j += L2) {                                         \
                    FT2 xv_;                                                                    \
                    memcpy(&xv_, cf + j, sizeof xv_);                                           \
                    COARSE_ACCUMULATE_##V(FT2, FI2, xv_, vtf, vef, aqf, awf, nanf);             \
                    COARSE_KEEP_##V(xv_, vtf);                                                  \
                }                                                                               \
                for (int l = 0; l < L2; l++) {                                                  \
                    hqd += (double)aqf[l];                                                      \
                    wsd += (double)awf[l];                                                      \
                }                                                                               \
            }                                                                                   \
            POWER_COUNT(3, 1);                                                                  \
            POWER_COUNT(4, kc);                                                                 \
            COARSE_SHRINK_##V(L2);                                                              \
            int nan_any = 0;                                                                    \
            for (int l = 0; l < L2; l++)                                                        \
                nan_any |= nanf[l] != 0;                                                        \
            if (nan_any || !(wsd > 0.0) || !(hqd > 0.0))                                        \
                break;                                                                          \
            const double h = vpow_2(hqd, a);                                                    \
            const double step = (h - 1.0) * (hqd / h) / wsd;                                    \
            if (!(step > POWER_COARSE_MARGIN))                                                  \
                break;                                                                          \
            tau += step - POWER_COARSE_MARGIN;                                                  \
            if (!(step >= POWER_COARSE_STOP))                                                   \
                break;                                                                          \
        }                                                                                       \
        if (tau > tau0)                                                                         \
            LONG_DROP_##V(cand, k, LONG_MOVE_INDEX);                                            \
    } while (0)

/* Steps in floats from the normal model's start (cut b of issue #16), LONG_FINE: Halley's step on
   h(t) = ||[cand - t]_+||_q - 1 at tau over the candidates cand[0 .. k), from the sums A = sum d^q,
   B = sum d^(q - 1), C = sum d^(q - 2) (h' = -A^(1/q - 1) B, h''/h' = -(q - 1)(A C - B^2) / (A B):
   Newton's step n = (A^(1/q) - 1) A^(1 - 1/q) / B over 1 + n h'' / (2 h')); d = cand - tau formed in
   double and then rounded to a float (a relative error of 6e-8 of d, where the coarse passes' float
   z err by 6e-8 absolute), its power in floats (COARSE_POW512), d^(q - 2) as d^(q - 1) times
   rcp14(d) (C only scales the correction), the sums in floats over POWER_LONG_COARSE_CHUNK vectors a
   lane, then in double. From the normal start (some 1e-4 off on normal rows) the step lands within
   the loop's tolerance (the powers' relative error, some 1e-7, moves it by about that times
   A / (q B); Halley's own error is about the cube of the start's); a second step follows a step
   longer than POWER_FINE_AGAIN (a start far off: a cut candidate set, no normal sample). The loop
   starts from where they land with from_above set (not a bound either way: a negative first step
   lands below the root), and its first double pass settles where Newton's double step, then a
   settling pass, took two (or three). From the normal start where the pseudo-row put
   POWER_FINE_MIN_SUPPORT of its entries in the support; where q < 2 (alpha > 1.5) C grows without
   bound as d -> 0 and Newton's step n is taken alone (from some 1e-4 off it lands within the
   tolerance on rows 40% or more in the support: alpha 1.55 and 1.6 at deviation 0.01, 8,000
   scores, settle; the double loop took two passes and its output scatters: some 78 -> 37 and 63 ->
   35 thousand ticks a row in those phases; narrower supports settle less often, alpha 1.7: 63%,
   and are left to the loop). Not where the pseudo-row's support is narrower (where the first
   double pass drops most candidates, the passes after it are short and a float pass over them all
   costs more than it saves: alpha 1.5 at deviation 0.03, 32,000 scores, a quarter in the support,
   took 1.75 float passes and 1.25 double ones for three double ones). Also after the coarse steps
   (a lower bound some POWER_COARSE_MARGIN below the root; their drops leave about the support;
   q >= 2 only: for q < 2 Newton's step from there did not settle): one step, then the settling pass where POWER_SETTLE_PAYS, where the double loop took a step and
   a second pass to settle (alpha 1.3 at deviation 0.3, 8,000 scores: 3 coarse and 2 double passes
   -> 3 coarse, 1 float step, 1 settling pass; the two double passes' 18.6 thousand ticks a row ->
   5.9 for the settling pass, the float step 5.5 more in the coarse phase). Also from the candidates'
   mean bound where the series cannot serve (the spread reaches the threshold's distance) and
   Newton's first step from that bound, (q - 1) var / (2 gap), is shorter than a coarse step's stop
   (no coarse step, no normal start there: alpha 1.4 at deviation 0.01, 32,000 scores, took three
   double passes; now one float and one double). A step is kept where it lands above the bound lo
   and below 0 (the maximum's z). W256 (the AVX2 functions): the same with eight lanes and
   SETTLE_POW256's powers. GEN: none. */
#define POWER_FINE_MIN_SUPPORT (POWER_NORMAL_N * 2 / 5)
#define POWER_FINE_AGAIN 1e-3
#define LONG_FINE_GEN ((void)0)
#ifdef NMT_WIDE_AVX512
/* sixteen d = c - tau, two vectors of eight doubles d0, d1 rounded to floats, into LONG_FINE's float
   sums aq_ (d^q), aw_ (d^(q - 1)), ac_ (d^(q - 2): d^(q - 1) rcp14(d)) over d > 0, the powers by
   COARSE_POW512 with the floats e in vef_ (LONG_FINE_W512, BLOCK_FINE_W512) */
#define FINE_ACCUMULATE512(d0, d1)                                                              \
    do {                                                                                        \
        const __m512 df_ = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(d0)),      \
                                              _mm512_cvtpd_ps(d1), 1);                          \
        const __mmask16 pos_ = _mm512_cmp_ps_mask(df_, _mm512_setzero_ps(), _CMP_GT_OQ);        \
        __m512 w_;                                                                              \
        COARSE_POW512(df_, pos_, vef_, w_);                                                     \
        aw_ = _mm512_add_ps(aw_, w_);                                                           \
        aq_ = _mm512_mask3_fmadd_ps(w_, df_, aq_, pos_);                                        \
        ac_ = _mm512_mask3_fmadd_ps(w_, _mm512_rcp14_ps(df_), ac_, pos_);                       \
    } while (0)
#define LONG_FINE_W512                                                                          \
    do {                                                                                        \
        COARSE512_TABLES;                                                                       \
        const __m512 vef_ = _mm512_set1_ps((float)e);                                           \
        const __m512d low_ = _mm512_set1_pd(-4.0); /* past k: below every tau (>= -1) */         \
        for (int s_ = 0; s_ < 2; s_++) { /* a second where the first was long */                \
            const __m512d tv_ = _mm512_set1_pd(tau);                                            \
            double hqf_ = 0.0, wsf_ = 0.0, csf_ = 0.0;                                          \
            for (int64_t j0_ = 0; j0_ < k; j0_ += 16 * POWER_LONG_COARSE_CHUNK) {               \
                const int64_t j1_ = k - j0_ > 16 * POWER_LONG_COARSE_CHUNK ? j0_ + 16 * POWER_LONG_COARSE_CHUNK : k; \
                __m512 aq_ = _mm512_setzero_ps(), aw_ = aq_, ac_ = aq_;                         \
                for (int64_t i_ = j0_; i_ < j1_; i_ += 16) {                                    \
                    const int64_t left_ = k - i_;                                               \
                    const __mmask8 m0_ = left_ >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << left_) - 1u); \
                    const __mmask8 m1_ = left_ >= 16 ? (__mmask8)0xFF                           \
                                         : left_ > 8 ? (__mmask8)((1u << (left_ - 8)) - 1u) : (__mmask8)0; \
                    const __m512d d0_ = _mm512_sub_pd(_mm512_mask_loadu_pd(low_, m0_, cand + i_), tv_); \
                    const __m512d d1_ = _mm512_sub_pd(_mm512_mask_loadu_pd(low_, m1_, cand + i_ + 8), tv_); \
                    FINE_ACCUMULATE512(d0_, d1_);                                               \
                }                                                                               \
                csf_ += _mm512_reduce_add_pd(F16_SUM_PD(ac_));                                  \
                hqf_ += _mm512_reduce_add_pd(F16_SUM_PD(aq_));                                  \
                wsf_ += _mm512_reduce_add_pd(F16_SUM_PD(aw_));                                  \
            }                                                                                   \
            POWER_COUNT(15, 1);                                                                 \
            if (!power_fine_step(hqf_, wsf_, csf_, a, qr, lo, &tau))                            \
                break;                                                                          \
        }                                                                                       \
    } while (0)
#endif

/* The settling pass in floats (LONG_SETTLE; the AVX-512 functions, and the AVX2 ones: W256 below): where the loop's start is meant
   to lie within the tolerance of the root (the moments' series; the float Halley step's landing),
   its first double pass only finds a step too short to take and keeps its powers for the output.
   This pass does that in floats, with a bound: d = c - tau formed in double and rounded to a float,
   w = d^(q - 1) by SETTLE_POW512 (relative error at most POWER_SETTLE_POW_ERR(e) units of 2^-24 of
   the float d's power: tests/sparse/test_power_settle.py measures it against float64), hq = sum w d
   and ws = sum w in floats over POWER_SETTLE_CHUNK vectors a lane, then in doubles. So each sum errs
   by at most POWER_SETTLE_ERR(e) units of 2^-24 relative (the power's error, the rounding of d taken
   to the power q, the lane's chunk of fused adds, one spare), plus what the terms below 2^-126 may
   lose (the pass's cut; d itself there, flushed where denormals are): k 2^-125 in hq, k
   max(2^-125, 2^(1 - 126 e)) in ws. Newton's step s = (hq - hq^(1 - 1/q)) / ws then errs by at most
   dhq (1/q + |h - 1|) / ws_lo + |s| dws / ws_lo (ws_lo = ws - dws; its derivatives, taken
   1.1 times for the second order): where |s| plus that stays within rtol max(1, |tau|), the double
   pass's step (some 1e-14 relative off the exact one) would be too short to take as well, so the
   loop would return this tau: the row is settled, and hq and the pass's powers serve the output: a
   row whose every entry is a candidate (k == len) has r^q = w d, r and w written in place by the
   pass (floats), LONG_SETTLED_OUTPUT then only scales them; the others keep w in wk[0 .. k) (floats
   as doubles) for LONG_OUTPUT. Outputs within some 10 units of 2^-24 of the double pass's (the
   tests allow 40, and 4e-7 absolute against float64). Otherwise (ws 0, the bound too wide, or a
   candidate whose r^q may fall below float32's normal range: SETTLE_POW512's faint lanes, where the
   float powers would flush or round an output the double pass keeps as a subnormal above 0, so a
   settled row's support is the double pass's) the double loop and its output run as before, the
   pass lost (tests/sparse/test_power_settle.py
   holds it under 5% of the normal rows tried; 1 in 1,376 on a wider grid). A float pass with the
   output in place costs about half a double pass and its output. Taken only where the bound is expected to be at most 0.4 of the tolerance
   (POWER_SETTLE_PAYS; the series' start leaves half of it to the step: hq / (q ws) is about the
   mean d, the threshold's gap k^(-1/q) at the root): at float32's tolerance, from some 80 candidates
   at alpha 1.45, 280 at 1.3, 550 at 1.25, 1,400 at 1.2, 5,700 at 1.15, 21,000 at 1.12.
   GEN: none (the double loop). */
#ifdef NMT_POWER_NO_SETTLE /* a diagnostic build (tests/sparse/test_power_settle.py): the double loop alone */
#define POWER_NO_SETTLE 1
#else
#define POWER_NO_SETTLE 0
#endif
#define POWER_SETTLE_CHUNK 4
#define POWER_SETTLE_POW_ERR(e) (4.0 + 0.5 * (e))
#define POWER_SETTLE_ERR(e) (POWER_SETTLE_POW_ERR(e) + ((e) + 1.0) + (POWER_SETTLE_CHUNK + 1.0) + 1.0)
#define POWER_SETTLE_PAYS(e, qr, gap, tau)                                                      \
    (POWER_SETTLE_ERR(e) * 0x1p-24 * (gap) / (qr) <= 0.4 * rtol * (fabs(tau) > 1.0 ? fabs(tau) : 1.0))
#if NMT_VECTORS
/* LONG_SETTLE's decision from the pass's sums hq = sum w d, ws = sum w over the k candidates at
   tau (each within POWER_SETTLE_ERR(e) units of 2^-24, plus what terms below 2^-126 may lose: w d <
   2^-125 each; w < max(2^-125, 2^(1 - 126 e)), e < 1: d^e of a d below 2^-126 is not small): whether
   Newton's step s = (hq - hq^(1 - 1/q)) / ws plus its error bound (dhq (1/q + |h - 1|) / ws_lo +
   |s| dws / ws_lo, taken 1.1 times for the second order) stays within rtol max(1, |tau|) (a, the
   caller's 1/q) */
static inline int power_settles(double hq, double ws, int64_t k, double e, double a, double rtol, double tau)
{
    const double c = POWER_SETTLE_ERR(e) * 0x1p-24;
    const double tq = (double)k * 0x1p-125, tw = (double)k * fmax(0x1p-125, exp2(1.0 - 126.0 * e));
    const double dq = c * hq + tq, dw = c * ws + tw, wlo = ws - dw;
    if (!(hq > 0.0 && hq < INFINITY && wlo > 0.0 && ws < INFINITY))
        return 0;
    const double h = vpow_2(hq, a);
    const double step = (h - 1.0) * (hq / h) / ws;
    const double err = 1.1 * (dq * (a + fabs(h - 1.0)) / wlo + dw / wlo * fabs(step));
    return fabs(step) + err <= rtol * (fabs(tau) > 1.0 ? fabs(tau) : 1.0);
}
/* LONG_FINE's step from its float sums A = hq, B = ws, C = cs at *tau (a = 1/q, qr = q): Halley's
   (Newton's where q < 2 or where Halley's correction is not sane), taken (*tau moved) where it lands
   above lo and below 0; returns whether it was longer than POWER_FINE_AGAIN (another step then) */
static inline int power_fine_step(double hq, double ws, double cs, double a, double qr, double lo, double *tau)
{
    if (!(ws > 0.0) || !(hq > 0.0))
        return 0;
    const double h = vpow_2(hq, a);
    const double newton = (h - 1.0) * (hq / h) / ws;
    const double den = qr < 2.0 ? 1.0 /* (q < 2: C unbounded near the edge; Newton's step) */
        : 1.0 - newton * (qr - 1.0) * (hq * cs - ws * ws) / (2.0 * hq * ws);
    const double step = den > 0.5 ? newton / den : newton; /* (Halley's, where sane) */
    if (!(*tau + step > lo && *tau + step < 0.0))
        return 0;
    *tau += step;
    return fabs(step) > POWER_FINE_AGAIN;
}
#endif
#define LONG_SETTLE_GEN ((void)0)
#ifdef NMT_WIDE_AVX512
/* d^e on the lanes pos of sixteen floats d (0 elsewhere and where e log2 d < -126), e = ef + elo
   (ef = e rounded to a float; the vectors vef, velo), the tables of COARSE512_TABLES loaded: as
   COARSE_POW512 (the same tables and polynomials), but y = e log2 d is not rounded to a float before
   2^y: s = k + lc_i with its rounding se (Fast2Sum: |k| >= 1 > lc_i or k = 0), e s as yh + ye (a
   fused multiply-subtract gives ye exactly), n = y rounded to sixteenths (from yh + e (log2(1 + r)
   + se)), and the fraction f = (yh - n) + ye + e (log2(1 + r) + se) + elo s, whose parts are each
   short (yh - n exact), so 2^f errs by the polynomials and some roundings of f (|f| <= 1/32)
   alone, where COARSE_POW512's y, rounded at its magnitude (up to 126), made the relative error
   grow with |y| (some 1e-7 (1 + |y|)). The error left: the tables' roundings (lc_i: 2^-25 times e
   in y), the series (2e-10 in log2, 4e-11 in 2^f), the roundings of 2^f, of t2_j and of the product
   (about 3 units of 2^-24): POWER_SETTLE_POW_ERR. The lanes off pos are not blended to a harmless
   value (their getexp / getmant of zeros or negatives are ignored: masked at the end); the tables'
   indices are not masked to four bits (vpermps reads the low four); scalef floors n itself. The
   mask faint gathers the lanes of pos where q log2 d = y + s (q = e + 1) is below -124: d^q, the
   lane's r^q, may fall below float32's normal range (or d^e below the pass's cut). */
#define SETTLE_POW512(d, pos, vef, velo, out, faint)                                            \
    do {                                                                                        \
        const __m512 k_ = _mm512_getexp_ps(d);                                                  \
        const __m512 m_ = _mm512_getmant_ps(d, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);           \
        const __m512i i_ = _mm512_srli_epi32(_mm512_castps_si512(m_), 19); /* (vpermps: low 4 bits) */ \
        const __m512 r_ = _mm512_fmsub_ps(m_, _mm512_permutexvar_ps(i_, inv_), _mm512_set1_ps(1.0f)); \
        __m512 p_;                                                                              \
        COARSE512_LOG_SERIES(r_, p_);                                                           \
        const __m512 lci_ = _mm512_permutexvar_ps(i_, lc_);                                     \
        const __m512 s_ = _mm512_add_ps(k_, lci_);                                              \
        const __m512 se_ = _mm512_sub_ps(lci_, _mm512_sub_ps(s_, k_));                          \
        const __m512 corr_ = _mm512_fmadd_ps(p_, r_, se_);                                      \
        const __m512 yh_ = _mm512_mul_ps((vef), s_);                                            \
        const __m512 ye_ = _mm512_fmsub_ps((vef), s_, yh_);                                     \
        const __m512 ya_ = _mm512_fmadd_ps((vef), corr_, yh_);                                  \
        const __mmask16 under_ = _mm512_cmp_ps_mask(ya_, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);  \
        (faint) |= (__mmask16)((pos) & _mm512_cmp_ps_mask(_mm512_add_ps(ya_, s_), _mm512_set1_ps(-124.0f), _CMP_LT_OQ)); \
        const __m512 n_ = _mm512_roundscale_ps(ya_, 0x40 | _MM_FROUND_TO_NEAREST_INT); /* 1/16ths */ \
        __m512 f_ = _mm512_fmadd_ps((vef), corr_, _mm512_add_ps(_mm512_sub_ps(yh_, n_), ye_));  \
        f_ = _mm512_fmadd_ps((velo), s_, f_);                                                   \
        const __m512i j_ = _mm512_cvtps_epi32(_mm512_mul_ps(n_, _mm512_set1_ps(16.0f)));        \
        __m512 x_;                                                                              \
        COARSE512_EXP2_FRACTION(f_, j_, x_);                                                    \
        (out) = _mm512_maskz_scalef_ps((__mmask16)((pos) & ~under_), x_, n_); /* x 2^floor(n) */ \
    } while (0)
#define SETTLE_WIDEN_SUM(acc, v)                                                                \
    (acc) = _mm512_add_pd((acc), F16_SUM_PD(v))
/* one vector of sixteen candidates from cand + i_ (the masks m0_, m1_ of the halves read: constants
   in the loop over whole vectors) into the lane sums aq_, aw_, the output or wk (LONG_SETTLE_W512) */
#define SETTLE_VECTOR(m0_, m1_)                                                                 \
    do {                                                                                        \
        const __m512d d0_ = _mm512_sub_pd(_mm512_mask_loadu_pd(low_, (m0_), cand + i_), tv_);  \
        const __m512d d1_ = _mm512_sub_pd(_mm512_mask_loadu_pd(low_, (m1_), cand + i_ + 8), tv_); \
        const __m512 df_ = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(d0_)),     \
                                              _mm512_cvtpd_ps(d1_), 1);                         \
        const __mmask16 pos_ = _mm512_cmp_ps_mask(df_, _mm512_setzero_ps(), _CMP_GT_OQ);        \
        __m512 w_;                                                                              \
        SETTLE_POW512(df_, pos_, vef_, velo_, w_, faint_);                                      \
        aw_ = _mm512_add_ps(aw_, w_);                                                           \
        aq_ = _mm512_mask3_fmadd_ps(w_, df_, aq_, pos_);                                        \
        if (k == len) { /* in place: r^q = w d (normalised after), r, w */                       \
            const __mmask16 m_ = (__mmask16)((m0_) | ((unsigned)(m1_) << 8));                   \
            _mm512_mask_storeu_ps(pr + i_, m_, _mm512_maskz_mul_ps(pos_, w_, df_));             \
            if (rr)                                                                             \
                _mm512_mask_storeu_ps(rr + i_, m_, _mm512_maskz_mov_ps(pos_, df_));             \
            if (wr)                                                                             \
                _mm512_mask_storeu_ps(wr + i_, m_, w_);                                         \
        } else {                                                                                \
            _mm512_mask_storeu_pd(wk + i_, (m0_), F16_LO_PD(w_));                               \
            _mm512_mask_storeu_pd(wk + i_ + 8, (m1_), F16_HI_PD(w_));                           \
        }                                                                                       \
    } while (0)
/* (no NaN can reach the pass: rows holding one stop at their maximum; a NaN or inf sum would fail
   the test below anyway) */
#define LONG_SETTLE_W512                                                                        \
    do {                                                                                        \
        COARSE512_TABLES;                                                                       \
        const float ef_ = (float)e;                                                             \
        const __m512 vef_ = _mm512_set1_ps(ef_), velo_ = _mm512_set1_ps((float)(e - (double)ef_)); \
        const __m512d tv_ = _mm512_set1_pd(tau);                                                \
        const __m512d low_ = _mm512_set1_pd(-4.0); /* past k: below every tau (>= -1) */         \
        __m512d hqd_ = _mm512_setzero_pd(), wsd_ = hqd_;                                        \
        __mmask16 faint_ = 0; /* lanes whose r^q = d^q may fall below 2^-124 */                 \
        for (int64_t i_ = 0; i_ < k;) {                                                         \
            const int64_t j1_ = k - i_ > 16 * POWER_SETTLE_CHUNK ? i_ + 16 * POWER_SETTLE_CHUNK : k; \
            __m512 aq_ = _mm512_setzero_ps(), aw_ = aq_;                                        \
            for (; i_ + 16 <= j1_; i_ += 16)                                                    \
                SETTLE_VECTOR((__mmask8)0xFF, (__mmask8)0xFF);                                  \
            if (i_ < j1_) { /* the last, fewer than sixteen */                                  \
                const int64_t left_ = j1_ - i_;                                                 \
                const __mmask8 m0_ = left_ >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << left_) - 1u); \
                const __mmask8 m1_ = left_ > 8 ? (__mmask8)((1u << (left_ - 8)) - 1u) : (__mmask8)0; \
                SETTLE_VECTOR(m0_, m1_);                                                        \
                i_ = j1_;                                                                       \
            }                                                                                   \
            SETTLE_WIDEN_SUM(hqd_, aq_);                                                        \
            SETTLE_WIDEN_SUM(wsd_, aw_);                                                        \
        }                                                                                       \
        const double hqf_ = _mm512_reduce_add_pd(hqd_), wsf_ = _mm512_reduce_add_pd(wsd_);      \
        POWER_COUNT(16, 1);                                                                     \
        if (!faint_ && power_settles(hqf_, wsf_, k, e, a, rtol, tau)) {                         \
            settled_ = 1;                                                                       \
            hq = hqf_;                                                                          \
            POWER_COUNT(17, 1);                                                                 \
        }                                                                                       \
    } while (0)
#endif

/* Step 5's loop eight candidates at a time (W512: the AVX-512 functions; the same products and
   roundings as the loop entry by entry, written by scatters, or by one store where the eight
   candidates' places follow each other (a broad row that lost a few entries to the bound keeps
   long runs: 31,997 of 32,000 at alpha 1.3, deviation 0.1; the scatters cost some ten times the
   stores there); the sums (only where the stats are
   asked for) in vectors, where one by
   one they were a chain of dependent adds: 1.1 ns a candidate on a broad row); GEN: none */
#define LONG_OUTPUT_GEN ((void)0)
#ifdef NMT_WIDE_AVX512
#define LONG_OUTPUT_W512                                                                        \
    do {                                                                                        \
        if (st)                                                                                 \
            LONG_OUTPUT_EIGHTS(1);                                                              \
        else /* (no stats asked for: no sums, r converted only where written) */               \
            LONG_OUTPUT_EIGHTS(0);                                                              \
    } while (0)
#define LONG_OUTPUT_EIGHTS(SUMS)                                                                \
    do {                                                                                        \
        const __m512d tv_ = _mm512_set1_pd(tau), iv_ = _mm512_set1_pd(inv);                    \
        const __m256i iota_ = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);                       \
        __m512d ps_ = _mm512_setzero_pd(), prs_ = ps_;                                          \
        for (; i + 8 <= k; i += 8) {                                                            \
            const __m512d c_ = _mm512_loadu_pd(cand + i), w_ = _mm512_loadu_pd(wk + i);        \
            const __mmask8 in_ = _mm512_cmp_pd_mask(c_, tv_, _CMP_GT_OQ);                       \
            const __m512d d_ = _mm512_maskz_sub_pd(in_, c_, tv_);                               \
            const __m256 pf_ = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_mul_pd(w_, d_), iv_));      \
            /* every entry a candidate (k == len): idx[i] = i, stored in place (idx unread: a row \
               kept whole leaves it unwritten); else eight places in a row: stored there */     \
            const int64_t at_ = k == len ? i : (int64_t)idx[i];                                 \
            __m256i ix_ = iota_;                                                                \
            int run_ = k == len;                                                                \
            if (!run_) {                                                                        \
                ix_ = _mm256_loadu_si256((const __m256i *)(idx + i));                           \
                run_ = _mm256_cmpeq_epi32_mask(ix_, _mm256_add_epi32(_mm256_set1_epi32((int32_t)at_), iota_)) \
                       == (__mmask8)0xFF;                                                       \
            }                                                                                   \
            if (run_) {                                                                         \
                _mm256_storeu_ps(pr + at_, pf_);                                                \
                if (rr)                                                                         \
                    _mm256_storeu_ps(rr + at_, _mm512_cvtpd_ps(d_));                            \
                if (wr)                                                                         \
                    _mm256_storeu_ps(wr + at_, _mm512_cvtpd_ps(w_));                            \
            } else {                                                                            \
                _mm256_i32scatter_ps(pr, ix_, pf_, 4);                                          \
                if (rr)                                                                         \
                    _mm256_i32scatter_ps(rr, ix_, _mm512_cvtpd_ps(d_), 4);                      \
                if (wr)                                                                         \
                    _mm256_i32scatter_ps(wr, ix_, _mm512_cvtpd_ps(w_), 4);                      \
            }                                                                                   \
            if (SUMS) {                                                                         \
                const __m512d pd_ = _mm512_cvtps_pd(pf_);                                       \
                ps_ = _mm512_add_pd(ps_, pd_);                                                  \
                prs_ = _mm512_add_pd(prs_, _mm512_mul_pd(pd_, _mm512_cvtps_pd(_mm512_cvtpd_ps(d_)))); \
            }                                                                                   \
        }                                                                                       \
        psum += _mm512_reduce_add_pd(ps_);                                                      \
        prsum += _mm512_reduce_add_pd(prs_);                                                    \
    } while (0)
#endif

/* The output of a row the settling pass settled with every entry a candidate (k == len): the pass
   wrote r^q = w d (floats: the float powers' product), r and w in place; here p = r^q inv in floats
   (inv = 1 / hq rounded to a float: the double path's p = w d inv in doubles, rounded once, differs
   by some 3 units of 2^-24 more), with the stats' sums of p and p r in doubles as LONG_OUTPUT's (r
   from the candidates as there). i = k after it. Otherwise (or GEN) LONG_OUTPUT. */
#define LONG_SETTLED_OUTPUT_GEN LONG_OUTPUT_GEN
#ifdef NMT_WIDE_AVX512
#define LONG_SETTLED_OUTPUT_W512                                                                \
    do {                                                                                        \
        if (!(settled_ && k == len)) {                                                          \
            LONG_OUTPUT_W512;                                                                   \
            break;                                                                              \
        }                                                                                       \
        const __m512 ivf_ = _mm512_set1_ps((float)inv);                                         \
        const __m512d tv_ = _mm512_set1_pd(tau), low_ = _mm512_set1_pd(-4.0);                  \
        __m512d ps_ = _mm512_setzero_pd(), prs_ = ps_;                                          \
        for (; i < k; i += 16) {                                                                \
            const int64_t left_ = k - i;                                                        \
            const __mmask16 m_ = left_ >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left_) - 1u); \
            const __m512 pf_ = _mm512_mul_ps(_mm512_maskz_loadu_ps(m_, pr + i), ivf_);          \
            _mm512_mask_storeu_ps(pr + i, m_, pf_);                                             \
            if (st) {                                                                           \
                const __m512d p0_ = F16_LO_PD(pf_);                                             \
                const __m512d p1_ = F16_HI_PD(pf_);                                             \
                const __m512d c0_ = _mm512_mask_loadu_pd(low_, (__mmask8)m_, cand + i);         \
                const __m512d c1_ = _mm512_mask_loadu_pd(low_, (__mmask8)(m_ >> 8), cand + i + 8); \
                const __m512d d0_ = _mm512_maskz_sub_pd(_mm512_cmp_pd_mask(c0_, tv_, _CMP_GT_OQ), c0_, tv_); \
                const __m512d d1_ = _mm512_maskz_sub_pd(_mm512_cmp_pd_mask(c1_, tv_, _CMP_GT_OQ), c1_, tv_); \
                ps_ = _mm512_add_pd(ps_, _mm512_add_pd(p0_, p1_));                              \
                prs_ = _mm512_fmadd_pd(p0_, _mm512_cvtps_pd(_mm512_cvtpd_ps(d0_)), prs_);         \
                prs_ = _mm512_fmadd_pd(p1_, _mm512_cvtps_pd(_mm512_cvtpd_ps(d1_)), prs_);         \
            }                                                                                   \
        }                                                                                       \
        i = k;                                                                                  \
        psum += _mm512_reduce_add_pd(ps_);                                                      \
        prsum += _mm512_reduce_add_pd(prs_);                                                    \
    } while (0)
#endif


#include "_power_avx2.h" /* the AVX2 functions' float passes (W256) */

#define DEFINE_POWER_LONG(NAME, ATTR, FT, IT32, DT, IT, L, ANY, V, FT2, FI2, L2)                              \
ATTR static void NAME(const float *xs, int64_t rows, int64_t len, const double *am1, int64_t a_stride, \
                      int64_t max_iter, double rtol, float *p, float *root, float *weights,     \
                      float *stats, double *cand)                                               \
{                                                                                               \
    int64_t m_acc = len / (POWER_LONG_BLOCK * L);                                               \
    const int64_t most_ = POWER_LONG_MAX_ACC * 8 / L; /* (at most 256 maxima at every width: the \
        AVX2 functions' four lanes had half the AVX-512 ones' on long rows, a bound some 50% wider) */ \
    m_acc = m_acc < 1 ? 1 : m_acc > most_ ? most_ : m_acc;                                      \
    const int64_t seg = (len / (m_acc * L)) * L; /* entries a segment (the last: to the end) */ \
    double *wk = cand + len + 8;     /* the candidates' d^(q - 1) at the last pass */           \
    double *bz = wk + len + 8;       /* the block maxima */                                     \
    int32_t *idx = (int32_t *)(bz + POWER_LONG_MAX_ACC * 8); /* the candidates' places */       \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const float *xr = xs + r * len;                                                         \
        float *pr = p + r * len, *rr = root ? root + r * len : 0;                               \
        float *wr = weights ? weights + r * len : 0;                                            \
        float *st = stats ? stats + POWER_STATS * r : 0;                                        \
        const double a = am1[r * a_stride], qr = 1.0 / a, e = qr - 1.0;                         \
        float bm[POWER_LONG_MAX_ACC * 8]; /* 1. the maxima of the segments' lanes */             \
        FT xv;                                                                                  \
        int64_t j = 0;                                                                          \
        float top = -INFINITY;                                                                  \
        int bad = 0;                                                                            \
        POWER_ROW_START;                                                                    \
        SEGMENT_MAXIMA(float, FT, IT32, L, xr, len, m_acc, seg, bm, top, bad);                  \
        if (bad || top == -INFINITY) { /* NaN / +inf: all NaN; no finite entry: all zeros */    \
            power_fill_outputs(pr, rr, wr, 0, len, bad ? NAN : 0.0f);                           \
            if (st) {                                                                           \
                st[0] = bad ? -1.0f : INFINITY;                                                 \
                st[1] = st[2] = st[3] = st[4] = bad ? NAN : 0.0f;                               \
            }                                                                                   \
            continue;                                                                           \
        }                                                                                       \
        double hq = 0.0, tau = -1.0;                                                            \
        int from_above = 0; /* the loop's start may lie above the root (its first step then negative) */ \
        POWER_PHASE(0);                                                                     \
        int64_t k = 0; /* 2. the bound from the block maxima */                                 \
        for (int64_t i = 0; i < m_acc * L; i++) {                                               \
            bz[k] = ((double)bm[i] - top) * a;                                                  \
            k += bz[k] > -1.0;                                                                  \
        }                                                                                       \
        LONG_NEWTON(DT, IT, L, bz, k, POWER_LONG_BOUND_RTOL, KEEP_NOTHING, LONG_MOVE_NOTHING, V); \
        tau -= 1e-9 * (fabs(tau) > 1.0 ? fabs(tau) : 1.0); /* the polynomials' rounding */      \
        tau = tau > -1.0 ? tau : -1.0;                                                          \
        const double lo = tau;                                                                  \
        POWER_PHASE(1);                                                                     \
        double mom[POWER_SERIES_ORDER + 1], abs7 = 0.0, dlo = 0.0, dhi = 0.0, r0 = 0.0;           \
        int moments_ = 0; /* the candidates' step set mom, abs7, dlo, dhi, r0 (LONG_CONVERT_MOMENTS) */ \
        int whole_ = 0;   /* every entry a candidate, from the scores (LONG_WHOLE_W512) */         \
        int fine_ = 0;    /* float steps from the normal start or the mean bound (LONG_FINE) */ \
        int settle_ = 0;  /* the start meant to settle: a float pass tries first (LONG_SETTLE) */ \
        int idx_lazy_ = 0; /* the candidates' places not written: the identity (LONG_MOVE_INDEX) */ \
        (void)whole_;                                                                           \
        { /* 3. the candidates above it */                                                      \
            const float cut = power_float_below((double)top + lo / a);                          \
            LONG_CANDIDATES_##V(FT, IT32, DT, IT, L, ANY);                                          \
        }                                                                                       \
        POWER_PHASE(2);                                                                     \
        const int steps_ok = max_iter >= POWER_COARSE_MIN_ITER && e <= POWER_COARSE_MAX_E       \
                             && k >= POWER_LONG_COARSE_MIN_K; /* (float steps: coarse, LONG_FINE) */ \
        int coarse = steps_ok, near_ = 0; /* near_: from the mean bound, a short first step */   \
        if (k > len / 4) { /* a broad row: the candidates' mean bound, mean(z) - k^(-1/q) (the power\
                              mean: their sum [z - t]_+^q is at least 1 there), often the closer */\
            if (!moments_) { /* (the W512 candidates' step took them) */                          \
                const int64_t k0 = k < 256 ? k : 256; /* the moments' centre: the first ones' mean */ \
                for (int64_t i = 0; i < k0; i++)                                                \
                    r0 += cand[i];                                                              \
                r0 /= (double)k0;                                                               \
                LONG_MOMENTS(DT, IT, L);                                                        \
            }                                                                                   \
            const double m1 = mom[1] / (double)k, mean = r0 + m1, gap = pow((double)k, -a);      \
            double mb = mean - gap;                                                             \
            const double var = mom[2] / (double)k - m1 * m1;                                    \
            mb -= 1e-9 * (fabs(mb) > 1.0 ? fabs(mb) : 1.0); /* the sum's rounding */            \
            if (mb > tau) {                                                                     \
                tau = mb;                                                                       \
                /* where every candidate stays in the support, Newton's first step from there is\
                   about (q - 1) var / (2 gap): shorter than a coarse step's stop, the coarse steps\
                   would only delay the loop (scores within 0.01 of each other at alpha 1.3) */ \
                coarse = coarse && (qr - 1.0) * var / (2.0 * gap) >= POWER_COARSE_STOP;         \
                near_ = steps_ok && !coarse;                                                    \
            }                                                                                   \
            /* every candidate inside the support: the root of the moments' series (the root's \
               u is at most about the gap: the power mean) */                                   \
            const double spread = fabs(dlo) > dhi ? fabs(dlo) : dhi;                            \
            double u = 0.0;                                                                     \
            if (spread < gap) {                                                                 \
                if (!moments_)                                                                  \
                    LONG_MOMENTS_HIGH(DT, IT, L);                                               \
                u = power_series_root(mom, abs7, qr, gap, spread, rtol);                        \
            }                                                                                   \
            /* less half the tolerance: below the root where the truncation is as estimated, \
               and the loop's first step, some half the tolerance, settles it */                \
            const double ts = r0 - u - 0.5 * rtol * (fabs(r0 - u) > 1.0 ? fabs(r0 - u) : 1.0);  \
            if (u > 0.0 && ts > tau) {                                                          \
                tau = ts;                                                                       \
                coarse = 0;                                                                     \
                from_above = 1;                                                                 \
                settle_ = steps_ok && POWER_SETTLE_PAYS(e, qr, gap, tau);                       \
            } else if (u == 0.0 && coarse && var > 0.0 && k >= len - len / 16) { /* normal model */ \
                const int bad0 = bad;                                                           \
                const double lb = tau, cn = pow((double)k / POWER_NORMAL_N, a), sd = sqrt(var);  \
                for (int j_ = 0; j_ < POWER_NORMAL_N / 2; j_++) {                               \
                    bz[POWER_NORMAL_N / 2 + j_] = cn * (mean + sd * POWER_NORMAL_Q[j_]);         \
                    bz[POWER_NORMAL_N / 2 - 1 - j_] = cn * (mean - sd * POWER_NORMAL_Q[j_]);     \
                }                                                                               \
                const double bmean = cn * mean, bmax = bz[POWER_NORMAL_N - 1];                  \
                tau = bmean - pow((double)POWER_NORMAL_N, -a);                                  \
                tau = tau > bmax - 1.0 ? tau : bmax - 1.0;                                      \
                int64_t kn = POWER_NORMAL_N;                                                    \
                LONG_NEWTON(DT, IT, L, bz, kn, POWER_NORMAL_RTOL, KEEP_NOTHING, LONG_MOVE_NOTHING, V); \
                const double tn = tau / cn;                                                     \
                tau = lb;                                                                       \
                if (!bad && tn > lb && tn < 0.0) {                                              \
                    tau = tn;                                                                   \
                    coarse = 0;                                                                 \
                    from_above = 1;                                                             \
                    fine_ = kn >= POWER_FINE_MIN_SUPPORT;                                       \
                    settle_ = fine_ && POWER_SETTLE_PAYS(e, qr, gap, tau);                      \
                }                                                                               \
                bad = bad0;                                                                     \
            } else if (u == 0.0 && near_ && qr >= 2.0) { /* the mean bound, a step short of it */ \
                from_above = 1;                                                                 \
                fine_ = 1;                                                                      \
                settle_ = POWER_SETTLE_PAYS(e, qr, gap, tau);                                  \
            }                                                                                   \
            if (!from_above && tau > lo && var > 0.0                                            \
                && erfc((mean - tau) / sqrt(2.0 * var)) >= 2.0 * POWER_PREDROP_SHARE)           \
                LONG_DROP_##V(cand, k, LONG_MOVE_INDEX); /* (the mean bound's, before any pass) */ \
        }                                                                                       \
        POWER_PHASE(3);                                                                     \
        POWER_COUNT(0, 1);                                                                      \
        POWER_COUNT(2, k);                                                                      \
        if (coarse)                                                                             \
            LONG_COARSE(FT, FT2, FI2, L2, DT, L, V); /* 4. the threshold: coarse steps, then */ \
        if (coarse && qr >= 2.0) { /* (LONG_FINE: after them too, some POWER_COARSE_MARGIN off) */ \
            from_above = 1;                                                                     \
            fine_ = 1;                                                                          \
            settle_ = POWER_SETTLE_PAYS(e, qr, pow((double)k, -a), tau);                        \
        }                                                                                       \
        if (fine_)                                                                              \
            LONG_FINE_##V;                                                                      \
        POWER_PHASE(4);                                                                     \
        int settled_ = 0;                                                                       \
        if (settle_ && !POWER_NO_SETTLE)                                                        \
            LONG_SETTLE_##V;                                                                    \
        if (!settled_)                                                                          \
            LONG_NEWTON(DT, IT, L, cand, k, rtol, LONG_KEEP_W, LONG_MOVE_INDEX, V);             \
        POWER_PHASE(5);                                                                     \
        /* 5. the output: zeros, then r^q = d^(q - 1) d from the last pass at the candidates left */ \
        const double inv = hq > 0.0 ? 1.0 / hq : 1.0;                                           \
        if (k < len) /* (k == len: every entry a candidate, in order; every one written below) */ \
            power_fill_outputs(pr, rr, wr, 0, len, 0.0f);                                       \
        double psum = 0.0, prsum = 0.0;                                                         \
        int64_t i = 0;                                                                          \
        LONG_SETTLED_OUTPUT_##V; /* eight at a time where vectors serve, then one by one */     \
        for (; i < k; i++) { /* (w is 0 off the support: zeros written there) */                \
            const double d = cand[i] > tau ? cand[i] - tau : 0.0;                               \
            const float pf = (float)(wk[i] * d * inv), rf = (float)d;                           \
            const int64_t at = idx_lazy_ ? i : idx[i]; /* (a row kept whole: in order) */       \
            pr[at] = pf;                                                                        \
            if (rr)                                                                             \
                rr[at] = rf;                                                                    \
            if (wr)                                                                             \
                wr[at] = (float)wk[i];                                                          \
            psum += (double)pf;                                                                 \
            prsum += (double)pf * (double)rf;                                                   \
        }                                                                                       \
        POWER_PHASE(6);                                                                     \
        for (int64_t i2 = 0; i2 < k; i2++)                                                      \
            POWER_COUNT(7, cand[i2] > tau);                                                     \
        if (st) {                                                                               \
            st[0] = (float)tau;                                                                 \
            st[1] = top;                                                                        \
            st[2] = (float)hq;                                                                  \
            st[3] = (float)psum;                                                                \
            st[4] = (float)prsum;                                                               \
        }                                                                                       \
    }                                                                                           \
}

/* The backward of alpha-entmax for a float alpha (or one per row) from the forward's r = [z - tau]_+:
 * s = r^e on the support (e = (2 - alpha) / (alpha - 1): s is p^(2 - alpha) up to the row's scale,
 * which the formula cancels), J^T g = s (g - <s, g> / sum s), sums in double. One pass forms s
 * (written to out; chunks of L entries without a support entry are zeros after one comparison)
 * and both sums, a second scales out in place. A NaN r gives NaN (as torch's r^e would).
 * e = 1 (s given: the forward's last powers, or 1.5-entmax's r = sqrt(p)) and e = 0 (s = 1 on the
 * support: sparsemax, r = p; a NaN is outside it, as torch's sign(NaN) = 0 has it) take no power, so their first pass tests no chunk (that branch
 * mispredicts on sparse rows) and takes a short row's last entries one by one, without copies.
 * A learnable alpha's gradient (ga given; r is then the output p, e = 2 - alpha, am1 = alpha - 1):
 * dp/dalpha = w - s sum w / sum s with w = p (1 - (alpha - 1) ln p) / (alpha - 1)^2 on the support
 * (the derivative of the fixed point; ln p from the same logarithm as the power), so <g, dp/dalpha>
 * = <g, w> - <g, s> sum w / sum s, sums taken in the same pass. */
/* one chunk of L entries of the backward's first pass: rp, gp, op point at L floats; where alpha's
   gradient is asked for, w = p (1 - (alpha - 1) ln p) / (alpha - 1)^2 and its sums too: read at dp
   (L floats, the forward's, where da is given) or from rp's p (va: alpha - 1) */
#define POWER_BACKWARD_CHUNK(FT, IT32, DT, IT, ANY, V, rp, gp, dp, op)                         \
    do {                                                                                        \
        FT rv, gv;                                                                              \
        memcpy(&rv, rp, sizeof rv);                                                             \
        const IT32 c = ~(rv <= fz); /* the support, and NaN */                                  \
        if (raise && !ANY(c)) { /* (without powers, no test: its branch mispredicts on sparse rows) */ \
            memcpy(op, &fz, sizeof fz);                                                         \
            break;                                                                              \
        }                                                                                       \
        memcpy(&gv, gp, sizeof gv);                                                             \
        const DT d = __builtin_convertvector(rv, DT);                                           \
        const IT m = d > zero;                                                                  \
        DT lg = zero, w = e0 ? one : d; /* e = 0 (the support's indicator), 1 (s given): no power */ \
        if (raise)                                                                              \
            BACKWARD_POWER_##V(DT, IT, SEL(IT, DT, m, d, one), lg, w);                          \
        w = SEL(IT, DT, m, w, e0 ? zero : d * 0.0); /* 0 off the support, NaN for NaN (e = 0: 0) */ \
        const DT gd = __builtin_convertvector(gv, DT);                                          \
        as += w;                                                                                \
        ag += w * gd;                                                                           \
        if (ga && da) { /* the forward's dp/dalpha (dalpha): no logarithm here */               \
            FT dv;                                                                              \
            memcpy(&dv, dp, sizeof dv);                                                         \
            agw += __builtin_convertvector(dv, DT) * gd;                                        \
        } else if (ga) { /* ln p = log2 p ln 2, from the logarithm above */                    \
            const DT wa = SEL(IT, DT, m, d * (one - va * (lg * POW_LN2)) / (va * va), d * 0.0); \
            aw += wa;                                                                           \
            agw += wa * gd;                                                                     \
        }                                                                                       \
        const FT sv = __builtin_convertvector(w, FT);                                           \
        memcpy(op, &sv, sizeof sv);                                                             \
    } while (0)
#define DEFINE_POWER_BACKWARD(NAME, ATTR, FT, IT32, DT, IT, L, ANY, V)                               \
ATTR static void NAME(const float *r, const float *g, int64_t rows, int64_t n, const double *e, \
                      int64_t e_stride, const double *am1, int64_t a_stride, const float *da,   \
                      float *out, float *ga)                                                    \
{                                                                                               \
    const DT zero = {0}, one = zero + 1.0;                                                      \
    const FT fz = {0};                                                                          \
    for (int64_t row = 0; row < rows; row++) {                                                  \
        const float *rr = r + row * n, *gr = g + row * n;                                       \
        const float *dr = da ? da + row * n : gr; /* (without da: never read) */                \
        float *o = out + row * n;                                                               \
        /* alpha's gradient from p: its logarithm (none where the forward's dp/dalpha is given) */ \
        const int from_p = ga && !da;                                                           \
        const double er = e[row * e_stride], ar = from_p ? am1[row * a_stride] : 0.0;           \
        const int raise = (er != 1.0 && er != 0.0) || from_p;                                   \
        const int e0 = er == 0.0;                                                               \
        DT ve, va, as = zero, ag = zero, aw = zero, agw = zero;                                 \
        for (int l = 0; l < L; l++) {                                                           \
            ve[l] = er;                                                                         \
            va[l] = ar;                                                                         \
        }                                                                                       \
        int64_t j = 0;                                                                          \
        for (; j + L <= n; j += L)                                                              \
            POWER_BACKWARD_CHUNK(FT, IT32, DT, IT, ANY, V, rr + j, gr + j, dr + j, o + j);      \
        if (j < n && !raise) { /* the last entries one by one (short rows: no copies) */       \
            for (; j < n; j++) {                                                                \
                const double d = rr[j];                                                         \
                const double w = d > 0.0 ? (e0 ? 1.0 : d) : e0 ? 0.0 : d * 0.0;                 \
                as[0] += w;                                                                     \
                ag[0] += w * (double)gr[j];                                                     \
                if (ga && da)                                                                   \
                    agw[0] += (double)dr[j] * (double)gr[j];                                    \
                o[j] = (float)w;                                                                \
            }                                                                                   \
        }                                                                                       \
        if (j < n) { /* the last entries, padded with zeros */                                  \
            float rt[L], gt[L], dt[L], ot[L];                                                   \
            memset(rt, 0, sizeof rt);                                                           \
            memset(gt, 0, sizeof gt);                                                           \
            memset(dt, 0, sizeof dt);                                                           \
            memcpy(rt, rr + j, (size_t)(n - j) * sizeof(float));                                \
            memcpy(gt, gr + j, (size_t)(n - j) * sizeof(float));                                \
            if (da)                                                                             \
                memcpy(dt, dr + j, (size_t)(n - j) * sizeof(float));                            \
            POWER_BACKWARD_CHUNK(FT, IT32, DT, IT, ANY, V, rt, gt, dt, ot);                     \
            memcpy(o + j, ot, (size_t)(n - j) * sizeof(float));                                 \
        }                                                                                       \
        double total = 0.0, dot = 0.0, wsum = 0.0, wdot = 0.0;                                  \
        for (int l = 0; l < L; l++) {                                                           \
            total += as[l];                                                                     \
            dot += ag[l];                                                                       \
            wsum += aw[l];                                                                      \
            wdot += agw[l];                                                                     \
        }                                                                                       \
        const double floor_ = total > (double)FLT_MIN || total != total ? total : (double)FLT_MIN; \
        const float coef = (float)(dot / floor_);                                               \
        if (ga) /* <g, w> - <g, s> sum w / sum s, or (da) <g, dp/dalpha> */                     \
            ga[row] = (float)(da ? wdot : wdot - dot * (wsum / floor_));                        \
        FT cv;                                                                                  \
        for (int l = 0; l < L; l++)                                                             \
            cv[l] = coef;                                                                       \
        for (j = 0; j + L <= n; j += L) {                                                       \
            FT sv, gv;                                                                          \
            memcpy(&sv, o + j, sizeof sv);                                                      \
            memcpy(&gv, gr + j, sizeof gv);                                                     \
            sv = (gv - cv) * sv;                                                                \
            memcpy(o + j, &sv, sizeof sv);                                                      \
        }                                                                                       \
        for (; j < n; j++)                                                                      \
            o[j] = (gr[j] - coef) * o[j];                                                       \
    }                                                                                           \
}

#define NO_ATTR
/* every function of one vector width: L lanes of doubles (and of floats, int32 and int64 beside
   them), built with ATTR, a comparison's any-lane test ANY; named power_*_SUFFIX */
#define DEFINE_POWER_WIDTH(SUFFIX, ATTR, L, L2, ANY, V)                                                \
    DEFINE_POWER(power_f32_##SUFFIX, float, ATTR, nmt_i64x##L,                                 \
                 POWER_SUMS(float, nmt_f32x##L, nmt_f64x##L, nmt_i64x##L, L, KEEP_NOTHING, POW_GEN), vpow_2)          \
    DEFINE_POWER_BLOCK(power_block_f32_##SUFFIX, float, ATTR, nmt_f64x##L, nmt_i64x##L, L)     \
    DEFINE_POWER_PROBS(power_probs_##SUFFIX, ATTR, nmt_f64x##L, nmt_i64x##L, L, nmt_f32x##L2, nmt_i32x##L2, L2, V, 0) \
    DEFINE_POWER_PROBS(power_probs_da_##SUFFIX, ATTR, nmt_f64x##L, nmt_i64x##L, L, nmt_f32x##L2, nmt_i32x##L2, L2, V, 1) \
    DEFINE_POWER_LONG(power_long_##SUFFIX, ATTR, nmt_f32x##L, nmt_i32x##L, nmt_f64x##L, nmt_i64x##L, L, ANY, V, nmt_f32x##L2, nmt_i32x##L2, L2) \
    DEFINE_POWER_BACKWARD(power_backward_##SUFFIX, ATTR, nmt_f32x##L, nmt_i32x##L, nmt_f64x##L, nmt_i64x##L, L, ANY, V)
#if NMT_VECTORS
DEFINE_POWER_WIDTH(v, NO_ATTR, 2, 4, ANY_WORDS, GEN)
#else
DEFINE_POWER(power_f32_v, float, NO_ATTR, int64_t, SCALAR_POWER_SUMS(float), pow)
#define POWER_BLOCK_MAX_N 0 /* no vectors: every row by itself */
#define power_block_f32_v power_f32_v
#endif

#if NMT_VECTORS && defined(NMT_WIDE_AVX2)
DEFINE_POWER_WIDTH(avx2, AVX2, 4, 8, ANY_128, W256)
#define POWER_HAVE_AVX2() CPU_HAS_AVX2()
#if defined(NMT_WIDE_AVX512)
DEFINE_POWER_WIDTH(avx512, AVX512, 8, 16, ANY_256, W512)
#define POWER_HAVE_AVX512() CPU_HAS_AVX512()
#endif
#else
#define power_f32_avx2 power_f32_v
#define power_block_f32_avx2 power_block_f32_v
#define power_probs_avx2 power_probs_v
#define power_probs_da_avx2 power_probs_da_v
#define power_long_avx2 power_long_v
#define power_backward_avx2 power_backward_v
#define POWER_HAVE_AVX2() 0
#endif

#if defined(NMT_POWER_COUNTS) && NMT_VECTORS && defined(NMT_WIDE_AVX2)
/* The diagnostic build's view of the settling pass's powers (tests/sparse/test_power_settle.py):
   out[i] = d[i]^e by SETTLE_POW512 where the processor has the AVX-512 functions' instructions and
   they are built, else by SETTLE_POW256 where it has the AVX2 ones' (0 where d[i] <= 0), n a
   multiple of 16; returns the vector width used (512 or 256), 0 where neither serves (nothing
   written). */
#ifdef NMT_WIDE_AVX512
AVX512 static void settle_pow_avx512(const float *d, int64_t n, double e, float *out)
{
    COARSE512_TABLES;
    const float ef = (float)e;
    const __m512 vef = _mm512_set1_ps(ef), velo = _mm512_set1_ps((float)(e - (double)ef));
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 v = _mm512_loadu_ps(d + i);
        const __mmask16 pos = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
        __m512 w;
        __mmask16 faint = 0;
        SETTLE_POW512(v, pos, vef, velo, w, faint);
        (void)faint;
        _mm512_storeu_ps(out + i, w);
    }
}
#endif
AVX2 static void settle_pow_avx2(const float *d, int64_t n, double e, float *out)
{
    POW256_TABLES;
    const float ef = (float)e;
    const __m256 vef = _mm256_set1_ps(ef), velo = _mm256_set1_ps((float)(e - (double)ef));
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 v = _mm256_loadu_ps(d + i);
        const __m256 pos = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ);
        __m256 w, faint = _mm256_setzero_ps();
        SETTLE_POW256(v, pos, vef, velo, w, faint);
        (void)faint;
        _mm256_storeu_ps(out + i, w);
    }
}
int nmt_settle_pow_f32(const float *d, int64_t n, double e, float *out)
{
    if (n % 16 != 0)
        return 0;
#ifdef NMT_WIDE_AVX512
    if (CPU_HAS_AVX512()) {
        settle_pow_avx512(d, n, e, out);
        return 512;
    }
#endif
    if (!CPU_HAS_AVX2())
        return 0;
    settle_pow_avx2(d, n, e, out);
    return 256;
}
#endif

#ifndef POWER_HAVE_AVX512
#define power_f32_avx512 power_f32_v
#define power_block_f32_avx512 power_block_f32_v
#define power_probs_avx512 power_probs_v
#define power_probs_da_avx512 power_probs_da_v
#define power_long_avx512 power_long_v
#define power_backward_avx512 power_backward_v
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
                             float *, float *, float *, float *, const int32_t *);

/* The blocks' lanes run until the slowest lane settles, and the loop's passes grow as alpha nears 1
   (random rows of 50, one thread: 1.11 ms for 4,096 at alpha 1.3, 1.85 at 1.1, 0.76 at 1.6), so
   rows of one alpha a row in random order (1.1 to 1.6) took 1.67 ms where the same rows ordered by
   alpha took 1.18. power_alpha_order: the rows of am1[0 .. rows) ordered by POWER_ALPHA_BUCKETS
   buckets of alpha - 1 within each window of POWER_ORDER_WINDOW rows (a counting sort: rows of one
   bucket in their order; a window's 32 blocks get alphas some 1/32 of its range apart, and its rows
   stay close in memory), or NULL where no block of eight consecutive rows mixes buckets (one alpha
   a head: each head's rows together already) or the order cannot be allocated (the rows then go
   in their order; a block's mates move its rows' outputs by an ulp or two at most). Only rows of
   POWER_ORDER_MIN_N entries or more are ordered: forward and backward with a learnable alpha a row
   in 1.1 to 1.6, one thread, rows ordered against in their order: 16,384 rows of 20 4.8 -> 7.1 ms
   and 12,288 of 28 4.5 -> 5.6 (the rows' scattered reads and writes cost more than the lanes
   saved), 8,192 of 40 even, 4,096 of 50 2.30 -> 1.86, of 100 3.97 -> 3.38, 1,024 of 256 2.16 -> 1.57. */
#define POWER_ALPHA_BUCKETS 64
#define POWER_ORDER_WINDOW 256
#define POWER_ORDER_MIN_N 48
static int power_alpha_bucket(double a)
{
    return a > 0.0 && a < 1.0 ? (int)(a * POWER_ALPHA_BUCKETS) : 0;
}

static int32_t *power_alpha_order(const double *am1, int64_t rows)
{
    int mixed = 0;
    for (int64_t r = 0; r < rows && !mixed; r++)
        mixed = power_alpha_bucket(am1[r]) != power_alpha_bucket(am1[r - r % 8]);
    if (!mixed || rows > INT32_MAX)
        return NULL;
    int32_t *order = malloc((size_t)rows * sizeof(int32_t));
    if (!order)
        return NULL;
    for (int64_t w = 0; w < rows; w += POWER_ORDER_WINDOW) {
        const int64_t end = w + POWER_ORDER_WINDOW < rows ? w + POWER_ORDER_WINDOW : rows;
        int64_t start[POWER_ALPHA_BUCKETS + 1] = {0};
        for (int64_t r = w; r < end; r++)
            start[power_alpha_bucket(am1[r]) + 1]++;
        start[0] = w;
        for (int b = 0; b < POWER_ALPHA_BUCKETS; b++)
            start[b + 1] += start[b];
        for (int64_t r = w; r < end; r++)
            order[start[power_alpha_bucket(am1[r])]++] = (int32_t)r;
    }
    return order;
}

static void probs_groups(probs_solver solve, const float *x, int64_t rows, int64_t n, const double *am1,
                         int64_t a_stride, int64_t max_iter, double rtol, float *p, float *root, float *weights,
                         float *dalpha, float *stats, int64_t first, int64_t last)
{
    first *= 8;
    last = last * 8 < rows ? last * 8 : rows;
    if (last > first) { /* (a thread's own rows: ordered within them, so the threads' shares stay mixed) */
        int32_t *order = a_stride == 1 && last - first > 8 && n >= POWER_ORDER_MIN_N
                         ? power_alpha_order(am1 + first, last - first) : NULL;
        solve(x + first * n, last - first, n, am1 + first * a_stride, a_stride, max_iter, rtol, p + first * n,
              root ? root + first * n : 0, weights ? weights + first * n : 0, dalpha ? dalpha + first * n : 0,
              stats ? stats + POWER_STATS * first : 0, order);
        free(order);
    }
}

typedef void (*long_solver)(const float *, int64_t, int64_t, const double *, int64_t, int64_t, double, float *,
                            float *, float *, float *, double *);
typedef void (*power_backward_rows)(const float *, const float *, int64_t, int64_t, const double *, int64_t,
                                    const double *, int64_t, const float *, float *, float *);
#endif

/* alpha-entmax of the rows x (float32, any values) with alpha - 1 = am1 in (0, 1) per row (a_stride 1)
   or for all (0): p, where root is given r = [z - tau]_+, where weights is given s = r^(q - 1) (the
   Newton loop's last powers, taken at the tau returned: the backward's s, proportional to
   p^(2 - alpha), with no power of its own), where dalpha is given dp/dalpha (BLOCK_DALPHA; 0 off
   the support; rows of at most POWER_BLOCK_MAX_N entries, longer ones return 0: with weights, what
   nmt_power_backward_f32 takes for alpha's gradient without a logarithm of its own), and where stats is given POWER_STATS floats
   a row: tau, the row maximum, sum r^q, and the sums of the written p and p r in double (rows
   holding NaN or +inf: -1 then NaNs; rows without a finite entry: +inf then zeros). Rows of at most POWER_BLOCK_MAX_N entries by blocks (see
   DEFINE_POWER_PROBS), longer ones row by row, pruned (DEFINE_POWER_LONG; scratch:
   POWER_LONG_THREAD_SCRATCH(n) doubles for each of the threads). Returns 0 without writing anything where
   it does not serve (a build without vectors, long rows without scratch): the caller computes them
   otherwise. */
int nmt_power_probs_f32(const float *x, int64_t rows, int64_t n, const double *am1, int64_t a_stride,
                        int64_t max_iter, double rtol, float *p, float *root, float *weights, float *dalpha,
                        float *stats, double *scratch, int threads)
{
#if NMT_VECTORS
    if (n > POWER_BLOCK_MAX_N) {
        if (!scratch || dalpha)
            return 0;
        const long_solver solve = POWER_HAVE_AVX512() ? power_long_avx512
                                  : POWER_HAVE_AVX2() ? power_long_avx2 : power_long_v;
        FOR_THREADS(threads, rows,
                    solve(x + FIRST * n, LAST - FIRST, n, am1 + FIRST * a_stride, a_stride, max_iter, rtol,
                          p + FIRST * n, root ? root + FIRST * n : 0, weights ? weights + FIRST * n : 0,
                          stats ? stats + POWER_STATS * FIRST : 0,
                          scratch + t_ * POWER_LONG_THREAD_SCRATCH(n)));
        return 1;
    }
    const probs_solver solve = dalpha ? (POWER_HAVE_AVX512() ? power_probs_da_avx512
                                         : POWER_HAVE_AVX2() ? power_probs_da_avx2 : power_probs_da_v)
                               : POWER_HAVE_AVX512() ? power_probs_avx512
                               : POWER_HAVE_AVX2() ? power_probs_avx2 : power_probs_v;
    FOR_THREADS(threads, (rows + 7) / 8,
                probs_groups(solve, x, rows, n, am1, a_stride, max_iter, rtol, p, root, weights, dalpha, stats,
                             FIRST, LAST));
    return 1;
#else
    (void)x; (void)rows; (void)n; (void)am1; (void)a_stride; (void)max_iter; (void)rtol; (void)p; (void)root;
    (void)weights; (void)dalpha; (void)stats; (void)scratch; (void)threads;
    return 0;
#endif
}

/* J^T g of alpha-entmax per row (float32 rows r, g, out of n entries), s = r^e, e one per row
   (e_stride 1) or for all (0): see DEFINE_POWER_BACKWARD. Where ga is given, r holds the output p
   itself (e = 2 - alpha) and ga[row] gets alpha's gradient <g, dp/dalpha> from am1 = alpha - 1 (one
   per row, a_stride 1, or for all); or, where da is given (the forward's dalpha: nmt_power_probs_f32),
   r is s itself (e = 1: the forward's weights) and alpha's gradient is <g, da> (no logarithm, am1
   unread). Rows split over `threads` threads. Returns 0 without writing
   anything in a build without vectors (the caller computes it otherwise). */
int nmt_power_backward_f32(const float *r, const float *g, int64_t rows, int64_t n, const double *e,
                           int64_t e_stride, const double *am1, int64_t a_stride, const float *da, float *out,
                           float *ga, int threads)
{
#if NMT_VECTORS
    const power_backward_rows solve = POWER_HAVE_AVX512() ? power_backward_avx512
                                      : POWER_HAVE_AVX2() ? power_backward_avx2 : power_backward_v;
    FOR_THREADS(threads, rows,
                solve(r + FIRST * n, g + FIRST * n, LAST - FIRST, n, e + FIRST * e_stride, e_stride,
                      am1 ? am1 + FIRST * a_stride : 0, a_stride, da ? da + FIRST * n : 0, out + FIRST * n,
                      ga ? ga + FIRST : 0));
    return 1;
#else
    (void)r; (void)g; (void)rows; (void)n; (void)e; (void)e_stride; (void)am1; (void)a_stride; (void)da; (void)out;
    (void)ga; (void)threads;
    return 0;
#endif
}
