// The cuDNN wrappers of kernels/cuda (conv2d.cu, batch_norm_cudnn.cu, pool_cudnn.cu) under the
// emulated cuDNN: descriptors are destroyed on every path, errors included, and the limits of what
// they hand to cuDNN. Their results are checked through the engine (tests/device).
#include "kernels/emu/shim/cudnn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "kernels/algorithm_policy.h"
#include "kernels/conv2d.h"
#include "kernels/cuda/batch_norm_cudnn.h"
#include "kernels/cuda/pool_cudnn.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

namespace cu = kernels::cuda;
using ConvCuda = kernels::Conv2d<kernels::Cuda>;

TEST(CudnnWrappers, ARefusedSizeLeaksNoDescriptor) {
  // The legacy API's descriptors (cudnn::cached); the graph API's are checked below.
  kernels::set_cudnn_legacy_conv(true);
  // x's batch does not fit cuDNN's int: the wrapper throws after creating x's descriptor.
  kernels::Conv2dGeometry g{int64_t(1) << 40, 3, 9, 11, 5, 3, 3, 1, 1, 1, 1, 1, 1, 9, 11};
  const int before = emu::cudnn_live_descriptors();
  EXPECT_THROW(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, true, {}),
               rg::Error);
  EXPECT_EQ(emu::cudnn_live_descriptors(), before);
  // A geometry cuDNN itself refuses (y's size disagrees with the convolution's): a failed call;
  // its four descriptors (x, y, w, the convolution) were made and are kept for the thread, as
  // every shape's are (cudnn::cached).
  g.n = 2;
  g.ho = 4;
  EXPECT_THROW(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::backward, true, {}),
               rg::Error);
  EXPECT_EQ(emu::cudnn_live_descriptors(), before + 4);
  // A good one, differing only in ho: its own four, and none more when asked again.
  g.ho = 9;
  EXPECT_EQ(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, true, {}), 0);
  EXPECT_EQ(emu::cudnn_live_descriptors(), before + 8);
  EXPECT_EQ(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, true, {}), 0);
  EXPECT_EQ(emu::cudnn_live_descriptors(), before + 8);
  kernels::set_cudnn_legacy_conv(false);
  // The graph API (the default): the refused geometry keeps nothing of its own (the legacy API,
  // its fallback, refuses it too); a good one keeps its x, w, y, convolution, operation, graph,
  // engine configuration and plan, once.
  g.n = 3;
  g.ho = 4;
  const int graph_before = emu::cudnn_live_descriptors();
  EXPECT_THROW(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, true, {}),
               rg::Error);
  EXPECT_EQ(emu::cudnn_live_descriptors(), graph_before + 4) << "the legacy API's four";
  // (Another batch: the choice's key has no ho, which a caller derives from the rest.)
  g.n = 5;
  g.ho = 9;
  EXPECT_EQ(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, true, {}), 0);
  EXPECT_EQ(emu::cudnn_live_descriptors(), graph_before + 4 + 8);
  EXPECT_EQ(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, true, {}), 0);
  EXPECT_EQ(emu::cudnn_live_descriptors(), graph_before + 4 + 8);
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
  const kernels::Pool2dGeometry g{6, 9, 11, 3, 3, 2, 2, 1, 1, 5, 6};
  EXPECT_TRUE(cu::cudnn_pool2d_supported(g));
  kernels::Pool2dGeometry empty = g;
  empty.planes = 0;
  EXPECT_FALSE(cu::cudnn_pool2d_supported(empty));
  kernels::Pool2dGeometry wide = g;
  wide.ph = 2;  // more than half the kernel
  EXPECT_FALSE(cu::cudnn_pool2d_supported(wide));
  kernels::Pool2dGeometry huge = g;
  huge.planes = int64_t(1) << 30;
  EXPECT_FALSE(cu::cudnn_pool2d_supported(huge));
  EXPECT_THROW(cu::cudnn_avg_pool2d_forward<float>(empty, nullptr, nullptr, true, nullptr),
               rg::Error);
}

