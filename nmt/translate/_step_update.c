/* The bookkeeping of one beam search step after its candidates are known, row by row in one call:
 * what nmt/translate/search_step.py's select_step computes with some forty tensor operations on
 * (rows,) and (rows, k) tensors, each of which costs more than its arithmetic.
 *
 * Inputs per row r (rows of `slots` live prefixes before the step, k = beam size):
 *   prev[r, s]        score of the prefix of slot s before the step (-inf: no live prefix);
 *   unknown[r, s]     1 where that slot's log-probabilities hold a NaN or +inf;
 *   top_value[r, j], top_index[r, j]  (j < width, width = k or k + 1) the best candidates in
 *                     descending order, index s * vocab + token;
 *   exact_in[r], reason_in[r], best_in[r, 0 .. n_best), top_finished_in[r]: the row's state.
 * Outputs (new arrays; inputs are not written):
 *   score[r, j] = top_value[r, j], parent[r, j] = top_index / vocab, token[r, j] = top_index % vocab
 *   for j < k; live[r, j] = score, or -inf where the token is EOS (a finished hypothesis is no
 *   live prefix); best[r, .] the n_best largest of best_in[r, .] and of the finished candidates'
 *   score / penalty, descending; top_finished[r] = top_finished_in[r] or the best candidate
 *   finished; exact, reason: the certificate after the step, each violation recorded once, the
 *   first reason kept (certify: a live slot with an unknown log-probability -> code_nonfinite,
 *   then a finite candidate left out (width > k) -> code_pruned); done[r]: nothing live, or the
 *   row settled: its worst kept finished score is finite and either the best candidate of some
 *   step finished or that score is at least max(live) / bound_penalty, and (certify) the row is
 *   no longer exact (an exact row searches on until nothing is live).
 * The same values as the torch code, in the same type: divisions by penalty and bound_penalty
 * are made in T, the penalties rounded to T first, as torch divides a tensor by a Python number.
 * Returns 0, or 1 (nothing written) when k, width or n_best is out of range.
 */
#include <math.h>
#include <stdint.h>

#define NMT_MAX_BEST 256

#define DEFINE_STEP_UPDATE(NAME, T)                                                              \
int NAME(int64_t rows, int64_t slots, int64_t k, int64_t width, int64_t n_best, int64_t vocab,   \
         int64_t eos, int certify, double penalty, double bound_penalty, int64_t code_nonfinite, \
         int64_t code_pruned, const T *prev, const uint8_t *unknown, const T *top_value,         \
         const int64_t *top_index, const uint8_t *exact_in, const int64_t *reason_in,            \
         const T *best_in, const uint8_t *top_finished_in, T *score, T *live, int64_t *parent,   \
         int64_t *token, uint8_t *exact, int64_t *reason, T *best, uint8_t *top_finished,        \
         uint8_t *done)                                                                          \
{                                                                                                \
    const T neg_inf = (T)-INFINITY;                                                              \
    const T lp = (T)penalty, bound = (T)bound_penalty;                                           \
    T merged[NMT_MAX_BEST];                                                                      \
    if (k < 1 || width < k || width > k + 1 || n_best < 1 || n_best + k > NMT_MAX_BEST)         \
        return 1;                                                                                \
    for (int64_t r = 0; r < rows; r++) {                                                         \
        int ex = exact_in[r] != 0;                                                               \
        int64_t why = reason_in[r];                                                              \
        const T *tv = top_value + r * width;                                                     \
        const int64_t *ti = top_index + r * width;                                               \
        if (certify) {                                                                           \
            int nonfinite = 0;                                                                   \
            for (int64_t s = 0; s < slots; s++)                                                  \
                nonfinite |= unknown[r * slots + s] && prev[r * slots + s] > neg_inf;            \
            if (nonfinite && ex)                                                                 \
                why = code_nonfinite;                                                            \
            ex = ex && !nonfinite;                                                               \
            if (width > k) {                                                                     \
                int pruned = tv[k] > neg_inf;                                                    \
                if (pruned && ex)                                                                \
                    why = code_pruned;                                                           \
                ex = ex && !pruned;                                                              \
            }                                                                                    \
        }                                                                                        \
        int64_t filled = 0;                                                                      \
        for (int64_t j = 0; j < n_best; j++)                                                     \
            merged[filled++] = best_in[r * n_best + j];                                          \
        int any_live = 0, first_finished = 0;                                                    \
        T max_live = neg_inf;                                                                    \
        for (int64_t j = 0; j < k; j++) {                                                        \
            const T v = tv[j];                                                                   \
            const int64_t p = ti[j] / vocab, tok = ti[j] - p * vocab;                            \
            const int is_eos = tok == eos, finished = is_eos && v > neg_inf;                     \
            const T kept = is_eos ? neg_inf : v;                                                 \
            score[r * k + j] = v;                                                                \
            parent[r * k + j] = p;                                                               \
            token[r * k + j] = tok;                                                              \
            live[r * k + j] = kept;                                                              \
            any_live |= kept > neg_inf;                                                          \
            max_live = kept > max_live ? kept : max_live;                                        \
            merged[filled++] = finished ? v / lp : neg_inf;                                      \
            if (j == 0)                                                                          \
                first_finished = finished;                                                       \
        }                                                                                        \
        /* the n_best largest, descending: insertion sort of n_best + k values */               \
        for (int64_t i = 1; i < filled; i++) {                                                   \
            const T x = merged[i];                                                               \
            int64_t q = i;                                                                       \
            while (q > 0 && merged[q - 1] < x) {                                                 \
                merged[q] = merged[q - 1];                                                       \
                q--;                                                                             \
            }                                                                                    \
            merged[q] = x;                                                                       \
        }                                                                                        \
        for (int64_t j = 0; j < n_best; j++)                                                     \
            best[r * n_best + j] = merged[j];                                                    \
        const int top = top_finished_in[r] != 0 || first_finished;                               \
        const T worst = merged[n_best - 1];                                                      \
        int settled = worst > neg_inf && (top || worst >= max_live / bound);                     \
        if (certify)                                                                             \
            settled = settled && !ex;                                                            \
        exact[r] = (uint8_t)ex;                                                                  \
        reason[r] = why;                                                                         \
        top_finished[r] = (uint8_t)top;                                                          \
        done[r] = (uint8_t)(!any_live || settled);                                               \
    }                                                                                            \
    return 0;                                                                                    \
}

DEFINE_STEP_UPDATE(nmt_step_update_f32, float)
DEFINE_STEP_UPDATE(nmt_step_update_f64, double)
