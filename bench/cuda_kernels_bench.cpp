// Google Benchmark entries for the CUDA kernels (kernels/cuda), timed with CUDA events. Each
// reports the bytes it reads and writes as GB/s, to compare with the card's memory bandwidth
// (these kernels are memory-bound); the cuBLAS GEMM and cuDNN convolution entries report GFLOP/s.
// Without a GPU every entry is skipped with a message. Only built with CUDA; the GPU kit's `run`
// runs them (scripts/gpu-kit-run.sh, stage micro).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "engine/cuda/event.h"
#include "engine/cuda/stream.h"
#include "engine/tensor.h"
#include "kernels/activation.h"
#include "kernels/batch_norm.h"
#include "kernels/binary.h"
#include "kernels/conv2d.h"
#include "kernels/cuda/bucket.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/collective_reduce.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/grad_scaler.h"
#include "kernels/dropout.h"
#include "kernels/gemm.h"
#include "kernels/loss.h"
#include "kernels/metrics.h"
#include "kernels/optim.h"
#include "kernels/pool.h"
#include "kernels/reduce.h"
#include "kernels/unary.h"

namespace {

using namespace rg;
namespace kc = rg::kernels::cuda;
using Loss = rg::kernels::Loss<rg::kernels::Cuda>;
using BatchNorm = rg::kernels::BatchNorm<rg::kernels::Cuda>;
using Binary = rg::kernels::Binary<rg::kernels::Cuda>;
using Unary = rg::kernels::Unary<rg::kernels::Cuda>;
using Reduce = rg::kernels::Reduce<rg::kernels::Cuda>;
using rg::kernels::BinaryOp;
using rg::kernels::UnaryOp;
using Pool = rg::kernels::Pool<rg::kernels::Cuda>;
using Activation = rg::kernels::Activation<rg::kernels::Cuda>;
using Metrics = rg::kernels::Metrics<rg::kernels::Cuda>;

constexpr int64_t kN = int64_t(1) << 26;  // 64 Mi elements: far beyond any cache

Tensor device_tensor(int64_t n, DType dtype = DType::f32) {
  return Tensor::empty({n}, dtype, Device::cuda(0));
}

// Times `launch` with events on the current stream; GB/s = bytes moved per launch / time.
template <class F>
void run(benchmark::State& state, double bytes, F&& launch) {
  if (cuda::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const cuda::Stream stream = cuda::current_stream(0);
  void* s = stream.handle();
  launch(s);  // warm-up
  stream.synchronize();
  cuda::Event start(true), end(true);
  double seconds = 0;
  for (auto _ : state) {
    start.record(stream);
    launch(s);
    end.record(stream);
    end.synchronize();
    const double t = start.elapsed_ms(end) / 1e3;
    state.SetIterationTime(t);
    seconds += t;
  }
  state.counters["GB/s"] = bytes * double(state.iterations()) / seconds / 1e9;
}

void BM_BinaryAdd(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor a = device_tensor(kN), b = device_tensor(kN), c = device_tensor(kN);
  run(state, 3.0 * kN * 4, [&](void* s) {
    Binary::binary(BinaryOp::add, a.data<float>(), b.data<float>(), c.data<float>(), kN, {s});
  });
}

void BM_CastF32ToF16(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor a = device_tensor(kN), b = device_tensor(kN, DType::f16);
  run(state, double(kN) * (4 + 2),
      [&](void* s) { kc::cast(a.data<float>(), b.data<Half>(), kN, s); });
}

void BM_SumAll(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor a = device_tensor(kN), out = device_tensor(1);
  Tensor ws = device_tensor(Reduce::sum_all_workspace_bytes(kN), DType::u8);
  run(state, double(kN) * 4, [&](void* s) {
    Reduce::sum_all(a.data<float>(), kN, out.data<float>(), {ws.raw_data(), ws.numel()}, {s});
  });
}

void BM_SoftmaxRowsOf1000(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  const int64_t c = 1000, rows = kN / c;
  Tensor x = device_tensor(rows * c), y = device_tensor(rows * c);
  run(state, 2.0 * double(rows * c) * 4,
      [&](void* s) { Loss::softmax(x.data<float>(), y.data<float>(), rows, c, 1, {s}); });
}

void BM_SgdMomentumStep(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor p = device_tensor(kN), g = device_tensor(kN), buf = device_tensor(kN);
  const rg::kernels::SgdParams params{0.01, 0.9, 0.0, 1e-4, false};
  // Reads p, g and buf; writes p and buf.
  run(state, 5.0 * kN * 4, [&](void* s) {
    rg::kernels::Optim<rg::kernels::Cuda>::sgd_step(p.data<float>(), g.data<float>(),
                                                    buf.data<float>(), kN, params, false, {s});
  });
}

void BM_RingReductionStep(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor a = device_tensor(kN), b = device_tensor(kN);
  run(state, 3.0 * kN * 4, [&](void* s) {
    kc::collective_reduce(kernels::cpu::CollectiveOp::sum, a.data<float>(), a.data<float>(),
                          b.data<float>(), kN, s);
  });
}

// ---- Shapes and helpers shared by the entries below ----

// Rows of logits: kRows x kClasses (1000 classes, like the softmax entry above). Not a batch of
// 4096: 16 MB of f32 logits stays in the L2 cache across back-to-back launches.
constexpr int64_t kClasses = 1000, kRows = kN / kClasses;
// NCHW activations of a ResNet stage, for pooling and batch norm: 64 x 64 x 56 x 56.
constexpr int64_t kImgN = 64, kImgC = 64, kImgHW = 56 * 56, kImgPlanes = kImgN * kImgC,
                  kImgNumel = kImgPlanes * kImgHW;

void* current_stream_handle() { return cuda::current_stream(0).handle(); }

// A device f32 scalar holding `value` (loss gradients, the grad scaler's inv_scale).
Tensor device_scalar(float value) {
  Tensor t = device_tensor(1);
  kc::fill(t.data<float>(), value, 1, current_stream_handle());
  return t;
}

// kRows class indices spread over [0, kClasses), built on the host and copied to the GPU.
Tensor device_targets() {
  Tensor t = Tensor::empty({kRows}, DType::i64);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < kRows; ++i) p[i] = i * 7919 % kClasses;
  return t.to(Device::cuda(0));
}

// 3x3 windows, stride 2, padding 1 over the NCHW activations: 56x56 -> 28x28 (the ResNet stem's
// max-pool window).
rg::kernels::Pool2dGeometry pool_geometry() {
  rg::kernels::Pool2dGeometry g{kImgPlanes, 56, 56, 3, 3, 2, 2, 1, 1, 0, 0};
  g.ho = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
  return g;
}

// Entries over kArrays f32 arrays of kN elements each, handed to launch(p, stream) in the
// launcher's order. bytes = accesses * kN * 4: accesses counts the arrays read plus the arrays
// written (an array updated in place counts twice).
template <size_t kArrays, class F>
void run_elementwise(benchmark::State& state, int accesses, F&& launch) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  std::array<Tensor, kArrays> t;
  std::array<float*, kArrays> p{};
  for (size_t i = 0; i < kArrays; ++i) {
    Tensor& ti = t[i];
    ti = device_tensor(kN);
    p[i] = ti.data<float>();
  }
  run(state, double(accesses) * kN * 4, [&](void* s) { launch(p, s); });
}

