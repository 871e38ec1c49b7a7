// Dropout<Cuda> (kernels/dropout.h): each thread draws one Philox block per group of four
// elements, exactly as Dropout<Cpu>, and compares 24-bit integers instead of floats (see
// keep_threshold).
#include <cmath>
#include <tuple>

#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/dropout.h"
#include "kernels/error.h"
#include "kernels/philox.h"

namespace rg::kernels::cuda {
namespace {

using namespace detail;

// kForward: also out[i] = x[i] * mask[i]; x and out are unused otherwise.
template <bool kForward, class D>
__global__ void dropout_kernel(const D* x, D* out, D* mask, int64_t n, uint32_t threshold, D scale,
                               uint64_t seed, philox::Offset first) {
  const int64_t groups = (n + 3) / 4;
  const uint64_t offset = first.resolve();
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
                    uint64_t seed, philox::Offset offset, void* stream) {
  kernels::detail::check_dropout(name, n, p);
  if (n == 0) return;
  using D = device_t<T>;
  const int64_t groups = (n + 3) / 4;
  RG_LAUNCH((dropout_kernel<kForward, D>), blocks_for(groups), kThreads, 0, as_stream(stream),
            dev(x), dev(out), dev(mask), n, ::rg::kernels::detail::dropout_keep_threshold(p),
            to_device(scale), seed, offset);
}

}  // namespace
}  // namespace rg::kernels::cuda

namespace rg::kernels {

template <>
template <class T>
void Dropout<Cuda>::mask(T* mask, int64_t n, double p, T scale, uint64_t seed,
                         philox::Offset offset, Ctx ctx) {
  cuda::launch_dropout<false>("dropout_mask", static_cast<const T*>(nullptr),
                              static_cast<T*>(nullptr), mask, n, p, scale, seed, offset,
                              ctx.stream);
}

template <>
template <class T>
void Dropout<Cuda>::forward(const T* x, T* out, T* mask, int64_t n, double p, T scale,
                            uint64_t seed, philox::Offset offset, Ctx ctx) {
  cuda::launch_dropout<true>("dropout_forward", x, out, mask, n, p, scale, seed, offset,
                             ctx.stream);
}

template <>
template <class T>
void Dropout<Cuda>::backward(const T* grad, const T* mask, T* grad_in, int64_t n, Ctx ctx) {
  using namespace cuda::detail;
  kernels::detail::check_dropout("dropout_backward", n, 0.0);
  if (n == 0) return;
  using D = device_t<T>;
  RG_LAUNCH(cuda::dropout_backward_kernel<D>, blocks_for(n), kThreads, 0, as_stream(ctx.stream),
            dev(grad), dev(mask), dev(grad_in), n);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_dropout_kernels() {
  using K = Dropout<Cuda>;
  return std::tuple{&K::mask<T>, &K::forward<T>, &K::backward<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_dropout_kernels)

}  // namespace rg::kernels
