// Modified Gram-Schmidt in f64 on the CPU: P has few columns, and f32 Gram-Schmidt loses
// orthogonality when they are nearly dependent.
#include "kernels/cpu/orthonormalize.h"

#include <cmath>

#include "kernels/error.h"

namespace rg::kernels::cpu {

template <class T>
void orthonormalize_columns(T* p, int64_t n, int64_t r, double* w) {
  RG_CHECK(n >= 0 && r >= 0, "cpu::orthonormalize_columns: sizes must be >= 0, got ", n, " x ",
           r);
  for (int64_t k = 0; k < n * r; ++k) w[k] = double(p[k]);
  auto at = [&](int64_t row, int64_t col) -> double& { return w[row * r + col]; };
  for (int64_t i = 0; i < r; ++i) {
    double before = 0;
    for (int64_t k = 0; k < n; ++k) before += at(k, i) * at(k, i);
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t j = 0; j < i; ++j) {
        double dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += at(k, j) * at(k, i);
        for (int64_t k = 0; k < n; ++k) at(k, i) -= dot * at(k, j);
      }
    double norm = 0;
    for (int64_t k = 0; k < n; ++k) norm += at(k, i) * at(k, i);
    norm = std::sqrt(norm);
    const double scale = norm > 1e-6 * std::sqrt(before) && norm > 0 ? 1.0 / norm : 0.0;
    for (int64_t k = 0; k < n; ++k) at(k, i) *= scale;
  }
  for (int64_t k = 0; k < n * r; ++k) p[k] = T(w[k]);
}

template void orthonormalize_columns<float>(float*, int64_t, int64_t, double*);
template void orthonormalize_columns<double>(double*, int64_t, int64_t, double*);

}  // namespace rg::kernels::cpu
