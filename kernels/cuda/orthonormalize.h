// Orthonormalization of the columns of a small row-major matrix (PowerSGD's P factors) on a
// device, with kernels/cpu/orthonormalize.h's contract. Plain C++ header: `stream` is a
// cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// As cpu::orthonormalize_columns: modified Gram-Schmidt, two passes, in f64 in `work` (n * r
// device doubles), degenerate columns set to zero. One block does the whole matrix (the columns
// depend on each other; P is n x r with r a small rank). Instantiated for float and double.
template <class T>
void orthonormalize_columns(T* p, int64_t n, int64_t r, double* work, void* stream);

}  // namespace rg::kernels::cuda
