// The embedding kernels on CUDA (kernels/embedding.h). The forward gathers one element per thread
// and finds the first out-of-range index in one finishing block. The backward gives each thread
// one column k and one bucket b of rows (r % buckets == b): the thread walks the indices in
// position order and adds grad[i, k] into row r's sum for each index of its bucket, so every sum
// has the CPU kernel's order, no two threads write one element and no atomics are needed. Buckets
// raise the thread count above d; the work per thread stays n index reads. f16/bf16 sum in an f32
// workspace, rounded once at the end.
#include <math.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/embedding.h"
#include "kernels/error.h"
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
using cuda::detail::MinOp;
using cuda::detail::store;

constexpr unsigned int kFinishThreads = 1024;
constexpr int64_t kTargetThreads = 1 << 14;  // backward: column-bucket threads to aim for

__device__ __forceinline__ bool valid_index(int64_t r, int64_t v) { return r >= 0 && r < v; }

// out[i, k] = weight[indices[i], k], NaN for an index out of range.
template <class D>
__global__ void embedding_kernel(const D* weight, const int64_t* indices, D* out, int64_t n,
                                 int64_t v, int64_t d) {
  using A = compute_t<D>;
  for (int64_t e = grid_start(); e < n * d; e += grid_stride()) {
    const int64_t i = e / d, k = e % d;
    const int64_t r = indices[i];
    out[e] = valid_index(r, v) ? weight[r * d + k] : store<D>(static_cast<A>(NAN));
  }
}

// One block: first_bad = {the first position whose index is out of range, its index}, or {n, 0}.
__global__ void first_bad_kernel(const int64_t* indices, int64_t* first_bad, int64_t n, int64_t v) {
  __shared__ long long scratch[32];
  long long first = n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (!valid_index(indices[i], v) && first == n) first = i;  // positions increase per thread
  }
  first = block_reduce(first, MinOp{}, static_cast<long long>(n), scratch);
  if (threadIdx.x == 0) {
    first_bad[0] = static_cast<int64_t>(first);
    first_bad[1] = first < n ? indices[first] : 0;
  }
}

template <class A>
__global__ void zero_kernel(A* p, int64_t count) {
  for (int64_t e = grid_start(); e < count; e += grid_stride()) p[e] = A(0);
}

// Thread (b, k): sum[r, k] += grad[i, k] for i in order, over the indices r with r % buckets == b.
template <class D, class A>
__global__ void embedding_backward_kernel(const D* grad, const int64_t* indices, A* sum, int64_t n,
                                          int64_t v, int64_t d, int64_t padding_idx,
                                          int64_t buckets) {
  for (int64_t t = grid_start(); t < buckets * d; t += grid_stride()) {
    const int64_t b = t / d, k = t % d;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = indices[i];
      if (!valid_index(r, v) || r == padding_idx || r % buckets != b) continue;
      sum[r * d + k] += load(grad[i * d + k]);
    }
  }
}

template <class D, class A>
__global__ void round_kernel(const A* sum, D* out, int64_t count) {
  for (int64_t e = grid_start(); e < count; e += grid_stride()) out[e] = store<D>(sum[e]);
}

}  // namespace

template <>
template <class T>
void Embedding<Cuda>::embedding(const T* weight, const int64_t* indices, T* out, int64_t* first_bad,
                                int64_t n, int64_t v, int64_t d, Ctx ctx) {
  using D = device_t<T>;
  detail::check_embedding_sizes("embedding", n, v, d);
  const auto s = as_stream(ctx.stream);
  RG_LAUNCH(first_bad_kernel, 1u, kFinishThreads, 0, s, indices, first_bad, n, v);
  if (n * d == 0) return;
  RG_LAUNCH(embedding_kernel<D>, blocks_for(n * d), kThreads, 0, s, dev(weight), indices, dev(out),
            n, v, d);
}

template <>
template <class T>
int64_t Embedding<Cuda>::embedding_backward_workspace_bytes(int64_t v, int64_t d) {
  using A = compute_t<device_t<T>>;
  return std::is_same_v<A, device_t<T>> ? 0 : v * d * static_cast<int64_t>(sizeof(A));
}

template <>
template <class T>
void Embedding<Cuda>::embedding_backward(const T* grad, const int64_t* indices, T* grad_weight,
                                         int64_t n, int64_t v, int64_t d, int64_t padding_idx,
                                         Workspace workspace, Ctx ctx) {
  using D = device_t<T>;
  using A = compute_t<D>;
  detail::check_embedding_sizes("embedding_backward", n, v, d);
  detail::check_padding_idx("embedding_backward", padding_idx, v);
  const int64_t count = v * d;
  if (count == 0) return;
  constexpr bool in_place = std::is_same_v<A, D>;
  const int64_t needed = embedding_backward_workspace_bytes<T>(v, d);
  RG_ASSERT(in_place || (workspace.data != nullptr && workspace.bytes >= needed),
            "embedding_backward: needs a workspace of ", needed, " bytes, got ", workspace.bytes);
  A* sum = in_place ? reinterpret_cast<A*>(dev(grad_weight)) : static_cast<A*>(workspace.data);
  const auto s = as_stream(ctx.stream);
  RG_LAUNCH(zero_kernel<A>, blocks_for(count), kThreads, 0, s, sum, count);
  if (n > 0) {
    const int64_t buckets =
        std::max<int64_t>(1, std::min<int64_t>(v, (kTargetThreads + d - 1) / d));
    RG_LAUNCH((embedding_backward_kernel<D, A>), blocks_for(buckets * d), kThreads, 0, s, dev(grad),
              indices, sum, n, v, d, padding_idx, buckets);
  }
  if constexpr (!in_place) {
    RG_LAUNCH((round_kernel<D, A>), blocks_for(count), kThreads, 0, s, sum, dev(grad_weight),
              count);
  }
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_embedding_kernels() {
  using K = Embedding<Cuda>;
  return std::tuple{&K::embedding<T>, &K::embedding_backward_workspace_bytes<T>,
                    &K::embedding_backward<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_embedding_kernels)

}  // namespace rg::kernels
