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
 * shows in the sums or in min/max, and the caller then runs the careful pass. SAT (0 or 1, known at
 * compile time): count saturated elements; without it the loop does a fifth less work. */
#define FAST_PASS(NAME, VT, LOAD, SAT)                                                                 \
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
                if (SAT)                                                                               \
                    sat += (fabs(v - c) >= t) ? (VT)1 : (VT)0;                                         \
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

FAST_PASS(fast_f32, float, load_f32, 1)
FAST_PASS(fast_f64, double, load_f64, 1)
FAST_PASS(fast_bf16, float, load_bf16, 1)
FAST_PASS(plain_f32, float, load_f32, 0)
FAST_PASS(plain_f64, double, load_f64, 0)
FAST_PASS(plain_bf16, float, load_bf16, 0)
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
    case 0: fast = sat_on ? fast_f32 : plain_f32; pass = pass_f32; load = load_f32_d; break;
    case 1: fast = sat_on ? fast_f64 : plain_f64; pass = pass_f64; load = load_f64; break;
    case 2: fast = sat_on ? fast_bf16 : plain_bf16; pass = pass_bf16; load = load_bf16_d; break;
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
 * given) were zero in previous too; previous may be zero itself (updated in place). A row of a live unit usually has a nonzero element at its
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
        uint8_t before = previous == 0 || previous[r];
        zero[r] = z;
        count += z && before;
    }
    return count;
}

/* Softmax rows from their logits (see modulelens/stats/softmax.py). For a row x with maximum m,
 * e = exp(x - m) and Z = sum(e): the probabilities are e / Z, the largest is 1 / Z and the entropy is
 * log Z - sum(e * (x - m)) / Z. Entries of -inf are masked. Rows with fewer than two unmasked entries
 * are left out; a row holding NaN (or +inf) counts with statistics 0, as the PyTorch path's
 * nan_to_num does. The exponential is a polynomial (relative error about 1e-7) that vectorises. */
typedef struct {
    double kept, entropy, top, peaked;
} soft_t;

#define SOFT_CHUNK 128

static inline float exp_nonpositive(float x) {
    /* exp(x) for x <= 0: 2^k * exp(r), k = round(x / ln 2), |r| <= ln(2) / 2, a degree-7 Taylor
     * polynomial for exp(r) (truncation below 6e-9). Below -87 (and for NaN) the result is 0. */
    float xc = x >= -87.0f ? x : -87.0f;
    float kf = (xc * 1.44269504f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = (xc - kf * 0.693145752f) - kf * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * (8.3333338e-3f
              + r * (1.3888889e-3f + r * 1.9841270e-4f))))));
    int32_t bits = ((int32_t)kf + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale * (x >= -87.0f ? 1.0f : 0.0f); /* a product, not a branch: it vectorises */
}

CLONES static void softmax_row(const float *x, int64_t n, double onehot, soft_t *acc) {
    float m = -INFINITY, unmasked = 0;
#pragma omp simd reduction(max:m) reduction(+:unmasked)
    for (int64_t i = 0; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        unmasked += x[i] != -INFINITY ? 1.0f : 0.0f;
    }
    if (unmasked < 2)
        return;
    /* Sums in float over chunks of SOFT_CHUNK entries (a few per vector lane), added up in double:
     * mixing float and double in the loop would stop it from vectorising. */
    double z = 0, w = 0, bad = 0;
    for (int64_t lo = 0; lo < n; lo += SOFT_CHUNK) {
        int64_t hi = n - lo < SOFT_CHUNK ? n : lo + SOFT_CHUNK;
        float zc = 0, wc = 0, badc = 0;
#pragma omp simd reduction(+:zc, wc, badc)
        for (int64_t i = lo; i < hi; i++) {
            float d = x[i] - m; /* NaN for NaN entries and for +inf ones (inf - inf) */
            float e = exp_nonpositive(d);
            float dc = d >= -87.0f ? d : 0.0f; /* where e is 0: 0, not 0 * -inf */
            badc += d != d ? 1.0f : 0.0f;
            zc += e;
            wc += e * dc;
        }
        z += zc;
        w += wc;
        bad += badc;
    }
    acc->kept += 1;
    if (bad > 0)
        return;
    double top = 1.0 / z;
    acc->entropy += (log(z) - w / z) / log((double)unmasked);
    acc->top += top;
    acc->peaked += top >= onehot;
}