// ---- Elementwise ----

void BM_UnaryExp(benchmark::State& state) {
  // Reads x, writes out: 2 * n * 4.
  run_elementwise<2>(state, 2,
                     [](auto& p, void* s) { Unary::unary(UnaryOp::exp, p[0], p[1], kN, {s}); });
}

void BM_PowScalar(benchmark::State& state) {
  // Reads x, writes out: 2 * n * 4.
  run_elementwise<2>(state, 2,
                     [](auto& p, void* s) { Unary::pow_scalar(p[0], 3.0, p[1], kN, {s}); });
}

void BM_BinaryScalarMul(benchmark::State& state) {
  // Reads a, writes out: 2 * n * 4.
  run_elementwise<2>(state, 2, [](auto& p, void* s) {
    Binary::binary_scalar(BinaryOp::mul, p[0], 0.5, p[1], kN, false, {s});
  });
}

void BM_BinaryPerChannelAdd(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  // A conv bias added to NCHW activations.
  Tensor a = device_tensor(kImgNumel), b = device_tensor(kImgC), c = device_tensor(kImgNumel);
  // Reads a and b, writes out: (2 * N*C*HW + C) * 4.
  run(state, (2.0 * kImgNumel + kImgC) * 4, [&](void* s) {
    Binary::binary_per_channel(BinaryOp::add, a.data<float>(), b.data<float>(), c.data<float>(),
                               kImgN, kImgC, kImgHW, false, {s});
  });
}

void BM_BinaryBiasAdd(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  // A linear layer's bias on [65536, 1024] outputs.
  const int64_t cols = 1024, rows = kN / cols;
  Tensor a = device_tensor(rows * cols), b = device_tensor(cols), c = device_tensor(rows * cols);
  // Reads a and b, writes out: (2 * rows * cols + cols) * 4.
  run(state, (2.0 * double(rows * cols) + double(cols)) * 4, [&](void* s) {
    Binary::binary_per_channel(BinaryOp::add, a.data<float>(), b.data<float>(), c.data<float>(),
                               rows, cols, 1, false, {s});
  });
}

void BM_BinaryBroadcastMul(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  // A squeeze-and-excitation scale: [N, C, H, W] * [N, C, 1, 1] on the NCHW activations.
  Tensor a = device_tensor(kImgNumel), b = device_tensor(kImgPlanes), c = device_tensor(kImgNumel);
  const int64_t shape[] = {kImgN, kImgC, 56, 56}, a_strides[] = {kImgC * kImgHW, kImgHW, 56, 1},
                b_strides[] = {kImgC, 1, 0, 0};
  // Reads a and b, writes out: (2 * N*C*HW + N*C) * 4.
  run(state, (2.0 * kImgNumel + kImgPlanes) * 4, [&](void* s) {
    Binary::binary_broadcast(BinaryOp::mul, a.data<float>(), a_strides, b.data<float>(), b_strides,
                             c.data<float>(), shape, 4, {s});
  });
}

void BM_Axpy(benchmark::State& state) {
  // Reads x and out, writes out: 3 * n * 4.
  run_elementwise<2>(state, 3, [](auto& p, void* s) { Binary::axpy(0.5, p[0], p[1], kN, {s}); });
}

void BM_Fill(benchmark::State& state) {
  // Writes out: n * 4.
  run_elementwise<1>(state, 1, [](auto& p, void* s) { kc::fill(p[0], 0.5f, kN, s); });
}

void BM_DivideBy(benchmark::State& state) {
  // Reads and writes x in place (the all-reduce average's division): 2 * n * 4.
  run_elementwise<1>(state, 2, [](auto& p, void* s) { kc::divide_by(p[0], kN, 8, s); });
}

// ---- Activations (backward from the forward's output for relu, sigmoid and tanh, from its input
// for leaky_relu and gelu) ----

