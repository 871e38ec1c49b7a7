// Tensor factories: constant, ranged, from host data and random (from an explicit Generator).
#pragma once

#include <vector>

#include "engine/generator.h"
#include "engine/tensor.h"

namespace rg {

Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
            Device device = Device::cpu());
// Like t: shape, dtype, device and memory format (PyTorch's preserve_format).
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
// [start, end) in steps of `step`, like torch.arange.
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::i64);
inline Tensor arange(double end, DType dtype = DType::i64) { return arange(0, end, 1, dtype); }

// Copies host values into a new tensor of `shape` (numel must match), converting to `dtype`.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dtype = dtype_of<T>());

// Random tensors. Element i uses Philox word i%4 of counter (offset + i/4) of `gen`'s stream
// (normal: words 2i, 2i+1), so the values do not depend on threading or device.
Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::f32);   // U[0, 1)
Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::f32);  // N(0, 1)
Tensor& uniform_(Tensor& t, double low, double high, Generator& gen);
Tensor& normal_(Tensor& t, double mean, double stddev, Generator& gen);

}  // namespace rg
