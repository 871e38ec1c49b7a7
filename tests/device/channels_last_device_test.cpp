// channels_last tensors (MemoryFormat, engine/tensor.h) on the CPU and on cuda:0: the layout
// conversion and its count, the ops that refuse the format (the safety net), the ResNet ops in
// both formats against each other (forward, every gradient, formats of the results), and a whole
// ResNet-18 step that runs no layout conversion once model and batch are channels last.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "device/device_test_util.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/activation.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/binary.h"
#include "engine/ops/conv2d.h"
#include "engine/ops/flatten.h"
#include "engine/ops/loss.h"
#include "engine/ops/matmul.h"
#include "engine/ops/pool.h"
#include "engine/ops/reduce.h"
#include "engine/ops/shape.h"
#include "engine/tf32.h"
#include "kernels/cpu/conv2d_onednn.h"
#include "kernels/error.h"
#include "layers/models/registry.h"
#include "layers/module.h"
#include "layers/optim/optimizer.h"

namespace rg {
namespace {

using testing::kCuda;
using testing::random_tensor;
constexpr MemoryFormat kLast = MemoryFormat::channels_last;
constexpr MemoryFormat kContiguous = MemoryFormat::contiguous;

// The devices a test runs on: the CPU, and cuda:0 when there is one.
std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu()};
  if (cuda::runtime().device_count() > 0) d.push_back(kCuda);
  return d;
}

// The raw memory of t, in storage order.
std::vector<double> memory_of(const Tensor& t) {
  const NoGradGuard no_grad;
  return t.detach().reinterpret_memory_format(kContiguous).to_vector<double>();
}

TEST(ChannelsLast, ConversionLaysOutNhwcKeepsTheValuesAndIsCounted) {
  for (const Device device : devices()) {
    SCOPED_TRACE(device.str());
    Generator gen(3);
    const Tensor x = random_tensor({2, 3, 4, 5}, gen, DType::f32).to(device);
    const int64_t before = layout_conversions();
    const Tensor y = x.contiguous(kLast);
    EXPECT_EQ(layout_conversions(), before + 1);
    EXPECT_EQ(y.memory_format(), kLast);
    EXPECT_EQ(y.shape(), x.shape());
    // Element (n, c, h, w) lies at ((n * H + h) * W + w) * C + c.
    const std::vector<double> logical = x.to_vector<double>(), mem = memory_of(y);
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t h = 0; h < 4; ++h)
          for (int64_t w = 0; w < 5; ++w)
            ASSERT_EQ(mem[size_t(((n * 4 + h) * 5 + w) * 3 + c)],
                      logical[size_t(((n * 3 + c) * 4 + h) * 5 + w)]);
    EXPECT_TRUE(y.contiguous(kLast).is_same(y)) << "already in the format: no copy";
    EXPECT_EQ(layout_conversions(), before + 1);
    EXPECT_EQ(memory_of(y.contiguous()), logical);
    EXPECT_EQ(layout_conversions(), before + 2);
    // Reading the values in the shape's order converts too.
    EXPECT_EQ(y.to_vector<double>(), logical) << "the same logical values";
    EXPECT_EQ(layout_conversions(), before + 3);
    // Formats survive the copies that keep a tensor's layout.
    EXPECT_EQ(y.clone().memory_format(), kLast);
    EXPECT_EQ(y.to(DType::f64).memory_format(), kLast);
    EXPECT_EQ(y.to(Device::cpu()).memory_format(), kLast);
    EXPECT_EQ(memory_of(y.to(Device::cpu())), mem);
    EXPECT_EQ(empty_like(y).memory_format(), kLast);
    EXPECT_EQ(zeros_like(y).memory_format(), kLast);
    EXPECT_EQ(y.narrow(0, 1, 1).to_vector<double>(), x.narrow(0, 1, 1).to_vector<double>());
    // copy_ between formats converts.
    Tensor z = Tensor::empty(x.shape(), DType::f32, device);
    z.copy_(y);
    EXPECT_EQ(memory_of(z), logical);
    // Across devices with a dtype change (staged on one side): the layout survives the staging.
    for (const Device to : devices()) {
      Tensor w = Tensor::empty(x.shape(), DType::f64, to, kLast);
      w.copy_(y);
      EXPECT_EQ(w.to_vector<double>(), logical) << "to " << to.str();
      Tensor back = Tensor::empty(x.shape(), DType::f32, device, kLast);
      back.copy_(w);
      EXPECT_EQ(memory_of(back), mem) << "back from " << to.str();
    }
    EXPECT_NE(y.str().find("memory_format=channels_last"), std::string::npos);
  }
}