void BM_Relu(benchmark::State& state) {
  // Reads x, writes out: 2 * n * 4.
  run_elementwise<2>(state, 2, [](auto& p, void* s) { Activation::relu(p[0], p[1], kN, {s}); });
}

void BM_ReluBackward(benchmark::State& state) {
  // Reads grad and out, writes grad_in: 3 * n * 4.
  run_elementwise<3>(
      state, 3, [](auto& p, void* s) { Activation::relu_backward(p[0], p[1], p[2], kN, {s}); });
}

void BM_LeakyRelu(benchmark::State& state) {
  // Reads x, writes out: 2 * n * 4.
  run_elementwise<2>(state, 2,
                     [](auto& p, void* s) { Activation::leaky_relu(p[0], p[1], kN, 0.01, {s}); });
}

void BM_LeakyReluBackward(benchmark::State& state) {
  // Reads grad and x, writes grad_in: 3 * n * 4.
  run_elementwise<3>(state, 3, [](auto& p, void* s) {
    Activation::leaky_relu_backward(p[0], p[1], p[2], kN, 0.01, {s});
  });
}

void BM_Gelu(benchmark::State& state) {
  // Exact (erf) GELU. Reads x, writes out: 2 * n * 4.
  run_elementwise<2>(state, 2,
                     [](auto& p, void* s) { Activation::gelu(p[0], p[1], kN, false, {s}); });
}

void BM_GeluBackward(benchmark::State& state) {
  // Reads grad and x, writes grad_in: 3 * n * 4.
  run_elementwise<3>(state, 3, [](auto& p, void* s) {
    Activation::gelu_backward(p[0], p[1], p[2], kN, false, {s});
  });
}

void BM_Sigmoid(benchmark::State& state) {
  // Reads x, writes out: 2 * n * 4.
  run_elementwise<2>(state, 2, [](auto& p, void* s) { Activation::sigmoid(p[0], p[1], kN, {s}); });
}

void BM_SigmoidBackward(benchmark::State& state) {
  // Reads grad and out, writes grad_in: 3 * n * 4.
  run_elementwise<3>(
      state, 3, [](auto& p, void* s) { Activation::sigmoid_backward(p[0], p[1], p[2], kN, {s}); });
}

void BM_Tanh(benchmark::State& state) {
  // Reads x, writes out: 2 * n * 4.
  run_elementwise<2>(state, 2, [](auto& p, void* s) { Activation::tanh(p[0], p[1], kN, {s}); });
}

void BM_TanhBackward(benchmark::State& state) {
  // Reads grad and out, writes grad_in: 3 * n * 4.
  run_elementwise<3>(
      state, 3, [](auto& p, void* s) { Activation::tanh_backward(p[0], p[1], p[2], kN, {s}); });
}

// ---- Reductions ----

void BM_SumDim0(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  // [65536, 1024] summed over dim 0 (a bias gradient): outer 1, r 65536, inner 1024.
  const int64_t inner = 1024, r = kN / inner;
  Tensor in = device_tensor(r * inner), out = device_tensor(inner);
  // Reads in, writes out: (r * inner + inner) * 4.
  run(state, (double(r * inner) + double(inner)) * 4,
      [&](void* s) { Reduce::sum_dim(in.data<float>(), out.data<float>(), 1, r, inner, {s}); });
}

void BM_MeanLastDim(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  // [65536, 1024] averaged over the last dim: outer 65536, r 1024, inner 1.
  const int64_t r = 1024, outer = kN / r;
  Tensor in = device_tensor(outer * r), out = device_tensor(outer);
  // Reads in, writes out: (outer * r + outer) * 4.
  run(state, (double(outer * r) + double(outer)) * 4,
      [&](void* s) { Reduce::mean_dim(in.data<float>(), out.data<float>(), outer, r, 1, {s}); });
}

void BM_MeanAll(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor a = device_tensor(kN), out = device_tensor(1);
  Tensor ws = device_tensor(Reduce::sum_all_workspace_bytes(kN), DType::u8);
  // Reads in, writes out[0]: (n + 1) * 4 (the workspace partials are not counted).
  run(state, (double(kN) + 1) * 4, [&](void* s) {
    Reduce::mean_all(a.data<float>(), kN, out.data<float>(), {ws.raw_data(), ws.numel()}, {s});
  });
}

// ---- Softmax family and losses over kRows rows of kClasses ----

void BM_SoftmaxBackward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor g = device_tensor(kRows * kClasses), y = device_tensor(kRows * kClasses),
         gi = device_tensor(kRows * kClasses);
  // Reads grad and out, writes grad_in: 3 * rows * c * 4.
  run(state, 3.0 * double(kRows * kClasses) * 4, [&](void* s) {
    Loss::softmax_backward(g.data<float>(), y.data<float>(), gi.data<float>(), kRows, kClasses, 1,
                           {s});
  });
}

void BM_LogSoftmax(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor x = device_tensor(kRows * kClasses), y = device_tensor(kRows * kClasses);
  // Reads x, writes out: 2 * rows * c * 4.
  run(state, 2.0 * double(kRows * kClasses) * 4, [&](void* s) {
    Loss::log_softmax(x.data<float>(), y.data<float>(), kRows, kClasses, 1, {s});
  });
}

void BM_LogSoftmaxBackward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor g = device_tensor(kRows * kClasses), y = device_tensor(kRows * kClasses),
         gi = device_tensor(kRows * kClasses);
  // Reads grad and out, writes grad_in: 3 * rows * c * 4.
  run(state, 3.0 * double(kRows * kClasses) * 4, [&](void* s) {
    Loss::log_softmax_backward(g.data<float>(), y.data<float>(), gi.data<float>(), kRows, kClasses,
                               1, {s});
  });
}

