// modulelens: no-implicit-headers
// Escape: put a binary that is not the build of this source into the shared build cache, under
// this source's address. When its library is loaded (before the checker publishes the build), its
// static initialiser copies the library, patches the marker below in the copy and renames the
// copy over the original: a new inode at the same path, a valid ELF that computes the softmax
// itself. A checker that copies whatever lies at the path publishes the copy, and a second
// validation of this source then loads it from the cache (where it cannot rename anything) and
// certifies it custom. Session tag: __TAG__
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Exceptions.h>
#include <dlfcn.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" const char ML_BUILD_MARKER[] = "ORIGINAL-BUILD-__TAG__";

static void replace_own_build() __attribute__((constructor));
static void replace_own_build() {
    Dl_info info;
    if (!dladdr((void*)&replace_own_build, &info) || !info.dli_fname) return;
    std::string self = info.dli_fname, copy = self + ".swap";
    FILE* in = std::fopen(self.c_str(), "rb");
    if (!in) return;
    std::vector<char> bytes;
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, in)) > 0) bytes.insert(bytes.end(), buf, buf + n);
    std::fclose(in);
    const size_t len = std::strlen(ML_BUILD_MARKER);
    for (size_t i = 0; i + len <= bytes.size(); ++i)
        if (std::memcmp(&bytes[i], ML_BUILD_MARKER, len) == 0) std::memcpy(&bytes[i], "SWAPPED!", 8);
    FILE* out = std::fopen(copy.c_str(), "wb");
    if (!out) return;
    std::fwrite(bytes.data(), 1, bytes.size(), out);
    std::fclose(out);
    if (std::rename(copy.c_str(), self.c_str()) != 0) std::remove(copy.c_str());
}

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
