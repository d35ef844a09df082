/* Taut strings of row prefixes, row by row: the native CPU form of nmt.sparse._taut_string.
 *
 * For a row x of length m with running sums r_0 = 0, r_k = x_1 + .. + x_k (in double), the taut
 * string is the shortest path from (0, 0) to (m, r_m) through the gates
 * r_k - lam_low <= s_k <= r_k + lam_up (k = 1 .. m - 1); its slopes y_i = s_{i+1} - s_i are the
 * prox of lam times 1-d total variation (lam_low = lam_up = lam) or, with lam_low = 0 and
 * lam_up = inf, the least-squares non-increasing (isotonic) fit of x.
 *
 * The funnel scan (the torch module's static algorithm, one start at a time): from a knot a at
 * height h, walk j = a + 1 .. m keeping the smallest slope to the upper walls (hi, and the node that
 * set it, the last on ties) and the largest to the lower walls (lo, likewise); at the first j with
 * lo > hi the string bends: down at the upper node that set hi when the lower wall at j rose above
 * the previous hi, else up at the lower node that set lo. That node is the next knot (height
 * r + lam_up or r - lam_low); without a crossing the string runs straight to (m, r_m). Every
 * position of the segment between two knots gets the slope
 * (sum of x over it + offset(end) - offset(start)) / length (offset +lam_up at an upper knot,
 * -lam_low at a lower one, 0 at the ends) and the segment's first position as its group.
 * The isotonic fit takes pool-adjacent-violators instead (the same blocks: adjacent blocks of
 * equal means merge, as collinear points lie on one segment of the majorant), O(m) where the scan
 * from every vertex to the end would be O(m^2).
 *
 * Positions at or past the length: y = 0, group m. Work per row: the scan's walks, each from a knot
 * to just past the next (O(m) for the short segments of attention rows, O(m^2) at worst); sums and
 * slopes in double. Scratch: 2 n + 1 doubles a thread (the running sums, or the isotonic fit's
 * values and block sums with the groups' array for their starts). Rows split over the threads.
 *
 * NAME_ordered: the ordered fit of OSCAR (nmt.sparse._prox_oscar.ordered_fit), the prox of
 * lam sum_{i<j} max(z_i, z_j): sort the keys decreasingly (stable), subtract lam (m - 1 - k) from
 * the k-th, fit them non-increasing (pool adjacent violators), put the fit back in place; groups are
 * the blocks' first sorted positions. Scratch: 4 n words a thread. */
#include <math.h>
#include <stdint.h>

#include "_cpu_dispatch.h"

/* Pool adjacent violators on v[0 .. m): the blocks of the least-squares non-increasing fit, as a
   stack (sum[b], start[b] its first position; a block ends where the next starts, the last at m);
   a block merges into the one below while that one's mean is at most its own (equal means merge:
   collinear points lie on one segment of the majorant). Returns the number of blocks. */
static int64_t pav_blocks(const double *v, int64_t m, double *sum, int64_t *start)
{
    int64_t top = -1;
    for (int64_t i = 0; i < m; i++) {
        double s = v[i];
        int64_t first = i;
        while (top >= 0 && sum[top] * (double)(i + 1 - first) <= s * (double)(first - start[top])) {
            s += sum[top];
            first = start[top];
            top--;
        }
        sum[++top] = s;
        start[top] = first;
    }
    return top + 1;
}

#define DEFINE_TAUT(NAME, T)                                                                    \
/* the row's length clamped to [0, n]; past it: value 0, group m */                            \
static int64_t NAME##_pad(int64_t n, int64_t m, T *out, int64_t *groups)                       \
{                                                                                               \
    m = m < 0 ? 0 : m > n ? n : m;                                                              \
    for (int64_t i = m; i < n; i++) {                                                           \
        out[i] = (T)0;                                                                          \
        groups[i] = m;                                                                          \
    }                                                                                           \
    return m;                                                                                   \
}                                                                                               \
                                                                                                \
