// 2-D max and average pooling on raw NCHW arrays (floor mode), forward and backward.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

// n * c independent planes of h x w; the caller computes ho/wo.
struct Pool2dGeometry {
  int64_t planes, h, w;
  int64_t kh, kw, sh, sw, ph, pw;
  int64_t ho, wo;
};

// y = the window maxima (padding counts as -inf; NaN wins, as in PyTorch); argmax holds each
// maximum's index inside its input plane (ih * w + iw), the first one on ties.
template <class T>
void max_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y, int64_t* argmax);
// gx = 0, then gx[argmax] += gy (windows overlap when stride < kernel).
template <class T>
void max_pool2d_backward(const Pool2dGeometry& g, const T* gy, const int64_t* argmax, T* gx);

// y = window sums divided by the window size clipped to the padded input (count_include_pad)
// or to the input itself.
template <class T>
void avg_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y, bool count_include_pad);
template <class T>
void avg_pool2d_backward(const Pool2dGeometry& g, const T* gy, T* gx, bool count_include_pad);

}  // namespace rg::kernels::cpu
