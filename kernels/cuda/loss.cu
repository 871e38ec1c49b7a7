// The loss kernels on CUDA (kernels/loss.h). Rows (inner == 1) take one block each: a block max,
// then a block sum of exp(x - max), both warp shuffles then shared memory. Other dimensions take
// one thread per (outer, inner) column, whose reads are coalesced across the threads of a warp.
// Loss means add per-row f64 values in one finishing block (a fixed tree), which also finds the
// first row with an out-of-range target, so results do not depend on timing.
#include <math.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/half.h"
#include "kernels/loss.h"

namespace rg::kernels {
namespace {

using cuda::detail::MinOp;

using cuda::detail::as_stream;
using cuda::detail::block_reduce;
using cuda::detail::blocks_for;
using cuda::detail::compute_t;
using cuda::detail::dev;
using cuda::detail::device_t;
using cuda::detail::exp_;
using cuda::detail::grid_start;
using cuda::detail::grid_stride;
using cuda::detail::kFullMask;
using cuda::detail::kThreads;
using cuda::detail::load;
using cuda::detail::log_;
using cuda::detail::MaxOp;
using cuda::detail::store;
using cuda::detail::SumOp;

constexpr unsigned int kRowThreads = 256;  // at most, per row block
constexpr unsigned int kFinishThreads = 1024;
constexpr int64_t kMaxGrid = 65535;  // row loops cover the rest

template <class A>
__device__ __forceinline__ A nan_value() {
  return static_cast<A>(NAN);
}

template <class D>
__global__ void softmax_rows_kernel(const D* x, D* out, int64_t rows, int64_t c, bool log_out) {
  using A = compute_t<D>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const D* p = x + row * c;
    D* q = out + row * c;
    A m = -INFINITY;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) m = MaxOp{}(m, load(p[k]));
    m = block_reduce(m, MaxOp{}, A(-INFINITY), scratch);
    A s = 0;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) s += exp_(load(p[k]) - m);
    s = block_reduce(s, SumOp{}, A(0), scratch);
    if (log_out) {
      const A lse = m + log_(s);
      for (int64_t k = threadIdx.x; k < c; k += blockDim.x) q[k] = store<D>(load(p[k]) - lse);
    } else {
      for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
        q[k] = store<D>(exp_(load(p[k]) - m) / s);
      }
    }
  }
}

template <class D>
__global__ void softmax_columns_kernel(const D* x, D* out, int64_t outer, int64_t c, int64_t inner,
                                       bool log_out) {
  using A = compute_t<D>;
  for (int64_t t = grid_start(); t < outer * inner; t += grid_stride()) {
    const int64_t base = t / inner * c * inner + t % inner;
    const D* p = x + base;
    D* q = out + base;
    A m = -INFINITY;
    for (int64_t k = 0; k < c; ++k) m = MaxOp{}(m, load(p[k * inner]));
    A s = 0;
    for (int64_t k = 0; k < c; ++k) s += exp_(load(p[k * inner]) - m);
    const A lse = m + log_(s);
    for (int64_t k = 0; k < c; ++k) {
      const A v = load(p[k * inner]);
      q[k * inner] = store<D>(log_out ? v - lse : exp_(v - m) / s);
    }
  }
}

// log: grad_in = g - exp(y) * sum(g); softmax: grad_in = y * (g - sum(g * y)).
template <class D>
__global__ void softmax_backward_rows_kernel(const D* grad, const D* out, D* grad_in, int64_t rows,
                                             int64_t c, bool log_out) {
  using A = compute_t<D>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const D* g = grad + row * c;
    const D* y = out + row * c;
    D* gi = grad_in + row * c;
    A s = 0;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
      s += log_out ? load(g[k]) : load(g[k]) * load(y[k]);
    }
    s = block_reduce(s, SumOp{}, A(0), scratch);
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
      const A gk = load(g[k]), yk = load(y[k]);
      gi[k] = store<D>(log_out ? gk - exp_(yk) * s : yk * (gk - s));
    }
  }
}