// One contract for conv2d: both backends take the bias in forward and return its gradient (f64
// sums) from backward, with the same arguments (CUDA's kernel used to take no bias: the engine
// added it and summed its gradient itself).
TEST(Conv2dKernels, BothBackendsTakeTheBiasAndGiveItsGradient) {
  using ConvCpu = kernels::Conv2d<kernels::Cpu>;
  const kernels::Conv2dGeometry g{3, 2, 7, 6, 4, 3, 3, 2, 1, 1, 0, 1, 1, 4, 4};
  const auto x = random_values<double>(g.n * g.c * g.h * g.w, 1);
  const auto w = random_values<double>(g.o * g.c * g.kh * g.kw, 2);
  const auto b = random_values<double>(g.o, 3);
  const auto gy = random_values<double>(g.n * g.o * g.ho * g.wo, 4);
  std::vector<double> y(gy.size()), want_y(gy.size());
  const int64_t fwd = ConvCuda::workspace_bytes<double>(g, kernels::ConvPass::forward, false, {});
  const int64_t bwd = ConvCuda::workspace_bytes<double>(g, kernels::ConvPass::backward, false, {});
  EXPECT_EQ(ConvCpu::workspace_bytes<double>(g, kernels::ConvPass::forward, false, {}), 0);
  std::vector<unsigned char> ws(size_t(std::max<int64_t>({fwd, bwd, 1})));
  const kernels::Workspace workspace{ws.data(), int64_t(ws.size())};
  ConvCuda::forward<double>(g, x.data(), w.data(), b.data(), y.data(), false, workspace, {});
  ConvCpu::forward<double>(g, x.data(), w.data(), b.data(), want_y.data(), false, {}, {});
  expect_close(y, want_y, 1e-12, 1e-12, "conv2d forward with bias");
  std::vector<double> gx(x.size()), gw(w.size()), gb(b.size()), want_gx(x.size()),
      want_gw(w.size()), want_gb(b.size());
  ConvCuda::backward<double>(g, x.data(), w.data(), gy.data(), gx.data(), gw.data(), gb.data(),
                             false, workspace, {});
  ConvCpu::backward<double>(g, x.data(), w.data(), gy.data(), want_gx.data(), want_gw.data(),
                            want_gb.data(), false, {}, {});
  expect_close(gx, want_gx, 1e-12, 1e-12, "conv2d gx");
  expect_close(gw, want_gw, 1e-12, 1e-12, "conv2d gw");
  expect_close(gb, want_gb, 1e-12, 1e-12, "conv2d gb");
  // The bias gradient alone: no workspace, the other passes skipped.
  std::vector<double> only_gb(b.size());
  ConvCuda::backward<double>(g, nullptr, nullptr, gy.data(), nullptr, nullptr, only_gb.data(),
                             false, {}, {});
  expect_close(only_gb, want_gb, 1e-12, 1e-12, "conv2d gb alone");
}

// [n, c, hw] <-> [n, hw, c].
std::vector<double> channels_last(const std::vector<double>& v, int64_t n, int64_t c, int64_t hw,
                                  bool to_last) {
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t s = 0; s < hw; ++s) {
        const size_t first = size_t((i * c + ch) * hw + s), last = size_t((i * hw + s) * c + ch);
        (to_last ? out[last] : out[first]) = to_last ? v[first] : v[last];
      }
  return out;
}

// channels_last (kernels/conv2d.h): x, w, y and their gradients in NHWC order (the filter KRSC).
// Each backend gives the NCHW results transposed: the CPU converting at its boundary, CUDA through
// both cuDNN APIs on NHWC descriptors; the bias and its gradient included.
TEST(Conv2dKernels, ChannelsLastGivesTheNchwResultsTransposed) {
  using ConvCpu = kernels::Conv2d<kernels::Cpu>;
  kernels::Conv2dGeometry g{2, 3, 5, 4, 4, 3, 3, 2, 1, 1, 1, 1, 1, 3, 4};
  const int64_t hw = g.h * g.w, k = g.kh * g.kw, hwo = g.ho * g.wo;
  const auto x = random_values<double>(g.n * g.c * hw, 11);
  const auto w = random_values<double>(g.o * g.c * k, 12);
  const auto b = random_values<double>(g.o, 13);
  const auto gy = random_values<double>(g.n * g.o * hwo, 14);
  // The NCHW reference, on the CPU.
  std::vector<double> y(gy.size()), gx(x.size()), gw(w.size()), gb(b.size());
  ConvCpu::forward<double>(g, x.data(), w.data(), b.data(), y.data(), false, {}, {});
  ConvCpu::backward<double>(g, x.data(), w.data(), gy.data(), gx.data(), gw.data(), gb.data(),
                            false, {}, {});
  g.channels_last = true;
  const auto xl = channels_last(x, g.n, g.c, hw, true), wl = channels_last(w, g.o, g.c, k, true),
             gyl = channels_last(gy, g.n, g.o, hwo, true);
  for (const char* backend : {"cpu", "cuda graph API", "cuda legacy API"}) {
    SCOPED_TRACE(backend);
    const bool cpu = std::string(backend) == "cpu";
    kernels::set_cudnn_legacy_conv(std::string(backend) == "cuda legacy API");
    std::vector<double> yl(y.size()), gxl(x.size()), gwl(w.size()), glb(b.size());
    if (cpu) {
      ConvCpu::forward<double>(g, xl.data(), wl.data(), b.data(), yl.data(), false, {}, {});
      ConvCpu::backward<double>(g, xl.data(), wl.data(), gyl.data(), gxl.data(), gwl.data(),
                                glb.data(), false, {}, {});
    } else {
      const int64_t bytes =
          std::max({ConvCuda::workspace_bytes<double>(g, kernels::ConvPass::forward, false, {}),
                    ConvCuda::workspace_bytes<double>(g, kernels::ConvPass::backward, false, {}),
                    int64_t(1)});
      std::vector<unsigned char> ws(static_cast<size_t>(bytes));
      const kernels::Workspace workspace{ws.data(), bytes};
      ConvCuda::forward<double>(g, xl.data(), wl.data(), b.data(), yl.data(), false, workspace, {});
      ConvCuda::backward<double>(g, xl.data(), wl.data(), gyl.data(), gxl.data(), gwl.data(),
                                 glb.data(), false, workspace, {});
    }
    expect_close(channels_last(yl, g.n, g.o, hwo, false), y, 1e-12, 1e-12, "y");
    expect_close(channels_last(gxl, g.n, g.c, hw, false), gx, 1e-12, 1e-12, "gx");
    expect_close(channels_last(gwl, g.o, g.c, k, false), gw, 1e-12, 1e-12, "gw");
    expect_close(glb, gb, 1e-12, 1e-12, "gb");
  }
  kernels::set_cudnn_legacy_conv(false);
}

