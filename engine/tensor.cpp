// Tensor handle methods: metadata, views, conversions, element access, printing, autograd entry.
#include "engine/tensor.h"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "engine/autograd/engine.h"
#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/stream.h"
#include "engine/cuda/stream_trace.h"
#include "engine/dispatch.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "engine/ops/shape.h"
#include "kernels/cpu/cast.h"
#include "kernels/cuda/cast.h"
#include "kernels/error.h"

namespace rg {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    RG_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    RG_CHECK(!__builtin_mul_overflow(n, d, &n), "shape ", shape_str(s),
             " has more elements than fit in 64 bits");
  }
  return n;
}

const char* memory_format_name(MemoryFormat f) {
  return f == MemoryFormat::channels_last ? "channels_last" : "contiguous";
}

namespace {

void check_format_rank(const char* op, const Shape& shape, MemoryFormat format) {
  RG_CHECK(format != MemoryFormat::channels_last || shape.size() == 4, op,
           ": channels_last needs a 4-d [N, C, H, W] shape, got ", shape_str(shape));
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  check_format_rank("empty", shape, format);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->memory_format = format;
  impl->numel = shape_numel(shape);
  impl->storage = std::make_shared<Storage>(size_t(impl->numel) * element_size(dtype), device);
  return Tensor(std::move(impl));
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->numel = shape_numel(shape);
  impl->storage = std::make_shared<Storage>(size_t(impl->numel) * element_size(dtype),
                                            Device::cpu(), cuda::pinned_storage_allocator());
  return Tensor(std::move(impl));
}

#define RG_REQUIRE_DEFINED(what) RG_CHECK(impl_ != nullptr, what ": the tensor is undefined")

const Shape& Tensor::shape() const {
  RG_REQUIRE_DEFINED("shape()");
  return impl_->shape;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  RG_CHECK(d >= -n && d < n, "size(", d, "): dimension out of range for a ", n, "-d tensor");
  return impl_->shape[size_t(d < 0 ? d + n : d)];
}

int64_t Tensor::numel() const {
  RG_REQUIRE_DEFINED("numel()");
  return impl_->numel;
}

DType Tensor::dtype() const {
  RG_REQUIRE_DEFINED("dtype()");
  return impl_->dtype;
}

Device Tensor::device() const {
  RG_REQUIRE_DEFINED("device()");
  return impl_->storage->device();
}

MemoryFormat Tensor::memory_format() const {
  RG_REQUIRE_DEFINED("memory_format()");
  return impl_->memory_format;
}

void* Tensor::raw_data() const {
  RG_REQUIRE_DEFINED("data()");
  return static_cast<char*>(impl_->storage->data()) +
         impl_->offset * int64_t(element_size(impl_->dtype));
}

const std::shared_ptr<Storage>& Tensor::storage() const {
  RG_REQUIRE_DEFINED("storage()");
  return impl_->storage;
}

int64_t Tensor::storage_offset() const {
  RG_REQUIRE_DEFINED("storage_offset()");
  return impl_->offset;
}

void Tensor::bump_version() const { storage()->bump_version(); }

void Tensor::check_dtype(DType expected) const {
  RG_REQUIRE_DEFINED("data<T>()");
  RG_CHECK(impl_->dtype == expected, "data<", dtype_name(expected), ">() called on a ",
           dtype_name(impl_->dtype), " tensor");
}

namespace {

// A new impl that aliases `base`'s storage, in `format`.
Tensor alias(const Tensor& base, Shape shape, int64_t offset,
             MemoryFormat format = MemoryFormat::contiguous) {
  auto impl = std::make_shared<TensorImpl>();
  impl->numel = shape_numel(shape);
  impl->shape = std::move(shape);
  impl->dtype = base.dtype();
  impl->memory_format = format;
  impl->storage = base.storage();
  impl->offset = offset;
  return Tensor(std::move(impl));
}

}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  RG_REQUIRE_DEFINED("view()");
  Shape shape = requested;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      RG_CHECK(infer < 0, "view", shape_str(requested), ": only one dimension can be -1");
      infer = int(i);
    } else {
      RG_CHECK(shape[i] >= 0, "view", shape_str(requested), ": invalid dimension ", shape[i]);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    RG_CHECK(known != 0 && numel() % known == 0, "view", shape_str(requested),
             " is invalid for a tensor of ", numel(), " elements");
    shape[size_t(infer)] = numel() / known;
  }
  RG_CHECK(shape_numel(shape) == numel(), "view", shape_str(requested),
           " is invalid for a tensor of shape ", shape_str(this->shape()), " (", numel(),
           " elements)");
  const MemoryFormat format = memory_format();
  RG_CHECK(format == MemoryFormat::contiguous || shape == this->shape(), "view",
           shape_str(requested), ": a channels_last tensor of shape ", shape_str(this->shape()),
           " can only be viewed as its own shape (call .contiguous() first)");
  Tensor out = alias(*this, shape, impl_->offset, format);
  const Shape in_shape = this->shape();
  return autograd::record(out, "ViewBackward", {*this}, [in_shape](const Tensor& g) {
    return std::vector<Tensor>{g.view(in_shape)};
  });
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  RG_REQUIRE_DEFINED("narrow()");
  RG_CHECK(dim == 0, "narrow: only dim 0 is supported (a view must stay one block), got dim ", dim);
  RG_CHECK(this->dim() >= 1, "narrow: needs at least one dimension");
  const int64_t n = impl_->shape[0];
  RG_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: range [", start, ", ",
           start + length, ") is out of bounds for dim 0 of size ", n);
  Shape shape = impl_->shape;
  shape[0] = length;
  const int64_t row = n == 0 ? 0 : impl_->numel / n;
  // Dim 0 is outermost in both formats: the rows stay one block in this tensor's format.
  Tensor out = alias(*this, shape, impl_->offset + start * row, memory_format());
  const Shape in_shape = this->shape();
  const DType dt = dtype();
  const Device dev = device();
  const MemoryFormat format = memory_format();
  return autograd::record(out, "NarrowBackward", {*this}, [=](const Tensor& g) {
    Tensor full = Tensor::empty(in_shape, dt, dev, format).zero_();
    full.narrow(0, start, length).copy_(g);
    return std::vector<Tensor>{full};
  });
}

