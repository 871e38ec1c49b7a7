// Unscale + inf/NaN check: each thread scales its elements and remembers a non-finite one; a
// block-wide vote (__syncthreads_or) leaves one write of found_inf per block that saw one.
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/cuda/grad_scaler.h"
#include "kernels/error.h"

namespace rg::kernels::cuda {
namespace {

using namespace detail;

template <class D>
__global__ void unscale_kernel(D* x, int64_t n, float* found_inf, const float* inv_scale) {
  using A = compute_t<D>;
  const float inv = *inv_scale;
  int saw_non_finite = 0;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const A v = load(x[i]);
    saw_non_finite |= non_finite(v) ? 1 : 0;
    if (inv != 1.0f) x[i] = store<D>(v * static_cast<A>(inv));
  }
  // Every thread reaches the vote; blocks race only to store the same value, atomically.
  if (__syncthreads_or(saw_non_finite) && threadIdx.x == 0) atomicExch(found_inf, 1.0f);
}

__global__ void inverse_scale_kernel(const float* scale, float* inv_scale) {
  *inv_scale = static_cast<float>(1.0 / static_cast<double>(*scale));
}

__global__ void update_scale_kernel(float* scale, int64_t* growth_tracker, const float* found_inf,
                                    double growth_factor, double backoff_factor,
                                    int64_t growth_interval) {
  if (*found_inf != 0.0f) {
    *scale = static_cast<float>(static_cast<double>(*scale) * backoff_factor);
    *growth_tracker = 0;
  } else if (++*growth_tracker == growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(*scale) * growth_factor);
    if (!non_finite(grown)) *scale = grown;
    *growth_tracker = 0;
  }
}

}  // namespace

void inverse_scale(const float* scale, float* inv_scale, void* stream) {
  RG_LAUNCH(inverse_scale_kernel, 1, 1, 0, as_stream(stream), scale, inv_scale);
}

void update_scale(float* scale, int64_t* growth_tracker, const float* found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval,
                  void* stream) {
  RG_LAUNCH(update_scale_kernel, 1, 1, 0, as_stream(stream), scale, growth_tracker, found_inf,
            growth_factor, backoff_factor, growth_interval);
}

template <class T>
void unscale_check_finite(T* x, int64_t n, float* found_inf, const float* inv_scale, void* stream) {
  RG_CHECK(n >= 0, "cuda::unscale_check_finite: element count must be >= 0, got ", n);
  if (n == 0) return;
  RG_CHECK(found_inf != nullptr && inv_scale != nullptr,
           "cuda::unscale_check_finite: found_inf and inv_scale must be device scalars");
  using D = device_t<T>;
  RG_LAUNCH(unscale_kernel<D>, blocks_for(n), kThreads, 0, as_stream(stream), dev(x), n, found_inf,
            inv_scale);
}

template void unscale_check_finite<float>(float*, int64_t, float*, const float*, void*);
template void unscale_check_finite<double>(double*, int64_t, float*, const float*, void*);
template void unscale_check_finite<Half>(Half*, int64_t, float*, const float*, void*);
template void unscale_check_finite<BFloat16>(BFloat16*, int64_t, float*, const float*, void*);

}  // namespace rg::kernels::cuda
