// CUDA 2-D max and average pooling on NCHW device arrays (floor mode), forward and backward, with
// the geometry and semantics of kernels/cpu/pool.h; plus global average pooling
// (adaptive_avg_pool2d to 1x1); and average pooling through cuDNN (pool_cudnn.cu). Plain C++
// header: `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

#include "kernels/cpu/pool.h"

namespace rg::kernels::cuda {

// Instantiated for float, double, Half and BFloat16; the half types compute in f32. The geometry
// must be consistent: ho = (h + 2 * ph - kh) / sh + 1 (likewise wo), 0 <= ph <= kh / 2.
// Backward passes gather (one thread per input pixel, windows in the CPU's order) instead of
// scattering with atomics, so they are deterministic.
using cpu::Pool2dGeometry;

// y = the window maxima (padding counts as -inf; NaN wins); argmax holds each maximum's index
// inside its input plane (ih * w + iw), the first one on ties.
template <class T>
void max_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y, int64_t* argmax, void* stream);
// gx[j] = sum of gy over the windows whose argmax is j (argmax from max_pool2d_forward).
template <class T>
void max_pool2d_backward(const Pool2dGeometry& g, const T* gy, const int64_t* argmax, T* gx,
                         void* stream);

// y = window sums divided by the window size clipped to the padded input (count_include_pad)
// or to the input itself.
template <class T>
void avg_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y, bool count_include_pad,
                        void* stream);
template <class T>
void avg_pool2d_backward(const Pool2dGeometry& g, const T* gy, T* gx, bool count_include_pad,
                         void* stream);

// y[p] = mean of the hw values of plane p (adaptive_avg_pool2d with output size (1, 1)).
template <class T>
void adaptive_avg_pool2d_1x1_forward(const T* x, T* y, int64_t planes, int64_t hw, void* stream);
// gx[p, i] = gy[p] / hw
template <class T>
void adaptive_avg_pool2d_1x1_backward(const T* gy, T* gx, int64_t planes, int64_t hw, void* stream);

// Average pooling through cuDNN (cudnnPoolingForward/Backward, CUDNN_POOLING_AVERAGE_COUNT_
// INCLUDE_PADDING or _EXCLUDE_PADDING), the results of avg_pool2d_forward/backward up to rounding;
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
