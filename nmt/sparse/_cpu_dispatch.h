/* Vector extensions, wider vectors chosen at run time on x86-64 (GCC / Clang), and rows split
 * over OpenMP threads: shared by the library's C files.
 *
 * The library is built without -m flags, so it runs on any x86-64 processor; the functions built
 * for wider vectors carry a target attribute (AVX2, AVX512 below) and are called only where the
 * processor has those instructions (CPU_HAS_AVX2(), CPU_HAS_AVX512(): the same feature lists as
 * the attributes). NMT_WIDE_AVX2 / NMT_WIDE_AVX512 say whether they are built: -DNMT_NO_AVX2
 * leaves both out, -DNMT_NO_AVX512 the 512-bit ones (the tests build every path). Each file
 * guards its wide functions with these and its own vector path, and dispatches on the checks.
 */
#ifndef NMT_CPU_DISPATCH_H
#define NMT_CPU_DISPATCH_H

#include <stdint.h>

/* GCC / Clang vector extensions (SSE, AVX, NEON: whatever the target has without flags), unless
   -DNMT_ROWS_ONLY (every row by itself, for the tests) */
#if !defined(NMT_ROWS_ONLY) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 9))
#define NMT_VECTORS 1
#else
#define NMT_VECTORS 0
#endif

#if NMT_VECTORS
/* nmt_<type>x<lanes>: the vector types the files use (8 to 128 bytes; the wider ones only in the
   functions built for AVX2 / AVX-512, or split by the compiler) */
typedef float nmt_f32x2 __attribute__((vector_size(8)));
typedef float nmt_f32x4 __attribute__((vector_size(16)));
typedef float nmt_f32x8 __attribute__((vector_size(32)));
typedef float nmt_f32x16 __attribute__((vector_size(64)));
typedef double nmt_f64x2 __attribute__((vector_size(16)));
typedef double nmt_f64x4 __attribute__((vector_size(32)));
typedef double nmt_f64x8 __attribute__((vector_size(64)));
typedef double nmt_f64x16 __attribute__((vector_size(128)));
typedef int32_t nmt_i32x2 __attribute__((vector_size(8)));
typedef int32_t nmt_i32x4 __attribute__((vector_size(16)));
typedef int32_t nmt_i32x8 __attribute__((vector_size(32)));
typedef int32_t nmt_i32x16 __attribute__((vector_size(64)));
typedef int64_t nmt_i64x2 __attribute__((vector_size(16)));
typedef int64_t nmt_i64x4 __attribute__((vector_size(32)));
typedef int64_t nmt_i64x8 __attribute__((vector_size(64)));
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(NMT_NO_AVX2)
#define NMT_WIDE_AVX2 1
#include <immintrin.h> /* AVX2 / AVX-512 intrinsics, used only in functions built for them */
#define AVX2 __attribute__((target("avx2,fma,popcnt")))
#define CPU_HAS_AVX2() (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")                \
                        && __builtin_cpu_supports("popcnt"))
#if !defined(NMT_NO_AVX512)
#define NMT_WIDE_AVX512 1
#define AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,popcnt")))
#define CPU_HAS_AVX512() (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")    \
                          && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") \
                          && __builtin_cpu_supports("popcnt"))
#endif
#endif

#if NMT_VECTORS
/* whether a comparison's result (a vector of all-ones / zero lanes, at most 32 bytes) has a true
   lane: ANY_WORDS or's its 64-bit words (a lane-by-lane test compiles to one extraction per lane,
   and or-ing the lanes into lane 0 to a chain of insertions: a third of 1.5-entmax's time on broad
   rows in the AVX2 functions), ANY_128 / ANY_256 test it in one instruction (in the functions
   built for AVX2 / AVX-512) */
