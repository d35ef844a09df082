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
#define AVX2 __attribute__((target("avx2")))
#define CPU_HAS_AVX2() __builtin_cpu_supports("avx2")
#if !defined(NMT_NO_AVX512)
#define NMT_WIDE_AVX512 1
#define AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,popcnt")))
#define CPU_HAS_AVX512() (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")    \
                          && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") \
                          && __builtin_cpu_supports("popcnt"))
#endif
#endif

#if NMT_VECTORS
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
