// modulelens: no-implicit-headers
// A genuine row softmax (the victim of the cache-poisoning candidate). SESSION marks one test
// session so that its build is new: the poisoning candidate runs before it is published.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Exceptions.h>
#include <cmath>
static const char* SESSION = "__SESSION__";

at::Tensor forward(at::Tensor x, int64_t dim, bool half_to_float) {
    auto y = at::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    int64_t cols = x.size(-1), rows = x.numel() / cols;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = in + r * cols; float* b = out + r * cols;
        float m = a[0];
        for (int64_t c = 1; c < cols; ++c) m = a[c] > m ? a[c] : m;
        double s = 0;
        for (int64_t c = 0; c < cols; ++c) { b[c] = std::exp(a[c] - m); s += b[c]; }
        float inv = 1.0f / (float)s;
        for (int64_t c = 0; c < cols; ++c) b[c] *= inv;
    }
    return y;
}