TEST(ChannelsLast, GradientsComeBackInTheInputsFormat) {
  for (const Device device : devices()) {
    SCOPED_TRACE(device.str());
    Generator gen(4);
    const Tensor x =
        random_tensor({2, 3, 2, 2}, gen, DType::f64).to(device).set_requires_grad(true);
    const Tensor w = random_tensor({2, 3, 2, 2}, gen, DType::f64).to(device);
    sum(mul(x.contiguous(kLast), w.contiguous(kLast))).backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().memory_format(), kContiguous);
    EXPECT_EQ(x.grad().to_vector<double>(), w.to_vector<double>());
    // A contiguous gradient reaching a channels_last input is converted by the engine.
    const Tensor xl = x.detach().contiguous(kLast).set_requires_grad(true);
    sum(mul(xl.contiguous(), w)).backward();
    EXPECT_EQ(xl.grad().memory_format(), kLast);
    EXPECT_EQ(xl.grad().to_vector<double>(), w.to_vector<double>());
    // A contiguous seed for a channels_last root, and a hook that returns a contiguous
    // replacement: both reach relu's backward in its output's layout.
    const auto expected = [&](const Tensor& seed) {
      std::vector<double> v = seed.to_vector<double>(), in = x.to_vector<double>();
      for (size_t i = 0; i < v.size(); ++i) v[i] = in[i] > 0 ? v[i] : 0.0;
      return v;
    };
    const Tensor seed = random_tensor({2, 3, 2, 2}, gen, DType::f64).to(device);
    const Tensor a = x.detach().contiguous(kLast).set_requires_grad(true);
    relu(a).backward(seed);
    EXPECT_EQ(a.grad().to_vector<double>(), expected(seed));
    const Tensor b = x.detach().contiguous(kLast).set_requires_grad(true);
    const Tensor r = relu(b);
    r.register_hook([](const Tensor& g) { return g.contiguous(); });
    r.backward(seed.contiguous(kLast));
    EXPECT_EQ(b.grad().to_vector<double>(), expected(seed));
  }
}

// An optimizer's state follows its parameter into channels last (Module::to between steps): the
// momentum is converted, not read in the old layout.
TEST(ChannelsLast, OptimizerStateFollowsAParameterThatChangedLayout) {
  for (const Device device : devices()) {
    SCOPED_TRACE(device.str());
    Generator gen(6);
    const Tensor init = random_tensor({3, 2, 3, 3}, gen, DType::f64).to(device);
    const Tensor g1 = random_tensor({3, 2, 3, 3}, gen, DType::f64).to(device);
    const Tensor g2 = random_tensor({3, 2, 3, 3}, gen, DType::f64).to(device);
    Tensor plain = init.clone().set_requires_grad(true);
    Tensor moved = init.clone().set_requires_grad(true);
    optim::Sgd a({plain}, {.lr = 0.1, .momentum = 0.9});
    optim::Sgd b({moved}, {.lr = 0.1, .momentum = 0.9});
    plain.set_grad(g1);
    moved.set_grad(g1);
    a.step();
    b.step();
    {
      const NoGradGuard no_grad;
      nn::assign_in_place(moved, moved.detach().contiguous(kLast));
    }
    plain.set_grad(g2);
    moved.set_grad(g2.contiguous(kLast));
    a.step();
    b.step();
    EXPECT_EQ(b.momentum_buffer(0).memory_format(), kLast);
    EXPECT_EQ(moved.to_vector<double>(), plain.to_vector<double>());
  }
}

TEST(ChannelsLast, OpsThatReadByPositionRefuseItByName) {
  Generator gen(5);
  const Tensor y = random_tensor({2, 3, 4, 4}, gen, DType::f32).contiguous(kLast);
  const auto expect_refused = [](const std::function<void()>& f, const std::string& op) {
    try {
      f();
      ADD_FAILURE() << op << " took a channels_last tensor";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(op), std::string::npos) << m;
      EXPECT_NE(m.find("channels_last"), std::string::npos) << m;
    }
  };
  expect_refused([&] { (void)matmul(y, y); }, "matmul");
  expect_refused([&] { (void)permute(y, {0, 2, 3, 1}); }, "permute");
  expect_refused([&] { (void)sum(y, {1}); }, "sum");
  expect_refused([&] { (void)y.view({2, 48}); }, "view");
  expect_refused([&] { (void)add(y, random_tensor({4}, gen, DType::f32)); }, "add");
  // What does not depend on the layout takes it: a full sum, elementwise ops, flatten (copies).
  EXPECT_NEAR(sum(y).item(), sum(y.contiguous()).item(), 1e-4);
  EXPECT_EQ(relu(y).memory_format(), kLast);
  EXPECT_EQ(flatten(y, 1).to_vector<double>(), flatten(y.contiguous(), 1).to_vector<double>());
  // Mixed formats in an elementwise op: the second converted to the first's.
  const Tensor c = random_tensor({2, 3, 4, 4}, gen, DType::f32);
  const Tensor s = add(y, c);
  EXPECT_EQ(s.memory_format(), kLast);
  EXPECT_EQ(s.to_vector<double>(), add(y.contiguous(), c).to_vector<double>());
}

