// The cuDNN wrappers of kernels/cuda under the emulated cuDNN: descriptors are destroyed on every
// path, errors included. Their results are checked through the engine (tests/device).
#include "kernels/emu/shim/cudnn.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "emu/kernels/kernel_test_util.h"
#include "kernels/cuda/conv2d.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

namespace cu = kernels::cuda;

TEST(CudnnWrappers, ARefusedSizeLeaksNoDescriptor) {
  // x's batch does not fit cuDNN's int: the wrapper throws after creating x's descriptor.
  cu::Conv2dGeometry g{int64_t(1) << 40, 3, 9, 11, 5, 3, 3, 1, 1, 1, 1, 1, 1, 9, 11};
  const int before = emu::cudnn_live_descriptors();
  EXPECT_THROW(cu::conv2d_workspace_bytes<float>(g, cu::ConvPass::forward, true, nullptr),
               rg::Error);
  EXPECT_EQ(emu::cudnn_live_descriptors(), before);
  // A geometry cuDNN itself refuses (y's size disagrees with the convolution's): a failed call.
  g.n = 2;
  g.ho = 4;
  EXPECT_THROW(cu::conv2d_workspace_bytes<float>(g, cu::ConvPass::backward_data, true, nullptr),
               rg::Error);
  EXPECT_EQ(emu::cudnn_live_descriptors(), before);
  // And a good one, for contrast: its descriptors live only during the call.
  g.ho = 9;
  EXPECT_EQ(cu::conv2d_workspace_bytes<float>(g, cu::ConvPass::forward, true, nullptr), 0);
  EXPECT_EQ(emu::cudnn_live_descriptors(), before);
}

}  // namespace
}  // namespace rg::emu_kernel_test
