/* log2, exp2 and exp of float vectors by polynomials (GCC / Clang vector extensions: vectors FT of
 * floats with int32 lanes FI, any width), for the passes where float32 precision is what is asked:
 * the coarse Newton steps of alpha-entmax (_power_threshold.c, log2 and exp2) and exp of a
 * log-softmax (_cross_entropy.c, exp). Branch-free, lane by lane.
 *
 * VLOG2F(FT, FI, d, out): log2 of the positive, normal lanes of d from the exponent and the series
 *   2 atanh(s) / ln 2, s = (m - 1) / (m + 1), of the mantissa m in [sqrt(1/2), sqrt(2)) to s^7:
 *   absolute error about 4e-8 before the floats' rounding.
 * VEXPF(FT, FI, x, out): e^x, the argument reduced with ln 2 in two parts (1.5 ulps; below).
 * VEXP2F(FT, FI, y, out): 2^y for y <= 127 from the nearest integer n and the Taylor series of
 *   e^t, t = (y - n) ln 2 in [-ln(2) / 2, ln(2) / 2], to degree 7 (relative error 5e-9 before
 *   the floats' rounding: within about 2 ulps); 0 below 2^-126 (no subnormals) and for -inf; NaN
 *   lanes give NaN.
 * So a^b = VEXP2F(b VLOG2F(a)) has a relative error of about 1e-7 (1 + |b log2 a|).
 */
#ifndef NMT_FLOAT_MATH_H
#define NMT_FLOAT_MATH_H

#define FM_SQRT2 1.4142135623730951
#define FM_LOG2E 1.4426950408889634
#define FM_LN2 0.6931471805599453

#define VLOG2F(FT, FI, d, out)                                                                  \
    do {                                                                                        \
        const FI bits_ = (FI)(d);                                                               \
        FT ex_ = __builtin_convertvector((bits_ >> 23) - 127, FT);                              \
        FT m_ = (FT)((bits_ & 0x007FFFFF) | 0x3F800000); /* [1, 2) */                           \
        const FI big_ = m_ > (float)FM_SQRT2;                                                   \
        m_ = (FT)(((FI)(m_ * 0.5f) & big_) | ((FI)m_ & ~big_));                                 \
        ex_ += (FT)((FI)((FT){0} + 1.0f) & big_);                                               \
        const FT s_ = (m_ - 1.0f) / (m_ + 1.0f), u_ = s_ * s_;                                  \
        const FT p_ = (u_ * (1.0f / 3.0f) + 1.0f) + (u_ * u_) * (u_ * (1.0f / 7.0f) + 0.2f);   \
        (out) = ex_ + (float)(2.0 * FM_LOG2E) * (s_ * p_);                                      \
    } while (0)

#define VEXP2F(FT, FI, y, out)                                                                  \
    do {                                                                                        \
        const FI under_ = (y) < -126.0f;                                                        \
        const FT yc_ = (FT)((FI)(y) & ~under_); /* under: 2^0, then 0 */                        \
        const FT r_ = yc_ + 12582912.0f; /* 1.5 * 2^23: rounds to an integer */                 \
        const FT n_ = r_ - 12582912.0f;                                                         \
        const FI ni_ = (FI)r_ - (FI)((FT){0} + 12582912.0f);                                    \
        const FT t_ = (yc_ - n_) * (float)FM_LN2, t2_ = t_ * t_, t4_ = t2_ * t2_;               \
        const FT e_ = ((t_ + 1.0f) + t2_ * (t_ * (1.0f / 6.0f) + 0.5f))                        \
                      + t4_ * ((t_ * (1.0f / 120.0f) + 1.0f / 24.0f)                            \
                               + t2_ * (t_ * (1.0f / 5040.0f) + 1.0f / 720.0f));                \
        (out) = (FT)((FI)(e_ * (FT)((ni_ + 127) << 23)) & ~under_);                             \
    } while (0)


/* e^x for x <= 88 by n = round(x log2 e), t = x - n ln 2 with ln 2 split in two (FM_LN2_HI has 9
   significant bits, so n FM_LN2_HI is exact for |n| < 2^15) and the Taylor series of e^t to degree
   7 (relative error 5e-9 before the floats' rounding): within 1.5 ulps of the true value, 0 where
   n < -126 (no subnormals) and for -inf; NaN lanes give NaN. */
#define FM_LN2_HI 0.693359375f
#define FM_LN2_LO -2.12194440e-4f
#define VEXPF(FT, FI, x, out)                                                                   \
    do {                                                                                        \
        const FT xl_ = (x) * (float)FM_LOG2E;                                                   \
        const FI under_ = xl_ < -126.0f;                                                        \
        const FT xc_ = (FT)((FI)(x) & ~under_); /* under: e^0, then 0 */                        \
        const FT r_ = (FT)((FI)xl_ & ~under_) + 12582912.0f; /* 1.5 * 2^23: rounds */           \
        const FT n_ = r_ - 12582912.0f;                                                         \
        const FI ni_ = (FI)r_ - (FI)((FT){0} + 12582912.0f);                                    \
        const FT t_ = (xc_ - n_ * FM_LN2_HI) - n_ * FM_LN2_LO, t2_ = t_ * t_, t4_ = t2_ * t2_;  \
        const FT e_ = ((t_ + 1.0f) + t2_ * (t_ * (1.0f / 6.0f) + 0.5f))                        \
                      + t4_ * ((t_ * (1.0f / 120.0f) + 1.0f / 24.0f)                            \
                               + t2_ * (t_ * (1.0f / 5040.0f) + 1.0f / 720.0f));                \
        (out) = (FT)((FI)(e_ * (FT)((ni_ + 127) << 23)) & ~under_);                             \
    } while (0)

#endif
