/* The AVX2 functions' float passes of alpha-entmax's long rows, included by _power_threshold.c where
 * its loop (DEFINE_POWER_LONG) is defined: the macros named *_W256 that its V = W256 instance expands
 * (the AVX2 functions, DEFINE_POWER_WIDTH(avx2, ...)). They read the file's constants, tables and
 * helpers defined before the include (POWER_LONG_COARSE_CHUNK, POWER_SETTLE_CHUNK, COARSE512_INV /
 * LC / T2, POW_LOG_SERIES, power_settles, power_fine_step, ...). */
#ifndef NMT_POWER_AVX2_H
#define NMT_POWER_AVX2_H

/* The AVX2 functions' float passes (V = W256): the candidates' compaction (LONG_CANDIDATES_W256),
   the float step (LONG_FINE_W256), the settling pass (LONG_SETTLE_W256) and the output by vectors
   (LONG_OUTPUT_W256, LONG_SETTLED_OUTPUT_W256), as the AVX-512 functions' with eight float lanes
   (four double ones); the rest as the vector extensions have it (GEN). AVX2 has no compress, mask
   registers, getexp / getmant, scalef or sixteen-lane permutation: a movemask and a permutation from
   a table (LEFTPACK8), all-ones lanes and and-masks, the exponent and mantissa from the bits (for
   normal floats: a subnormal d is below every lane's cut, the faint mask takes it), two permutations
   and a blend (TABLE16_256), a product by 2^floor(n) built from its bits. SETTLE_POW256 computes
   SETTLE_POW512's sums and roundings (the same tables, polynomials and fused operations): the same
   floats for every normal d (tests/sparse/test_power_settle.py), so POWER_SETTLE_POW_ERR holds. */
#ifdef NMT_WIDE_AVX2
#define LONG_SUMS_W256 LONG_SUMS_GEN
#define LONG_DROP_W256 LONG_DROP_GEN
#define POW256_TABLES                                                                           \
    const __m256 inv_lo_ = _mm256_loadu_ps(COARSE512_INV), inv_hi_ = _mm256_loadu_ps(COARSE512_INV + 8); \
    const __m256 lc_lo_ = _mm256_loadu_ps(COARSE512_LC), lc_hi_ = _mm256_loadu_ps(COARSE512_LC + 8); \
    const __m256 t2_lo_ = _mm256_loadu_ps(COARSE512_T2), t2_hi_ = _mm256_loadu_ps(COARSE512_T2 + 8)
/* the sixteen-entry table lo, hi (two registers) at the low four bits of the 32-bit lanes i */
#define TABLE16_256(lo, hi, i)                                                                  \
    _mm256_blendv_ps(_mm256_permutevar8x32_ps((lo), (i)), _mm256_permutevar8x32_ps((hi), (i)),   \
                     _mm256_castsi256_ps(_mm256_slli_epi32((i), 28)))
#define POW256_LOG_SERIES(r, out) POW_LOG_SERIES(_mm256_set1_ps, _mm256_fmadd_ps, r, out)
#define POW256_EXP2_FRACTION(f, j, out)                                                         \
    do {                                                                                        \
        POW_EXP2_SERIES(_mm256_set1_ps, _mm256_fmadd_ps, f, out);                               \
        (out) = _mm256_mul_ps((out), TABLE16_256(t2_lo_, t2_hi_, (j)));                         \
    } while (0)
/* the tables and e = q - 1 as the float vef_ and its remainder velo_ (SETTLE_POW256's operands) */
#define POW256_SETUP                                                                            \
    POW256_TABLES;                                                                              \
    const float ef_ = (float)e;                                                                 \
    const __m256 vef_ = _mm256_set1_ps(ef_), velo_ = _mm256_set1_ps((float)(e - (double)ef_))
/* SETTLE_POW512 on eight floats: pos all-ones on the lanes to take (0 elsewhere and where
   e log2 d < -126), faint or'ed with the lanes of pos where q log2 d < -124 (all-ones lanes) */
