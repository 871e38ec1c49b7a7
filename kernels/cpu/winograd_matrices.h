// The matrices of the 1-D Winograd (Toom-Cook) algorithm F(m, r), built at compile time: m outputs
// of the correlation y[i] = sum_k g[k] d[i + k] of n = m + r - 1 inputs d with r taps g are
//   y = AT [(G g) * (BT d)]     (* elementwise; AT is m x n, G is n x r, BT is n x n),
// using n - 1 finite interpolation points 0, 1, -1, 2, -2, 1/2, -1/2, ... and infinity. This is
// the transpose of Toom-Cook polynomial multiplication c = V^-1 [(V_m u) * (V_r g)]: AT = V_m^T,
// G = V_r, BT = V^-T, with each point's scale f_j = prod_{l != j} (a_j - a_l) moved from G into
// BT (Lavin and Gray's convention, which keeps BT integral for F(4, 3)). The same points give
// F(4, 3) (the forward convolution: 4x4 outputs of a 3x3 filter, 6x6 input tiles) and F(3, 4)
// (the weight gradient: 3x3 sums of 4x4 gradient tiles against the same 6x6 input tiles), which
// therefore share BT. Only constexpr arithmetic: both instruction-set variants of
// kernels/cpu/conv2d_winograd.cpp include this header and get the same constants.
#pragma once

#include <array>

namespace rg::kernels::cpu::winograd {

template <int M, int R>
struct Matrices {
  static constexpr int m = M, r = R, n = M + R - 1;
  std::array<double, M*(M + R - 1)> at{};             // m x n
  std::array<double, (M + R - 1) * R> g{};            // n x r
  std::array<double, (M + R - 1) * (M + R - 1)> bt{};  // n x n
};

namespace detail {

constexpr double point(int j) {
  constexpr double points[] = {0, 1, -1, 2, -2, 0.5, -0.5, 3, -3};
  return points[j];
}
constexpr double power(double a, int k) {
  double p = 1;
  for (int i = 0; i < k; ++i) p *= a;
  return p;
}
constexpr double absolute(double a) { return a < 0 ? -a : a; }

// Row j of the Vandermonde matrix with `cols` columns: the powers of point j, or for the last
// row (infinity) the leading coefficient only.
constexpr double vandermonde(int n, int j, int col, int cols) {
  if (j == n - 1) return col == cols - 1 ? 1.0 : 0.0;
  return power(point(j), col);
}

}  // namespace detail

template <int M, int R>
constexpr Matrices<M, R> make_matrices() {
  constexpr int n = M + R - 1;
  static_assert(n - 1 <= 9, "not enough interpolation points");
  Matrices<M, R> w{};
  // V^-1 by Gauss-Jordan elimination with partial pivoting.
  std::array<double, n * n> a{}, inv{};
  for (int j = 0; j < n; ++j) {
    for (int l = 0; l < n; ++l) {
      a[j * n + l] = detail::vandermonde(n, j, l, n);
      inv[j * n + l] = j == l ? 1.0 : 0.0;
    }
  }
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    for (int j = col + 1; j < n; ++j) {
      if (detail::absolute(a[j * n + col]) > detail::absolute(a[pivot * n + col])) pivot = j;
    }
    for (int l = 0; l < n; ++l) {
      double t = a[col * n + l];
      a[col * n + l] = a[pivot * n + l];
      a[pivot * n + l] = t;
      t = inv[col * n + l];
      inv[col * n + l] = inv[pivot * n + l];
      inv[pivot * n + l] = t;
    }
    const double d = a[col * n + col];
    for (int l = 0; l < n; ++l) {
      a[col * n + l] /= d;
      inv[col * n + l] /= d;
    }
    for (int j = 0; j < n; ++j) {
      if (j == col) continue;
      const double f = a[j * n + col];
      for (int l = 0; l < n; ++l) {
        a[j * n + l] -= f * a[col * n + l];
        inv[j * n + l] -= f * inv[col * n + l];
      }
    }
  }
  for (int j = 0; j < n; ++j) {
    double f = 1;
    if (j < n - 1) {
      for (int l = 0; l < n - 1; ++l) {
        if (l != j) f *= detail::point(j) - detail::point(l);
      }
    }
    for (int i = 0; i < n; ++i) w.bt[j * n + i] = f * inv[i * n + j];  // diag(f) V^-T
    for (int k = 0; k < R; ++k) w.g[j * R + k] = detail::vandermonde(n, j, k, R) / f;
    for (int i = 0; i < M; ++i) w.at[i * n + j] = detail::vandermonde(n, j, i, M);
  }
  // Exact small integers and simple fractions come out of the elimination within rounding;
  // snap them so that the float constants are exact.
  for (double& v : w.bt) {
    const double r = double(static_cast<long long>(v + (v < 0 ? -0.5 : 0.5)));
    if (detail::absolute(v - r) < 1e-9) v = r;
  }
  return w;
}

inline constexpr Matrices<4, 3> kF43 = make_matrices<4, 3>();  // forward, input gradient
inline constexpr Matrices<3, 4> kF34 = make_matrices<3, 4>();  // weight gradient

}  // namespace rg::kernels::cpu::winograd
