/* Group averaging, row by row: the native CPU form of nmt.sparse._groups.group_average (the
 * Jacobian-vector product of the structured proxes: every member entry gets the mean of the
 * gradient over the members sharing its group id; other entries 0). Sums and counts in double,
 * per row over the ids [0, n_groups) in the caller's scratch (2 n_groups doubles a thread); an id
 * out of that range counts nowhere (0 for a member). Rows split over the threads. */
#include <stdint.h>

#include "_cpu_dispatch.h"

#define DEFINE_GROUP_AVERAGE(NAME, T)                                                           \
static void NAME##_row(const T *grad, const int64_t *groups, const uint8_t *member, int64_t n, \
                       int64_t n_groups, T *out, double *sum)                                   \
{                                                                                               \
    double *count = sum + n_groups;                                                             \
    for (int64_t g = 0; g < n_groups; g++)                                                      \
        sum[g] = count[g] = 0.0;                                                                \
    for (int64_t i = 0; i < n; i++) {                                                           \
        const int64_t g = groups[i];                                                            \
        if (member[i] && g >= 0 && g < n_groups) {                                              \
            sum[g] += (double)grad[i];                                                          \
            count[g] += 1.0;                                                                    \
        }                                                                                       \
    }                                                                                           \
    for (int64_t i = 0; i < n; i++) {                                                           \
        const int64_t g = groups[i];                                                            \
        out[i] = member[i] && g >= 0 && g < n_groups ? (T)(sum[g] / count[g]) : (T)0;           \
    }                                                                                           \
}                                                                                               \
                                                                                                \
void NAME(const T *grad, const int64_t *groups, const uint8_t *member, int64_t rows, int64_t n, \
          int64_t n_groups, T *out, double *scratch, int threads)                               \
{                                                                                               \
    FOR_THREADS(threads, rows,                                                                  \
                for (int64_t row = FIRST; row < LAST; row++)                                    \
                    NAME##_row(grad + row * n, groups + row * n, member + row * n, n, n_groups, \
                               out + row * n, scratch + t_ * 2 * n_groups));                    \
}

DEFINE_GROUP_AVERAGE(nmt_group_average_f32, float)
DEFINE_GROUP_AVERAGE(nmt_group_average_f64, double)
