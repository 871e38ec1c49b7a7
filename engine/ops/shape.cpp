// permute, transpose, narrow_copy and split through kernels/shape.h: each forward and backward is
// one strided copy, whose layout is built (and coalesced) here. transpose wraps permute and split
// wraps narrow_copy, so autograd sums a split's chunk gradients like any other fan-out.
#include "engine/ops/shape.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <utility>

#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "engine/trace.h"
#include "kernels/error.h"
#include "kernels/shape.h"

namespace rg {
namespace {

using kernels::StridedCopy;

// dim in [-n, n) as [0, n), or an rg::Error naming `what`, the value and the shape.
int64_t normalize_dim(const char* op, const char* what, int64_t dim, const Tensor& x) {
  const int64_t n = x.dim();
  RG_CHECK(dim >= -n && dim < n, op, ": ", what, " ", dim, " is out of range for shape ",
           shape_str(x.shape()));
  return dim < 0 ? dim + n : dim;
}

// Elements from src (from element src_offset on) into dst (from dst_offset on) by `layout`, on
// their device; f32/f64 (+ f16/bf16 on CUDA) through dispatch_on, and i64.
void strided_copy(const char* op, const Tensor& src, int64_t src_offset, const Tensor& dst,
                  int64_t dst_offset, const StridedCopy& layout) {
  const StridedCopy l = kernels::detail::coalesce(layout);
  if (kernels::detail::copy_numel(l) == 0) return;
  const auto run = [&]<class T, class B>() {
    kernels::ShapeCopy<B>::strided_copy(src.data<T>() + src_offset, dst.data<T>() + dst_offset, l,
                                        kernel_ctx(src));
  };
  if (src.dtype() != DType::i64) {
    dispatch_on(src.device(), src.dtype(), op, run);
  } else if (src.device().is_cuda()) {
    run.template operator()<int64_t, kernels::Cuda>();
  } else {
    run.template operator()<int64_t, kernels::Cpu>();
  }
}

// out = x permuted by perm (already checked), without recording.
Tensor permute_kernel(const Tensor& x, const std::vector<int64_t>& perm) {
  const int64_t n = x.dim();
  Shape shape(n);
  StridedCopy l;
  l.ndim = static_cast<int>(n);
  int64_t src_stride[kernels::kMaxCopyDims] = {}, dst_stride = 1;
  for (int64_t k = n - 1, s = 1; k >= 0; --k) {
    src_stride[k] = s;
    s *= x.size(k);
  }
  for (int64_t k = n - 1; k >= 0; --k) {
    shape[k] = l.sizes[k] = x.size(perm[k]);
    l.src_strides[k] = src_stride[perm[k]];
    l.dst_strides[k] = dst_stride;
    dst_stride *= shape[k];
  }
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  strided_copy("permute", x, 0, out, 0, l);
  return out;
}

std::atomic<int64_t> g_layout_conversions{0};

// The element strides of a 4-d tensor of `shape` laid out in `format`, by logical dimension.
std::array<int64_t, 4> format_strides(const Shape& s, MemoryFormat format) {
  if (format == MemoryFormat::channels_last) return {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
  return {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
}

// x's elements in `format` (x is 4-d and in the other one), without recording.
Tensor convert_layout(const Tensor& x, MemoryFormat format) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device(), format);
  const auto from = format_strides(x.shape(), x.memory_format());
  const auto to = format_strides(x.shape(), format);
  StridedCopy l;
  l.ndim = 4;
  for (int k = 0; k < 4; ++k) {
    l.sizes[k] = x.size(k);
    l.src_strides[k] = from[size_t(k)];
    l.dst_strides[k] = to[size_t(k)];
  }
  g_layout_conversions.fetch_add(1, std::memory_order_relaxed);
  if (x.device().is_cuda() && trace::enabled()) {  // a kernel on the GPU (the profile's count)
    trace::instant(detail::cat("layout conversion to ", memory_format_name(format), " ",
                               dtype_name(x.dtype()), shape_str(x.shape())),
                   "layout conversion", trace::Clock::now());
  }
  strided_copy("layout_conversion", x, 0, out, 0, l);
  return out;
}

// The copies between a tensor of `shape` (the whole) and its slice [start, start + length) along
// dim, as an [outer, length, inner] box: whole to slice (the forward) and slice to whole (the
// backward), and the slice's first element's offset in the whole.
struct Slice {
  StridedCopy whole_to_slice;
  StridedCopy slice_to_whole;
  int64_t offset;
};
Slice slice_layout(const Shape& shape, int64_t dim, int64_t start, int64_t length) {
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < dim; ++k) outer *= shape[k];
  for (size_t k = dim + 1; k < shape.size(); ++k) inner *= shape[k];
  StridedCopy whole{
      3, {outer, length, inner}, {shape[dim] * inner, inner, 1}, {length * inner, inner, 1}};
  StridedCopy back = whole;
  std::swap(back.src_strides, back.dst_strides);
  return {whole, back, start * inner};
}

}  // namespace

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  if (cpu_half_inputs({x})) return permute(half_to_f32(x), dims).to(x.dtype());
  check_inputs("permute", {x});
  const int64_t n = x.dim();
  RG_CHECK(n <= kernels::kMaxCopyDims, "permute: at most ", kernels::kMaxCopyDims,
           " dimensions are supported, got shape ", shape_str(x.shape()));
  std::vector<int64_t> perm(dims.size()), inverse(n, -1);
  bool valid = static_cast<int64_t>(dims.size()) == n;
  for (size_t k = 0; valid && k < dims.size(); ++k) {
    const int64_t d = dims[k] < 0 ? dims[k] + n : dims[k];
    valid = d >= 0 && d < n && inverse[d] < 0;
    if (valid) {
      perm[k] = d;
      inverse[d] = static_cast<int64_t>(k);
    }
  }
  RG_CHECK(valid, "permute: dims ", shape_str(dims), " is not a permutation of the ", n,
           " dimensions of shape ", shape_str(x.shape()));
  return autograd::record(
      permute_kernel(x, perm), "PermuteBackward", {x},
      [inverse](const Tensor& g) { return std::vector<Tensor>{permute_kernel(g, inverse)}; });
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  RG_CHECK(x.defined(), "transpose: input is an undefined tensor");
  const int64_t a = normalize_dim("transpose", "dim0", dim0, x);
  const int64_t b = normalize_dim("transpose", "dim1", dim1, x);
  std::vector<int64_t> perm(x.dim());
  for (int64_t k = 0; k < x.dim(); ++k) perm[k] = k;
  std::swap(perm[a], perm[b]);
  return permute(x, perm);
}