#define SETTLE_POW256(d, pos, vef, velo, out, faint)                                            \
    do {                                                                                        \
        const __m256i b_ = _mm256_castps_si256(d);                                              \
        const __m256 k_ = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b_, 23), _mm256_set1_epi32(127))); \
        const __m256i mb_ = _mm256_or_si256(_mm256_and_si256(b_, _mm256_set1_epi32(0x007FFFFF)), \
                                            _mm256_set1_epi32(0x3F800000));                     \
        const __m256 m_ = _mm256_castsi256_ps(mb_); /* [1, 2) */                                \
        const __m256i i_ = _mm256_srli_epi32(mb_, 19); /* (the table: its low four bits) */     \
        const __m256 r_ = _mm256_fmsub_ps(m_, TABLE16_256(inv_lo_, inv_hi_, i_), _mm256_set1_ps(1.0f)); \
        __m256 p_;                                                                              \
        POW256_LOG_SERIES(r_, p_);                                                              \
        const __m256 lci_ = TABLE16_256(lc_lo_, lc_hi_, i_);                                    \
        const __m256 s_ = _mm256_add_ps(k_, lci_);                                              \
        const __m256 se_ = _mm256_sub_ps(lci_, _mm256_sub_ps(s_, k_));                          \
        const __m256 corr_ = _mm256_fmadd_ps(p_, r_, se_);                                      \
        const __m256 yh_ = _mm256_mul_ps((vef), s_);                                            \
        const __m256 ye_ = _mm256_fmsub_ps((vef), s_, yh_);                                     \
        const __m256 ya_ = _mm256_fmadd_ps((vef), corr_, yh_);                                  \
        const __m256 under_ = _mm256_cmp_ps(ya_, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);          \
        (faint) = _mm256_or_ps((faint), _mm256_and_ps((pos), _mm256_cmp_ps(_mm256_add_ps(ya_, s_), \
                                                                             _mm256_set1_ps(-124.0f), _CMP_LT_OQ))); \
        const __m256 n_ = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(ya_, _mm256_set1_ps(16.0f)), \
                                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), \
                                        _mm256_set1_ps(0.0625f)); /* sixteenths */               \
        __m256 f_ = _mm256_fmadd_ps((vef), corr_, _mm256_add_ps(_mm256_sub_ps(yh_, n_), ye_));  \
        f_ = _mm256_fmadd_ps((velo), s_, f_);                                                   \
        const __m256i j_ = _mm256_cvtps_epi32(_mm256_mul_ps(n_, _mm256_set1_ps(16.0f)));        \
        __m256 x_;                                                                              \
        POW256_EXP2_FRACTION(f_, j_, x_);                                                       \
        const __m256i fl_ = _mm256_srai_epi32(j_, 4); /* floor(n) */                            \
        const __m256 two_ = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(fl_, _mm256_set1_epi32(127)), 23)); \
        (out) = _mm256_and_ps(_mm256_mul_ps(x_, two_), _mm256_andnot_ps(under_, (pos)));         \
    } while (0)
/* The coarse passes (LONG_COARSE) in the AVX2 functions: COARSE_ACCUMULATE's sums with
   SETTLE_POW256's powers (more accurate than VLOG2F / VEXP2F, whose error the coarse margin covers;
   a d below 2^-126 gets the power of one of 2^-127 .. 2^-126: a larger w, a shorter step), the
   entries at or below tau dropped as they are read (COARSE_KEEP_W512's, by LEFTPACK8) */
#define COARSE_ACCUMULATE_W256(FT, FI, xv, vtf, vef, aqf, awf, nanf)                            \
    do {                                                                                        \
        POW256_TABLES;                                                                          \
        const __m256 d_ = _mm256_sub_ps((__m256)(xv), (__m256)(vtf));                           \
        const __m256 pos_ = _mm256_cmp_ps(d_, _mm256_setzero_ps(), _CMP_GT_OQ);                 \
        __m256 w_, faint_ = _mm256_setzero_ps();                                                \
        SETTLE_POW256(d_, pos_, (__m256)(vef), _mm256_setzero_ps(), w_, faint_);                \
        (void)faint_;                                                                           \
        (awf) = (FT)_mm256_add_ps((__m256)(awf), w_);                                           \
        (aqf) = (FT)_mm256_add_ps((__m256)(aqf), _mm256_mul_ps(w_, _mm256_and_ps(d_, pos_)));   \
        (nanf) |= (FI)(((FT)d_) != ((FT)d_));                                                   \
    } while (0)