Tensor Tensor::flat_narrow(int64_t start, int64_t length) const {
  RG_REQUIRE_DEFINED("flat_narrow()");
  RG_CHECK(start >= 0 && length >= 0 && start + length <= numel(), "flat_narrow: range [", start,
           ", ", start + length, ") is out of bounds for a tensor of ", numel(), " elements");
  RG_CHECK(!autograd::needs_grad({*this}),
           "flat_narrow is not differentiable; use it under NoGradGuard or on detached tensors");
  return alias(*this, Shape{length}, impl_->offset + start);
}

Tensor Tensor::detach() const {
  RG_REQUIRE_DEFINED("detach()");
  return alias(*this, shape(), impl_->offset, memory_format());
}

Tensor Tensor::reinterpret_memory_format(MemoryFormat format) const {
  RG_REQUIRE_DEFINED("reinterpret_memory_format()");
  check_format_rank("reinterpret_memory_format", shape(), format);
  RG_CHECK(!autograd::needs_grad({*this}),
           "reinterpret_memory_format is not differentiable; use it under NoGradGuard or on "
           "detached tensors");
  return alias(*this, shape(), impl_->offset, format);
}

Tensor Tensor::contiguous(MemoryFormat format) const {
  RG_REQUIRE_DEFINED("contiguous()");
  return rg::contiguous(*this, format);
}