// f(inputs) in both formats (every 4-d input channels last in the second): the outputs and the
// gradients of every input agree, the 4-d results lie in `expect` and each gradient in its
// input's format.
void expect_formats_agree(Device device, const std::vector<Tensor>& host_inputs,
                          const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          MemoryFormat expect, double tol, const std::string& what) {
  SCOPED_TRACE(what + " on " + device.str());
  std::vector<Tensor> a, b;
  for (const Tensor& t : host_inputs) {  // fresh leaves (t itself stays without a gradient)
    a.push_back(t.clone().to(device).set_requires_grad(true));
    Tensor l = t.clone().to(device);
    if (l.dim() == 4) l = l.contiguous(kLast);
    b.push_back(l.set_requires_grad(true));
  }
  const Tensor ya = f(a), yb = f(b);
  EXPECT_EQ(yb.memory_format(), expect);
  testing::expect_close(yb, ya, tol, tol, "output");
  Generator gen(9);
  const Tensor up = random_tensor(ya.shape(), gen, ya.dtype()).to(device);
  sum(mul(ya, up)).backward();
  sum(mul(yb, up)).backward();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(b[i].grad().defined()) << "input " << i;
    EXPECT_EQ(b[i].grad().memory_format(), b[i].memory_format()) << "input " << i;
    testing::expect_close(b[i].grad(), a[i].grad(), tol, tol, "gradient " + std::to_string(i));
  }
}

// cuDNN has no f64 convolution of NHWC tensors: on CUDA an f64 channels-last convolution runs
// contiguous (x and w converted, the output converted back: 3 conversions), f32 converts nothing;
// both give channels-last outputs with the CPU's values.
TEST(ChannelsLast, AnF64ConvolutionOnCudaRunsContiguousAndGivesChannelsLast) {
  RG_REQUIRE_DEVICE();
  const cuda::Tf32Guard full_f32(false, false);
  for (const DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Generator gen(12);
    const Tensor x = random_tensor({2, 3, 6, 5}, gen, dtype).contiguous(kLast);
    const Tensor w = random_tensor({4, 3, 3, 3}, gen, dtype).contiguous(kLast);
    const Tensor xd = x.to(kCuda), wd = w.to(kCuda);
    const int64_t before = layout_conversions();
    const Tensor y = conv2d(xd, wd, Tensor(), {1, 1}, {1, 1});
    EXPECT_EQ(layout_conversions() - before, dtype == DType::f64 ? 3 : 0);
    EXPECT_EQ(y.memory_format(), kLast);
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
    testing::expect_close(y.to(Device::cpu()), conv2d(x, w, Tensor(), {1, 1}, {1, 1}), tol, tol,
                          "conv2d");
  }
}

TEST(ChannelsLast, ResNetOpsGiveTheContiguousResultsInBothFormats) {
  for (const Device device : devices()) {
    for (const DType dtype : {DType::f32, DType::f64}) {
      Generator gen(11);
      const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
      const Tensor x = random_tensor({3, 4, 6, 5}, gen, dtype);
      const Tensor w = random_tensor({5, 4, 3, 3}, gen, dtype);
      const Tensor bias = random_tensor({5}, gen, dtype);
      const Tensor r = random_tensor({3, 4, 6, 5}, gen, dtype);
      const Tensor g = random_tensor({4}, gen, dtype, 0.5, 1.5);
      const Tensor beta = random_tensor({4}, gen, dtype);
      const auto stats = [&] {
        return std::pair{zeros({4}, dtype, device), ones({4}, dtype, device)};
      };
      expect_formats_agree(
          device, {x, w, bias},
          [](const std::vector<Tensor>& v) {
            return conv2d(v[0], v[1], v[2], {2, 1}, {1, 1});
          },
          kLast, tol, "conv2d");
      expect_formats_agree(
          device, {x, g, beta},
          [&](const std::vector<Tensor>& v) {
            auto [m, s] = stats();
            return batch_norm(v[0], m, s, v[1], v[2], true);
          },
          kLast, tol, "batch_norm");
      expect_formats_agree(
          device, {x, g, beta},
          [&](const std::vector<Tensor>& v) {
            auto [m, s] = stats();
            return batch_norm_relu(v[0], m, s, v[1], v[2], true);
          },
          kLast, tol, "batch_norm_relu");
      expect_formats_agree(
          device, {x, r, g, beta},
          [&](const std::vector<Tensor>& v) {
            auto [m, s] = stats();
            return batch_norm_add_relu(v[0], v[1], m, s, v[2], v[3], true);
          },
          kLast, tol, "batch_norm_add_relu");
      expect_formats_agree(
          device, {x, r}, [](const std::vector<Tensor>& v) { return relu(add(v[0], v[1])); }, kLast,
          0, "relu(add)");
      expect_formats_agree(
          device, {x},
          [](const std::vector<Tensor>& v) {
            return max_pool2d(v[0], {3, 2}, {2, 2}, {1, 1});
          },
          kLast, 0, "max_pool2d");
      expect_formats_agree(
          device, {x},
          [](const std::vector<Tensor>& v) {
            return avg_pool2d(v[0], {2, 2}, {2, 1}, {1, 0}, false);
          },
          kLast, tol, "avg_pool2d");
      // A 1x1 output lies the same in both formats: it comes back contiguous.
      expect_formats_agree(
          device, {x},
          [](const std::vector<Tensor>& v) {
            return adaptive_avg_pool2d(v[0], {1, 1});
          },
          kContiguous, tol, "adaptive_avg_pool2d");
    }
  }
}