#define COARSE_KEEP_W256(xv, vtf)                                                               \
    do {                                                                                        \
        const unsigned m_ = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps((__m256)(xv), (__m256)(vtf), _CMP_GT_OQ)); \
        _mm256_storeu_ps(cf + kept_, LEFTPACK8_PS((__m256)(xv), m_));                           \
        kept_ += __builtin_popcount(m_);                                                        \
    } while (0)
#define COARSE_SHRINK_W256 COARSE_SHRINK_KEPT
/* the eight candidates from src (doubles) less tau as floats (d rounded once, as the AVX-512
   functions' conversion) */
#define F8_FROM_PD(src, tv)                                                                     \
    _mm256_set_m128(_mm256_cvtpd_ps(_mm256_sub_pd(_mm256_loadu_pd((src) + 4), (tv))),          \
                    _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_loadu_pd(src), (tv))))
/* the low and the high four of eight floats v as doubles, added lane by lane (F16_SUM_PD's) */
#define F8_SUM_PD(v) _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),                 \
                                   _mm256_cvtps_pd(_mm256_extractf128_ps((v), 1)))
/* the sum of four doubles, (v0 + v1) + (v2 + v3) (the output's sums, the moments) */
AVX2 static inline double power_sum4_pd(__m256d v)
{
    double l[4];
    _mm256_storeu_pd(l, v);
    return (l[0] + l[1]) + (l[2] + l[3]);
}
/* the largest of four doubles (the moments' spread) */
AVX2 static inline double power_max4_pd(__m256d v)
{
    double l[4];
    _mm256_storeu_pd(l, v);
    return fmax(fmax(l[0], l[1]), fmax(l[2], l[3]));
}
/* the sum of eight floats, widened, in double (as F16_SUM_PD's reduction) */
AVX2 static inline double power_sum8_pd(__m256 v)
{
    const __m256d s = F8_SUM_PD(v);
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}
/* the candidates c[i .. i + 8) into buf (eight doubles) padded past k with -4 (below every tau) */
#define PAD8_PD(buf, c, i, k)                                                                   \
    do {                                                                                        \
        for (int l_ = 0; l_ < 8; l_++)                                                          \
            (buf)[l_] = (i) + l_ < (k) ? (c)[(i) + l_] : -4.0;                                  \
    } while (0)

#define LONG_CANDIDATES_W256(FT, IT32, DT, IT, L, ANY)                                          \
    do {                                                                                        \
        float *tf = (float *)wk; /* the candidates as floats */                                 \
        const __m256 cut8 = _mm256_set1_ps(cut);                                                \
        (void)xv;                                                                               \
        __m256i jv = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);                                 \
        const __m256i eight = _mm256_set1_epi32(8);                                             \
        k = 0;                                                                                  \
        for (j = 0; j + 8 <= len; j += 8) { /* stored whole at k <= j: within the row's room */ \
            const __m256 v = _mm256_loadu_ps(xr + j);                                           \
            const unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, cut8, _CMP_GT_OQ)); \
            if (m) {                                                                            \
                const __m256i ix = LEFTPACK8_INDEX(m);                                          \
                _mm256_storeu_ps(tf + k, _mm256_permutevar8x32_ps(v, ix));                      \
                _mm256_storeu_si256((__m256i *)(idx + k), _mm256_permutevar8x32_epi32(jv, ix)); \
                k += __builtin_popcount(m);                                                     \
            }                                                                                   \
            jv = _mm256_add_epi32(jv, eight);                                                   \
        }                                                                                       \
        for (; j < len; j++) {                                                                  \
            tf[k] = xr[j];                                                                      \
            idx[k] = (int32_t)j;                                                                \
            k += xr[j] > cut;                                                                   \
        }                                                                                       \
        const __m256d top4 = _mm256_set1_pd((double)top), a4 = _mm256_set1_pd(a);              \
        int64_t i = 0;                                                                          \
        if (k > len / 4) { /* a broad row: its moments as the candidates are converted */       \
            LONG_CONVERT_MOMENTS256;                                                            \
        } else {                                                                                \
            for (; i + 4 <= k; i += 4)                                                          \
                _mm256_storeu_pd(cand + i, _mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(tf + i)), top4), a4)); \
            for (; i < k; i++)                                                                  \
                cand[i] = ((double)tf[i] - top) * a;                                            \
        }                                                                                       \
    } while (0)