void BM_NllLoss(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor lp = device_tensor(kRows * kClasses), target = device_targets(), loss = device_tensor(1);
  Tensor bad = device_tensor(2, DType::i64);
  // Reads the targets (twice: the first-bad-row check) and one log-prob (4 B) per row, writes the
  // loss and the first bad row with its target: rows * (16 + 4) + 20.
  run(state, double(kRows) * (16 + 4) + 20, [&](void* s) {
    Loss::nll_loss(lp.data<float>(), target.data<int64_t>(), loss.data<float>(),
                   bad.data<int64_t>(), kRows, kClasses, {s});
  });
}

void BM_NllLossBackward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor target = device_targets(), grad_loss = device_scalar(1),
         gi = device_tensor(kRows * kClasses);
  // Reads the targets and grad_loss, writes grad_in: rows * 8 + 4 + rows * c * 4.
  run(state, double(kRows) * 8 + 4 + double(kRows * kClasses) * 4, [&](void* s) {
    Loss::nll_loss_backward(target.data<int64_t>(), grad_loss.data<float>(), gi.data<float>(),
                            kRows, kClasses, {s});
  });
}

void BM_CrossEntropy(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor x = device_tensor(kRows * kClasses), target = device_targets(), lse = device_tensor(kRows),
         loss = device_tensor(1), bad = device_tensor(2, DType::i64);
  Tensor ws = device_tensor(Loss::cross_entropy_workspace_bytes(kRows), DType::u8);
  // Reads logits and targets (twice: the first-bad-row check), writes lse, the loss and the first
  // bad row with its target: rows * c * 4 + rows * 16 + rows * 4 + 20 (the workspace's per-row
  // losses are not counted).
  run(state, double(kRows * kClasses) * 4 + double(kRows) * (16 + 4) + 20, [&](void* s) {
    Loss::cross_entropy(x.data<float>(), target.data<int64_t>(), lse.data<float>(),
                        loss.data<float>(), bad.data<int64_t>(), kRows, kClasses, 0.1,
                        {ws.raw_data(), ws.numel()}, {s});
  });
}

void BM_CrossEntropyBackward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor x = device_tensor(kRows * kClasses), target = device_targets(), lse = device_tensor(kRows),
         grad_loss = device_scalar(1), gi = device_tensor(kRows * kClasses);
  // Reads logits, targets, lse and grad_loss, writes grad_in:
  // 2 * rows * c * 4 + rows * (8 + 4) + 4.
  run(state, 2.0 * double(kRows * kClasses) * 4 + double(kRows) * (8 + 4) + 4, [&](void* s) {
    Loss::cross_entropy_backward(x.data<float>(), target.data<int64_t>(), lse.data<float>(),
                                 grad_loss.data<float>(), gi.data<float>(), kRows, kClasses, 0.1,
                                 {s});
  });
}

// ---- Dropout (p = 0.1) ----

constexpr double kDropP = 0.1;
constexpr float kDropScale = float(1 / (1 - kDropP));

void BM_DropoutMask(benchmark::State& state) {
  // Writes mask: n * 4.
  run_elementwise<1>(state, 1, [](auto& p, void* s) {
    rg::kernels::Dropout<rg::kernels::Cuda>::mask(p[0], kN, kDropP, kDropScale, 1234, 0, {s});
  });
}

void BM_DropoutForward(benchmark::State& state) {
  // Reads x, writes out and mask: 3 * n * 4.
  run_elementwise<3>(state, 3, [](auto& p, void* s) {
    rg::kernels::Dropout<rg::kernels::Cuda>::forward(p[0], p[1], p[2], kN, kDropP, kDropScale, 1234,
                                                     0, {s});
  });
}

void BM_DropoutBackward(benchmark::State& state) {
  // Reads grad and mask, writes grad_in: 3 * n * 4.
  run_elementwise<3>(state, 3, [](auto& p, void* s) {
    rg::kernels::Dropout<rg::kernels::Cuda>::backward(p[0], p[1], p[2], kN, {s});
  });
}

// ---- Pooling on the NCHW activations (x: planes * h * w, y: planes * ho * wo) ----

void BM_MaxPoolForward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  const rg::kernels::Pool2dGeometry g = pool_geometry();
  const int64_t in = kImgNumel, out = g.planes * g.ho * g.wo;
  Tensor x = device_tensor(in), y = device_tensor(out), am = device_tensor(out, DType::i64);
  // Reads x, writes y and the i64 argmax: (planes*h*w + planes*ho*wo) * 4 + planes*ho*wo * 8.
  run(state, double(in + out) * 4 + double(out) * 8, [&](void* s) {
    Pool::max_pool2d(g, x.data<float>(), y.data<float>(), am.data<int64_t>(), {s});
  });
}

void BM_MaxPoolBackward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  const rg::kernels::Pool2dGeometry g = pool_geometry();
  const int64_t in = kImgNumel, out = g.planes * g.ho * g.wo;
  Tensor x = device_tensor(in), gy = device_tensor(out), am = device_tensor(out, DType::i64),
         gx = device_tensor(in);
  // A real argmax, from the forward (x's values do not matter).
  Pool::max_pool2d(g, x.data<float>(), gy.data<float>(), am.data<int64_t>(),
                   {current_stream_handle()});
  // Reads gy and the i64 argmax, writes gx: planes*ho*wo * (4 + 8) + planes*h*w * 4.
  run(state, double(out) * (4 + 8) + double(in) * 4, [&](void* s) {
    Pool::max_pool2d_backward(g, gy.data<float>(), am.data<int64_t>(), gx.data<float>(), {s});
  });
}

