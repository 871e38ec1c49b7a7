// Gram-Schmidt on one block: each dot product and norm is a block reduction in f64 over the rows,
// the columns go one after another. Sums run in another order than the CPU's, so the two agree to
// rounding, not bitwise.
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/cuda/orthonormalize.h"
#include "kernels/error.h"

namespace rg::kernels::cuda {
namespace {

using namespace detail;

constexpr int kGsThreads = 256;

// Sum over the rows of w[k, a] * w[k, b], returned to every thread.
__device__ double column_dot(const double* w, int64_t n, int64_t r, int64_t a, int64_t b,
                             double* scratch) {
  double s = 0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) s += w[k * r + a] * w[k * r + b];
  return block_sum(s, scratch);
}

template <class T>
__global__ void gram_schmidt_kernel(T* p, int64_t n, int64_t r, double* w) {
  __shared__ double scratch[32];
  for (int64_t k = threadIdx.x; k < n * r; k += blockDim.x) w[k] = double(p[k]);
  __syncthreads();  // from here on, row k belongs to thread k % blockDim.x
  for (int64_t i = 0; i < r; ++i) {
    const double before = column_dot(w, n, r, i, i, scratch);
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t j = 0; j < i; ++j) {
        const double dot = column_dot(w, n, r, j, i, scratch);
        // Each thread updates the rows it read, so no barrier is needed before the next dot.
        for (int64_t k = threadIdx.x; k < n; k += blockDim.x) w[k * r + i] -= dot * w[k * r + j];
      }
    const double norm = sqrt(column_dot(w, n, r, i, i, scratch));
    const double scale = norm > 1e-6 * sqrt(before) && norm > 0 ? 1.0 / norm : 0.0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) w[k * r + i] *= scale;
  }
  __syncthreads();  // rows were owned by threads, the copy back goes by flat index
  for (int64_t k = threadIdx.x; k < n * r; k += blockDim.x) p[k] = T(w[k]);
}

}  // namespace

template <class T>
void orthonormalize_columns(T* p, int64_t n, int64_t r, double* work, void* stream) {
  RG_CHECK(n >= 0 && r >= 0, "cuda::orthonormalize_columns: sizes must be >= 0, got ", n, " x ",
           r);
  if (n == 0 || r == 0) return;
  RG_LAUNCH(gram_schmidt_kernel<T>, 1, kGsThreads, 0, as_stream(stream), p, n, r, work);
}

template void orthonormalize_columns<float>(float*, int64_t, int64_t, double*, void*);
template void orthonormalize_columns<double>(double*, int64_t, int64_t, double*, void*);

}  // namespace rg::kernels::cuda