template <class D>
__global__ void softmax_backward_columns_kernel(const D* grad, const D* out, D* grad_in,
                                                int64_t outer, int64_t c, int64_t inner,
                                                bool log_out) {
  using A = compute_t<D>;
  for (int64_t t = grid_start(); t < outer * inner; t += grid_stride()) {
    const int64_t base = t / inner * c * inner + t % inner;
    const D* g = grad + base;
    const D* y = out + base;
    D* gi = grad_in + base;
    A s = 0;
    for (int64_t k = 0; k < c; ++k) {
      s += log_out ? load(g[k * inner]) : load(g[k * inner]) * load(y[k * inner]);
    }
    for (int64_t k = 0; k < c; ++k) {
      const A gk = load(g[k * inner]), yk = load(y[k * inner]);
      gi[k * inner] = store<D>(log_out ? gk - exp_(yk) * s : yk * (gk - s));
    }
  }
}

// One block: the first row with an out-of-range target (n when none), from the per-thread first
// bad rows; every thread calls it.
__device__ int64_t block_first_bad(const int64_t* target, int64_t n, int64_t c,
                                   long long* scratch) {
  long long first = n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t t = target[i];
    if ((t < 0 || t >= c) && first == n) first = i;  // rows in increasing order per thread
  }
  return static_cast<int64_t>(block_reduce(first, MinOp{}, static_cast<long long>(n), scratch));
}

// One block: loss = -sum_i log_probs[i, target[i]] / n (in f64), first_bad[0..1].
template <class D>
__global__ void nll_loss_kernel(const D* log_probs, const int64_t* target, D* loss,
                                int64_t* first_bad, int64_t n, int64_t c) {
  __shared__ double scratch[32];
  __shared__ long long bad_scratch[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t t = target[i];
    acc -=
        (t >= 0 && t < c) ? static_cast<double>(load(log_probs[i * c + t])) : nan_value<double>();
  }
  acc = block_reduce(acc, SumOp{}, 0.0, scratch);
  const int64_t bad = block_first_bad(target, n, c, bad_scratch);
  if (threadIdx.x == 0) {
    *loss = store<D>(acc / static_cast<double>(n));
    first_bad[0] = bad;
    first_bad[1] = bad < n ? target[bad] : 0;
  }
}

template <class D>
__global__ void nll_loss_backward_kernel(const int64_t* target, const D* grad_loss, D* grad_in,
                                         int64_t n, int64_t c) {
  using A = compute_t<D>;
  const A value = -load(*grad_loss) / static_cast<A>(n);
  for (int64_t idx = grid_start(); idx < n * c; idx += grid_stride()) {
    grad_in[idx] = store<D>(idx % c == target[idx / c] ? value : A(0));  // never true when bad
  }
}

// One block per row: lse[i] and the row's smoothed loss into row_loss[i].
template <class D>
__global__ void cross_entropy_rows_kernel(const D* logits, const int64_t* target, D* lse,
                                          double* row_loss, int64_t n, int64_t c, double eps) {
  using A = compute_t<D>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const D* p = logits + row * c;
    A m = -INFINITY;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) m = MaxOp{}(m, load(p[k]));
    m = block_reduce(m, MaxOp{}, A(-INFINITY), scratch);
    A s = 0, sx = 0;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
      const A v = load(p[k]);
      s += exp_(v - m);
      sx += v;
    }
    s = block_reduce(s, SumOp{}, A(0), scratch);
    sx = block_reduce(sx, SumOp{}, A(0), scratch);
    if (threadIdx.x == 0) {
      const A l = m + log_(s);
      lse[row] = store<D>(l);
      const int64_t t = target[row];
      const A nll = (t >= 0 && t < c) ? l - load(p[t]) : nan_value<A>();
      // mean_j(-log_softmax[i, j]) = lse_i - mean_j x[i, j]
      const A smooth = l - sx / static_cast<A>(c);
      row_loss[row] = (1.0 - eps) * static_cast<double>(nll) + eps * static_cast<double>(smooth);
    }
  }
}