/* LONG_CONVERT_MOMENTS in the AVX2 functions (four doubles a vector; the sums by fused
   multiply-adds where LONG_MOMENT_SUMS takes them so) */
#define LONG_MOMENT_SUMS256(d1)                                                                 \
    do {                                                                                        \
        const __m256d ad_ = _mm256_andnot_pd(_mm256_set1_pd(-0.0), (d1)), d2_ = _mm256_mul_pd((d1), (d1)); \
        const __m256d d3_ = _mm256_mul_pd(d2_, (d1)), d6_ = _mm256_mul_pd(d3_, d3_);            \
        hi_ = _mm256_max_pd(hi_, ad_);                                                          \
        a1_ = _mm256_add_pd(a1_, (d1));                                                         \
        a2_ = _mm256_add_pd(a2_, d2_);                                                          \
        a3_ = _mm256_add_pd(a3_, d3_);                                                          \
        a4_ = _mm256_fmadd_pd(d2_, d2_, a4_);                                                   \
        a5_ = _mm256_fmadd_pd(d3_, d2_, a5_);                                                   \
        a6_ = _mm256_add_pd(a6_, d6_);                                                          \
        a7_ = _mm256_fmadd_pd(d6_, ad_, a7_);                                                   \
    } while (0)
#define LONG_CONVERT_MOMENTS256                                                                 \
    do {                                                                                        \
        const int64_t k0_ = k < 256 ? k : 256;                                                  \
        for (i = 0; i < k0_; i++) { /* the centre's candidates first */                         \
            cand[i] = ((double)tf[i] - top) * a;                                                \
            r0 += cand[i];                                                                      \
        }                                                                                       \
        r0 /= (double)k0_;                                                                      \
        const __m256d r0v_ = _mm256_set1_pd(r0);                                                \
        __m256d a1_ = _mm256_setzero_pd(), a2_ = a1_, a3_ = a1_, a4_ = a1_, a5_ = a1_, a6_ = a1_; \
        __m256d a7_ = a1_, hi_ = a1_;                                                           \
        for (i = 0; i + 4 <= k0_; i += 4) {                                                     \
            const __m256d d1_ = _mm256_sub_pd(_mm256_loadu_pd(cand + i), r0v_);                 \
            LONG_MOMENT_SUMS256(d1_);                                                           \
        }                                                                                       \
        for (; i + 4 <= k; i += 4) { /* (i == k0_ here: 256, or k0_ == k's whole vectors) */    \
            const __m256d dv_ = _mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(tf + i)), top4), a4); \
            _mm256_storeu_pd(cand + i, dv_);                                                    \
            const __m256d d1_ = _mm256_sub_pd(dv_, r0v_);                                       \
            LONG_MOMENT_SUMS256(d1_);                                                           \
        }                                                                                       \
        /* (the last ones; those below k0_ converted already: the same value) */                \
        LONG_MOMENT_FINISH_BY(i, k, tf, power_sum4_pd, power_max4_pd);                          \
        moments_ = 1;                                                                           \
    } while (0)

/* eight floats d into LONG_FINE's float sums aq_ (d^q), aw_ (d^(q - 1)), ac_ (d^(q - 1) rcp(d)) over
   d > 0, SETTLE_POW256's powers with e in vef_ and velo (faint_ or'ed; LONG_FINE_W256,
   BLOCK_FINE_W256) */
#define FINE_ACCUMULATE256(d, velo)                                                             \
    do {                                                                                        \
        const __m256 df_ = (d);                                                                 \
        const __m256 pos_ = _mm256_cmp_ps(df_, _mm256_setzero_ps(), _CMP_GT_OQ);                \
        __m256 w_;                                                                              \
        SETTLE_POW256(df_, pos_, vef_, (velo), w_, faint_);                                     \
        aw_ = _mm256_add_ps(aw_, w_);                                                           \
        aq_ = _mm256_fmadd_ps(w_, _mm256_and_ps(df_, pos_), aq_);                               \
        ac_ = _mm256_fmadd_ps(w_, _mm256_and_ps(_mm256_rcp_ps(df_), pos_), ac_);                \
    } while (0)
