// Shape ops that return new contiguous tensors: permute, transpose, narrow_copy and split, as
// torch.permute, torch.transpose, torch.narrow(...).contiguous() and torch.split with an int
// split_size; and the layout conversion between memory formats (Tensor::contiguous). All are
// differentiable; f32, f64, f16 and bf16 on both devices, and i64 (not differentiable) too.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace rg {

// out.size(k) == x.size(dims[k]); negative dims count from the end. dims must be a permutation of
// x's dimensions (an rg::Error naming dims and the shape otherwise); at most 8 dimensions. The
// gradient is the output gradient permuted by the inverse permutation.
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);

// permute swapping dim0 and dim1 (negative dims count from the end).
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);

// A copy of x's elements [start, start + length) along dim (negative dim counts from the end);
// start and length must satisfy 0 <= start, 0 <= length, start + length <= x.size(dim) (an
// rg::Error naming them and the shape otherwise). The gradient is the output gradient placed into
// zeros of x's shape.
Tensor narrow_copy(const Tensor& x, int64_t dim, int64_t start, int64_t length);

// x cut along dim into chunks of split_size (the last one may be smaller), each a narrow_copy; a
// dim of size 0 gives one empty chunk. split_size must be positive.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);

// x in `format` (Tensor::contiguous): x itself when already in it, else a copy by one strided
// copy ("layout_conversion" on the op's stream), counted below and, on a CUDA device while
// tracing, marked by a "layout conversion" instant (ringgrad-bench profile counts them per step).
// The gradient is converted back to x's format.
Tensor contiguous(const Tensor& x, MemoryFormat format);
// Layout conversions run by this process so far (forward and backward, every device, a
// channels_last DataLoader's workers included: count around a step without a loader, or use the
// trace's instants, which mark CUDA conversions only).
int64_t layout_conversions();

}  // namespace rg