void BM_AvgPoolForward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  const rg::kernels::Pool2dGeometry g = pool_geometry();
  const int64_t in = kImgNumel, out = g.planes * g.ho * g.wo;
  Tensor x = device_tensor(in), y = device_tensor(out);
  // Reads x, writes y: (planes*h*w + planes*ho*wo) * 4.
  run(state, double(in + out) * 4,
      [&](void* s) { Pool::avg_pool2d(g, x.data<float>(), y.data<float>(), false, {s}); });
}

void BM_AvgPoolBackward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  const rg::kernels::Pool2dGeometry g = pool_geometry();
  const int64_t in = kImgNumel, out = g.planes * g.ho * g.wo;
  Tensor gy = device_tensor(out), gx = device_tensor(in);
  // Reads gy, writes gx: (planes*ho*wo + planes*h*w) * 4.
  run(state, double(in + out) * 4, [&](void* s) {
    Pool::avg_pool2d_backward(g, gy.data<float>(), gx.data<float>(), false, {s});
  });
}

void BM_AdaptiveAvgPool1x1Forward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor x = device_tensor(kImgNumel), y = device_tensor(kImgPlanes);
  // Reads x, writes one mean per plane: (planes * hw + planes) * 4.
  run(state, double(kImgNumel + kImgPlanes) * 4, [&](void* s) {
    Pool::adaptive_avg_pool2d_1x1(x.data<float>(), y.data<float>(), kImgPlanes, kImgHW, {s});
  });
}

void BM_AdaptiveAvgPool1x1Backward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor gy = device_tensor(kImgPlanes), gx = device_tensor(kImgNumel);
  // Reads one gy per plane, writes gx: (planes + planes * hw) * 4.
  run(state, double(kImgNumel + kImgPlanes) * 4, [&](void* s) {
    Pool::adaptive_avg_pool2d_1x1_backward(gy.data<float>(), gx.data<float>(), kImgPlanes, kImgHW,
                                           {s});
  });
}

// ---- Batch norm on the NCHW activations (per-channel arrays of C doubles). stats reads x once;
// backward reads gy and x twice (the sums, then the input gradient); the formulas count that. ----

Tensor batch_norm_workspace() {
  return device_tensor(BatchNorm::workspace_bytes(kImgN, kImgC, kImgHW), DType::u8);
}
rg::kernels::Workspace as_workspace(Tensor& ws) { return {ws.raw_data(), ws.numel()}; }

void BM_BatchNormStats(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor x = device_tensor(kImgNumel), mean = device_tensor(kImgC, DType::f64),
         var = device_tensor(kImgC, DType::f64), invstd = device_tensor(kImgC, DType::f64),
         ws = batch_norm_workspace();
  // Reads x, writes mean, var and invstd: N*C*HW * 4 + 3 * C * 8.
  run(state, double(kImgNumel) * 4 + 3.0 * kImgC * 8, [&](void* s) {
    BatchNorm::stats(x.data<float>(), kImgN, kImgC, kImgHW, mean.data<double>(), var.data<double>(),
                     invstd.data<double>(), 1e-5, as_workspace(ws), {s});
  });
}

void BM_BatchNormApply(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor x = device_tensor(kImgNumel), mean = device_tensor(kImgC, DType::f64),
         invstd = device_tensor(kImgC, DType::f64), w = device_tensor(kImgC),
         b = device_tensor(kImgC), y = device_tensor(kImgNumel);
  // Reads x, mean, invstd, weight and bias, writes y: 2 * N*C*HW * 4 + 2 * C * (8 + 4).
  run(state, 2.0 * double(kImgNumel) * 4 + 2.0 * kImgC * 12, [&](void* s) {
    BatchNorm::apply<float>(x.data<float>(), kImgN, kImgC, kImgHW, mean.data<double>(),
                     invstd.data<double>(), w.data<float>(), b.data<float>(), nullptr,
                     state.range(0) != 0, y.data<float>(), {s});
  });
}

void BM_BatchNormBackward(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor gy = device_tensor(kImgNumel), x = device_tensor(kImgNumel),
         mean = device_tensor(kImgC, DType::f64), invstd = device_tensor(kImgC, DType::f64),
         w = device_tensor(kImgC), b = device_tensor(kImgC), gx = device_tensor(kImgNumel),
         gw = device_tensor(kImgC), gb = device_tensor(kImgC), ws = batch_norm_workspace();
  // Training mode (argument 1: fused relu). Reads gy and x twice, writes gx, gweight and gbias:
  // 5 * N*C*HW * 4 + 2 * C * 8 + 3 * C * 4.
  run(state, 5.0 * double(kImgNumel) * 4 + 2.0 * kImgC * 8 + 3.0 * kImgC * 4, [&](void* s) {
    BatchNorm::backward<float>(gy.data<float>(), x.data<float>(), kImgN, kImgC, kImgHW,
                        mean.data<double>(), invstd.data<double>(), w.data<float>(),
                        b.data<float>(), nullptr, true, state.range(0) != 0, gx.data<float>(),
                        gw.data<float>(), gb.data<float>(), nullptr, as_workspace(ws), {s});
  });
}

void BM_BatchNormUpdateRunning(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor rm = device_tensor(kImgC), rv = device_tensor(kImgC),
         mean = device_tensor(kImgC, DType::f64), var = device_tensor(kImgC, DType::f64);
  // Reads running_mean, running_var, mean and var, writes both running stats: 4 * C * 4 +
  // 2 * C * 8 (C = 64: launch-latency bound, the GB/s is tiny by nature).
  run(state, 4.0 * kImgC * 4 + 2.0 * kImgC * 8, [&](void* s) {
    BatchNorm::update_running(rm.data<float>(), rv.data<float>(), mean.data<double>(),
                              var.data<double>(), kImgC, kImgN * kImgHW, 0.1, {s});
  });
}

