// Memory statistics, caches, record_stream and the copies between host and device storages.
#include "engine/cuda/memory.h"

#include "engine/cuda/event.h"
#include "engine/cuda/runtime.h"
#include "engine/tensor.h"
#include "kernels/error.h"

namespace rg::cuda {

DeviceMemoryStats memory_stats(int device) { return runtime().device_allocator(device).stats(); }

void reset_peak_memory_stats(int device) { runtime().device_allocator(device).reset_peak_stats(); }

HostMemoryStats pinned_memory_stats() { return runtime().pinned_allocator().stats(); }

void empty_cache() {
  Runtime& rt = runtime();
  if (rt.device_count() == 0) return;
  // All or nothing: a capture anywhere refuses before any cache is emptied (each allocator
  // refuses again if a capture begins meanwhile).
  for (int d = 0; d < rt.device_count(); ++d) {
    RG_CHECK(!rt.device_allocator(d).capturing(),
             "cuda::empty_cache during a CUDA graph capture on cuda:", d,
             ": nothing was emptied (it would wait for events and free memory); call it after "
             "the capture ends");
  }
  RG_CHECK(!rt.pinned_allocator().capturing(),
           "cuda::empty_cache during a CUDA graph capture: nothing was emptied (it would wait for "
           "events and unpin memory); call it after the capture ends");
  for (int d = 0; d < rt.device_count(); ++d) rt.device_allocator(d).empty_cache();
  rt.pinned_allocator().empty_cache();
}

void record_stream(const Tensor& t, const Stream& stream) {
  RG_CHECK(t.defined(), "record_stream: the tensor is undefined");
  const Storage& s = *t.storage();
  if (s.data() == nullptr) return;  // empty tensor: no block
  Runtime& rt = runtime();
  if (s.device().is_cuda()) {
    RG_CHECK(s.device().index == stream.device_index(), "record_stream: a tensor on ",
             s.device().str(), " cannot be used by stream ", stream.str());
    rt.device_allocator(s.device().index).record_stream(s.data(), stream.handle());
  } else {
    RG_CHECK(s.pinned(),
             "record_stream: the tensor is in pageable CPU memory; only CUDA and "
             "pinned tensors can be used by a stream asynchronously");
    rt.pinned_allocator().record_stream(s.data(), stream.device_index(), stream.handle());
  }
}

Allocator& device_storage_allocator(int device) { return runtime().storage_allocator(device); }

Allocator& pinned_storage_allocator() { return runtime().pinned_storage_allocator(); }

void copy_bytes(const Storage& dst, size_t dst_offset, const Storage& src, size_t src_offset,
                size_t nbytes, bool non_blocking) {
  RG_CHECK(dst_offset + nbytes <= dst.nbytes() && src_offset + nbytes <= src.nbytes(),
           "copy_bytes: range out of bounds");
  RG_CHECK(dst.device().is_cuda() || src.device().is_cuda(),
           "copy_bytes: neither side is CUDA memory");
  if (nbytes == 0) return;
  Runtime& rt = runtime();
  const Device cuda_side = dst.device().is_cuda() ? dst.device() : src.device();
  const int device = rt.check_device(cuda_side.index, "copy memory");
  if (src.device().is_cuda()) rt.check_device(src.device().index, "copy memory");
  const Stream stream(device, rt.current_stream(device));
  char* d = static_cast<char*>(dst.data()) + dst_offset;
  const char* s = static_cast<const char*>(src.data()) + src_offset;

  if (dst.device().is_cuda() && src.device().is_cuda()) {
    if (src.device() == dst.device()) {
      rt.backend().copy_async(d, s, nbytes, device, stream.handle());
      return;
    }
    // Between devices: after the work that wrote src, and before src's stream may reuse it.
    const Stream src_stream(src.device().index, rt.current_stream(src.device().index));
    stream.wait(src_stream);
    rt.backend().copy_async(d, s, nbytes, device, stream.handle());
    src_stream.wait(stream);
    return;
  }

  const Storage& host = dst.device().is_cpu() ? dst : src;
  // Noted before the copy is queued: a stream under a raw capture is refused with nothing queued.
  const bool pinned_use = non_blocking && host.pinned();
  if (pinned_use) rt.pinned_allocator().record_stream(host.data(), device, stream.handle());
  rt.backend().copy_async(d, s, nbytes, device, stream.handle());
  if (!non_blocking) stream.synchronize();
}

void zero_bytes(const Storage& dst, size_t offset, size_t nbytes) {
  RG_CHECK(dst.device().is_cuda(), "zero_bytes: ", dst.device().str(), " is not a CUDA device");
  RG_CHECK(offset + nbytes <= dst.nbytes(), "zero_bytes: range out of bounds");
  if (nbytes == 0) return;
  Runtime& rt = runtime();
  const int device = rt.check_device(dst.device().index, "fill memory");
  rt.backend().memset_async(static_cast<char*>(dst.data()) + offset, 0, nbytes, device,
                            rt.current_stream(device));
}

}  // namespace rg::cuda