// cuDNN's graph API (the default) with a workspace smaller than its plan needs: the pass falls
// back to the legacy API within the workspace given (the query sized it for the graph API's plan;
// another thread's or handle's choice may need more), and computes the same.
TEST(Conv2dGraphApi, APlanNeedingMoreWorkspaceThanGivenFallsBackToTheLegacyApi) {
  // Engine 1 (the only one in this offer) needs 1024 bytes; the legacy algorithms none.
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::nondeterministic_only);
  const kernels::Conv2dGeometry g{2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 7, 6};
  const auto x = random_values<float>(g.n * g.c * g.h * g.w, 5);
  const auto w = random_values<float>(g.o * g.c * g.kh * g.kw, 6);
  std::vector<float> y(size_t(g.n * g.o * g.ho * g.wo)), y_legacy(y.size());
  const int64_t bytes = ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, false, {});
  EXPECT_EQ(bytes, 1024);
  std::vector<unsigned char> ws(static_cast<size_t>(bytes));
  const int64_t engine1 = emu::cudnn_engine_executions(1);
  const int64_t legacy = emu::cudnn_calls("cudnnConvolutionForward");
  ConvCuda::forward<float>(g, x.data(), w.data(), nullptr, y.data(), false,
                           kernels::Workspace{ws.data(), int64_t(ws.size())}, {});
  EXPECT_EQ(emu::cudnn_engine_executions(1) - engine1, 1);
  ConvCuda::forward<float>(g, x.data(), w.data(), nullptr, y_legacy.data(), false, {}, {});
  EXPECT_EQ(emu::cudnn_engine_executions(1) - engine1, 1) << "no workspace: not the plan";
  EXPECT_EQ(emu::cudnn_calls("cudnnConvolutionForward") - legacy, 1);
  EXPECT_EQ(y, y_legacy);  // the same CPU convolution in f32 on both emulated paths
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::standard);
}

// Choosing an engine and building its plan cannot be captured: a configuration first seen inside
// a CUDA graph capture is an error that says so, and the capture stays usable.
TEST(Conv2dGraphApi, AConfigurationFirstSeenInACaptureIsAClearError) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const kernels::Ctx ctx{stream, 0};
  // The stream's cuDNN handle is made outside the capture (cudnnCreate cannot be captured).
  kernels::Conv2dGeometry g{1, 2, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 5, 5};
  // f32 without TF32: the emulated engine 2 (FMA), 256 bytes of workspace.
  EXPECT_EQ(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, false, ctx), 256);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  g.n = 3;  // a configuration not seen before
  try {
    ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, false, ctx);
    ADD_FAILURE() << "no error";
  } catch (const rg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d forward of a configuration first seen inside a "
                                         "CUDA graph capture (3x2x5x5, 3 filters of 3x3)"),
              std::string::npos)
        << e.what();
  }
  g.n = 1;  // the one seen before serves inside the capture
  EXPECT_EQ(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, false, ctx), 256);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph != nullptr) {
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// The legacy API under benchmark times its algorithms with cudnnFind* (allocations, timing on the
// stream): a configuration first seen inside a capture is an error that says so; without
// benchmark its heuristics (host-only queries) choose inside the capture.
TEST(Conv2dLegacyApi, ABenchmarkedConfigurationFirstSeenInACaptureIsAClearError) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const kernels::Ctx ctx{stream, 0};
  kernels::set_cudnn_legacy_conv(true);
  kernels::Conv2dGeometry g{1, 2, 5, 4, 3, 3, 3, 1, 1, 1, 1, 1, 1, 5, 4};
  EXPECT_GE(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, false, ctx), 0);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  g.n = 4;  // a configuration not seen before: the heuristics choose within the capture
  EXPECT_GE(ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, false, ctx), 0);
  kernels::set_cudnn_benchmark(true);
  g.n = 5;
  try {
    ConvCuda::workspace_bytes<float>(g, kernels::ConvPass::forward, false, ctx);
    ADD_FAILURE() << "no error";
  } catch (const rg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d forward of a configuration first seen inside a "
                                         "CUDA graph capture cannot be timed (--cudnn-benchmark)"),
              std::string::npos)
        << e.what();
  }
  kernels::set_cudnn_benchmark(false);
  kernels::set_cudnn_legacy_conv(false);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph != nullptr) {
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace rg::emu_kernel_test
