/* Exact sorted thresholds of sparsemax (q = 1) and 1.5-entmax (q = 2), one row at a time.
 *
 * The native CPU form of nmt.sparse._threshold._numpy_sorted_shifted_threshold: for each row z
 * (n entries) it returns zmax (the row maximum) and tau_rel, the threshold of
 * v = scale * (z - zmax) with p = [v - tau_rel]_+^q summing to 1. The arithmetic is that of the
 * NumPy / torch paths, operation by operation in the row's type (no contraction into FMAs: build
 * with -ffp-contract=off), prefix sums accumulated in double, so the results are the same bits:
 *
 *   v_k sorted descending, clamped at -2;  cs_k, c2_k: prefix sums of v and v^2;
 *   q = 1: k = #{k : cs_k - k v_k < 1},  tau = (cs_k - 1) / k;
 *   q = 2: k = #{k : c2_k - 2 v_k (cs_k - k v_k / 2) < 1},
 *          tau = mean - sqrt(max((1 - c2_k) / k + mean^2, 0)),  mean = cs_k / k;  (k >= 1)
 *
 * Only entries that may pass the test are sorted: v > -1.5 (q = 1; below it the test value is at
 * least 1.5) or v > -1.25 (q = 2; at least 1.5625), found in one pass (narrowing them further
 * by a Newton lower bound of tau cost more than it saved on 16-50 entries).
 * Rows without a finite entry: tau = +inf, zmax = -0.0 (the other paths negate 0). Rows holding
 * NaN: zmax = NaN, tau of the other entries (NaN sorts last there); rows holding +inf, and rows
 * of only NaN: both NaN.
 * Rows are independent; nothing is allocated but the caller's scratch (2 n entries). One thread:
 * the inputs it serves are small (splitting (3840, 16) over two threads gained nothing while
 * torch's OpenMP workers still spin after the surrounding operators).
 */
#include <math.h>
#include <stdint.h>

#define DEFINE_SOLVE(NAME, T)                                                                   \
static void NAME##_sort_desc(T *a, T *tmp, int64_t m)                                           \
{                                                                                               \
    /* insertion sort of runs of 16, then bottom-up merges (descending) */                    \
    const int64_t run = 16;                                                                     \
    for (int64_t lo = 0; lo < m; lo += run) {                                                   \
        int64_t hi = lo + run < m ? lo + run : m;                                               \
        for (int64_t i = lo + 1; i < hi; i++) {                                                 \
            T x = a[i];                                                                         \
            int64_t j = i - 1;                                                                  \
            while (j >= lo && a[j] < x) { a[j + 1] = a[j]; j--; }                               \
            a[j + 1] = x;                                                                       \
        }                                                                                       \
    }                                                                                           \
    for (int64_t width = run; width < m; width *= 2) {                                          \
        for (int64_t lo = 0; lo < m; lo += 2 * width) {                                         \
            int64_t mid = lo + width < m ? lo + width : m;                                      \
            int64_t hi = lo + 2 * width < m ? lo + 2 * width : m;                               \
            int64_t i = lo, j = mid, o = lo;                                                    \
            while (i < mid && j < hi) tmp[o++] = a[i] >= a[j] ? a[i++] : a[j++];                \
            while (i < mid) tmp[o++] = a[i++];                                                  \
            while (j < hi) tmp[o++] = a[j++];                                                   \
        }                                                                                       \
        for (int64_t i = 0; i < m; i++) a[i] = tmp[i];                                          \
    }                                                                                           \
}                                                                                               \
                                                                                                \
void NAME(const T *z, int64_t rows, int64_t n, int q, double scale, T *tau, T *zmax, T *scratch)\
{                                                                                               \
    const T neg_scale = (T)(-scale);                                                            \
    const T bound = q == 1 ? (T)-1.5 : (T)-1.25;                                                \
    T *cand = scratch, *tmp = scratch + n;                                                      \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const T *row = z + r * n;                                                               \
        T top = -INFINITY;                                                                      \
        int64_t n_nan = 0;                                                                      \
        int has_posinf = 0;                                                                     \
        for (int64_t i = 0; i < n; i++) {                                                       \
            T x = row[i];                                                                       \
            if (x != x) n_nan++;                                                                \
            else if (x == INFINITY) has_posinf = 1;                                             \
            else if (x > top) top = x;                                                          \
        }                                                                                       \
        const int has_nan = n_nan > 0;                                                          \
        if (has_posinf || n_nan == n) { tau[r] = NAN; zmax[r] = NAN; continue; }                \
        if (top == -INFINITY) { tau[r] = INFINITY; zmax[r] = has_nan ? NAN : (T)-0.0; continue; }\
        /* v = (-z - (-zmax)) * (-scale), as the other paths round it */                        \
        const T neg_max = -top;                                                                 \
        int64_t m = 0;                                                                          \
        for (int64_t i = 0; i < n; i++) {                                                       \
            T x = row[i];                                                                       \
            if (x != x) continue;                                                               \
            T v = (T)((T)(-x - neg_max) * neg_scale);                                           \
            if (v > bound) cand[m++] = v;                                                       \
        }                                                                                       \
        NAME##_sort_desc(cand, tmp, m);                                                         \
        /* the support count over the sorted candidates; then the prefix sums at k = max(count, 1)   \
           again (the same additions in the same order: the same values) */                      \
        double s = 0.0, s2 = 0.0;                                                               \
        int64_t count = 0;                                                                      \
        for (int64_t k = 1; k <= m; k++) {                                                      \
            T v = cand[k - 1];                                                                  \
            s += (double)v;                                                                     \
            T cs_k = (T)s;                                                                      \
            T test = (T)((T)k * v);                                                             \
            if (q == 1) {                                                                       \
                test = (T)(cs_k - test);                                                        \
            } else {                                                                            \
                s2 += (double)(T)(v * v);                                                       \
                test = (T)(test * (T)-0.5);                                                     \
                test = (T)(test + cs_k);                                                        \
                test = (T)(test * v);                                                           \
                test = (T)(test * (T)-2);                                                       \
                test = (T)(test + (T)s2);                                                       \
            }                                                                                   \
            count += test < 1;                                                                  \
        }                                                                                       \
        const int64_t k = count > 0 ? count : 1; /* <= m: the maximum (v = 0) is a candidate */ \
        s = 0.0;                                                                                \
        s2 = 0.0;                                                                               \
        for (int64_t j = 0; j < k; j++) {                                                       \
            s += (double)cand[j];                                                               \
            s2 += (double)(T)(cand[j] * cand[j]);                                               \
        }                                                                                       \
        const T cs_last = (T)s, c2_last = (T)s2;                                                \
        const T kf = (T)k;                                                                      \
        if (q == 1) {                                                                           \
            tau[r] = (T)((T)(cs_last - (T)1) / kf);                                             \
        } else {                                                                                \
            T mean = (T)(cs_last / kf);                                                         \
            T rad = (T)((T)((T)((T)1 - c2_last) / kf) + (T)(mean * mean));                      \
            tau[r] = (T)(mean - (T)sqrt(rad > 0 ? (double)rad : 0.0));                          \
        }                                                                                       \
        zmax[r] = has_nan ? (T)NAN : top;                                                       \
    }                                                                                           \
}

DEFINE_SOLVE(nmt_sorted_threshold_f32, float)
DEFINE_SOLVE(nmt_sorted_threshold_f64, double)
