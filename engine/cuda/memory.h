// CUDA memory as the rest of the engine sees it: memory statistics, the caches, the Storage
// allocators for CUDA and pinned memory, and asynchronous copies between storages.
#pragma once

#include <cstddef>

#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/pinned_allocator.h"
#include "engine/cuda/stream.h"
#include "engine/storage.h"

namespace rg {
class Tensor;
}

namespace rg::cuda {

// device -1: the current device. Throw rg::Error without a CUDA device.
DeviceMemoryStats memory_stats(int device = -1);
void reset_peak_memory_stats(int device = -1);
HostMemoryStats pinned_memory_stats();
// Returns the cached memory of every device and the cached pinned blocks (waiting for the events
// that guard blocks still in use by other streams). Does nothing when there is no CUDA device:
// nothing can be cached then. Refused (rg::Error, nothing emptied) while a cuda::Graph captures.
void empty_cache();

// `t`'s memory (CUDA or pinned) is used by work queued on `stream`: when `t`'s storage is freed,
// its block is reused only after that work is done. Needed when a tensor allocated on one stream
// is used on another (PyTorch's Tensor.record_stream).
void record_stream(const Tensor& t, const Stream& stream);

// The Storage allocators (engine/storage.h): CUDA memory of `device`, allocated for the current
// stream; pinned host memory. Throw rg::Error without a CUDA device.
Allocator& device_storage_allocator(int device);
Allocator& pinned_storage_allocator();

// Copies nbytes from src (at byte src_offset) to dst (at dst_offset); at least one is CUDA
// memory. Queued on the current stream of the CUDA side (of dst for device-to-device copies; a copy
// between two devices is also ordered after src's current stream, and src's current stream after
// it). With non_blocking=false a copy that involves host memory is complete on return; with
// non_blocking=true it is asynchronous when the host memory is pinned (its block is then kept
// from reuse until the copy is done), and complete on return otherwise.
void copy_bytes(const Storage& dst, size_t dst_offset, const Storage& src, size_t src_offset,
                size_t nbytes, bool non_blocking);
// Sets nbytes of CUDA memory to zero, on the current stream of its device.
void zero_bytes(const Storage& dst, size_t offset, size_t nbytes);

}  // namespace rg::cuda