/* out[4]: the kept rows, the sum of their entropies / log(unmasked entries), of their largest
 * probabilities, and the number whose largest probability is at least onehot. logits: (rows, n),
 * contiguous float32. */
void modulelens_softmax_rows(const float *logits, int64_t rows, int64_t n, double onehot, double *out) {
    soft_t acc = {0, 0, 0, 0};
    for (int64_t r = 0; r < rows; r++)
        softmax_row(logits + r * n, n, onehot, &acc);
    out[0] = acc.kept; out[1] = acc.entropy; out[2] = acc.top; out[3] = acc.peaked;
}

/* The rows of the attention weights softmax(q k^T * scale) of scaled_dot_product_attention without
 * an attention mask, for the query rows 0, step, 2 step... q (nb0, nb1, L, dim) and k (nb0, nb1, keys,
 * dim) are float32 with strides qs[4] and ks[4] in elements (0 where a batch dimension broadcasts).
 * causal: query i sees keys 0..i (is_causal=True). work: room for (dim + 1) * keys floats. out[4] as
 * for modulelens_softmax_rows. Logits are accumulated in float, as a float32 matmul does. */
CLONES void modulelens_attention_rows(const float *q, const int64_t *qs, const float *k, const int64_t *ks, int64_t nb0,
                                      int64_t nb1, int64_t rows, int64_t step, int64_t dim, int64_t keys, double scale,
                                      int causal, float *work, double onehot, double *out) {
    soft_t acc = {0, 0, 0, 0};
    float *restrict kt = work, *restrict logits = work + dim * keys;
    const float sc = (float)scale;
    for (int64_t b0 = 0; b0 < nb0; b0++) {
        for (int64_t b1 = 0; b1 < nb1; b1++) {
            const float *kb = k + b0 * ks[0] + b1 * ks[1], *qb = q + b0 * qs[0] + b1 * qs[1];
            for (int64_t j = 0; j < keys; j++) /* the keys transposed: each logit row is a vector loop */
                for (int64_t d = 0; d < dim; d++)
                    kt[d * keys + j] = kb[j * ks[2] + d * ks[3]];
            for (int64_t r = 0; r < rows; r++) {
                const float *qr = qb + r * step * qs[2];
                int64_t n = causal ? (r * step + 1 < keys ? r * step + 1 : keys) : keys;
                for (int64_t j = 0; j < n; j++)
                    logits[j] = 0.0f;
                for (int64_t d = 0; d < dim; d++) {
                    const float qd = qr[d * qs[3]], *restrict kd = kt + d * keys;
#pragma omp simd
                    for (int64_t j = 0; j < n; j++)
                        logits[j] += qd * kd[j];
                }
#pragma omp simd
                for (int64_t j = 0; j < n; j++)
                    logits[j] *= sc;
                softmax_row(logits, n, onehot, &acc);
            }
        }
    }
    out[0] = acc.kept; out[1] = acc.entropy; out[2] = acc.top; out[3] = acc.peaked;
}

/* Parameter statistics of one optimizer step in one call (see modulelens/stats/updates.py).
 * rec holds PARAM_FIELDS int64 fields per parameter:
 *   0 weight, 1 its dtype, 2 its numel, 3 its gradient (0: none; same dtype-independent numel),
 *   4 the gradient's dtype, 5-7 the update sample: rows, columns, row stride (elements of the
 *   weight from its start), 8 where to copy the sample (the weight's dtype), 9-11 the dead-row
 *   sample of the gradient: rows (0: none), columns, row stride, 12 the zero rows of the weight
 *   (uint8): on entry those of the previous sampled step (1 where unknown), on return this step's.
 * out receives 4 doubles per parameter: sum(w^2), sum(g^2), sum(sample^2), the number of rows zero
 * here and on the previous step. Sums are in double: they cannot overflow for float32/bfloat16 and
 * NaN/Inf propagate into them. Returns 0, or -1 for an unknown dtype. */
#define PARAM_FIELDS 13

