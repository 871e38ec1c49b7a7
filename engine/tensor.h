// Tensor: a cheap handle (shared_ptr<TensorImpl>) to a dense block of a Storage in one of two
// memory formats (row-major, or channels last for 4-d tensors), plus the autograd state of that
// tensor (requires_grad, grad, grad_fn, hooks).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/hooks.h"
#include "engine/storage.h"

namespace rg {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);

class Tensor;
namespace autograd {
class Node;
class AccumulateGrad;
}  // namespace autograd

using PostAccumulateGradHook = std::function<void(Tensor&)>;
// Called with the gradient w.r.t. a tensor when backward computes it; a returned tensor (same
// shape) replaces that gradient from then on (Tensor::register_hook).
using TensorHook = std::function<std::optional<Tensor>(const Tensor& grad)>;

// Autograd state, allocated only for tensors that take part in autograd.
struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<autograd::Node> grad_fn;                   // set for non-leaf results
  std::weak_ptr<autograd::AccumulateGrad> grad_accumulator;  // leaves: created lazily
  std::shared_ptr<struct TensorImpl> grad;  // accumulated gradient of a leaf (or retained)
  std::vector<PostAccumulateGradHook> post_accumulate_hooks;
  // A leaf's register_hook hooks (run before accumulating); a non-leaf's live on its grad_fn.
  HookList<TensorHook> hooks;
  bool retains_grad = false;  // a non-leaf whose retain_grad() was called
};

// How a tensor's elements lie in memory. Shapes are always logical ([N, C, H, W] for images):
//   contiguous     row-major in the shape's order (every tensor unless asked otherwise);
//   channels_last  a 4-d [N, C, H, W] tensor stored as [N, H, W, C], PyTorch's
//                  torch.channels_last, which cuDNN's NHWC convolutions run fastest on.
// Ops that read memory by position take contiguous tensors only unless they say otherwise: a
// channels_last tensor reaching one is an error naming the op (check_inputs, engine/ops/check.h),
// never a wrong result. Elementwise ops keep their input's format; conv2d, batch norm (and its
// fused forms) and pooling work in both (docs/architecture.md lists them). Tensor::contiguous
// converts, counted by layout_conversions() (engine/ops/shape.h).
enum class MemoryFormat : uint8_t { contiguous, channels_last };
const char* memory_format_name(MemoryFormat f);  // "contiguous", "channels_last"

struct TensorImpl {
  Shape shape;
  DType dtype = DType::f32;
  MemoryFormat memory_format = MemoryFormat::contiguous;
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  int64_t numel = 0;
  std::unique_ptr<AutogradMeta> autograd;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // A new uninitialized tensor (channels_last needs a 4-d shape). CUDA memory comes from the
  // device's caching allocator, for the current stream (engine/cuda/stream.h).
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
                      MemoryFormat format = MemoryFormat::contiguous);
  // A new uninitialized CPU tensor in pinned (page-locked) memory; needs a CUDA device.
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  const Shape& shape() const;
  int64_t dim() const { return int64_t(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  MemoryFormat memory_format() const;
  size_t nbytes() const { return size_t(numel()) * element_size(dtype()); }

  // Typed pointer to the first element; checks that T matches dtype().
  template <class T>
  T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;
  const std::shared_ptr<Storage>& storage() const;
  int64_t storage_offset() const;
  // Marks an in-place modification (saved-tensor checks in autograd rely on it).
  void bump_version() const;

  // Views share storage with *this. view/reshape/narrow are differentiable. A channels_last
  // tensor views only as its own shape (call contiguous() first); narrow keeps the format.
  Tensor view(const Shape& shape) const;  // one dim may be -1
  Tensor reshape(const Shape& shape) const { return view(shape); }
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;  // dim 0 only
  Tensor flat_narrow(int64_t start, int64_t length) const;          // 1-D view of a flat range

  Tensor to(DType dtype) const;  // a copy unless the dtype is already `dtype`
  Tensor clone() const;          // a new copy in the same memory format (differentiable)
  Tensor detach() const;         // same storage, no autograd history

  // *this if already in `format`, else a copy in it: one layout-conversion kernel, counted by
  // layout_conversions() (engine/ops/shape.h); differentiable (the gradient goes back to this
  // tensor's format). channels_last needs a 4-d tensor.
  Tensor contiguous(MemoryFormat format = MemoryFormat::contiguous) const;
  // The same memory read in `format` (no copy, not differentiable): for buffers that hold a
  // tensor's elements in that tensor's layout, as DDP's bucket views of channels_last gradients.
  Tensor reinterpret_memory_format(MemoryFormat format) const;

  // A copy on `device` unless already there (differentiable). Copies are queued on the current
  // stream of the CUDA device; non_blocking=false returns when a copy to or from the CPU is done,
  // non_blocking=true returns at once when the CPU side is pinned (synchronize the stream, or
  // order other streams after it with an Event, before using the result).
  Tensor to(Device device, bool non_blocking = false) const;
  bool is_pinned() const;     // CPU memory from the pinned allocator
  Tensor pin_memory() const;  // a copy in pinned memory unless already pinned (CPU tensors only)

  // Copies src (same shape, any dtype, any device, any memory format) into *this, converting;
  // not recorded by autograd. Across devices as `to(device, non_blocking)`; dtype conversions
  // between two CUDA tensors are not implemented yet.
  Tensor& copy_(const Tensor& src, bool non_blocking = false);
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }

  double item() const;  // the value of a one-element tensor, as double
  template <class T>
  T item() const {
    return static_cast<T>(item());
  }
  template <class T>
  std::vector<T> to_vector() const;  // all elements converted to T

  std::string str() const;  // PyTorch-like printing

  // Autograd.
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad);
  bool is_leaf() const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  // Undefined until a backward reached this leaf (or this non-leaf, after retain_grad()).
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  void zero_grad(bool set_to_none = true) const;
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // Runs after this leaf's .grad was updated by a backward pass, once per pass.
  void register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const;
  // As torch.Tensor.register_hook: fn(grad) runs when the gradient w.r.t. this tensor is computed,
  // before it reaches .grad (leaves) or flows on into the graph (non-leaves); returning a Tensor of
  // the same shape replaces the gradient, returning nothing (void or std::nullopt) keeps it. Hooks
  // run in registration order, each on the previous one's result. Needs requires_grad().
  template <class F>
  RemovableHandle register_hook(F fn) const {
    return add_hook(optional_result_hook<Tensor, const Tensor&>(std::move(fn)));
  }
  // As torch.Tensor.retain_grad: a non-leaf's .grad() is filled by backward (accumulating across
  // passes like a leaf's), after its register_hook hooks ran. Does nothing on a leaf.
  void retain_grad() const;
  bool retains_grad() const;  // true only for a non-leaf after retain_grad(), as in PyTorch

  AutogradMeta& autograd_meta() const;  // creates it on first use

 private:
  void check_dtype(DType expected) const;
  RemovableHandle add_hook(TensorHook hook) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Tensors with names, in order: state dicts, optimizer state, checkpoint contents.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

}  // namespace rg
