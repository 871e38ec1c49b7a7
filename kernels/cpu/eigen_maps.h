// Eigen array views over raw pointers, shared by the elementwise CPU kernels. Internal: included
// only by kernels/cpu/*.cpp, so Eigen never reaches a public header.
#pragma once

#include <Eigen/Core>

namespace rg::kernels::cpu {

template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

}  // namespace rg::kernels::cpu
