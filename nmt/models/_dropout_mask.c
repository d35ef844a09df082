/* Dropout of a float32 tensor with a counter-based mask: out[i] = x[i] * scale where entry i is
 * kept, 0 where it is dropped.
 *
 * Entry i is kept when the 32-bit word u(i) is at least `threshold` (= round(p 2^32), p the drop
 * probability): a Bernoulli(1 - p) draw up to 2^-32 in p. The words come from SplitMix64
 * (Steele, Lea & Flood 2014: its output function applied to seed + k * 0x9E3779B97F4A7C15, k the
 * pair's index), one 64-bit output for each pair of entries (2k: the low word, 2k + 1: the high
 * one). SplitMix64 passes BigCrush; a mask depends only on (seed, i), so the same seed gives the
 * same mask whatever the split over threads or the vector width, and the backward replays it
 * from the seed instead of keeping it (dropout's gradient is the same product: grad * mask *
 * scale).
 *
 * Vectors: GCC / Clang vector extensions of 64-bit lanes (eight where the processor has AVX-512,
 * four with AVX2, two otherwise; chosen at run time, as in nmt/sparse/_cpu_dispatch.h), the pairs
 * of a chunk in the lanes; a last odd entry by the scalar form. Built with OpenMP, a call splits
 * its pairs over the threads it is given. Nothing is allocated.
 */
#include <stdint.h>
#include <string.h>

#include "_cpu_dispatch.h"

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define MIX1 0xBF58476D1CE4E5B9ULL
#define MIX2 0x94D049BB133111EBULL

/* SplitMix64's output function */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * MIX1;
    z = (z ^ (z >> 27)) * MIX2;
    return z ^ (z >> 31);
}

/* pairs [first, last) one at a time (and the vector paths' rest) */
static void dropout_pairs_scalar(const float *x, int64_t n, uint64_t seed, uint32_t threshold, float scale,
                                 float *out, int64_t first, int64_t last)
{
    for (int64_t k = first; k < last; k++) {
        const uint64_t u = mix64(seed + (uint64_t)k * GOLDEN);
        const int64_t i = 2 * k;
        out[i] = (uint32_t)u >= threshold ? x[i] * scale : 0.0f;
        if (i + 1 < n)
            out[i + 1] = (uint32_t)(u >> 32) >= threshold ? x[i + 1] * scale : 0.0f;
    }
}

#if NMT_VECTORS
typedef uint64_t nmt_u64x2 __attribute__((vector_size(16)));
typedef uint64_t nmt_u64x4 __attribute__((vector_size(32)));
typedef uint64_t nmt_u64x8 __attribute__((vector_size(64)));
typedef uint32_t nmt_u32x4 __attribute__((vector_size(16)));
typedef uint32_t nmt_u32x8 __attribute__((vector_size(32)));
typedef uint32_t nmt_u32x16 __attribute__((vector_size(64)));

/* pairs [first, last): L pairs (2 L entries) a chunk, the words of a lane's output in the entries'
   order (low, high: little-endian, as the scalar form takes them) */
#define DEFINE_DROPOUT(NAME, ATTR, U64, U32, F32, I32, L)                                       \
ATTR static void NAME(const float *x, int64_t n, uint64_t seed, uint32_t threshold, float scale, \
                      float *out, int64_t first, int64_t last)                                  \
{                                                                                               \
    U64 k, step;                                                                                \
    for (int l = 0; l < L; l++) {                                                               \
        k[l] = seed + (uint64_t)(first + l) * GOLDEN;                                           \
        step[l] = (uint64_t)L * GOLDEN;                                                         \
    }                                                                                           \
    U32 th;                                                                                     \
    F32 sc;                                                                                     \
    for (int l = 0; l < 2 * L; l++) {                                                           \
        th[l] = threshold;                                                                      \
        sc[l] = scale;                                                                          \
    }                                                                                           \
    int64_t p = first;                                                                          \
    for (; p + L <= last && 2 * (p + L) <= n; p += L, k += step) {                              \
        U64 z = k;                                                                              \
        z = (z ^ (z >> 30)) * MIX1;                                                             \
        z = (z ^ (z >> 27)) * MIX2;                                                             \
        z ^= z >> 31;                                                                           \
        U32 u;                                                                                  \
        memcpy(&u, &z, sizeof u);                                                               \
        F32 xv;                                                                                 \
        memcpy(&xv, x + 2 * p, sizeof xv);                                                      \
        const I32 keep = (I32)(u >= th);                                                        \
        const F32 o = (F32)((I32)(xv * sc) & keep);                                             \
        memcpy(out + 2 * p, &o, sizeof o);                                                      \
    }                                                                                           \
    dropout_pairs_scalar(x, n, seed, threshold, scale, out, p, last);                           \
}

DEFINE_DROPOUT(dropout_v, , nmt_u64x2, nmt_u32x4, nmt_f32x4, nmt_i32x4, 2)
#ifdef NMT_WIDE_AVX2
DEFINE_DROPOUT(dropout_avx2, AVX2, nmt_u64x4, nmt_u32x8, nmt_f32x8, nmt_i32x8, 4)
#define DROPOUT_HAVE_AVX2() CPU_HAS_AVX2()
#ifdef NMT_WIDE_AVX512
DEFINE_DROPOUT(dropout_avx512, AVX512, nmt_u64x8, nmt_u32x16, nmt_f32x16, nmt_i32x16, 8)
#define DROPOUT_HAVE_AVX512() CPU_HAS_AVX512()
#endif
#endif
#endif

#ifndef DROPOUT_HAVE_AVX2
#define DROPOUT_HAVE_AVX2() 0
#define dropout_avx2 dropout_v
#endif
#ifndef DROPOUT_HAVE_AVX512
#define DROPOUT_HAVE_AVX512() 0
#define dropout_avx512 dropout_v
#endif
#if !NMT_VECTORS
#define dropout_v dropout_pairs_scalar
#endif

typedef void (*dropout_pairs)(const float *, int64_t, uint64_t, uint32_t, float, float *, int64_t, int64_t);

/* the chunks of eight pairs [first, last) */
static void dropout_chunks(dropout_pairs run, const float *x, int64_t n, uint64_t seed, uint32_t threshold,
                           float scale, float *out, int64_t first, int64_t last)
{
    const int64_t pairs = (n + 1) / 2;
    first *= 8;
    last = last * 8 < pairs ? last * 8 : pairs;
    if (last > first)
        run(x, n, seed, threshold, scale, out, first, last);
}

/* out[i] = x[i] * scale where u(i) >= threshold, else 0 (NaN and infinite x included), for i < n
   (x and out contiguous; out may be x), the seed read from *seed_at (a tensor's memory: the caller
   never reads it on the host): see the top of the file. Pairs split over `threads`
   threads in whole chunks of eight. */
void nmt_dropout_f32(const float *x, int64_t n, const uint64_t *seed_at, uint32_t threshold, float scale,
                     float *out, int threads)
{
    const uint64_t seed = *seed_at;
    const dropout_pairs run = DROPOUT_HAVE_AVX512() ? dropout_avx512 : DROPOUT_HAVE_AVX2() ? dropout_avx2 : dropout_v;
    FOR_THREADS(threads, ((n + 1) / 2 + 7) / 8,
                dropout_chunks(run, x, n, seed, threshold, scale, out, FIRST, LAST));
}
