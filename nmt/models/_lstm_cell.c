/* An LSTM cell's element-wise update for CPU inference, in one pass over its gates.
 *
 * Gates in sigmoid form (nmt/models/lstm_gates.py): per row the pre-activations of the four gates
 * (i, f, o, g), each `hidden` wide, the cell gate's rows doubled so that tanh(g) = 2 sigmoid(2g) - 1.
 * For row r (of `rows`) and unit j:
 *   a_k = gates[r, k H + j] (+ add[r, k H + j] where `add` is given), k = 0..3;
 *   i, f, o, s = sigmoid(a_0..a_3);
 *   c' = f c[r, j] + i (2 s - 1);   h' = o tanh(c')
 * with sigmoid(x) = 1 / (1 + exp(-x)) and tanh(x) = 2 sigmoid(2x) - 1, written to c_out[r, j] and
 * h_out[r, j]. Rows of `gates` are contiguous (4 H entries); rows of c, c_out and h_out start
 * every c_stride, c_out_stride and h_out_stride entries (their `hidden` entries contiguous); row r
 * of `add` at add + (r / add_block) * add_outer + (r % add_block) * add_inner (one time step of the
 * encoder's input products, both directions: blocks of add_block rows).
 *
 * exp is computed here (Cody-Waite reduction by ln 2, a degree-6 polynomial, the power of two
 * from the exponent bits; arguments clamped to [-87, 88], so every result is a normal float):
 * within 2 ulp of the exact value; the cell's outputs differ from torch's by ~1e-7. Every entry
 * takes the same arithmetic in the same order on every path (512-bit vectors where the processor
 * has AVX-512, 256-bit with AVX2, 128-bit through the compiler's vector extensions, one entry at a
 * time with -DNMT_ROWS_ONLY; a row's last entries in a zero-padded vector), no contraction into
 * FMAs (-ffp-contract=off): the same bits on every path. Rows split over `threads` threads where
 * built with OpenMP. Nothing is allocated.
 */
#include <stdint.h>
#include <string.h>

#include "_cpu_dispatch.h"

#define EXP_LO (-87.0f)
#define EXP_HI 88.0f
#define LOG2E 1.44269504088896341f
#define ROUNDER 12582912.0f /* 1.5 * 2^23: t + ROUNDER - ROUNDER rounds t to an integer */
#define LN2_HI 0.693359375f
#define LN2_LO (-2.12194440e-4f)
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f

