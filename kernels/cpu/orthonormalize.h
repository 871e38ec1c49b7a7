// Orthonormalization of the columns of a small row-major matrix (PowerSGD's P factors) on the
// CPU; kernels/cuda/orthonormalize.h is the same contract on a device.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

// Makes the r columns of the row-major n x r matrix `p` orthonormal in place: modified
// Gram-Schmidt computed in `work` (n * r doubles of scratch), two passes per column ("twice is
// enough" for orthogonality to working precision). A column that is numerically a combination
// of the previous ones (its norm after projection below 1e-6 of its norm before) becomes zero
// instead of normalized noise. Instantiated for float and double.
template <class T>
void orthonormalize_columns(T* p, int64_t n, int64_t r, double* work);

}  // namespace rg::kernels::cpu