#define LONG_FINE_W256                                                                          \
    do {                                                                                        \
        POW256_SETUP;                                                                           \
        const __m256 zero_ = _mm256_setzero_ps();                                               \
        for (int s_ = 0; s_ < 2; s_++) { /* a second where the first was long */                \
            const __m256d tv_ = _mm256_set1_pd(tau);                                            \
            double hqf_ = 0.0, wsf_ = 0.0, csf_ = 0.0;                                          \
            __m256 faint_ = zero_;                                                              \
            for (int64_t j0_ = 0; j0_ < k; j0_ += 8 * POWER_LONG_COARSE_CHUNK) {                \
                const int64_t j1_ = k - j0_ > 8 * POWER_LONG_COARSE_CHUNK ? j0_ + 8 * POWER_LONG_COARSE_CHUNK : k; \
                __m256 aq_ = zero_, aw_ = zero_, ac_ = zero_;                                   \
                for (int64_t i_ = j0_; i_ < j1_; i_ += 8) {                                     \
                    double pad_[8];                                                             \
                    const double *src_ = cand + i_;                                             \
                    if (i_ + 8 > k) {                                                           \
                        PAD8_PD(pad_, cand, i_, k);                                             \
                        src_ = pad_;                                                            \
                    }                                                                           \
                    FINE_ACCUMULATE256(F8_FROM_PD(src_, tv_), velo_);                           \
                }                                                                               \
                csf_ += power_sum8_pd(ac_);                                                     \
                hqf_ += power_sum8_pd(aq_);                                                     \
                wsf_ += power_sum8_pd(aw_);                                                     \
            }                                                                                   \
            (void)faint_;                                                                       \
            POWER_COUNT(15, 1);                                                                 \
            if (!power_fine_step(hqf_, wsf_, csf_, a, qr, lo, &tau))                            \
                break;                                                                          \
        }                                                                                       \
    } while (0)

/* one vector of eight candidates from src (cand + i_, or a padded copy of the last: its NW lanes
   written) into the lane sums aq_, aw_ and the output in place (k == len) or wk */
#define SETTLE_VECTOR256(src, NW)                                                               \
    do {                                                                                        \
        const __m256 df_ = F8_FROM_PD((src), tv_);                                              \
        const __m256 pos_ = _mm256_cmp_ps(df_, zero_, _CMP_GT_OQ);                              \
        __m256 w_;                                                                              \
        SETTLE_POW256(df_, pos_, vef_, velo_, w_, faint_);                                      \
        aw_ = _mm256_add_ps(aw_, w_);                                                           \
        aq_ = _mm256_fmadd_ps(w_, _mm256_and_ps(df_, pos_), aq_);                               \
        if (k == len) { /* in place: r^q = w d (normalised after), r, w */                       \
            const __m256 pq_ = _mm256_and_ps(_mm256_mul_ps(w_, df_), pos_), rq_ = _mm256_and_ps(df_, pos_); \
            if ((NW) == 8) {                                                                    \
                _mm256_storeu_ps(pr + i_, pq_);                                                 \
                if (rr)                                                                         \
                    _mm256_storeu_ps(rr + i_, rq_);                                             \
                if (wr)                                                                         \
                    _mm256_storeu_ps(wr + i_, w_);                                              \
            } else {                                                                            \
                float o_[3][8];                                                                 \
                _mm256_storeu_ps(o_[0], pq_);                                                   \
                _mm256_storeu_ps(o_[1], rq_);                                                   \
                _mm256_storeu_ps(o_[2], w_);                                                    \
                memcpy(pr + i_, o_[0], (NW) * sizeof(float));                                   \
                if (rr)                                                                         \
                    memcpy(rr + i_, o_[1], (NW) * sizeof(float));                               \
                if (wr)                                                                         \
                    memcpy(wr + i_, o_[2], (NW) * sizeof(float));                               \
            }                                                                                   \
        } else {                                                                                \
            const __m256d w0_ = _mm256_cvtps_pd(_mm256_castps256_ps128(w_));                    \
            const __m256d w1_ = _mm256_cvtps_pd(_mm256_extractf128_ps(w_, 1));                  \
            if ((NW) == 8) {                                                                    \
                _mm256_storeu_pd(wk + i_, w0_);                                                 \
                _mm256_storeu_pd(wk + i_ + 4, w1_);                                             \
            } else {                                                                            \
                double o_[8];                                                                   \
                _mm256_storeu_pd(o_, w0_);                                                      \
                _mm256_storeu_pd(o_ + 4, w1_);                                                  \
                memcpy(wk + i_, o_, (NW) * sizeof(double));                                     \
            }                                                                                   \
        }                                                                                       \
    } while (0)