/* exp(x) of one float, the arithmetic of the vector versions below, entry for entry */
static inline float exp_1(float x)
{
    x = x < EXP_LO ? EXP_LO : x;
    x = x > EXP_HI ? EXP_HI : x;
    const float n = (x * LOG2E + ROUNDER) - ROUNDER;
    const float r = (x - n * LN2_HI) - n * LN2_LO;
    const float p = (((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5);
    const float y = (p * (r * r) + r) + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

static inline float sigmoid_1(float x) { return 1.0f / (1.0f + exp_1(-x)); }

/* one entry of the update (see the top of the file) */
static inline void cell_1(float a0, float a1, float a2, float a3, float c, float *c_out, float *h_out)
{
    const float i = sigmoid_1(a0), f = sigmoid_1(a1), o = sigmoid_1(a2), s = sigmoid_1(a3);
    const float cn = f * c + i * (2.0f * s - 1.0f);
    *c_out = cn;
    *h_out = o * (2.0f * sigmoid_1(2.0f * cn) - 1.0f);
}

#if !NMT_VECTORS
static void cell_rows_1(const float *gates, const float *add, int64_t add_block, int64_t add_outer,
                        int64_t add_inner, const float *c, int64_t c_stride, int64_t first, int64_t last,
                        int64_t hidden, float *c_out, int64_t c_out_stride, float *h_out, int64_t h_out_stride)
{
    for (int64_t r = first; r < last; r++) {
        const float *g = gates + r * 4 * hidden;
        const float *a = add ? add + (r / add_block) * add_outer + (r % add_block) * add_inner : 0;
        for (int64_t j = 0; j < hidden; j++) {
            float x[4];
            for (int k = 0; k < 4; k++)
                x[k] = a ? g[k * hidden + j] + a[k * hidden + j] : g[k * hidden + j];
            cell_1(x[0], x[1], x[2], x[3], c[r * c_stride + j], c_out + r * c_out_stride + j,
                   h_out + r * h_out_stride + j);
        }
    }
}
#endif

#if NMT_VECTORS
/* The same arithmetic, LANES entries at a time (VT: float lanes, IT: int32 lanes of the same size).
   Lanes are selected by masks (vector ?: is C++ only). */
#define DEFINE_CELL_ROWS(NAME, VT, IT, LANES, ATTR)                                             \
ATTR static inline __attribute__((always_inline)) VT NAME##_exp(VT x)                                                          \
{                                                                                               \
    const VT lo = (VT){0} + EXP_LO, hi = (VT){0} + EXP_HI;                                      \
    IT m = x < lo;                                                                              \
    x = (VT)(((IT)x & ~m) | ((IT)lo & m));                                                      \
    m = x > hi;                                                                                 \
    x = (VT)(((IT)x & ~m) | ((IT)hi & m));                                                      \
    const VT n = (x * LOG2E + ROUNDER) - ROUNDER;                                               \
    const VT r = (x - n * LN2_HI) - n * LN2_LO;                                                 \
    const VT p = (((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5);                     \
    const VT y = (p * (r * r) + r) + 1.0f;                                                      \
    const IT bits = (__builtin_convertvector(n, IT) + 127) << 23;                               \
    return y * (VT)bits;                                                                        \
}                                                                                               \
ATTR static inline __attribute__((always_inline)) VT NAME##_sigmoid(VT x) { return 1.0f / (1.0f + NAME##_exp(-x)); }          \
ATTR static inline __attribute__((always_inline)) void NAME##_lanes(const float *g, const float *a, const float *cr,                  \
                                    int64_t hidden, int64_t j, int64_t n_, float *co, float *ho) \
{                                                                                               \
    VT x[4], cv = {0}, cn, h;                                                                   \
    for (int k = 0; k < 4; k++) {                                                               \
        x[k] = (VT){0};                                                                         \
        if (n_ == LANES)                                                                        \
            memcpy(&x[k], g + k * hidden + j, sizeof(VT));                                      \
        else                                                                                    \
            memcpy(&x[k], g + k * hidden + j, n_ * sizeof(float));                              \
        if (a) {                                                                                \
            VT b = {0};                                                                         \
            if (n_ == LANES)                                                                    \
                memcpy(&b, a + k * hidden + j, sizeof(VT));                                     \
            else                                                                                \
                memcpy(&b, a + k * hidden + j, n_ * sizeof(float));                             \
            x[k] = x[k] + b;                                                                    \
        }                                                                                       \
    }                                                                                           \
    if (n_ == LANES)                                                                            \
        memcpy(&cv, cr + j, sizeof(VT));                                                        \
    else                                                                                        \
        memcpy(&cv, cr + j, n_ * sizeof(float));                                                \
    const VT i = NAME##_sigmoid(x[0]), f = NAME##_sigmoid(x[1]);                                \
    const VT o = NAME##_sigmoid(x[2]), s = NAME##_sigmoid(x[3]);                                \
    cn = f * cv + i * (2.0f * s - 1.0f);                                                        \
    h = o * (2.0f * NAME##_sigmoid(2.0f * cn) - 1.0f);                                          \
    if (n_ == LANES) {                                                                          \
        memcpy(co + j, &cn, sizeof(VT));                                                        \
        memcpy(ho + j, &h, sizeof(VT));                                                         \
    } else {                                                                                    \
        memcpy(co + j, &cn, n_ * sizeof(float));                                                \
        memcpy(ho + j, &h, n_ * sizeof(float));                                                 \
    }                                                                                           \
}                                                                                               \
ATTR static void NAME(const float *gates, const float *add, int64_t add_block, int64_t add_outer, \
                      int64_t add_inner, const float *c, int64_t c_stride, int64_t first,       \
                      int64_t last, int64_t hidden, float *c_out, int64_t c_out_stride,         \
                      float *h_out, int64_t h_out_stride)                                       \
{                                                                                               \
    for (int64_t r = first; r < last; r++) {                                                    \
        const float *g = gates + r * 4 * hidden;                                                \
        const float *a = add ? add + (r / add_block) * add_outer + (r % add_block) * add_inner : 0; \
        const float *cr = c + r * c_stride;                                                     \
        float *co = c_out + r * c_out_stride, *ho = h_out + r * h_out_stride;                   \
        int64_t j = 0;                                                                          \
        for (; j + LANES <= hidden; j += LANES) /* whole vectors: constant-size copies */       \
            NAME##_lanes(g, a, cr, hidden, j, LANES, co, ho);                                   \
        if (j < hidden) /* the row's last entries in a zero-padded vector */                    \
            NAME##_lanes(g, a, cr, hidden, j, hidden - j, co, ho);                              \
    }                                                                                           \
}
#define NO_ATTR
DEFINE_CELL_ROWS(cell_rows_v, nmt_f32x4, nmt_i32x4, 4, NO_ATTR)
#else
#define cell_rows_v cell_rows_1
#endif

#if NMT_VECTORS && defined(NMT_WIDE_AVX2)
DEFINE_CELL_ROWS(cell_rows_avx2, nmt_f32x8, nmt_i32x8, 8, AVX2)
#define HAVE_AVX2() CPU_HAS_AVX2()
#else
#define cell_rows_avx2 cell_rows_v
#define HAVE_AVX2() 0
#endif

#if NMT_VECTORS && defined(NMT_WIDE_AVX512)
DEFINE_CELL_ROWS(cell_rows_avx512, nmt_f32x16, nmt_i32x16, 16, AVX512)
#define HAVE_AVX512() CPU_HAS_AVX512()
#else
#define cell_rows_avx512 cell_rows_avx2
#define HAVE_AVX512() 0
#endif

/* rows split over `threads` threads (FOR_THREADS, _cpu_dispatch.h) */
void nmt_lstm_cell_f32(const float *gates, const float *add, int64_t add_block, int64_t add_outer, int64_t add_inner,
                       const float *c, int64_t c_stride, int64_t rows, int64_t hidden, float *c_out,
                       int64_t c_out_stride, float *h_out, int64_t h_out_stride, int threads)
{
    void (*run)(const float *, const float *, int64_t, int64_t, int64_t, const float *, int64_t, int64_t, int64_t,
                int64_t, float *, int64_t, float *, int64_t) =
        HAVE_AVX512() ? cell_rows_avx512 : HAVE_AVX2() ? cell_rows_avx2 : cell_rows_v;
    FOR_THREADS(threads, rows, run(gates, add, add_block, add_outer, add_inner, c, c_stride, FIRST, LAST, hidden,
                                   c_out, c_out_stride, h_out, h_out_stride));
}