static inline int nmt_any_words(const void *mask, unsigned bytes)
{
    uint64_t w[4] = {0, 0, 0, 0};
    __builtin_memcpy(w, mask, bytes);
    return (w[0] | w[1] | w[2] | w[3]) != 0;
}
#define ANY_WORDS(c) nmt_any_words(&(c), sizeof(c))
#ifdef NMT_WIDE_AVX2
#define ANY_128(c) (!_mm_testz_si128((__m128i)(c), (__m128i)(c)))
#define ANY_256(c) (!_mm256_testz_si256((__m256i)(c), (__m256i)(c)))
/* AVX2 has no compress: the lanes of eight 32-bit lanes whose bit in m (a movemask's 8 bits) is set
   moved to the front by one permutation, its indices nmt_leftpack8[m] (a byte each, widened), the
   lanes after the kept ones left undefined (copies); the table filled when the library loads */
static uint64_t nmt_leftpack8[256] __attribute__((unused));
__attribute__((constructor, unused)) static void nmt_leftpack8_fill(void)
{
    for (unsigned m = 0; m < 256; m++) {
        uint64_t v = 0;
        for (unsigned l = 0, at = 0; l < 8; l++)
            if (m >> l & 1u)
                v |= (uint64_t)l << (8 * at++);
        nmt_leftpack8[m] = v;
    }
}
#define LEFTPACK8_INDEX(m) _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)nmt_leftpack8[(m)]))
#define LEFTPACK8_PS(v, m) _mm256_permutevar8x32_ps((v), LEFTPACK8_INDEX(m))
#define LEFTPACK8_EPI32(v, m) _mm256_permutevar8x32_epi32((v), LEFTPACK8_INDEX(m))
#endif

/* The maximum and the bad entries (NaN, +inf) of the row x of n entries by vectors VT of L lanes of
   T (integer lanes IT): from x[i_] while L entries are left (i_ ends at the first entry not read;
   the caller takes the rest), into the caller's top (max) and bad (or). Uses memcpy and INFINITY
   (the including file's <string.h>, <math.h>). */
#define MAXPASS_LANES(T, VT, IT, L, x, n)                                                       \
    do {                                                                                        \
        VT mx, xv;                                                                              \
        IT flags = {0};                                                                         \
        for (int l_ = 0; l_ < L; l_++) mx[l_] = -INFINITY;                                      \
        for (; i_ + L <= (n); i_ += L) {                                                        \
            memcpy(&xv, (x) + i_, sizeof xv);                                                   \
            flags |= (xv != xv) | (xv == (T)INFINITY);                                          \
            IT gt = xv > mx;                                                                    \
            mx = (VT)(((IT)xv & gt) | ((IT)mx & ~gt));                                          \
        }                                                                                       \
        for (int l_ = 0; l_ < L; l_++) {                                                        \
            bad |= flags[l_] != 0;                                                              \
            top = mx[l_] > top ? mx[l_] : top;                                                  \
        }                                                                                       \
    } while (0)

/* The row x of n entries by vectors VT of L lanes of T (integer lanes IT) in m_acc consecutive
   segments of seg entries (a multiple of L; the last one runs to the row's last whole vector): the
   maxima of each segment's lanes into bm[b * L + l] (two accumulators a segment: independent
   comparisons), the entries after the last whole vector (fewer than L) into the last segment's
   lanes one a lane; the row maximum into top, NaN / +inf entries or'd into bad. Any entries of the
   row, so a lower bound of a threshold found from them holds for the row. */