#define LONG_SETTLE_W256                                                                        \
    do {                                                                                        \
        POW256_SETUP;                                                                           \
        const __m256d tv_ = _mm256_set1_pd(tau);                                                \
        const __m256 zero_ = _mm256_setzero_ps();                                               \
        double hqf_ = 0.0, wsf_ = 0.0;                                                          \
        __m256 faint_ = zero_; /* lanes whose r^q = d^q may fall below 2^-124 */                \
        for (int64_t i_ = 0; i_ < k;) {                                                         \
            const int64_t j1_ = k - i_ > 8 * POWER_SETTLE_CHUNK ? i_ + 8 * POWER_SETTLE_CHUNK : k; \
            __m256 aq_ = zero_, aw_ = zero_;                                                    \
            for (; i_ + 8 <= j1_; i_ += 8)                                                      \
                SETTLE_VECTOR256(cand + i_, 8);                                                 \
            if (i_ < j1_) { /* the last, fewer than eight */                                    \
                double pad_[8];                                                                 \
                PAD8_PD(pad_, cand, i_, j1_);                                                   \
                SETTLE_VECTOR256(pad_, j1_ - i_);                                               \
                i_ = j1_;                                                                       \
            }                                                                                   \
            hqf_ += power_sum8_pd(aq_);                                                         \
            wsf_ += power_sum8_pd(aw_);                                                         \
        }                                                                                       \
        POWER_COUNT(16, 1);                                                                     \
        if (!_mm256_movemask_ps(faint_) && power_settles(hqf_, wsf_, k, e, a, rtol, tau)) {     \
            settled_ = 1;                                                                       \
            hq = hqf_;                                                                          \
            POWER_COUNT(17, 1);                                                                 \
        }                                                                                       \
    } while (0)

/* The short rows' blocks (DEFINE_POWER_PROBS, four rows a block, one a lane of doubles) in the AVX2
   functions: BLOCK_ENTRIES_W512's and BLOCK_FINE_W512's work with four lanes. The entries four of the
   four rows at a time, z formed row by row (the same doubles), the 4 x 4 block transposed in
   registers and stored a column at a time (-inf holes at or below -1 and in lanes not live; the
   lanes compacted where none keeps more than half its row); the float step from two entries of the
   four lanes a vector of eight floats, SETTLE_POW256's powers. */