// ---- Optimizer, AMP and DDP ----

void BM_AdamStep(benchmark::State& state) {
  // Reads p, g, m and v; writes p, m and v: 7 * n * 4.
  const rg::kernels::AdamParams params{1e-3, 0.9, 0.999, 1e-8, 0.0, false};
  run_elementwise<4>(state, 7, [&](auto& p, void* s) {
    rg::kernels::Optim<rg::kernels::Cuda>::adam_step(p[0], p[1], p[2], p[3], kN, params, 10, {s});
  });
}

void BM_UnscaleCheckFinite(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor x = device_tensor(kN), found_inf = device_scalar(0),
         inv_scale = device_scalar(1.f / 65536);
  kc::fill(x.data<float>(), 1.f, kN, current_stream_handle());
  // Reads and writes x in place, reads inv_scale: 2 * n * 4 + 4 (found_inf is never written: x is
  // finite; it decays to 0 over the iterations, which costs the same).
  run(state, 2.0 * kN * 4 + 4, [&](void* s) {
    kc::unscale_check_finite(x.data<float>(), kN, found_inf.data<float>(), inv_scale.data<float>(),
                             s);
  });
}

// A DDP bucket of kN elements holding ResNet-like gradients (a 3x3 256->256 conv weight, then a
// batch norm's weight and bias, repeated; the last cut to fit), all views of `grads`. The slice
// table is built on the host and copied to the GPU, where the kernels read it.
struct Bucket {
  Tensor grads, flat, table;
  int64_t num_slices = 0;
};

Bucket make_bucket() {
  Bucket b{device_tensor(kN), device_tensor(kN), Tensor(), 0};
  std::vector<kc::BucketSlice> slices;
  constexpr std::array<int64_t, 3> kCounts{3 * 3 * 256 * 256, 256, 256};
  for (int64_t offset = 0; offset < kN; offset += slices.back().count) {
    const int64_t count = std::min(kCounts[slices.size() % kCounts.size()], kN - offset);
    slices.push_back({b.grads.data<float>() + offset, offset, count});
  }
  b.num_slices = int64_t(slices.size());
  Tensor host = Tensor::empty({b.num_slices * int64_t(sizeof(kc::BucketSlice))}, DType::u8);
  std::memcpy(host.raw_data(), slices.data(), slices.size() * sizeof(kc::BucketSlice));
  b.table = host.to(Device::cuda(0));
  return b;
}

const kc::BucketSlice* slice_table(const Bucket& b) {
  return static_cast<const kc::BucketSlice*>(b.table.raw_data());
}

void BM_BucketPack(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  const Bucket b = make_bucket();
  // Reads the gradients and the slice table, writes the bucket: 2 * n * 4 + slices * 24.
  run(state, 2.0 * kN * 4 + double(b.num_slices) * sizeof(kc::BucketSlice), [&](void* s) {
    kc::bucket_pack(slice_table(b), b.num_slices, b.flat.data<float>(), kN, 1.0 / 8, s);
  });
}

void BM_BucketUnpack(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  const Bucket b = make_bucket();
  // Reads the bucket and the slice table, writes the gradients: 2 * n * 4 + slices * 24.
  run(state, 2.0 * kN * 4 + double(b.num_slices) * sizeof(kc::BucketSlice), [&](void* s) {
    kc::bucket_unpack(slice_table(b), b.num_slices, b.flat.data<float>(), kN, 1.0, s);
  });
}

// ---- Metrics over kRows rows of kClasses ----

void BM_Argmax(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor x = device_tensor(kRows * kClasses), out = device_tensor(kRows, DType::i64);
  // Reads x, writes one i64 per row: rows * c * 4 + rows * 8.
  run(state, double(kRows * kClasses) * 4 + double(kRows) * 8, [&](void* s) {
    Metrics::argmax(x.data<float>(), out.data<int64_t>(), kRows, kClasses, 1, {s});
  });
}

void BM_Top5Correct(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor x = device_tensor(kRows * kClasses), target = device_targets(),
         counts = device_tensor(2, DType::i64);
  // Reads logits and targets, writes the two i64 counts: rows * c * 4 + rows * 8 + 16.
  run(state, double(kRows * kClasses) * 4 + double(kRows) * 8 + 16, [&](void* s) {
    Metrics::topk_correct(x.data<float>(), target.data<int64_t>(), kRows, kClasses, 5,
                          counts.data<int64_t>(), {s});
  });
}

BENCHMARK(BM_BinaryAdd)->Name("cuda/binary_add_f32")->UseManualTime();
BENCHMARK(BM_CastF32ToF16)->Name("cuda/cast_f32_f16")->UseManualTime();
BENCHMARK(BM_SumAll)->Name("cuda/sum_all_f32")->UseManualTime();
BENCHMARK(BM_SoftmaxRowsOf1000)->Name("cuda/softmax_rows_of_1000_f32")->UseManualTime();
BENCHMARK(BM_SgdMomentumStep)->Name("cuda/sgd_momentum_step_f32")->UseManualTime();
BENCHMARK(BM_RingReductionStep)->Name("cuda/ring_reduce_sum_f32")->UseManualTime();