namespace {

size_t byte_offset(const Tensor& t) { return size_t(t.storage_offset()) * element_size(t.dtype()); }

// dst.copy_(src) when at least one of them is a CUDA tensor (both in one memory format: copy_
// made them so, and the staging tensors keep it). Conversions between dtypes happen on the CPU
// side of a host-device copy.
void copy_across_devices(Tensor& dst, const Tensor& src, bool non_blocking) {
  // While tracing, one span on the stream of the CUDA side (as the engine's dispatch gives ops).
  const cuda::OpSpan span("copy_", "op", dst.device().is_cuda() ? dst.device() : src.device());
  if (src.dtype() == dst.dtype()) {
    cuda::copy_bytes(*dst.storage(), byte_offset(dst), *src.storage(), byte_offset(src),
                     dst.nbytes(), non_blocking);
  } else if (src.device().is_cpu()) {
    Tensor converted = Tensor::empty(src.shape(), dst.dtype(), Device::cpu(), src.memory_format());
    converted.copy_(src);
    // Pageable memory: the copy has been staged when it returns, so `converted` may go.
    cuda::copy_bytes(*dst.storage(), byte_offset(dst), *converted.storage(), 0, dst.nbytes(),
                     non_blocking);
  } else if (dst.device().is_cpu()) {
    Tensor raw = Tensor::empty(src.shape(), src.dtype(), Device::cpu(), src.memory_format());
    cuda::copy_bytes(*raw.storage(), 0, *src.storage(), byte_offset(src), src.nbytes(),
                     /*non_blocking=*/false);
    dst.copy_(raw);
  } else if (src.device() != dst.device()) {
    // Between two devices: convert on the source device, then copy.
    Tensor converted = Tensor::empty(src.shape(), dst.dtype(), src.device(), src.memory_format());
    converted.copy_(src);
    cuda::copy_bytes(*dst.storage(), byte_offset(dst), *converted.storage(), 0, dst.nbytes(),
                     non_blocking);
  } else {
    void* stream = cuda_stream(dst);  // dst's device current: a null stream means its own
    dispatch_all(src.dtype(), [&]<class S>() {
      dispatch_all(dst.dtype(), [&]<class D>() {
        kernels::cuda::cast<S, D>(src.data<S>(), dst.data<D>(), dst.numel(), stream);
      });
    });
  }
}

}  // namespace

Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) {
  RG_REQUIRE_DEFINED("copy_()");
  RG_CHECK(src.defined(), "copy_: the source tensor is undefined");
  RG_CHECK(src.shape() == shape(), "copy_: source shape ", shape_str(src.shape()),
           " does not match destination shape ", shape_str(shape()));
  if (src.impl() == impl() || numel() == 0) return *this;
  if (src.memory_format() != memory_format()) {  // into this layout first, on src's device
    const NoGradGuard no_grad;
    return copy_(src.detach().contiguous(memory_format()), non_blocking);
  }
  if (!device().is_cpu() || !src.device().is_cpu()) {
    copy_across_devices(*this, src, non_blocking);
    bump_version();
    return *this;
  }
  if (src.dtype() == dtype()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
  } else {
    dispatch_all(src.dtype(), [&]<class S>() {
      dispatch_all(dtype(),
                   [&]<class D>() { kernels::cpu::cast<S, D>(src.data<S>(), data<D>(), numel()); });
    });
  }
  bump_version();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  RG_REQUIRE_DEFINED("fill_()");
  if (device().is_cuda()) {
    const cuda::OpSpan span("fill_", "op", device());
    if (value == 0.0 && !std::signbit(value)) {  // zero is all-zero bytes in every dtype
      cuda::zero_bytes(*storage(), byte_offset(*this), nbytes());
    } else {
      void* stream = cuda_stream(*this);  // as the ops: the kernel runs on this tensor's device
      dispatch_all(dtype(), [&]<class T>() {
        kernels::cuda::fill<T>(data<T>(), kernels::cpu::convert<T>(value), numel(), stream);
      });
    }
    bump_version();
    return *this;
  }
  dispatch_all(dtype(), [&]<class T>() {
    const T v = kernels::cpu::convert<T>(value);
    std::fill_n(data<T>(), numel(), v);
  });
  bump_version();
  return *this;
}