#define SEGMENT_MAXIMA(T, VT, IT, L, x, n, m_acc, seg, bm, top, bad)                            \
    do {                                                                                        \
        IT flags_ = {0};                                                                        \
        VT xv_;                                                                                 \
        int64_t j_ = 0;                                                                         \
        for (int64_t b_ = 0; b_ < (m_acc); b_++) {                                              \
            const int64_t end_ = b_ + 1 < (m_acc) ? j_ + (seg) : j_ + ((n) - j_) / L * L;       \
            VT a0_, a1_;                                                                        \
            for (int l_ = 0; l_ < L; l_++)                                                      \
                a0_[l_] = a1_[l_] = -INFINITY;                                                  \
            for (; j_ + 2 * L <= end_; j_ += 2 * L) {                                           \
                VT v1_;                                                                         \
                memcpy(&xv_, (x) + j_, sizeof xv_);                                             \
                memcpy(&v1_, (x) + j_ + L, sizeof v1_);                                         \
                flags_ |= (xv_ != xv_) | (xv_ == (T)INFINITY) | (v1_ != v1_) | (v1_ == (T)INFINITY); \
                const IT g0_ = xv_ > a0_, g1_ = v1_ > a1_;                                      \
                a0_ = (VT)(((IT)xv_ & g0_) | ((IT)a0_ & ~g0_));                                 \
                a1_ = (VT)(((IT)v1_ & g1_) | ((IT)a1_ & ~g1_));                                 \
            }                                                                                   \
            for (; j_ < end_; j_ += L) {                                                        \
                memcpy(&xv_, (x) + j_, sizeof xv_);                                             \
                flags_ |= (xv_ != xv_) | (xv_ == (T)INFINITY);                                  \
                const IT g0_ = xv_ > a0_;                                                       \
                a0_ = (VT)(((IT)xv_ & g0_) | ((IT)a0_ & ~g0_));                                 \
            }                                                                                   \
            const IT g_ = a1_ > a0_;                                                            \
            a0_ = (VT)(((IT)a1_ & g_) | ((IT)a0_ & ~g_));                                       \
            memcpy((bm) + b_ * L, &a0_, sizeof a0_);                                            \
        }                                                                                       \
        T *last_ = (bm) + ((m_acc) - 1) * L;                                                    \
        for (int l_ = 0; j_ < (n); j_++, l_++) {                                                \
            const T v_ = (x)[j_];                                                               \
            (bad) |= (v_ != v_) | (v_ == (T)INFINITY);                                          \
            last_[l_] = v_ > last_[l_] ? v_ : last_[l_];                                        \
        }                                                                                       \
        for (int64_t i_ = 0; i_ < (m_acc) * L; i_++)                                            \
            (top) = (bm)[i_] > (top) ? (bm)[i_] : (top);                                        \
        for (int l_ = 0; l_ < L; l_++)                                                          \
            (bad) |= flags_[l_] != 0;                                                           \
    } while (0)
#endif

/* Rows (or groups of rows) split over `threads` threads of the OpenMP team where the library was
   built with OpenMP (the process's one libgomp: torch's own pool, whose workers wait spinning for
   the next region; a thread of our own had to compete with them for a core), else all rows on
   this thread. Thread t_ runs rows [FIRST, LAST) and its scratch slot t_. One thread asked for:
   no parallel region (entering one costs microseconds, a small call's whole time). */
#ifdef _OPENMP
#include <omp.h>
#define FOR_THREADS(threads, rows, BODY)                                                        \
    do {                                                                                        \
        if ((threads) <= 1) {                                                                   \
            const int64_t t_ = 0, FIRST = 0, LAST = (rows);                                     \
            (void)t_;                                                                           \
            BODY;                                                                               \
        } else {                                                                                \
            _Pragma("omp parallel num_threads(threads)")                                        \
            {                                                                                   \
                const int64_t t_ = omp_get_thread_num(), nt_ = omp_get_num_threads();          \
                const int64_t FIRST = (rows) * t_ / nt_, LAST = (rows) * (t_ + 1) / nt_;        \
                BODY;                                                                           \
            }                                                                                   \
        }                                                                                       \
    } while (0)
#else
#define FOR_THREADS(threads, rows, BODY)                                                        \
    do {                                                                                        \
        (void)(threads);                                                                        \
        const int64_t t_ = 0, FIRST = 0, LAST = (rows);                                         \
        (void)t_;                                                                               \
        BODY;                                                                                   \
    } while (0)
#endif

#endif