// One block: loss = sum_i row_loss[i] / n (in f64), first_bad[0..1].
template <class D>
__global__ void mean_rows_kernel(const double* row_loss, const int64_t* target, D* loss,
                                 int64_t* first_bad, int64_t n, int64_t c) {
  __shared__ double scratch[32];
  __shared__ long long bad_scratch[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += row_loss[i];
  acc = block_reduce(acc, SumOp{}, 0.0, scratch);
  const int64_t bad = block_first_bad(target, n, c, bad_scratch);
  if (threadIdx.x == 0) {
    *loss = store<D>(acc / static_cast<double>(n));
    first_bad[0] = bad;
    first_bad[1] = bad < n ? target[bad] : 0;
  }
}

template <class D>
__global__ void cross_entropy_backward_kernel(const D* logits, const int64_t* target, const D* lse,
                                              const D* grad_loss, D* grad_in, int64_t n, int64_t c,
                                              compute_t<D> eps) {
  using A = compute_t<D>;
  const A scale = load(*grad_loss) / static_cast<A>(n);
  const A uniform = eps / static_cast<A>(c);
  for (int64_t idx = grid_start(); idx < n * c; idx += grid_stride()) {
    const int64_t i = idx / c;
    A v = exp_(load(logits[idx]) - load(lse[i])) - uniform;
    if (idx % c == target[i]) v -= A(1) - eps;  // never true when target[i] is out of range
    grad_in[idx] = store<D>(v * scale);
  }
}

// Block b of kLoss::kMseBlocks: the f64 sum of (x - y)^2 over its contiguous chunk.
template <class D>
__global__ void mse_partial_kernel(const D* x, const D* y, double* partial, int64_t n,
                                   int64_t blocks) {
  __shared__ double scratch[32];
  const int64_t b = blockIdx.x;
  double acc = 0;
  for (int64_t i = n * b / blocks + threadIdx.x; i < n * (b + 1) / blocks; i += blockDim.x) {
    const double d = static_cast<double>(load(x[i])) - static_cast<double>(load(y[i]));
    acc += d * d;
  }
  acc = block_reduce(acc, SumOp{}, 0.0, scratch);
  if (threadIdx.x == 0) partial[b] = acc;
}

// One thread: the partial sums in order, as the CPU adds them.
template <class D>
__global__ void mse_finish_kernel(const double* partial, D* loss, int64_t n, int64_t blocks) {
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b) total += partial[b];
  *loss = store<D>(total / static_cast<double>(n));
}

template <class D>
__global__ void mse_backward_kernel(const D* x, const D* y, const D* grad_loss, D* gx, D* gy,
                                    int64_t n) {
  using A = compute_t<D>;
  const A scale =
      static_cast<A>(2.0 * static_cast<double>(load(*grad_loss)) / static_cast<double>(n));
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const A g = (load(x[i]) - load(y[i])) * scale;
    if (gx) gx[i] = store<D>(g);
    if (gy) gy[i] = store<D>(-g);
  }
}

// Block b of kLoss::kMseBlocks: the f64 sum of the smooth L1 terms over its contiguous chunk.
template <class D>
__global__ void smooth_l1_partial_kernel(const D* x, const D* y, double* partial, int64_t n,
                                         int64_t blocks, double beta) {
  __shared__ double scratch[32];
  const int64_t b = blockIdx.x;
  double acc = 0;
  for (int64_t i = n * b / blocks + threadIdx.x; i < n * (b + 1) / blocks; i += blockDim.x) {
    const double d = fabs(static_cast<double>(load(x[i])) - static_cast<double>(load(y[i])));
    acc += d < beta ? 0.5 * d * d / beta : d - 0.5 * beta;
  }
  acc = block_reduce(acc, SumOp{}, 0.0, scratch);
  if (threadIdx.x == 0) partial[b] = acc;
}

template <class D>
__global__ void smooth_l1_backward_kernel(const D* x, const D* y, const D* grad_loss, D* gx, D* gy,
                                          int64_t n, compute_t<D> beta) {
  using A = compute_t<D>;
  const A scale = static_cast<A>(static_cast<double>(load(*grad_loss)) / static_cast<double>(n));
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const A d = load(x[i]) - load(y[i]);
    const A slope = (d < A(0) ? -d : d) < beta ? d / beta : A((d > A(0)) - (d < A(0)));
    const A g = slope * scale;
    if (gx) gx[i] = store<D>(g);
    if (gy) gy[i] = store<D>(-g);
  }
}

// Threads for a row of `len` elements: whole warps, at most kRowThreads.
unsigned int row_threads(int64_t len) {
  return static_cast<unsigned int>(std::clamp<int64_t>((len + 31) / 32 * 32, 32, kRowThreads));
}

unsigned int row_grid(int64_t rows) { return static_cast<unsigned int>(std::min(rows, kMaxGrid)); }