Tensor Tensor::to(DType target) const {
  RG_REQUIRE_DEFINED("to()");
  if (target == dtype()) return *this;
  Tensor out = Tensor::empty(shape(), target, device(), memory_format());
  out.copy_(*this);
  const DType src = dtype();
  if (is_floating(src) && is_floating(target)) {
    return autograd::record(out, "ToBackward", {*this},
                            [src](const Tensor& g) { return std::vector<Tensor>{g.to(src)}; });
  }
  return out;
}

Tensor Tensor::to(Device target, bool non_blocking) const {
  RG_REQUIRE_DEFINED("to()");
  const Device src = device();
  if (target == src) return *this;
  Tensor out = Tensor::empty(shape(), dtype(), target, memory_format());
  out.copy_(*this, non_blocking);
  if (is_floating(dtype())) {
    return autograd::record(out, "ToDeviceBackward", {*this},
                            [src](const Tensor& g) { return std::vector<Tensor>{g.to(src)}; });
  }
  return out;
}

bool Tensor::is_pinned() const {
  RG_REQUIRE_DEFINED("is_pinned()");
  return impl_->storage->pinned();
}

Tensor Tensor::pin_memory() const {
  RG_REQUIRE_DEFINED("pin_memory()");
  RG_CHECK(device().is_cpu(), "pin_memory: only CPU tensors can be pinned, this one is on ",
           device().str());
  if (is_pinned()) return *this;
  Tensor out = Tensor::empty_pinned(shape(), dtype());
  out.impl()->memory_format = memory_format();
  out.copy_(*this);
  return autograd::record(out, "PinMemoryBackward", {*this},
                          [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor Tensor::clone() const {
  RG_REQUIRE_DEFINED("clone()");
  Tensor out = Tensor::empty(shape(), dtype(), device(), memory_format());
  out.copy_(*this);
  return autograd::record(out, "CloneBackward", {*this},
                          [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

double Tensor::item() const {
  RG_REQUIRE_DEFINED("item()");
  RG_CHECK(numel() == 1, "item(): the tensor has ", numel(), " elements (shape ",
           shape_str(shape()), "), expected exactly one");
  if (!device().is_cpu()) return detach().to(Device::cpu()).item();
  return dispatch_all(dtype(),
                      [&]<class T>() { return kernels::cpu::convert<double>(*data<T>()); });
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  RG_REQUIRE_DEFINED("to_vector()");
  if (!device().is_cpu()) return detach().to(Device::cpu()).to_vector<T>();
  if (memory_format() != MemoryFormat::contiguous) {  // in the shape's (logical) order
    const NoGradGuard no_grad;
    return detach().contiguous().to_vector<T>();
  }
  std::vector<T> out(static_cast<size_t>(numel()));
  dispatch_all(dtype(), [&]<class S>() {
    const S* p = data<S>();
    for (int64_t i = 0; i < numel(); ++i) out[size_t(i)] = kernels::cpu::convert<T>(p[i]);
  });
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  const std::vector<double> v = to_vector<double>();
  const bool floating = is_floating(dtype());
  const Shape& s = shape();
  constexpr int64_t kEdge = 3;  // elements shown at each end of a long dimension
  // Recursive printer over dimensions, eliding the middle of dims longer than 2*kEdge.
  auto print = [&](auto&& self, size_t d, int64_t base, int64_t stride_prod) -> void {
    if (d == s.size()) {
      const double x = v[size_t(base)];
      if (floating) {
        if (std::isfinite(x) && (x == 0 || (std::fabs(x) >= 1e-4 && std::fabs(x) < 1e6))) {
          os << std::fixed << std::setprecision(4) << x;
        } else {
          os << std::scientific << std::setprecision(4) << x;
        }
      } else {
        os << int64_t(x);
      }
      return;
    }
    const int64_t n = s[d];
    const int64_t inner = n == 0 ? 0 : stride_prod / n;
    os << '[';
    for (int64_t i = 0; i < n; ++i) {
      if (n > 2 * kEdge && i == kEdge) {
        os << "..., ";
        i = n - kEdge;
      }
      self(self, d + 1, base + i * inner, inner);
      if (i + 1 < n) os << (d + 1 == s.size() ? ", " : ",\n" + std::string(d + 8, ' '));
    }
    os << ']';
  };
  os << "tensor(";
  print(print, 0, 0, numel());
  os << ", shape=" << shape_str(s) << ", dtype=" << dtype_name(dtype());
  if (!device().is_cpu()) os << ", device=" << device().str();
  if (memory_format() != MemoryFormat::contiguous)
    os << ", memory_format=" << memory_format_name(memory_format());
  if (requires_grad())
    os << (is_leaf() ? ", requires_grad=true" : ", grad_fn=" + grad_fn()->name());
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// ---- autograd ----

AutogradMeta& Tensor::autograd_meta() const {
  RG_REQUIRE_DEFINED("autograd");
  if (!impl_->autograd) impl_->autograd = std::make_unique<AutogradMeta>();
  return *impl_->autograd;
}

bool Tensor::requires_grad() const {
  RG_REQUIRE_DEFINED("requires_grad()");
  return impl_->autograd && impl_->autograd->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  RG_REQUIRE_DEFINED("set_requires_grad()");
  RG_CHECK(is_leaf(), "set_requires_grad can only change leaf tensors; use detach() first");
  RG_CHECK(!requires_grad || is_floating(dtype()),
           "only floating-point tensors can require gradients, this one is ", dtype_name(dtype()));
  autograd_meta().requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const { return !impl_->autograd || !impl_->autograd->grad_fn; }

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> kNone;
  return impl_->autograd ? impl_->autograd->grad_fn : kNone;
}

Tensor Tensor::grad() const {
  RG_REQUIRE_DEFINED("grad()");
  return impl_->autograd && impl_->autograd->grad ? Tensor(impl_->autograd->grad) : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    RG_CHECK(grad.shape() == shape() && grad.dtype() == dtype(), "set_grad: gradient ",
             shape_str(grad.shape()), " ", dtype_name(grad.dtype()), " does not match tensor ",
             shape_str(shape()), " ", dtype_name(dtype()));
  }
  autograd_meta().grad = grad.impl_ptr();
}

void Tensor::zero_grad(bool set_to_none) const {
  if (!impl_->autograd || !impl_->autograd->grad) return;
  if (set_to_none) {
    impl_->autograd->grad.reset();
  } else {
    Tensor(impl_->autograd->grad).zero_();
  }
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::Engine::backward({*this}, {gradient}, retain_graph);
}

RemovableHandle Tensor::add_hook(TensorHook hook) const {
  RG_REQUIRE_DEFINED("register_hook()");
  RG_CHECK(requires_grad(),
           "register_hook: cannot register a hook on a tensor that does not "
           "require grad");
  if (is_leaf()) return autograd_meta().hooks.add(std::move(hook));
  return grad_fn()->tensor_pre_hooks().add(std::move(hook));
}

void Tensor::retain_grad() const {
  RG_REQUIRE_DEFINED("retain_grad()");
  RG_CHECK(requires_grad(),
           "retain_grad: cannot retain the gradient of a tensor that does not "
           "require grad");
  AutogradMeta& meta = autograd_meta();
  if (is_leaf() || meta.retains_grad) return;
  meta.retains_grad = true;
  // Weak: the node must not keep its own output alive (the output owns the node).
  grad_fn()->set_retain_grad_hook([weak = std::weak_ptr<TensorImpl>(impl_)](const Tensor& g) {
    if (auto impl = weak.lock()) autograd::accumulate_grad(*impl->autograd, g);
  });
}

bool Tensor::retains_grad() const {
  RG_REQUIRE_DEFINED("retains_grad()");
  return impl_->autograd && impl_->autograd->retains_grad;
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  RG_CHECK(is_leaf() && requires_grad(),
           "post-accumulate-grad hooks can only be registered on leaf tensors that require grad");
  autograd_meta().post_accumulate_hooks.push_back(std::move(hook));
}

}  // namespace rg
