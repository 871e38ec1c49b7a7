// The gradient clipping kernels on CUDA (kernels/grad_clip.h): kNormBlocks blocks each reduce a
// contiguous chunk to an f64 partial (a block tree), one thread folds the partials into the
// accumulator in order; the scaling reads the norm on the device, so nothing waits for the host.
#include <math.h>

#include <cstdint>
#include <tuple>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/grad_clip.h"
#include "kernels/half.h"

namespace rg::kernels {
namespace {

using cuda::detail::as_stream;
using cuda::detail::block_reduce;
using cuda::detail::blocks_for;
using cuda::detail::compute_t;
using cuda::detail::dev;
using cuda::detail::device_t;
using cuda::detail::grid_start;
using cuda::detail::grid_stride;
using cuda::detail::kThreads;
using cuda::detail::load;
using cuda::detail::MaxOp;
using cuda::detail::store;
using cuda::detail::SumOp;

constexpr unsigned int kNormThreads = 256;

// Block b: sum of |x|^p (or max |x| when inf) over its contiguous chunk, in f64.
template <class D>
__global__ void norm_partial_kernel(const D* x, int64_t n, double p, bool inf, double* partial,
                                    int64_t blocks) {
  __shared__ double scratch[32];
  const int64_t b = blockIdx.x;
  double v = 0;
  for (int64_t i = n * b / blocks + threadIdx.x; i < n * (b + 1) / blocks; i += blockDim.x) {
    const double a = fabs(static_cast<double>(load(x[i])));
    if (inf) {
      v = MaxOp{}(v, a);
    } else {
      v += p == 2.0 ? a * a : p == 1.0 ? a : pow(a, p);
    }
  }
  v = inf ? block_reduce(v, MaxOp{}, 0.0, scratch) : block_reduce(v, SumOp{}, 0.0, scratch);
  if (threadIdx.x == 0) partial[b] = v;
}

// One thread: the partials folded into the accumulator in order, as the CPU does.
__global__ void norm_fold_kernel(const double* partial, int64_t blocks, bool inf, double* acc) {
  double total = *acc;
  for (int64_t b = 0; b < blocks; ++b)
    total = inf ? MaxOp{}(total, partial[b]) : total + partial[b];
  *acc = total;
}

template <class D>
__global__ void norm_finish_kernel(const double* acc, double p, D* out) {
  const double a = *acc;
  *out = store<D>(p == 1.0 || isinf(p) ? a : p == 2.0 ? sqrt(a) : pow(a, 1.0 / p));
}

template <class D>
__global__ void scale_by_clip_coef_kernel(D* x, int64_t n, const D* total_norm, double max_norm) {
  using A = compute_t<D>;
  const A coef = static_cast<A>(max_norm) / (load(*total_norm) + static_cast<A>(1e-6));
  const A c = coef > A(1) ? A(1) : coef;  // NaN stays NaN
  for (int64_t i = grid_start(); i < n; i += grid_stride()) x[i] = store<D>(load(x[i]) * c);
}

template <class D>
__global__ void clamp_kernel(D* x, int64_t n, compute_t<D> lo, compute_t<D> hi) {
  using A = compute_t<D>;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const A v = load(x[i]);
    x[i] = store<D>(v < lo ? lo : v > hi ? hi : v);  // NaN compares false both ways and stays
  }
}

}  // namespace

template <>
template <class T>
void GradClip<Cuda>::norm_accumulate(const T* x, int64_t n, double p, double* acc,
                                     Workspace workspace, Ctx ctx) {
  using D = device_t<T>;
  detail::check_norm_type("norm_accumulate", p);
  detail::check_clip_size("norm_accumulate", n);
  RG_ASSERT(workspace.data != nullptr && workspace.bytes >= norm_workspace_bytes(n),
            "norm_accumulate: workspace too small");
  if (n == 0) return;
  const auto s = as_stream(ctx.stream);
  double* partial = static_cast<double*>(workspace.data);
  const bool inf = isinf(p);
  RG_LAUNCH(norm_partial_kernel<D>, static_cast<unsigned int>(kNormBlocks), kNormThreads, 0, s,
            dev(x), n, p, inf, partial, kNormBlocks);
  RG_LAUNCH(norm_fold_kernel, 1u, 1u, 0, s, partial, kNormBlocks, inf, acc);
}

template <>
template <class T>
void GradClip<Cuda>::norm_finish(const double* acc, double p, T* out, Ctx ctx) {
  using D = device_t<T>;
  detail::check_norm_type("norm_finish", p);
  RG_LAUNCH(norm_finish_kernel<D>, 1u, 1u, 0, as_stream(ctx.stream), acc, p, dev(out));
}

template <>
template <class T>
void GradClip<Cuda>::scale_by_clip_coef(T* x, int64_t n, const T* total_norm, double max_norm,
                                        Ctx ctx) {
  using D = device_t<T>;
  detail::check_clip_size("scale_by_clip_coef", n);
  if (n == 0) return;
  RG_LAUNCH(scale_by_clip_coef_kernel<D>, blocks_for(n), kThreads, 0, as_stream(ctx.stream), dev(x),
            n, dev(total_norm), max_norm);
}

template <>
template <class T>
void GradClip<Cuda>::clamp(T* x, int64_t n, double lo, double hi, Ctx ctx) {
  using D = device_t<T>;
  using A = compute_t<D>;
  detail::check_clip_size("clamp", n);
  if (n == 0) return;
  RG_LAUNCH(clamp_kernel<D>, blocks_for(n), kThreads, 0, as_stream(ctx.stream), dev(x), n,
            static_cast<A>(lo), static_cast<A>(hi));
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_grad_clip_kernels() {
  using K = GradClip<Cuda>;
  return std::tuple{&K::norm_accumulate<T>, &K::norm_finish<T>, &K::scale_by_clip_coef<T>,
                    &K::clamp<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_grad_clip_kernels)

}  // namespace rg::kernels