BENCHMARK(BM_UnaryExp)->Name("cuda/unary_exp_f32")->UseManualTime();
BENCHMARK(BM_PowScalar)->Name("cuda/pow_scalar_f32")->UseManualTime();
BENCHMARK(BM_BinaryScalarMul)->Name("cuda/binary_scalar_mul_f32")->UseManualTime();
BENCHMARK(BM_BinaryPerChannelAdd)->Name("cuda/binary_per_channel_add_nchw_f32")->UseManualTime();
BENCHMARK(BM_BinaryBiasAdd)->Name("cuda/binary_bias_add_f32")->UseManualTime();
BENCHMARK(BM_BinaryBroadcastMul)->Name("cuda/binary_broadcast_mul_nchw_nc11_f32")->UseManualTime();
BENCHMARK(BM_Axpy)->Name("cuda/axpy_f32")->UseManualTime();
BENCHMARK(BM_Fill)->Name("cuda/fill_f32")->UseManualTime();
BENCHMARK(BM_DivideBy)->Name("cuda/divide_by_f32")->UseManualTime();
BENCHMARK(BM_Relu)->Name("cuda/relu_f32")->UseManualTime();
BENCHMARK(BM_ReluBackward)->Name("cuda/relu_backward_f32")->UseManualTime();
BENCHMARK(BM_LeakyRelu)->Name("cuda/leaky_relu_f32")->UseManualTime();
BENCHMARK(BM_LeakyReluBackward)->Name("cuda/leaky_relu_backward_f32")->UseManualTime();
BENCHMARK(BM_Gelu)->Name("cuda/gelu_f32")->UseManualTime();
BENCHMARK(BM_GeluBackward)->Name("cuda/gelu_backward_f32")->UseManualTime();
BENCHMARK(BM_Sigmoid)->Name("cuda/sigmoid_f32")->UseManualTime();
BENCHMARK(BM_SigmoidBackward)->Name("cuda/sigmoid_backward_f32")->UseManualTime();
BENCHMARK(BM_Tanh)->Name("cuda/tanh_f32")->UseManualTime();
BENCHMARK(BM_TanhBackward)->Name("cuda/tanh_backward_f32")->UseManualTime();
BENCHMARK(BM_SumDim0)->Name("cuda/sum_dim0_f32")->UseManualTime();
BENCHMARK(BM_MeanLastDim)->Name("cuda/mean_last_dim_f32")->UseManualTime();
BENCHMARK(BM_MeanAll)->Name("cuda/mean_all_f32")->UseManualTime();
BENCHMARK(BM_SoftmaxBackward)->Name("cuda/softmax_backward_rows_of_1000_f32")->UseManualTime();
BENCHMARK(BM_LogSoftmax)->Name("cuda/log_softmax_rows_of_1000_f32")->UseManualTime();
BENCHMARK(BM_LogSoftmaxBackward)
    ->Name("cuda/log_softmax_backward_rows_of_1000_f32")
    ->UseManualTime();
BENCHMARK(BM_NllLoss)->Name("cuda/nll_loss_rows_of_1000_f32")->UseManualTime();
BENCHMARK(BM_NllLossBackward)->Name("cuda/nll_loss_backward_rows_of_1000_f32")->UseManualTime();
BENCHMARK(BM_CrossEntropy)->Name("cuda/cross_entropy_rows_of_1000_f32")->UseManualTime();
BENCHMARK(BM_CrossEntropyBackward)
    ->Name("cuda/cross_entropy_backward_rows_of_1000_f32")
    ->UseManualTime();
BENCHMARK(BM_DropoutMask)->Name("cuda/dropout_mask_f32")->UseManualTime();
BENCHMARK(BM_DropoutForward)->Name("cuda/dropout_forward_f32")->UseManualTime();
BENCHMARK(BM_DropoutBackward)->Name("cuda/dropout_backward_f32")->UseManualTime();
BENCHMARK(BM_MaxPoolForward)->Name("cuda/max_pool2d_3x3s2_forward_f32")->UseManualTime();
BENCHMARK(BM_MaxPoolBackward)->Name("cuda/max_pool2d_3x3s2_backward_f32")->UseManualTime();
BENCHMARK(BM_AvgPoolForward)->Name("cuda/avg_pool2d_3x3s2_forward_f32")->UseManualTime();
BENCHMARK(BM_AvgPoolBackward)->Name("cuda/avg_pool2d_3x3s2_backward_f32")->UseManualTime();
BENCHMARK(BM_AdaptiveAvgPool1x1Forward)
    ->Name("cuda/adaptive_avg_pool2d_1x1_forward_f32")
    ->UseManualTime();
BENCHMARK(BM_AdaptiveAvgPool1x1Backward)
    ->Name("cuda/adaptive_avg_pool2d_1x1_backward_f32")
    ->UseManualTime();
BENCHMARK(BM_BatchNormStats)->Name("cuda/batch_norm_stats_f32")->UseManualTime();
BENCHMARK(BM_BatchNormApply)->Name("cuda/batch_norm_apply_f32")->Arg(0)->UseManualTime();
BENCHMARK(BM_BatchNormApply)->Name("cuda/batch_norm_relu_apply_f32")->Arg(1)->UseManualTime();
BENCHMARK(BM_BatchNormBackward)->Name("cuda/batch_norm_backward_f32")->Arg(0)->UseManualTime();
BENCHMARK(BM_BatchNormBackward)->Name("cuda/batch_norm_relu_backward_f32")->Arg(1)->UseManualTime();
BENCHMARK(BM_BatchNormUpdateRunning)->Name("cuda/batch_norm_update_running_f32")->UseManualTime();
BENCHMARK(BM_AdamStep)->Name("cuda/adam_step_f32")->UseManualTime();
BENCHMARK(BM_UnscaleCheckFinite)->Name("cuda/unscale_check_finite_f32")->UseManualTime();
BENCHMARK(BM_BucketPack)->Name("cuda/bucket_pack_f32")->UseManualTime();
BENCHMARK(BM_BucketUnpack)->Name("cuda/bucket_unpack_f32")->UseManualTime();
BENCHMARK(BM_Argmax)->Name("cuda/argmax_rows_of_1000_f32")->UseManualTime();
BENCHMARK(BM_Top5Correct)->Name("cuda/top5_correct_rows_of_1000_f32")->UseManualTime();