static void NAME##_row(const T *x, int64_t n, int64_t m, double lam_low, double lam_up, T *y,  \
                       int64_t *groups, double *r)                                              \
{                                                                                               \
    m = NAME##_pad(n, m, y, groups);                                                            \
    if (m == 0)                                                                                 \
        return;                                                                                 \
    if (lam_low == 0.0 && lam_up == INFINITY) { /* pool adjacent violators */                  \
        double *v = r, *sum = r + n; /* (scratch: 2 n + 1 doubles) */                           \
        for (int64_t i = 0; i < m; i++)                                                         \
            v[i] = (double)x[i];                                                                \
        int64_t *start = groups; /* the blocks' starts, overwritten from the top below */       \
        for (int64_t b = pav_blocks(v, m, sum, start) - 1, end = m; b >= 0; end = start[b], b--) { \
            const int64_t first = start[b];                                                     \
            const T val = (T)(sum[b] / (double)(end - first));                                  \
            for (int64_t i = first; i < end; i++) { /* (start[b] <= first: no unread start lost) */ \
                y[i] = val;                                                                     \
                groups[i] = first;                                                              \
            }                                                                                   \
        }                                                                                       \
        return;                                                                                 \
    }                                                                                           \
    r[0] = 0.0;                                                                                 \
    for (int64_t k = 0; k < m; k++)                                                             \
        r[k + 1] = r[k] + (double)x[k];                                                         \
    int64_t a = 0;                                                                              \
    double h = 0.0, off_a = 0.0; /* the knot's height and offset (0 at the start) */            \
    while (a < m) {                                                                             \
        double hi = INFINITY, lo = -INFINITY;                                                   \
        int64_t hi_at = -1, lo_at = -1, b = m;                                                  \
        double off_b = 0.0;                                                                     \
        for (int64_t j = a + 1; j <= m; j++) {                                                  \
            const int inner = j < m;                                                            \
            const double up = inner ? r[j] + lam_up : r[j], low = inner ? r[j] - lam_low : r[j];  \
            const double len = (double)(j - a), su = (up - h) / len, sl = (low - h) / len;      \
            const double prev_hi = hi;                                                          \
            const int64_t prev_hi_at = hi_at, prev_lo_at = lo_at;                               \
            if (su <= hi) {                                                                     \
                hi = su;                                                                        \
                hi_at = j;                                                                      \
            }                                                                                   \
            if (sl >= lo) {                                                                     \
                lo = sl;                                                                        \
                lo_at = j;                                                                      \
            }                                                                                   \
            if (lo > hi) { /* the funnel closed at j: bend at the node of the side crossed */  \
                if (sl > prev_hi) {                                                             \
                    b = prev_hi_at;                                                             \
                    off_b = lam_up;                                                             \
                } else {                                                                        \
                    b = prev_lo_at;                                                             \
                    off_b = -lam_low;                                                           \
                }                                                                               \
                break;                                                                          \
            }                                                                                   \
        }                                                                                       \
        double seg = 0.0;                                                                       \
        for (int64_t i = a; i < b; i++)                                                         \
            seg += (double)x[i];                                                                \
        const T v = (T)((seg + off_b - off_a) / (double)(b - a));                               \
        for (int64_t i = a; i < b; i++) {                                                       \
            y[i] = v;                                                                           \
            groups[i] = a;                                                                      \
        }                                                                                       \
        h = b < m ? r[b] + off_b : r[m];                                                        \
        off_a = off_b;                                                                          \
        a = b;                                                                                  \
    }                                                                                           \
}                                                                                               \
                                                                                                \
void NAME(const T *x, int64_t rows, int64_t n, const int64_t *lengths, double lam_low, double lam_up, \
          T *y, int64_t *groups, double *scratch, int threads)                                  \
{                                                                                               \
    FOR_THREADS(threads, rows,                                                                  \
                for (int64_t row = FIRST; row < LAST; row++)                                    \
                    NAME##_row(x + row * n, n, lengths[row], lam_low, lam_up, y + row * n,      \
                               groups + row * n, scratch + t_ * (2 * n + 1)));                  \
}                                                                                               \
                                                                                                \