Tensor narrow_copy(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  if (cpu_half_inputs({x})) return narrow_copy(half_to_f32(x), dim, start, length).to(x.dtype());
  check_inputs("narrow_copy", {x});
  const int64_t d = normalize_dim("narrow_copy", "dim", dim, x);
  const int64_t size = x.size(d);
  RG_CHECK(start >= 0 && length >= 0 && start <= size - length, "narrow_copy: start ", start,
           " and length ", length, " are out of range for size ", size, " of dim ", dim,
           " of shape ", shape_str(x.shape()));
  Shape shape = x.shape();
  shape[d] = length;
  const Slice s = slice_layout(x.shape(), d, start, length);
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  strided_copy("narrow_copy", x, s.offset, out, 0, s.whole_to_slice);
  return autograd::record(out, "NarrowCopyBackward", {x}, [s, xshape = x.shape()](const Tensor& g) {
    Tensor grad_x = zeros(xshape, g.dtype(), g.device());
    strided_copy("narrow_copy_backward", g, 0, grad_x, s.offset, s.slice_to_whole);
    return std::vector<Tensor>{grad_x};
  });
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  RG_CHECK(x.defined(), "split: input is an undefined tensor");
  RG_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  const int64_t d = normalize_dim("split", "dim", dim, x);
  const int64_t size = x.size(d);
  std::vector<Tensor> chunks;
  for (int64_t start = 0; start < size || chunks.empty(); start += split_size)
    chunks.push_back(narrow_copy(x, d, start, std::min(split_size, size - start)));
  return chunks;
}

Tensor contiguous(const Tensor& x, MemoryFormat format) {
  RG_CHECK(x.defined(), "contiguous: the tensor is undefined");
  if (x.memory_format() == format) return x;
  RG_CHECK(x.dim() == 4, "contiguous(", memory_format_name(format),
           "): needs a 4-d [N, C, H, W] tensor, got shape ", shape_str(x.shape()));
  if (cpu_half_inputs({x})) return contiguous(half_to_f32(x), format).to(x.dtype());
  const MemoryFormat from = x.memory_format();
  return autograd::record(
      convert_layout(x, format), "ContiguousBackward", {x}, [from](const Tensor& g) {
        return std::vector<Tensor>{g.memory_format() == from ? g : convert_layout(g, from)};
      });
}

int64_t layout_conversions() { return g_layout_conversions.load(std::memory_order_relaxed); }

}  // namespace rg