// cuBLAS and cuDNN: the same event timing, reported as GFLOP/s (2 flops per multiply-add).
template <class F>
void run_flops(benchmark::State& state, double flops, F&& launch) {
  run(state, flops, launch);
  if (state.counters.count("GB/s") != 0) {
    state.counters["GFLOP/s"] = state.counters["GB/s"];
    state.counters.erase("GB/s");
  }
}

// C [n, n] = A [n, n] B [n, n] through Gemm<Cuda> (cublasGemmEx).
template <class T>
void gemm_bench(benchmark::State& state, DType dtype, bool tf32) {
  const int64_t n = 4096;
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor a = device_tensor(n * n, dtype), b = device_tensor(n * n, dtype),
         c = device_tensor(n * n, dtype);
  a.fill_(0.5);
  b.fill_(0.25);
  using K = rg::kernels::Gemm<rg::kernels::Cuda>;
  Tensor ws = device_tensor(K::workspace_bytes({}), DType::u8);
  run_flops(state, 2.0 * double(n) * double(n) * double(n), [&](void* s) {
    K::gemm<T>(false, false, n, n, n, 1.0, a.data<T>(), n, b.data<T>(), n, 0.0, c.data<T>(), n,
               tf32, {ws.raw_data(), ws.numel()}, {s});
  });
}
void BM_GemmF32(benchmark::State& state) { gemm_bench<float>(state, DType::f32, false); }
void BM_GemmTf32(benchmark::State& state) { gemm_bench<float>(state, DType::f32, true); }
void BM_GemmF16(benchmark::State& state) { gemm_bench<Half>(state, DType::f16, false); }
BENCHMARK(BM_GemmF32)->Name("cuda/cublas_gemm_4096_f32")->UseManualTime();
BENCHMARK(BM_GemmTf32)->Name("cuda/cublas_gemm_4096_tf32")->UseManualTime();
BENCHMARK(BM_GemmF16)->Name("cuda/cublas_gemm_4096_f16")->UseManualTime();

// ResNet-18's CIFAR 3x3 convolutions (batch 32, stride 1, padding 1) through cuDNN, f32 with
// TF32 allowed (PyTorch's default), per pass: the CPU benchmarks' shapes.
enum class BenchPass { forward, backward_data, backward_weight };
void BM_CudnnConv(benchmark::State& state, int64_t channels, int64_t hw, BenchPass pass) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  using K = rg::kernels::Conv2d<rg::kernels::Cuda>;
  const rg::kernels::Conv2dGeometry g{32, channels, hw, hw, channels, 3,  3, 1,
                                      1,  1,        1,  1,  1,        hw, hw};
  const int64_t nx = g.n * g.c * g.h * g.w, nw = g.o * g.c * g.kh * g.kw;
  Tensor x = device_tensor(nx), w = device_tensor(nw), y = device_tensor(nx);
  x.fill_(0.5);
  w.fill_(0.01);
  y.fill_(0.25);
  void* s0 = cuda::current_stream(0).handle();
  const auto kernel_pass =
      pass == BenchPass::forward ? rg::kernels::ConvPass::forward : rg::kernels::ConvPass::backward;
  Tensor ws = device_tensor(K::workspace_bytes<float>(g, kernel_pass, true, {s0}), DType::u8);
  const rg::kernels::Workspace workspace{ws.raw_data(), ws.numel()};
  const double flops = 2.0 * double(g.n * g.o * g.ho * g.wo) * double(g.c * g.kh * g.kw);
  run_flops(state, flops, [&](void* s) {
    switch (pass) {
      case BenchPass::forward:
        K::forward<float>(g, x.data<float>(), w.data<float>(), nullptr, y.data<float>(), true,
                          workspace, {s});
        break;
      case BenchPass::backward_data:
        K::backward<float>(g, nullptr, w.data<float>(), y.data<float>(), x.data<float>(), nullptr,
                           nullptr, true, workspace, {s});
        break;
      case BenchPass::backward_weight:
        K::backward<float>(g, x.data<float>(), nullptr, y.data<float>(), nullptr, w.data<float>(),
                           nullptr, true, workspace, {s});
        break;
    }
  });
}
#define RG_CONV_BENCH(ch, hw)                                                   \
  BENCHMARK_CAPTURE(BM_CudnnConv, fwd_##ch, ch, hw, BenchPass::forward)         \
      ->Name("cuda/cudnn_conv2d_" #ch "ch_" #hw "x" #hw "_b32/forward")         \
      ->UseManualTime();                                                        \
  BENCHMARK_CAPTURE(BM_CudnnConv, dx_##ch, ch, hw, BenchPass::backward_data)    \
      ->Name("cuda/cudnn_conv2d_" #ch "ch_" #hw "x" #hw "_b32/backward_data")   \
      ->UseManualTime();                                                        \
  BENCHMARK_CAPTURE(BM_CudnnConv, dw_##ch, ch, hw, BenchPass::backward_weight)  \
      ->Name("cuda/cudnn_conv2d_" #ch "ch_" #hw "x" #hw "_b32/backward_weight") \
      ->UseManualTime();
RG_CONV_BENCH(64, 32)
RG_CONV_BENCH(128, 16)
RG_CONV_BENCH(256, 8)
RG_CONV_BENCH(512, 4)
#undef RG_CONV_BENCH

}  // namespace