// One SGD step of ResNet-18 (CIFAR stem) on a batch of 2: the loss.
Tensor step(nn::Module& model, optim::Optimizer& opt, const Tensor& x, const Tensor& target) {
  opt.zero_grad();
  Tensor loss = cross_entropy(model.forward(x), target);
  loss.backward();
  opt.step();
  return loss;
}

// Three steps of a contiguous and a channels_last ResNet-18 on `device`: no layout conversion,
// the same losses and parameters.
void expect_layouts_train_alike(Device device) {
  const nn::ModelSpec spec{.name = "resnet18", .sample_shape = {3, 16, 16}, .num_classes = 10};
  auto plain = nn::make_model(spec), last = nn::make_model(spec);
  plain->to(device);
  last->to(device);
  last->to(kLast);
  for (const auto& [name, t] : last->state_dict())
    EXPECT_EQ(t.memory_format(), t.dim() == 4 ? kLast : kContiguous) << name;
  optim::Sgd opt_plain(plain->parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::Sgd opt_last(last->parameters(), {.lr = 0.05, .momentum = 0.9});
  Generator gen(17);
  const Tensor x = random_tensor({2, 3, 16, 16}, gen, DType::f32).to(device);
  const Tensor xl = x.contiguous(kLast);
  const Tensor target = from_vector<int64_t>({3, 7}, {2}).to(device);
  for (int i = 0; i < 3; ++i) {
    const int64_t before = layout_conversions();
    const Tensor lp = step(*plain, opt_plain, x, target);
    const Tensor ll = step(*last, opt_last, xl, target);
    EXPECT_EQ(layout_conversions(), before) << "step " << i << " converted a layout";
    EXPECT_NEAR(ll.item(), lp.item(), 2e-4 * std::max(1.0, std::abs(lp.item()))) << "step " << i;
  }
  const auto pp = plain->parameters(), pl = last->parameters();
  for (size_t i = 0; i < pp.size(); ++i) {
    EXPECT_EQ(pl[i].grad().memory_format(), pl[i].memory_format()) << "parameter " << i;
    EXPECT_LT(testing::relative_error(pl[i], pp[i]), 1e-4) << "parameter " << i;
  }
  // The control: a contiguous batch into the channels_last model costs conv1 one conversion
  // (its input needs no gradient, so none in the backward).
  const int64_t before = layout_conversions();
  step(*last, opt_last, x, target);
  EXPECT_EQ(layout_conversions(), before + 1);
}

// On the CPU both models run the same algorithm for the 3x3 layers (oneDNN's Winograd on AVX-512
// machines, ours below), in both layouts: the parameters agree within 1.1e-6 after three steps,
// with or without ONEDNN_MAX_CPU_ISA=AVX2 (2026-11-30). Before our Winograd took NHWC arrays, an
// AVX2 machine ran direct convolutions for the channels-last model only, whose different
// rounding grew through three SGD steps of batch-2 batch norm to 1e-3 of the parameters. On the
// CPU again with oneDNN off, so that our own Winograd (both layouts) and im2col paths run on any
// machine, as they do on one without AVX-512.
TEST(ChannelsLast, AChannelsLastResNet18StepConvertsNothingAndTrainsAsTheContiguousOne) {
  for (const Device device : devices()) {
    SCOPED_TRACE(device.str());
    expect_layouts_train_alike(device);
  }
  SCOPED_TRACE("cpu, oneDNN off");
  kernels::cpu::set_onednn_enabled(false);
  expect_layouts_train_alike(Device::cpu());
  kernels::cpu::set_onednn_enabled(true);
}

}  // namespace
}  // namespace rg
