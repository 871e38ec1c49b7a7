// The cuDNN wrappers of kernels/cuda (conv2d.cu, batch_norm_cudnn.cu, pool_cudnn.cu) under the
// emulated cuDNN: descriptors are destroyed on every path, errors included, and the limits of what
// they hand to cuDNN. Their results are checked through the engine (tests/device).
#include "kernels/emu/shim/cudnn.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstdint>

#include "emu/kernels/kernel_test_util.h"
#include "kernels/cuda/batch_norm_cudnn.h"
#include "kernels/cuda/conv2d.h"
#include "kernels/cuda/pool.h"
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

TEST(CudnnWrappers, BatchNormLimits) {
  EXPECT_TRUE(cu::cudnn_batch_norm_supported(880801, 3, 1, 1e-5, true));
  EXPECT_FALSE(cu::cudnn_batch_norm_supported(880802, 3, 1, 1e-5, true));
  EXPECT_TRUE(cu::cudnn_batch_norm_supported(65535, 3, 1, 1e-5, false));
  EXPECT_FALSE(cu::cudnn_batch_norm_supported(65536, 3, 1, 1e-5, false));
  EXPECT_TRUE(cu::cudnn_batch_norm_supported(2, 3, 4, 0.0, true));  // CUDNN_BN_MIN_EPSILON is 0
  EXPECT_FALSE(cu::cudnn_batch_norm_supported(2, 3, 4, -1e-5, true));
  EXPECT_FALSE(cu::cudnn_batch_norm_supported(0, 3, 4, 1e-5, false));  // empty: ours
  EXPECT_FALSE(cu::cudnn_batch_norm_supported(2, 0, 4, 1e-5, true));
  EXPECT_FALSE(cu::cudnn_batch_norm_supported(2, 1 << 15, 1 << 15, 1e-5, true));  // 2^31 values
  EXPECT_FALSE(cu::cudnn_batch_norm_supported(1, int64_t(INT_MAX) + 1, 1, 1e-5, true));
  // Asking anyway is an error, not a cuDNN call.
  EXPECT_THROW(cu::cudnn_batch_norm_forward_inference<float>(
                   nullptr, 0, 3, 4, nullptr, nullptr, nullptr, nullptr, 1e-5, nullptr, nullptr),
               rg::Error);
}

TEST(CudnnWrappers, PoolLimits) {
  const cu::Pool2dGeometry g{6, 9, 11, 3, 3, 2, 2, 1, 1, 5, 6};
  EXPECT_TRUE(cu::cudnn_pool2d_supported(g));
  cu::Pool2dGeometry empty = g;
  empty.planes = 0;
  EXPECT_FALSE(cu::cudnn_pool2d_supported(empty));
  cu::Pool2dGeometry wide = g;
  wide.ph = 2;  // more than half the kernel
  EXPECT_FALSE(cu::cudnn_pool2d_supported(wide));
  cu::Pool2dGeometry huge = g;
  huge.planes = int64_t(1) << 30;
  EXPECT_FALSE(cu::cudnn_pool2d_supported(huge));
  EXPECT_THROW(cu::cudnn_avg_pool2d_forward<float>(empty, nullptr, nullptr, true, nullptr),
               rg::Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