#define BLOCK_LANE_ENTRIES_W256(L) ((void)real) /* (BLOCK_ENTRIES_W256 after the lanes) */
#define BLOCK_ENTRIES_W256(L)                                                                   \
    do {                                                                                        \
        const float *xl_[4];                                                                    \
        int64_t cn_[4];                                                                         \
        for (int l = 0; l < 4; l++)                                                             \
            xl_[l] = x + rowof[l] * n;                                                          \
        const __m256d ninf_ = _mm256_set1_pd(-INFINITY), m1_ = _mm256_set1_pd(-1.0);           \
        const __m256d lv_ = (__m256d)live; /* all-ones in the live lanes */                     \
        __m256i cnt_ = _mm256_setzero_si256();                                                  \
        int64_t j_ = 0;                                                                         \
        for (; j_ + 4 <= n; j_ += 4) {                                                          \
            __m256d r_[4], c_[4];                                                               \
            for (int l = 0; l < 4; l++) /* z of row l, as the lane forms it */                  \
                r_[l] = _mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(xl_[l] + j_)), \
                                                    _mm256_set1_pd(vtop[l])), _mm256_set1_pd(vi[l])); \
            const __m256d t0_ = _mm256_unpacklo_pd(r_[0], r_[1]), t1_ = _mm256_unpackhi_pd(r_[0], r_[1]); \
            const __m256d t2_ = _mm256_unpacklo_pd(r_[2], r_[3]), t3_ = _mm256_unpackhi_pd(r_[2], r_[3]); \
            c_[0] = _mm256_permute2f128_pd(t0_, t2_, 0x20);                                     \
            c_[1] = _mm256_permute2f128_pd(t1_, t3_, 0x20);                                     \
            c_[2] = _mm256_permute2f128_pd(t0_, t2_, 0x31);                                     \
            c_[3] = _mm256_permute2f128_pd(t1_, t3_, 0x31);                                     \
            for (int c = 0; c < 4; c++) { /* entry j_ + c of the four rows */                   \
                const __m256d in_ = _mm256_and_pd(lv_, _mm256_cmp_pd(c_[c], m1_, _CMP_GT_OQ));  \
                _mm256_storeu_pd(col + (j_ + c) * L, _mm256_blendv_pd(ninf_, c_[c], in_));      \
                cnt_ = _mm256_sub_epi64(cnt_, _mm256_castpd_si256(in_));                        \
                _mm_storeu_si128((__m128i *)(place + (j_ + c) * L), _mm_set1_epi32((int32_t)(j_ + c))); \
            }                                                                                   \
        }                                                                                       \
        _mm256_storeu_si256((__m256i *)cn_, cnt_);                                              \
        for (; j_ < n; j_++) /* the last, fewer than four */                                    \
            for (int l = 0; l < 4; l++) {                                                       \
                const double v = ((double)xl_[l][j_] - vtop[l]) * vi[l];                        \
                const int in = live[l] != 0 && v > -1.0;                                        \
                col[j_ * L + l] = in ? v : -INFINITY;                                           \
                place[j_ * L + l] = (int32_t)j_;                                                \
                cn_[l] += in;                                                                   \
            }                                                                                   \
        BLOCK_ENTRIES_KEEP(4, L);                                                               \
    } while (0)
#define BLOCK_FINE_W256(DT, IT, L, cnt)                                                         \
    do {                                                                                        \
        BLOCK_FINE_LANES(IT, L, cnt);                                                           \
        POW256_TABLES;                                                                          \
        const __m256d t4_ = (__m256d)vt;                                                        \
        const __m128 ve4_ = _mm256_cvtpd_ps((__m256d)ve);                                       \
        const __m256 vef_ = _mm256_set_m128(ve4_, ve4_), zero8_ = _mm256_setzero_ps();          \
        __m256 aq_ = zero8_, aw_ = zero8_, ac_ = zero8_, faint_ = zero8_;                       \
        for (int64_t j_ = 0; j_ < (cnt); j_ += 2) { /* (cnt odd: the -inf column after it) */   \
            const __m256d d0_ = _mm256_sub_pd(_mm256_loadu_pd(col + j_ * L), t4_);              \
            const __m256d d1_ = j_ + 1 < (cnt) ? _mm256_sub_pd(_mm256_loadu_pd(col + (j_ + 1) * L), t4_) \
                                               : _mm256_set1_pd(-1.0);                          \
            FINE_ACCUMULATE256(_mm256_set_m128(_mm256_cvtpd_ps(d1_), _mm256_cvtpd_ps(d0_)), zero8_); \
        }                                                                                       \
        (void)faint_;                                                                           \
        BLOCK_FINE_TAKE(DT, IT, (DT)F8_SUM_PD(aq_), (DT)F8_SUM_PD(aw_), (DT)F8_SUM_PD(ac_));    \
    } while (0)

/* Step 5's loop four candidates at a time (the AVX2 functions): stored where their places follow
   each other (every candidate in order where k == len), else one by one (LONG_OUTPUT_ONE) */
#define LONG_OUTPUT_ONE(i)                                                                      \
    do {                                                                                        \
        const double d = cand[i] > tau ? cand[i] - tau : 0.0;                                   \
        const float pf = (float)(wk[i] * d * inv), rf = (float)d;                               \
        const int64_t at = idx_lazy_ ? (i) : idx[i];                                            \
        pr[at] = pf;                                                                            \
        if (rr)                                                                                 \
            rr[at] = rf;                                                                        \
        if (wr)                                                                                 \
            wr[at] = (float)wk[i];                                                              \
        psum += (double)pf;                                                                     \
        prsum += (double)pf * (double)rf;                                                       \
    } while (0)
/* the output's vector sums ps_ (of p) and prs_ (of p r) added to psum, prsum */
#define OUTPUT_SUMS256                                                                          \
    do {                                                                                        \
        psum += power_sum4_pd(ps_);                                                             \
        prsum += power_sum4_pd(prs_);                                                           \
    } while (0)