template <class T>
void softmax_forward(const char* op, const T* x, T* out, int64_t outer, int64_t c, int64_t inner,
                     bool log_out, void* stream) {
  using D = device_t<T>;
  detail::check_softmax_sizes(op, outer, c, inner);
  if (outer == 0 || c == 0 || inner == 0) return;
  const auto s = as_stream(stream);
  if (inner == 1) {
    RG_LAUNCH(softmax_rows_kernel<D>, row_grid(outer), row_threads(c), 0, s, dev(x), dev(out),
              outer, c, log_out);
  } else {
    RG_LAUNCH(softmax_columns_kernel<D>, blocks_for(outer * inner), kThreads, 0, s, dev(x),
              dev(out), outer, c, inner, log_out);
  }
}

template <class T>
void softmax_grad(const char* op, const T* grad, const T* out, T* grad_in, int64_t outer, int64_t c,
                  int64_t inner, bool log_out, void* stream) {
  using D = device_t<T>;
  detail::check_softmax_sizes(op, outer, c, inner);
  if (outer == 0 || c == 0 || inner == 0) return;
  const auto s = as_stream(stream);
  if (inner == 1) {
    RG_LAUNCH(softmax_backward_rows_kernel<D>, row_grid(outer), row_threads(c), 0, s, dev(grad),
              dev(out), dev(grad_in), outer, c, log_out);
  } else {
    RG_LAUNCH(softmax_backward_columns_kernel<D>, blocks_for(outer * inner), kThreads, 0, s,
              dev(grad), dev(out), dev(grad_in), outer, c, inner, log_out);
  }
}

}  // namespace

template <>
template <class T>
void Loss<Cuda>::softmax(const T* x, T* out, int64_t outer, int64_t c, int64_t inner, Ctx ctx) {
  softmax_forward("softmax", x, out, outer, c, inner, false, ctx.stream);
}

template <>
template <class T>
void Loss<Cuda>::softmax_backward(const T* grad, const T* out, T* grad_in, int64_t outer, int64_t c,
                                  int64_t inner, Ctx ctx) {
  softmax_grad("softmax_backward", grad, out, grad_in, outer, c, inner, false, ctx.stream);
}

template <>
template <class T>
void Loss<Cuda>::log_softmax(const T* x, T* out, int64_t outer, int64_t c, int64_t inner, Ctx ctx) {
  softmax_forward("log_softmax", x, out, outer, c, inner, true, ctx.stream);
}

template <>
template <class T>
void Loss<Cuda>::log_softmax_backward(const T* grad, const T* out, T* grad_in, int64_t outer,
                                      int64_t c, int64_t inner, Ctx ctx) {
  softmax_grad("log_softmax_backward", grad, out, grad_in, outer, c, inner, true, ctx.stream);
}

template <>
template <class T>
void Loss<Cuda>::nll_loss(const T* log_probs, const int64_t* target, T* loss, int64_t* first_bad,
                          int64_t n, int64_t c, Ctx ctx) {
  using D = device_t<T>;
  detail::check_loss_rows("nll_loss", n, c);
  RG_LAUNCH(nll_loss_kernel<D>, 1u, kFinishThreads, 0, as_stream(ctx.stream), dev(log_probs),
            target, dev(loss), first_bad, n, c);
}

template <>
template <class T>
void Loss<Cuda>::nll_loss_backward(const int64_t* target, const T* grad_loss, T* grad_in, int64_t n,
                                   int64_t c, Ctx ctx) {
  using D = device_t<T>;
  detail::check_loss_rows("nll_loss_backward", n, c);
  if (n == 0) return;
  RG_LAUNCH(nll_loss_backward_kernel<D>, blocks_for(n * c), kThreads, 0, as_stream(ctx.stream),
            target, dev(grad_loss), dev(grad_in), n, c);
}

template <>
template <class T>
void Loss<Cuda>::cross_entropy(const T* logits, const int64_t* target, T* lse, T* loss,
                               int64_t* first_bad, int64_t n, int64_t c, double label_smoothing,
                               Workspace workspace, Ctx ctx) {
  using D = device_t<T>;
  detail::check_loss_rows("cross_entropy", n, c);
  detail::check_label_smoothing("cross_entropy", label_smoothing);
  detail::check_workspace("cross_entropy", workspace, cross_entropy_workspace_bytes(n));
  const auto s = as_stream(ctx.stream);
  double* row_loss = static_cast<double*>(workspace.data);
  if (n > 0) {
    RG_LAUNCH(cross_entropy_rows_kernel<D>, row_grid(n), row_threads(c), 0, s, dev(logits), target,
              dev(lse), row_loss, n, c, label_smoothing);
  }
  RG_LAUNCH(mean_rows_kernel<D>, 1u, kFinishThreads, 0, s, row_loss, target, dev(loss), first_bad,
            n, c);
}

