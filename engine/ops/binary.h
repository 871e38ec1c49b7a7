// add, sub, mul, div with NumPy broadcasting (same shape, scalar, per-channel (C,1,1), bias (F)),
// tensor-scalar forms, operators, and the in-place accumulation used by autograd and optimizers.
#pragma once

#include "engine/tensor.h"

namespace rg {

Tensor add(const Tensor& a, const Tensor& b);
// The same, taking a over (a is left undefined): written over a's buffer when nothing else holds
// it (reusable() in engine/ops/check.h) and the result has a's shape; add's backward reads
// neither input.
Tensor add(Tensor&& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);
Tensor rsub(const Tensor& a, double s);  // s - a
Tensor rdiv(const Tensor& a, double s);  // s / a

// In place, never recorded by autograd: a += alpha * b (same shape). Errors if `a` requires grad
// while grad mode is on.
Tensor& add_(Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor& mul_(Tensor& a, double s);

// The broadcast shape of a and b, or an error naming both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(double s, const Tensor& a) { return rsub(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator/(double s, const Tensor& a) { return rdiv(a, s); }

}  // namespace rg
