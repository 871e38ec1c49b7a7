// Average pooling through cuDNN (pool_cudnn.cu) on NCHW device arrays: a CUDA-only alternative to
// kernels/pool.h's avg_pool2d kernels, with the same geometry. Plain C++ header: `stream` is a
// cudaStream_t.
#pragma once

#include <cstdint>

#include "kernels/pool.h"

namespace rg::kernels::cuda {

// cudnnPoolingForward/Backward with CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING or
// _EXCLUDE_PADDING: the results of Pool<B>::avg_pool2d and avg_pool2d_backward up to rounding;
// instantiated for float, double and Half. Max pooling has no cuDNN path: cuDNN's forward returns
// no argmax and its backward finds the maximum again from x and y, without saying which of equal
// maxima gets the gradient (CUDNN_POOLING_MAX_DETERMINISTIC promises only reproducibility), while
// ours routes it to the first one, as the CPU does; PyTorch does not use cuDNN for it either.

// Whether cuDNN takes this geometry: a non-empty input, every size within int and fewer than
// INT_MAX elements (the descriptors are planes x 1 x h x w).
bool cudnn_pool2d_supported(const Pool2dGeometry& g);
template <class T>
void cudnn_avg_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y, bool count_include_pad,
                              void* stream);
// gx from gy; cuDNN's interface also takes x and the forward's y (which max pooling needs).
template <class T>
void cudnn_avg_pool2d_backward(const Pool2dGeometry& g, const T* x, const T* y, const T* gy, T* gx,
                               bool count_include_pad, void* stream);

}  // namespace rg::kernels::cuda