template <>
template <class T>
void Loss<Cuda>::cross_entropy_backward(const T* logits, const int64_t* target, const T* lse,
                                        const T* grad_loss, T* grad_in, int64_t n, int64_t c,
                                        double label_smoothing, Ctx ctx) {
  using D = device_t<T>;
  using A = compute_t<D>;
  detail::check_loss_rows("cross_entropy_backward", n, c);
  detail::check_label_smoothing("cross_entropy_backward", label_smoothing);
  if (n == 0) return;
  RG_LAUNCH(cross_entropy_backward_kernel<D>, blocks_for(n * c), kThreads, 0, as_stream(ctx.stream),
            dev(logits), target, dev(lse), dev(grad_loss), dev(grad_in), n, c,
            static_cast<A>(label_smoothing));
}

template <>
template <class T>
void Loss<Cuda>::mse_loss(const T* x, const T* y, T* loss, int64_t n, Workspace workspace,
                          Ctx ctx) {
  using D = device_t<T>;
  RG_CHECK(n >= 0, "mse_loss: n must be non-negative, got ", n);
  detail::check_workspace("mse_loss", workspace, mse_loss_workspace_bytes(n));
  const auto s = as_stream(ctx.stream);
  double* partial = static_cast<double*>(workspace.data);
  RG_LAUNCH(mse_partial_kernel<D>, static_cast<unsigned int>(kMseBlocks), kRowThreads, 0, s, dev(x),
            dev(y), partial, n, kMseBlocks);
  RG_LAUNCH(mse_finish_kernel<D>, 1u, 1u, 0, s, partial, dev(loss), n, kMseBlocks);
}

template <>
template <class T>
void Loss<Cuda>::mse_loss_backward(const T* x, const T* y, const T* grad_loss, T* gx, T* gy,
                                   int64_t n, Ctx ctx) {
  using D = device_t<T>;
  RG_CHECK(n >= 0, "mse_loss_backward: n must be non-negative, got ", n);
  if (n == 0) return;
  RG_LAUNCH(mse_backward_kernel<D>, blocks_for(n), kThreads, 0, as_stream(ctx.stream), dev(x),
            dev(y), dev(grad_loss), dev(gx), dev(gy), n);
}

template <>
template <class T>
void Loss<Cuda>::smooth_l1_loss(const T* x, const T* y, T* loss, int64_t n, double beta,
                                Workspace workspace, Ctx ctx) {
  using D = device_t<T>;
  detail::check_smooth_l1_beta("smooth_l1_loss", n, beta);
  detail::check_workspace("smooth_l1_loss", workspace, smooth_l1_loss_workspace_bytes(n));
  const auto s = as_stream(ctx.stream);
  double* partial = static_cast<double*>(workspace.data);
  RG_LAUNCH(smooth_l1_partial_kernel<D>, static_cast<unsigned int>(kMseBlocks), kRowThreads, 0, s,
            dev(x), dev(y), partial, n, kMseBlocks, beta);
  RG_LAUNCH(mse_finish_kernel<D>, 1u, 1u, 0, s, partial, dev(loss), n, kMseBlocks);
}

template <>
template <class T>
void Loss<Cuda>::smooth_l1_loss_backward(const T* x, const T* y, const T* grad_loss, T* gx, T* gy,
                                         int64_t n, double beta, Ctx ctx) {
  using D = device_t<T>;
  using A = compute_t<D>;
  detail::check_smooth_l1_beta("smooth_l1_loss_backward", n, beta);
  if (n == 0) return;
  RG_LAUNCH(smooth_l1_backward_kernel<D>, blocks_for(n), kThreads, 0, as_stream(ctx.stream), dev(x),
            dev(y), dev(grad_loss), dev(gx), dev(gy), n, static_cast<A>(beta));
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_loss_kernels() {
  using K = Loss<Cuda>;
  return std::tuple{&K::log_softmax<T>,    &K::log_softmax_backward<T>,
                    &K::softmax<T>,        &K::softmax_backward<T>,
                    &K::nll_loss<T>,       &K::nll_loss_backward<T>,
                    &K::cross_entropy<T>,  &K::cross_entropy_backward<T>,
                    &K::mse_loss<T>,       &K::mse_loss_backward<T>,
                    &K::smooth_l1_loss<T>, &K::smooth_l1_loss_backward<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_loss_kernels)

}  // namespace rg::kernels
