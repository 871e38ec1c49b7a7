// The pieces every cuDNN wrapper of kernels/cuda shares (conv2d.cu, batch_norm_cudnn.cu,
// pool_cudnn.cu): data types, int sizes, RAII descriptors and one handle per (device, stream).
// Internal to the .cu files: it includes <cudnn.h> (the emulated one under the emulator).
#pragma once

#include <cudnn.h>

#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "kernels/cuda/check.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels::cuda::cudnn {

template <class T>
constexpr cudnnDataType_t data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDNN_DATA_FLOAT;
  if constexpr (std::is_same_v<T, double>) return CUDNN_DATA_DOUBLE;
  if constexpr (std::is_same_v<T, Half>) return CUDNN_DATA_HALF;
  if constexpr (std::is_same_v<T, BFloat16>) return CUDNN_DATA_BFLOAT16;
}

// alpha and beta in the type cuDNN reads them as: double for f64 data, float otherwise.
template <class T>
using scale_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Whether v fits cuDNN's int sizes.
inline bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

inline int as_int(const char* op, const char* what, int64_t v) {
  RG_CHECK(fits_int(v), op, ": ", what, " = ", v, " is outside cuDNN's int range");
  return static_cast<int>(v);
}

// Owns one cuDNN descriptor. It is created before the derived class's constructor body sets it,
// so a set call (or size check) that throws there destroys it again instead of leaking it.
template <class D, cudnnStatus_t (*Create)(D*), cudnnStatus_t (*Destroy)(D)>
class Descriptor {
 public:
  D d = nullptr;
  Descriptor() { RG_CUDA_CHECK(Create(&d)); }
  ~Descriptor() { (void)Destroy(d); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
};

// The descriptor set D (a struct of Descriptor members) of `key`, built from `args` by the first
// call on this thread and kept for the thread's life: a steady training step creates and
// destroys no descriptor (each such cuDNN call costs host time per op; ResNet-18 made ~130 per
// step). One cache per D; per thread, so no lock. A constructor that throws (a refused size)
// keeps nothing.
template <class D, class Key, class... Args>
const D& cached(const Key& key, const Args&... args) {
  thread_local std::map<Key, std::unique_ptr<const D>> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, std::make_unique<const D>(args...)).first;
  return *it->second;
}

// A packed NCHW tensor (or NHWC: channels last); op names the caller in size errors.
struct TensorDesc : Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                               cudnnDestroyTensorDescriptor> {
  TensorDesc(const char* op, cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w,
             cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW) {
    RG_CUDA_CHECK(cudnnSetTensor4dDescriptor(d, format, type, as_int(op, "n", n),
                                             as_int(op, "channels", c), as_int(op, "height", h),
                                             as_int(op, "width", w)));
  }
};

struct Handle {
  cudnnHandle_t h = nullptr;
  std::mutex mu;  // a cuDNN handle must not be used by two host threads at once
};

// The handle of (current device, stream), created on first use; it lives as long as the process,
// like cuBLAS's. A handle whose stream cannot be set is destroyed again, not kept half made. The
// table's mutex is held only here: calls on different handles run concurrently, each under its
// handle's own mutex (LockedHandle).
inline Handle& handle_for(void* stream) {
  static std::mutex table_mu;
  static std::map<std::pair<int, void*>, Handle> handles;
  int device = 0;
  RG_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(table_mu);
  Handle& handle = handles[{device, stream}];
  if (handle.h == nullptr) {
    cudnnHandle_t h = nullptr;
    RG_CUDA_CHECK(cudnnCreate(&h));
    const cudnnStatus_t status = cudnnSetStream(h, static_cast<cudaStream_t>(stream));
    if (status != CUDNN_STATUS_SUCCESS) (void)cudnnDestroy(h);
    RG_CUDA_CHECK(status);
    handle.h = h;
  }
  return handle;
}

// The handle of (current device, stream), held for the calls of one operation.
class LockedHandle {
 public:
  explicit LockedHandle(void* stream) : handle_(handle_for(stream)), lock_(handle_.mu) {}
  cudnnHandle_t get() const { return handle_.h; }

 private:
  Handle& handle_;
  std::lock_guard<std::mutex> lock_;
};

}  // namespace rg::kernels::cuda::cudnn