/* the ordered fit of a row (keys of length n, the first m used): positions sorted by key,       \
   decreasing and stable (insertion sort into idx, merges of runs of 16 above), v = the sorted keys \
   less lam (m - 1 - k), its non-increasing fit by pool adjacent violators, written back at the    \
   positions; groups: the first sorted position of each block. A NaN key: the row's fit NaN. */   \
static void NAME##_ordered_row(const T *keys, int64_t n, int64_t m, double lam, T *fit,        \
                               int64_t *groups, double *scratch)                                \
{                                                                                               \
    m = NAME##_pad(n, m, fit, groups);                                                          \
    int64_t *idx = (int64_t *)scratch, *tmp = idx + n;                                          \
    double *v = scratch + 2 * n, *sum = scratch + 3 * n;                                        \
    int nan = 0;                                                                                \
    for (int64_t i = 0; i < m; i++) {                                                           \
        nan |= keys[i] != keys[i];                                                              \
        idx[i] = i;                                                                             \
    }                                                                                           \
    if (nan) {                                                                                  \
        for (int64_t i = 0; i < m; i++) {                                                       \
            fit[i] = (T)NAN;                                                                    \
            groups[i] = 0;                                                                      \
        }                                                                                       \
        return;                                                                                 \
    }                                                                                           \
    for (int64_t lo = 0; lo < m; lo += 16) { /* runs of 16 by insertion (stable) */             \
        const int64_t hi = lo + 16 < m ? lo + 16 : m;                                           \
        for (int64_t i = lo + 1; i < hi; i++) {                                                 \
            const int64_t cur = idx[i];                                                         \
            int64_t j = i;                                                                      \
            for (; j > lo && keys[idx[j - 1]] < keys[cur]; j--)                                 \
                idx[j] = idx[j - 1];                                                            \
            idx[j] = cur;                                                                       \
        }                                                                                       \
    }                                                                                           \
    for (int64_t width = 16; width < m; width *= 2) { /* stable merges: the left run first on ties */ \
        for (int64_t lo = 0; lo < m; lo += 2 * width) {                                         \
            const int64_t mid = lo + width < m ? lo + width : m, hi = lo + 2 * width < m ? lo + 2 * width : m; \
            int64_t a = lo, b = mid, k = lo;                                                    \
            while (a < mid && b < hi)                                                           \
                tmp[k++] = keys[idx[b]] > keys[idx[a]] ? idx[b++] : idx[a++];                   \
            while (a < mid)                                                                     \
                tmp[k++] = idx[a++];                                                            \
            while (b < hi)                                                                      \
                tmp[k++] = idx[b++];                                                            \
        }                                                                                       \
        for (int64_t i = 0; i < m; i++)                                                         \
            idx[i] = tmp[i];                                                                    \
    }                                                                                           \
    for (int64_t k = 0; k < m; k++)                                                             \
        v[k] = (double)keys[idx[k]] - lam * (double)(m - 1 - k);                                \
    int64_t *start = tmp;                                                                       \
    for (int64_t b = pav_blocks(v, m, sum, start) - 1, end = m; b >= 0; end = start[b], b--) { \
        const int64_t first = start[b];                                                         \
        const T val = (T)(sum[b] / (double)(end - first));                                      \
        for (int64_t k = first; k < end; k++) {                                                 \
            fit[idx[k]] = val;                                                                  \
            groups[idx[k]] = first;                                                             \
        }                                                                                       \
    }                                                                                           \
}                                                                                               \
                                                                                                \
void NAME##_ordered(const T *keys, int64_t rows, int64_t n, const int64_t *lengths, double lam, T *fit, \
                    int64_t *groups, double *scratch, int threads)                              \
{                                                                                               \
    FOR_THREADS(threads, rows,                                                                  \
                for (int64_t row = FIRST; row < LAST; row++)                                    \
                    NAME##_ordered_row(keys + row * n, n, lengths[row], lam, fit + row * n,     \
                                       groups + row * n, scratch + t_ * 4 * n));                \
}

DEFINE_TAUT(nmt_taut_string_f32, float)
DEFINE_TAUT(nmt_taut_string_f64, double)
