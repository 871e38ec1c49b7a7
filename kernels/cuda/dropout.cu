// Dropout kernels: each thread draws one Philox block per group of four elements, exactly as the
// CPU's dropout_mask, and compares 24-bit integers instead of floats (see keep_threshold).
#include <cmath>

#include "kernels/cuda/check.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/philox.h"

namespace rg::kernels::cuda {
namespace {

using namespace detail;

// The CPU keeps element i when double(to_uniform(w)) >= p, where to_uniform(w) = (w >> 8) / 2^24
// exactly; that is (w >> 8) >= p * 2^24, i.e. (w >> 8) >= ceil(p * 2^24) (p * 2^24 is exact).
uint32_t keep_threshold(double p) { return static_cast<uint32_t>(std::ceil(p * 16777216.0)); }

// kForward: also out[i] = x[i] * mask[i]; x and out are unused otherwise.
template <bool kForward, class D>
__global__ void dropout_kernel(const D* x, D* out, D* mask, int64_t n, uint32_t threshold, D scale,
                               uint64_t seed, uint64_t offset) {
  const int64_t groups = (n + 3) / 4;
  const D zero = store<D>(compute_t<D>(0));
  for (int64_t g = grid_start(); g < groups; g += grid_stride()) {
    const philox::U32x4 r = philox::block(seed, offset + static_cast<uint64_t>(g));
    for (int j = 0; j < 4; ++j) {
      const int64_t i = 4 * g + j;
      if (i >= n) break;
      const D m = (r.v[j] >> 8) >= threshold ? scale : zero;
      mask[i] = m;
      if constexpr (kForward) out[i] = store<D>(load(x[i]) * load(m));
    }
  }
}

template <class D>
__global__ void dropout_backward_kernel(const D* grad, const D* mask, D* grad_in, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    grad_in[i] = store<D>(load(grad[i]) * load(mask[i]));
  }
}

template <bool kForward, class T>
void launch_dropout(const char* name, const T* x, T* out, T* mask, int64_t n, double p, T scale,
                    uint64_t seed, uint64_t offset, void* stream) {
  RG_CHECK(n >= 0, "cuda::", name, ": element count must be >= 0, got ", n);
  RG_CHECK(p >= 0.0 && p <= 1.0, "cuda::", name, ": probability p must be in [0, 1], got ", p);
  if (n == 0) return;
  using D = device_t<T>;
  const int64_t groups = (n + 3) / 4;
  RG_LAUNCH((dropout_kernel<kForward, D>), blocks_for(groups), kThreads, 0, as_stream(stream),
            dev(x), dev(out), dev(mask), n, keep_threshold(p), to_device(scale), seed, offset);
}

}  // namespace

template <class T>
void dropout_mask(T* mask, int64_t n, double p, T scale, uint64_t seed, uint64_t offset,
                  void* stream) {
  launch_dropout<false>("dropout_mask", static_cast<const T*>(nullptr), static_cast<T*>(nullptr),
                        mask, n, p, scale, seed, offset, stream);
}

template <class T>
void dropout_forward(const T* x, T* out, T* mask, int64_t n, double p, T scale, uint64_t seed,
                     uint64_t offset, void* stream) {
  launch_dropout<true>("dropout_forward", x, out, mask, n, p, scale, seed, offset, stream);
}

template <class T>
void dropout_backward(const T* grad, const T* mask, T* grad_in, int64_t n, void* stream) {
  RG_CHECK(n >= 0, "cuda::dropout_backward: element count must be >= 0, got ", n);
  if (n == 0) return;
  using D = device_t<T>;
  RG_LAUNCH(dropout_backward_kernel<D>, blocks_for(n), kThreads, 0, as_stream(stream), dev(grad),
            dev(mask), dev(grad_in), n);
}

#define RG_INSTANTIATE(T)                                                                    \
  template void dropout_mask<T>(T*, int64_t, double, T, uint64_t, uint64_t, void*);          \
  template void dropout_forward<T>(const T*, T*, T*, int64_t, double, T, uint64_t, uint64_t, \
                                   void*);                                                   \
  template void dropout_backward<T>(const T*, const T*, T*, int64_t, void*);
RG_INSTANTIATE(float)
RG_INSTANTIATE(double)
RG_INSTANTIATE(Half)
RG_INSTANTIATE(BFloat16)
#undef RG_INSTANTIATE

}  // namespace rg::kernels::cuda