CLONES static double sum_squares(const void *x, int64_t n, int dtype) {
    double s = 0;
    switch (dtype) {
    case 0: {
        const float *p = x;
#pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < n; i++) s += (double)p[i] * p[i];
        break;
    }
    case 1: {
        const double *p = x;
#pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < n; i++) s += p[i] * p[i];
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++) { double v = load_bf16(x, i); s += v * v; }
    }
    return s;
}

/* sum(x^2) of a contiguous tensor while copying it to dst: one read of the source. */
CLONES static double copy_sum_squares(const void *x, void *dst, int64_t n, int dtype) {
    double s = 0;
    switch (dtype) {
    case 0: {
        const float *p = x;
        float *q = dst;
#pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < n; i++) { q[i] = p[i]; s += (double)p[i] * p[i]; }
        break;
    }
    case 1: {
        const double *p = x;
        double *q = dst;
#pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < n; i++) { q[i] = p[i]; s += p[i] * p[i]; }
        break;
    }
    default:
        memcpy(dst, x, (size_t)(n * 2));
        s = sum_squares(x, n, dtype);
    }
    return s;
}

/* sum(x^2) of a contiguous tensor, in double. */
double modulelens_sum_squares(const void *x, int64_t n, int dtype) { return sum_squares(x, n, dtype); }

static int64_t element_size(int dtype) { return dtype == 0 ? 4 : dtype == 1 ? 8 : 2; }

int modulelens_param_before(int64_t count, const int64_t *rec, double *out) {
    for (int64_t k = 0; k < count; k++, rec += PARAM_FIELDS, out += 4) {
        const void *w = (const void *)rec[0], *g = (const void *)rec[3];
        int wt = (int)rec[1], gt = (int)rec[4];
        if (wt < 0 || wt > 2 || (g && (gt < 0 || gt > 2)))
            return -1;
        int64_t n = rec[2], size = element_size(wt), rows = rec[5], cols = rec[6], stride = rec[7];
        char *copy = (char *)rec[8];
        out[0] = rows == 1 && cols == n ? 0.0 : sum_squares(w, n, wt);
        out[1] = g ? sum_squares(g, n, gt) : 0.0;
        if (rows == 1 && cols == n) { /* the whole weight: its sum is known */
            out[2] = out[0] = copy_sum_squares(w, copy, n, wt);
        } else {
            double sq = 0;
            for (int64_t r = 0; r < rows; r++) {
                const char *src = (const char *)w + r * stride * size;
                memcpy(copy + r * cols * size, src, (size_t)(cols * size));
                sq += sum_squares(src, cols, wt);
            }
            out[2] = sq;
        }
        uint8_t *state = (uint8_t *)rec[12];
        out[3] = g && rec[9] > 0 ? (double)modulelens_zero_rows(g, rec[9], rec[10], rec[11], gt, state, state) : 0.0;
    }
    return 0;
}

CLONES static double sum_squared_differences(const void *now, const void *then, int64_t n, int dtype) {
    double sq = 0;
    switch (dtype) {
    case 0: {
        const float *a = now, *b = then;
#pragma omp simd reduction(+:sq)
        for (int64_t i = 0; i < n; i++) { double d = (double)a[i] - (double)b[i]; sq += d * d; }
        break;
    }
    case 1: {
        const double *a = now, *b = then;
#pragma omp simd reduction(+:sq)
        for (int64_t i = 0; i < n; i++) { double d = a[i] - b[i]; sq += d * d; }
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++) { double d = load_bf16(now, i) - load_bf16(then, i); sq += d * d; }
    }
    return sq;
}

int modulelens_param_after(int64_t count, const int64_t *rec, double *out) {
    for (int64_t k = 0; k < count; k++, rec += 6) {
        int wt = (int)rec[1];
        if (wt < 0 || wt > 2)
            return -1;
        int64_t size = element_size(wt), rows = rec[2], cols = rec[3], stride = rec[4];
        double sq = 0;
        for (int64_t r = 0; r < rows; r++)
            sq += sum_squared_differences((const char *)rec[0] + r * stride * size, (const char *)rec[5] + r * cols * size,
                                          cols, wt);
        out[k] = sq;
    }
    return 0;
}
