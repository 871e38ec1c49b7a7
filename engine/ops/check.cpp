// Shared input validation for ops.
#include "engine/ops/check.h"

#include "engine/cuda/device_guard.h"
#include "engine/cuda/stream.h"
#include "kernels/error.h"

namespace rg {

void check_inputs(const char* op, std::initializer_list<Tensor> tensors, Formats formats) {
  const Tensor* first = nullptr;
  int i = 0;
  for (const Tensor& t : tensors) {
    RG_CHECK(t.defined(), op, ": input ", i, " is an undefined tensor");
    RG_CHECK(formats != Formats::contiguous || t.memory_format() == MemoryFormat::contiguous, op,
             ": input ", i, " is ", memory_format_name(t.memory_format()),
             ", which this op does not take (it reads memory in the shape's order); call "
             ".contiguous() first");
    RG_CHECK(formats != Formats::alike || first == nullptr ||
                 t.memory_format() == first->memory_format(),
             op, ": memory format mismatch, input 0 is ",
             memory_format_name(first->memory_format()), " but input ", i, " is ",
             memory_format_name(t.memory_format()));
    if (first == nullptr) {
      first = &t;
    } else {
      RG_CHECK(t.dtype() == first->dtype(), op, ": dtype mismatch, input 0 is ",
               dtype_name(first->dtype()), " but input ", i, " is ", dtype_name(t.dtype()));
      RG_CHECK(t.device() == first->device(), op, ": device mismatch, input 0 is on ",
               first->device().str(), " but input ", i, " is on ", t.device().str());
    }
    ++i;
  }
}

bool reusable(const Tensor& x) {
  if (!x.defined()) return false;
  const TensorImpl& impl = *x.impl();
  return x.impl_ptr().use_count() == 1 && impl.storage.use_count() == 1 && impl.offset == 0 &&
         impl.storage->nbytes() == x.nbytes() && !(x.requires_grad() && x.is_leaf());
}

void check_cpu_only(const char* op, std::initializer_list<Tensor> tensors) {
  int i = 0;
  for (const Tensor& t : tensors) {
    RG_CHECK(!t.defined() || !t.device().is_cuda(), op, ": not implemented on CUDA yet (input ", i,
             " is on ", t.device().str(), "); run it on the CPU");
    ++i;
  }
}

void check_dim(const char* op, const Tensor& t, int64_t ndim, const char* layout) {
  RG_CHECK(t.dim() == ndim, op, ": expected a ", ndim, "-d tensor (", layout, "), got shape ",
           shape_str(t.shape()));
}

void* cuda_stream(const Tensor& t) {
  // Kernels launch on the current device: make it t's (and leave it so, like torch.cuda).
  const int device = t.device().index;
  if (cuda::current_device() != device) cuda::set_device(device);
  return cuda::current_stream(device).handle();
}

kernels::Ctx kernel_ctx(const Tensor& t) {
  return t.device().is_cuda() ? kernels::Ctx{.stream = cuda_stream(t)} : kernels::Ctx{};
}

}  // namespace rg
