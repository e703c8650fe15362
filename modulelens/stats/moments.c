/* Moments of one contiguous CPU tensor in one pass (see modulelens/stats/fused.py).
 *
 * out[13] receives the moment vector of modulelens.stats.stats.FIELDS: numel, count (finite
 * elements), mean, M2, M3, M4 (central power sums of the finite elements), zeros, nan, inf, min,
 * max (over the finite elements), saturated count, sampled (always 0: every element is read).
 *
 * The power sums are accumulated in double around a shift (the mean of up to 256 evenly spaced
 * finite elements), then moved to the mean exactly; when the shift turns out to be more than 100
 * standard deviations from the mean (one huge outlier in the sample), a second pass around the
 * mean removes any cancellation. Saturation (sat_on): |x - centre| >= threshold.
 */
#include <math.h>
#include <tgmath.h> /* fabs of a float is fabsf: comparisons stay in the element type */
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

static inline float load_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }
static inline double load_f64(const void *p, int64_t i) { return ((const double *)p)[i]; }
static inline float load_bf16(const void *p, int64_t i) {
    uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline double load_f32_d(const void *p, int64_t i) { return load_f32(p, i); }
static inline double load_bf16_d(const void *p, int64_t i) { return load_bf16(p, i); }

typedef struct {
    double s1, s2, s3, s4, count, zeros, nan, sat, mn, mx;
} acc_t;

/* Both passes read the tensor in blocks of BLOCK elements: within a block, comparisons, counts,
 * min and max stay in the element type (VT: float for float32 and bfloat16, twice as many per
 * vector as double) and counts in VT are exact (below 2^24 per vector lane); only the power sums are
 * accumulated in double. Blocks are added up in double. */
#define BLOCK ((int64_t)1 << 20)

static void add_block(acc_t *a, double s1, double s2, double s3, double s4, double count, double zeros, double nan,
                      double sat, double mn, double mx) {
    a->s1 += s1; a->s2 += s2; a->s3 += s3; a->s4 += s4; a->count += count; a->zeros += zeros; a->nan += nan;
    a->sat += sat;
    a->mn = mn < a->mn ? mn : a->mn;
    a->mx = mx > a->mx ? mx : a->mx;
}

/* The pass for tensors without NaN/Inf (nearly all): no finiteness test per element. A NaN or Inf
 * shows in the sums or in min/max, and the caller then runs the careful pass. */
#define FAST_PASS(NAME, VT, LOAD)                                                                      \
    CLONES static void NAME(const void *x, int64_t n, double shift, double centre, double thr,        \
                            acc_t *a) {                                                                \
        *a = (acc_t){0, 0, 0, 0, 0, 0, 0, 0, INFINITY, -INFINITY};                                     \
        const VT c = (VT)centre, t = (VT)thr;                                                          \
        for (int64_t lo = 0; lo < n; lo += BLOCK) {                                                    \
            int64_t hi = n - lo < BLOCK ? n : lo + BLOCK;                                              \
            double s1 = 0, s2 = 0, s3 = 0, s4 = 0;                                                     \
            VT zeros = 0, sat = 0, mn = INFINITY, mx = -INFINITY;                                      \
            _Pragma("omp simd reduction(+:s1,s2,s3,s4,zeros,sat) reduction(min:mn) reduction(max:mx)") \
            for (int64_t i = lo; i < hi; i++) {                                                        \
                VT v = LOAD(x, i);                                                                     \
                double d = (double)v - shift;                                                          \
                double d2 = d * d;                                                                     \
                s1 += d;                                                                               \
                s2 += d2;                                                                              \
                s3 += d2 * d;                                                                          \
                s4 += d2 * d2;                                                                         \
                zeros += (v == 0) ? (VT)1 : (VT)0;                                                     \
                sat += (fabs(v - c) >= t) ? (VT)1 : (VT)0;                                             \
                mn = v < mn ? v : mn;                                                                  \
                mx = v > mx ? v : mx;                                                                  \
            }                                                                                          \
            add_block(a, s1, s2, s3, s4, (double)(hi - lo), zeros, 0, sat, mn, mx);                    \
        }                                                                                              \
    }

/* The careful pass: NaN and Inf are counted and left out of the sums, min and max. */
#define PASS(NAME, VT, LOAD)                                                                           \
    CLONES static void NAME(const void *x, int64_t n, double shift, double centre, double thr,        \
                            acc_t *a) {                                                                \
        *a = (acc_t){0, 0, 0, 0, 0, 0, 0, 0, INFINITY, -INFINITY};                                     \
        const VT c = (VT)centre, t = (VT)thr;                                                          \
        for (int64_t lo = 0; lo < n; lo += BLOCK) {                                                    \
            int64_t hi = n - lo < BLOCK ? n : lo + BLOCK;                                              \
            double s1 = 0, s2 = 0, s3 = 0, s4 = 0;                                                     \
            VT count = 0, zeros = 0, nan = 0, sat = 0, mn = INFINITY, mx = -INFINITY;                  \
            _Pragma("omp simd reduction(+:s1,s2,s3,s4,count,zeros,nan,sat) reduction(min:mn) reduction(max:mx)") \
            for (int64_t i = lo; i < hi; i++) {                                                        \
                VT v = LOAD(x, i);                                                                     \
                int fin = (v - v) == 0;                                                                \
                double d = fin ? (double)v - shift : 0.0;                                              \
                double d2 = d * d;                                                                     \
                s1 += d;                                                                               \
                s2 += d2;                                                                              \
                s3 += d2 * d;                                                                          \
                s4 += d2 * d2;                                                                         \
                count += fin ? (VT)1 : (VT)0;                                                          \
                zeros += (v == 0) ? (VT)1 : (VT)0;                                                     \
                nan += (v != v) ? (VT)1 : (VT)0;                                                       \
                sat += (fin && fabs(v - c) >= t) ? (VT)1 : (VT)0;                                      \
                mn = (fin && v < mn) ? v : mn;                                                         \
                mx = (fin && v > mx) ? v : mx;                                                         \
            }                                                                                          \
            add_block(a, s1, s2, s3, s4, count, zeros, nan, sat, mn, mx);                              \
        }                                                                                              \
    }

FAST_PASS(fast_f32, float, load_f32)
FAST_PASS(fast_f64, double, load_f64)
FAST_PASS(fast_bf16, float, load_bf16)
PASS(pass_f32, float, load_f32)
PASS(pass_f64, double, load_f64)
PASS(pass_bf16, float, load_bf16)

typedef void (*pass_fn)(const void *, int64_t, double, double, double, acc_t *);
typedef double (*load_fn)(const void *, int64_t);

static double sample_shift(const void *x, int64_t n, load_fn load) {
    int64_t stride = n > 256 ? n / 256 : 1;
    double s = 0, c = 0;
    for (int64_t i = 0; i < n; i += stride) {
        double v = load(x, i);
        if ((v - v) == 0.0) {
            s += v;
            c += 1.0;
        }
    }
    return c > 0 ? s / c : 0.0;
}

/* dtype: 0 float32, 1 float64, 2 bfloat16. Returns 0, or -1 for an unknown dtype. */
int modulelens_moments(const void *x, int64_t n, int dtype, int sat_on, double centre, double thr, double *out) {
    pass_fn fast, pass;
    load_fn load;
    switch (dtype) {
    case 0: fast = fast_f32; pass = pass_f32; load = load_f32_d; break;
    case 1: fast = fast_f64; pass = pass_f64; load = load_f64; break;
    case 2: fast = fast_bf16; pass = pass_bf16; load = load_bf16_d; break;
    default: return -1;
    }
    if (!sat_on)
        thr = INFINITY;
    double shift = sample_shift(x, n, load);
    acc_t a;
    fast(x, n, shift, centre, thr, &a);
    int finite = isfinite(a.s1) && isfinite(a.s2) && isfinite(a.s3) && isfinite(a.s4) && isfinite(a.mn) && isfinite(a.mx);
    if (!finite)
        pass(x, n, shift, centre, thr, &a);
    if (a.count > 0) {
        double mu = a.s1 / a.count, var = a.s2 / a.count - mu * mu;
        if (mu * mu > 1e4 * (var > 0 ? var : 0)) { /* the shift was far from the mean: redo around it */
            shift += mu;
            (finite ? fast : pass)(x, n, shift, centre, thr, &a);
        }
    }
    double cnt = a.count, mu = cnt > 0 ? a.s1 / cnt : 0.0;
    out[0] = (double)n;
    out[1] = cnt;
    out[2] = cnt > 0 ? shift + mu : 0.0;
    out[3] = cnt > 0 ? a.s2 - cnt * mu * mu : 0.0;
    out[4] = cnt > 0 ? a.s3 - 3 * mu * a.s2 + 2 * cnt * mu * mu * mu : 0.0;
    out[5] = cnt > 0 ? a.s4 - 4 * mu * a.s3 + 6 * mu * mu * a.s2 - 3 * cnt * mu * mu * mu * mu : 0.0;
    out[6] = a.zeros;
    out[7] = a.nan;
    out[8] = (double)n - cnt - a.nan;
    out[9] = a.mn;
    out[10] = a.mx;
    out[11] = a.sat;
    out[12] = 0.0;
    return 0;
}

/* Rows of a gradient that are exactly zero: row r holds the cols elements from r * row_stride on;
 * zero[r] = 1 when all of them are 0. Returns how many rows are zero here and (when previous is
 * given) were zero in previous too. A row of a live unit usually has a nonzero element at its
 * start, so this reads little more than one element per row. dtype as for modulelens_moments. */
int64_t modulelens_zero_rows(const void *x, int64_t rows, int64_t cols, int64_t row_stride, int dtype,
                             const uint8_t *previous, uint8_t *zero) {
    load_fn load;
    switch (dtype) {
    case 0: load = load_f32_d; break;
    case 1: load = load_f64; break;
    case 2: load = load_bf16_d; break;
    default: return -1;
    }
    int64_t count = 0;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t z = 1;
        for (int64_t c = 0; z && c < cols; c++)
            z = load(x, r * row_stride + c) == 0.0;
        zero[r] = z;
        count += z && (previous == 0 || previous[r]);
    }
    return count;
}