#define LONG_OUTPUT_W256                                                                        \
    do {                                                                                        \
        const __m256d tv_ = _mm256_set1_pd(tau), iv_ = _mm256_set1_pd(inv);                    \
        __m256d ps_ = _mm256_setzero_pd(), prs_ = ps_;                                          \
        for (; i + 4 <= k; i += 4) {                                                            \
            const int64_t at_ = k == len || idx_lazy_ ? i : (int64_t)idx[i];                    \
            if (!(k == len || idx_lazy_) && (int64_t)idx[i + 3] != at_ + 3) { /* (idx rises) */ \
                for (int64_t i1_ = i; i1_ < i + 4; i1_++)                                       \
                    LONG_OUTPUT_ONE(i1_);                                                       \
                continue;                                                                       \
            }                                                                                   \
            const __m256d c_ = _mm256_loadu_pd(cand + i), w_ = _mm256_loadu_pd(wk + i);        \
            const __m256d d_ = _mm256_and_pd(_mm256_sub_pd(c_, tv_), _mm256_cmp_pd(c_, tv_, _CMP_GT_OQ)); \
            const __m128 pf_ = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_mul_pd(w_, d_), iv_));      \
            const __m128 rf_ = _mm256_cvtpd_ps(d_);                                             \
            _mm_storeu_ps(pr + at_, pf_);                                                       \
            if (rr)                                                                             \
                _mm_storeu_ps(rr + at_, rf_);                                                   \
            if (wr)                                                                             \
                _mm_storeu_ps(wr + at_, _mm256_cvtpd_ps(w_));                                   \
            const __m256d pd_ = _mm256_cvtps_pd(pf_);                                           \
            ps_ = _mm256_add_pd(ps_, pd_);                                                      \
            prs_ = _mm256_add_pd(prs_, _mm256_mul_pd(pd_, _mm256_cvtps_pd(rf_)));               \
        }                                                                                       \
        OUTPUT_SUMS256;                                                                         \
    } while (0)
#define LONG_SETTLED_OUTPUT_W256                                                                \
    do {                                                                                        \
        if (!(settled_ && k == len)) {                                                          \
            LONG_OUTPUT_W256;                                                                   \
            break;                                                                              \
        }                                                                                       \
        const __m256 ivf_ = _mm256_set1_ps((float)inv);                                         \
        const __m256d tv_ = _mm256_set1_pd(tau);                                                \
        __m256d ps_ = _mm256_setzero_pd(), prs_ = ps_;                                          \
        if (!st) /* (no stats asked for: the scaling alone, eight at a time) */                  \
            for (; i + 8 <= k; i += 8)                                                          \
                _mm256_storeu_ps(pr + i, _mm256_mul_ps(_mm256_loadu_ps(pr + i), ivf_));         \
        for (; i + 4 <= k; i += 4) {                                                            \
            const __m128 pf_ = _mm_mul_ps(_mm_loadu_ps(pr + i), _mm256_castps256_ps128(ivf_));  \
            _mm_storeu_ps(pr + i, pf_);                                                         \
            const __m256d c_ = _mm256_loadu_pd(cand + i);                                       \
            const __m256d d_ = _mm256_and_pd(_mm256_sub_pd(c_, tv_), _mm256_cmp_pd(c_, tv_, _CMP_GT_OQ)); \
            const __m256d pd_ = _mm256_cvtps_pd(pf_);                                           \
            ps_ = _mm256_add_pd(ps_, pd_);                                                      \
            prs_ = _mm256_add_pd(prs_, _mm256_mul_pd(pd_, _mm256_cvtps_pd(_mm256_cvtpd_ps(d_)))); \
        }                                                                                       \
        for (; i < k; i++) {                                                                    \
            const float pf = pr[i] * (float)inv;                                                \
            pr[i] = pf;                                                                         \
            const double d = cand[i] > tau ? cand[i] - tau : 0.0;                               \
            psum += (double)pf;                                                                 \
            prsum += (double)pf * (double)(float)d;                                             \
        }                                                                                       \
        OUTPUT_SUMS256;                                                                         \
    } while (0)
#endif

#endif
