// Modules and models: parameter names (torchvision/PyTorch-example compatible), counts, default
// initialization ranges, train/eval behaviour, state_dict round trips and load errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/activation.h"
#include "engine/ops/binary.h"
#include "engine/ops/embedding.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/ops/matmul.h"
#include "engine/ops/reduce.h"
#include "kernels/error.h"
#include "layers/activation.h"
#include "layers/batch_norm.h"
#include "layers/conv2d.h"
#include "layers/embedding.h"
#include "layers/linear.h"
#include "layers/models/mlp.h"
#include "layers/models/registry.h"
#include "layers/models/resnet.h"
#include "layers/models/toynet.h"
#include "layers/pooling.h"
#include "layers/sequential.h"

namespace rg::nn {
namespace {

std::vector<std::string> names(const NamedTensors& v) {
  std::vector<std::string> out;
  for (auto& [n, t] : v) out.push_back(n);
  return out;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : t.to_vector<double>()) m = std::max(m, std::fabs(x));
  return m;
}

TEST(Linear, ForwardMatchesOpAndInitBounds) {
  Generator gen(1);
  Linear lin(100, 7, gen);
  EXPECT_EQ(names(lin.named_parameters()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(lin.weight.shape(), (Shape{7, 100}));
  EXPECT_EQ(lin.parameter_count(), 707);
  // PyTorch default: U(-1/sqrt(in), 1/sqrt(in)) for both weight and bias.
  EXPECT_LE(max_abs(lin.weight), 0.1);
  EXPECT_GT(max_abs(lin.weight), 0.09);
  EXPECT_LE(max_abs(lin.bias), 0.1);
  Tensor x = ones({3, 100});
  auto y = lin(x).to_vector<float>();
  auto ref = linear(x, lin.weight, lin.bias).to_vector<float>();
  EXPECT_EQ(y, ref);
  Linear nobias(4, 2, gen, false);
  EXPECT_EQ(names(nobias.named_parameters()), (std::vector<std::string>{"weight"}));
}

TEST(Embedding, PyTorchInitPaddingRowAndName) {
  Generator gen(3);
  Embedding emb(200, 50, gen, 7);
  EXPECT_EQ(names(emb.state_dict()), (std::vector<std::string>{"weight"}));
  EXPECT_EQ(emb.weight.shape(), (Shape{200, 50}));
  EXPECT_TRUE(emb.weight.requires_grad());
  // N(0, 1) over 10000 values (the padding row aside): mean within 0.05, std within 0.05 of 1.
  const std::vector<double> w = emb.weight.to_vector<double>();
  double s = 0, ss = 0;
  int64_t count = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (int64_t(i) / 50 == 7) {
      EXPECT_EQ(w[i], 0.0) << "padding row, column " << i % 50;
      continue;
    }
    s += w[i];
    ss += w[i] * w[i];
    ++count;
  }
  const double mean = s / double(count), var = ss / double(count) - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(std::sqrt(var), 1.0, 0.05);
  // The forward is the op with the layer's padding index: no gradient reaches row 7.
  const Tensor idx = from_vector<int64_t>({7, 1, 7, 1}, {2, 2});
  const Tensor y = emb(idx);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 50}));
  EXPECT_EQ(y.to_vector<float>(), embedding(emb.weight, idx, 7).to_vector<float>());
  sum(y).backward();
  const std::vector<float> g = emb.weight.grad().to_vector<float>();
  for (int64_t k = 0; k < 50; ++k) {
    EXPECT_EQ(g[size_t(7 * 50 + k)], 0.f);
    EXPECT_EQ(g[size_t(1 * 50 + k)], 2.f);
  }
  Embedding plain(4, 3, gen);  // no padding row: nothing zeroed
  for (double v : plain.weight.to_vector<double>()) EXPECT_NE(v, 0.0);
  EXPECT_THROW(Embedding(4, 3, gen, 4), Error);
}

TEST(Conv2d, ShapesNamesAndInit) {
  Generator gen(2);
  Conv2d conv(3, 8, {3, 3}, gen, {.stride = {2, 2}, .padding = {1, 1}});
  EXPECT_EQ(conv.weight.shape(), (Shape{8, 3, 3, 3}));
  EXPECT_LE(max_abs(conv.weight), 1.0 / std::sqrt(27.0));
  EXPECT_EQ(conv(zeros({2, 3, 9, 9})).shape(), (Shape{2, 8, 5, 5}));
  EXPECT_NE(conv.str().find("stride=(2, 2)"), std::string::npos) << conv.str();
}

TEST(BatchNorm2d, TrainUpdatesRunningStatsEvalUsesThem) {
  BatchNorm2d bn(2);
  EXPECT_EQ(names(bn.state_dict()),
            (std::vector<std::string>{"weight", "bias", "running_mean", "running_var",
                                      "num_batches_tracked"}));
  // Channel 0 holds 1,3 (mean 2, unbiased var 2); channel 1 holds 0,0.
  Tensor x = from_vector<float>({1, 0, 3, 0}, {2, 2, 1, 1});
  Tensor y = bn(x);
  auto rm = bn.running_mean.to_vector<float>(), rv = bn.running_var.to_vector<float>();
  EXPECT_FLOAT_EQ(rm[0], 0.1f * 2.0f);
  EXPECT_FLOAT_EQ(rv[0], 0.9f + 0.1f * 2.0f);
  EXPECT_FLOAT_EQ(rv[1], 0.9f);
  EXPECT_EQ(bn.num_batches_tracked.item(), 1.0);
  EXPECT_NEAR(y.to_vector<float>()[0], -1.0, 1e-4);  // (1 - 2) / sqrt(1 + eps)
  bn.eval();
  Tensor z = bn(x);
  EXPECT_NEAR(z.to_vector<float>()[0], (1 - 0.2) / std::sqrt(1.1 + 1e-5), 1e-5);
  EXPECT_EQ(bn.num_batches_tracked.item(), 1.0);
}

TEST(Pooling, Modules) {
  Tensor x = arange(16, DType::f32).view({1, 1, 4, 4});
  EXPECT_EQ(MaxPool2d({2, 2})(x).to_vector<float>(), (std::vector<float>{5, 7, 13, 15}));
  EXPECT_EQ(AvgPool2d({2, 2})(x).to_vector<float>(), (std::vector<float>{2.5, 4.5, 10.5, 12.5}));
  EXPECT_EQ(AdaptiveAvgPool2d()(x).to_vector<float>(), (std::vector<float>{7.5}));
}

TEST(Dropout, OnlyInTraining) {
  auto gen = std::make_shared<Generator>(3);
  Dropout d(0.5, gen);
  Tensor x = ones({1000});
  const auto train = d(x).to_vector<float>();
  int zeros_seen = 0;
  for (float v : train) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f);
    zeros_seen += v == 0.0f;
  }
  EXPECT_NEAR(zeros_seen, 500, 80);
  d.eval();
  EXPECT_EQ(d(x).to_vector<float>(), x.to_vector<float>());
  EXPECT_THROW(Dropout(1.5, gen), Error);
}

TEST(Sequential, RunsInOrderWithNumericNames) {
  Generator gen(4);
  Sequential seq;
  seq.push_back(std::make_shared<Flatten>());
  seq.push_back(std::make_shared<Linear>(12, 5, gen));
  seq.push_back(std::make_shared<ReLU>());
  EXPECT_EQ(names(seq.named_parameters()), (std::vector<std::string>{"1.weight", "1.bias"}));
  Tensor y = seq(ones({2, 3, 2, 2}));
  EXPECT_EQ(y.shape(), (Shape{2, 5}));
  for (float v : y.to_vector<float>()) EXPECT_GE(v, 0.0f);
}

TEST(Module, RegistersMembersFromOutsideWithoutASubclass) {
  // PyTorch's add_module/register_parameter/register_buffer, called on a container from outside.
  Generator gen(4);
  Sequential net;
  net.register_module("fc1", std::make_shared<Linear>(4, 3, gen));
  net.register_module("act", std::make_shared<ReLU>());
  Tensor& t = net.register_parameter("temperature", ones({1}));
  EXPECT_TRUE(t.requires_grad());
  net.register_buffer("steps", zeros({1}, DType::i64));
  EXPECT_EQ(names(net.state_dict()),
            (std::vector<std::string>{"temperature", "steps", "fc1.weight", "fc1.bias"}));
  EXPECT_EQ(names(net.named_parameters()),
            (std::vector<std::string>{"temperature", "fc1.weight", "fc1.bias"}));
  // Children registered on a Sequential run in order, as torch.nn.Sequential's add_module.
  EXPECT_EQ(net.size(), 2u);
  EXPECT_EQ(net(ones({2, 4})).shape(), (Shape{2, 3}));
  EXPECT_EQ(net[0].path(), "fc1");
  EXPECT_THROW(net.register_buffer("fc1", zeros({1})), Error);     // name taken
  EXPECT_THROW(net.register_parameter("a.b", zeros({1})), Error);  // not one path component
}

TEST(Sequential, NamedChildrenNameTheStateDictKeys) {
  Generator gen(5);
  Sequential net({{"conv1", std::make_shared<Conv2d>(1, 2, std::array<int64_t, 2>{3, 3}, gen)},
                  {"relu1", std::make_shared<ReLU>()},
                  {"flatten", std::make_shared<Flatten>()},
                  {"fc1", std::make_shared<Linear>(8, 3, gen)}});
  EXPECT_EQ(names(net.state_dict()),
            (std::vector<std::string>{"conv1.weight", "conv1.bias", "fc1.weight", "fc1.bias"}));
  EXPECT_EQ(net.size(), 4u);
  EXPECT_EQ(net[3].type_name(), "Linear");
  EXPECT_NE(net.str().find("(conv1): Conv2d("), std::string::npos) << net.str();
  // Runs in the given order: conv [1,1,4,4] -> [1,2,2,2] -> relu -> [1,8] -> fc1 -> [1,3].
  EXPECT_EQ(net(ones({1, 1, 4, 4})).shape(), (Shape{1, 3}));
  net.push_back("out", std::make_shared<ReLU>());
  EXPECT_EQ(net.named_children().back().first, "out");
  EXPECT_THROW(Sequential({{"a", std::make_shared<ReLU>()}, {"a", std::make_shared<ReLU>()}}),
               Error);
  // The unnamed form keeps PyTorch's positional names.
  Sequential plain({std::make_shared<Linear>(2, 2, gen), std::make_shared<ReLU>()});
  EXPECT_EQ(names(plain.state_dict()), (std::vector<std::string>{"0.weight", "0.bias"}));
}

// summary(): a row per module with its own parameters, the totals (trainable vs frozen, buffers)
// and the bytes, computed from the registered tensors.
TEST(Module, SummaryListsEveryModuleWithItsParametersAndTheTotals) {
  Generator gen(6);
  Sequential net({{"conv1", std::make_shared<Conv2d>(1, 2, std::array<int64_t, 2>{3, 3}, gen)},
                  {"bn1", std::make_shared<BatchNorm2d>(2)},
                  {"flatten", std::make_shared<Flatten>()},
                  {"fc1", std::make_shared<Linear>(8, 3, gen)}});
  net.register_parameter("scale", ones({1}), /*requires_grad=*/false);
  const std::string s = net.summary();
  for (const char* fragment :
       {"Sequential", "  conv1 (Conv2d)", "weight[2, 1, 3, 3] bias[2]", "  bn1 (BatchNorm2d)",
        "  flatten (Flatten)", "  fc1 (Linear)", "weight[3, 8] bias[3]", "scale[1]"}) {
    EXPECT_NE(s.find(fragment), std::string::npos) << fragment << "\n" << s;
  }
  // conv 18 + 2, bn 2 + 2, fc 24 + 3: 51 trainable; the frozen scale 1.
  EXPECT_NE(s.find("trainable parameters: 51\n"), std::string::npos) << s;
  EXPECT_NE(s.find("frozen parameters: 1\n"), std::string::npos) << s;
  EXPECT_EQ(net.parameter_count(), 52);
  // bn1's running mean and var (2 + 2) and its batch counter (1).
  EXPECT_NE(s.find("buffer elements: 5\n"), std::string::npos) << s;
  // 52 f32 parameters + 4 f32 running statistics + one i64 counter.
  EXPECT_NE(s.find("parameter and buffer bytes: 232\n"), std::string::npos) << s;
  // Thousands separators on a bigger model.
  Linear big(1000, 1000, gen);
  EXPECT_NE(big.summary().find("trainable parameters: 1,001,000\n"), std::string::npos)
      << big.summary();
}

// A model built from constructors without a Generator&: they draw from default_generator().
std::shared_ptr<Sequential> default_initialized_net() {
  return std::make_shared<Sequential>(Sequential::NamedModules{
      {"conv1", std::make_shared<Conv2d>(1, 4, std::array<int64_t, 2>{3, 3})},
      {"flatten", std::make_shared<Flatten>()},
      {"fc1", std::make_shared<Linear>(16, 5)},
      {"fc2", std::make_shared<Linear>(5, 2, /*bias=*/false)}});
}

std::vector<std::vector<float>> values(const Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [n, t] : m.state_dict()) out.push_back(t.to_vector<float>());
  return out;
}

TEST(Generator, ManualSeedMakesDefaultInitializedModelsBitIdentical) {
  manual_seed(7);
  auto a = default_initialized_net();
  manual_seed(7);
  auto b = default_initialized_net();
  const auto va = values(*a), vb = values(*b);
  ASSERT_EQ(va.size(), 5u);
  for (size_t i = 0; i < va.size(); ++i) {
    ASSERT_EQ(va[i].size(), vb[i].size());
    EXPECT_EQ(std::memcmp(va[i].data(), vb[i].data(), va[i].size() * sizeof(float)), 0) << i;
  }
  auto c = default_initialized_net();  // the stream went on: different weights
  EXPECT_NE(values(*c), va);
  manual_seed(8);
  EXPECT_NE(values(*default_initialized_net()), va);

  // The default generator seeded s draws what an explicit Generator(s) draws.
  manual_seed(11);
  Linear implicit(6, 3);
  Generator gen(11);
  Linear explicit_gen(6, 3, gen);
  EXPECT_EQ(values(implicit), values(explicit_gen));
  EXPECT_EQ(default_generator().offset(), gen.offset());

  // Dropout without a generator draws its masks from the default one.
  manual_seed(3);
  Dropout d;
  Dropout reference(0.5, std::make_shared<Generator>(3));
  EXPECT_EQ(d(ones({64})).to_vector<float>(), reference(ones({64})).to_vector<float>());
}

// The models' constructors without a Generator& draw from default_generator(): the same seed
// gives bit-identical weights, another seed other weights.
template <class Model, class... Args>
void expect_seeded_by_manual_seed(Args... args) {
  manual_seed(21);
  const auto a = values(Model(args...));
  manual_seed(21);
  const auto b = values(Model(args...));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0) << i;
  }
  manual_seed(22);
  EXPECT_NE(values(Model(args...)), a);
}

TEST(Models, DefaultGeneratorConstructorsFollowManualSeed) {
  expect_seeded_by_manual_seed<MLP>(int64_t{784}, std::vector<int64_t>{32, 16}, int64_t{10});
  expect_seeded_by_manual_seed<ToyNet>();
  expect_seeded_by_manual_seed<ResNet18>(int64_t{10});

  // ToyNet() also draws its dropout masks from the default generator, as torch.nn.Dropout.
  manual_seed(4);
  ToyNet net;
  EXPECT_EQ(&net.dropout1->generator(), &default_generator());
  EXPECT_EQ(&net.dropout2->generator(), &default_generator());
  // An explicit init Generator with the dropout generator left out: masks from the default one.
  Generator gen(4);
  ToyNet explicit_init(gen);
  EXPECT_EQ(values(explicit_init), values(net));
  EXPECT_EQ(&explicit_init.dropout1->generator(), &default_generator());
  // dropout = false keeps the layers, with p = 0.
  ToyNet no_dropout(/*dropout=*/false);
  EXPECT_EQ(no_dropout.dropout1->str(), "Dropout(p=0.000000)");
  EXPECT_EQ(net.dropout1->str(), "Dropout(p=0.250000)");
  EXPECT_EQ(ResNet18(7, /*imagenet_stem=*/true)(zeros({1, 3, 64, 64})).shape(), (Shape{1, 7}));
}

TEST(Conv2d, SquareKernelShorthandAsPyTorch) {
  Conv2d c(1, 32, 3);  // torch.nn.Conv2d(1, 32, 3)
  EXPECT_EQ(c.weight.shape(), (Shape{32, 1, 3, 3}));
  EXPECT_EQ(c.bias.shape(), (Shape{32}));
  EXPECT_EQ(c(zeros({2, 1, 28, 28})).shape(), (Shape{2, 32, 26, 26}));
  Conv2d strided(3, 8, 3, 2, 1, /*bias=*/false);  // Conv2d(3, 8, 3, 2, 1, bias=False)
  EXPECT_EQ(strided.str(),
            "Conv2d(3, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=false)");
  EXPECT_FALSE(strided.bias.defined());
  EXPECT_EQ(strided(zeros({1, 3, 32, 32})).shape(), (Shape{1, 8, 16, 16}));
  // The same initialization as the array form.
  manual_seed(5);
  Conv2d a(2, 4, 5);
  manual_seed(5);
  Conv2d b(2, 4, std::array<int64_t, 2>{5, 5});
  EXPECT_EQ(values(a), values(b));
  EXPECT_THROW(Conv2d(1, 2, 0), Error);
}

TEST(ToyNet, MatchesThePyTorchExample) {
  auto net = make_model({.name = "toynet", .sample_shape = {1, 28, 28}});
  // Parameter count and names of examples/mnist Net.
  EXPECT_EQ(net->parameter_count(), 1199882);
  EXPECT_EQ(names(net->named_parameters()),
            (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                      "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  Tensor logits = (*net)(zeros({2, 1, 28, 28}));
  EXPECT_EQ(logits.shape(), (Shape{2, 10}));
  EXPECT_THROW(make_model({.name = "toynet", .sample_shape = {3, 32, 32}}), Error);
}

TEST(ResNet18, TorchvisionNamesAndCounts) {
  auto net = make_model({.name = "resnet18", .sample_shape = {3, 32, 32}});
  EXPECT_EQ(net->parameter_count(), 11173962);  // torchvision resnet18(num_classes=10), 3x3 stem
  const auto sd = names(net->state_dict());
  EXPECT_EQ(sd.size(), 122u);
  auto has = [&](const std::string& n) { return std::find(sd.begin(), sd.end(), n) != sd.end(); };
  for (const char* n :
       {"conv1.weight", "bn1.running_mean", "layer1.0.conv1.weight",
        "layer1.0.bn1.num_batches_tracked", "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.running_var", "layer4.1.bn2.bias", "fc.weight", "fc.bias"}) {
    EXPECT_TRUE(has(n)) << n;
  }
  EXPECT_FALSE(has("layer1.0.downsample.0.weight"));
  auto imagenet = make_model({.name = "resnet18-imagenet", .sample_shape = {3, 64, 64}});
  EXPECT_EQ(imagenet->parameter_count(), 11173962 - 64 * 3 * 9 + 64 * 3 * 49);
  Tensor logits = (*net)(zeros({2, 3, 32, 32}));
  EXPECT_EQ(logits.shape(), (Shape{2, 10}));
  EXPECT_EQ((*imagenet)(zeros({1, 3, 64, 64})).shape(), (Shape{1, 10}));
}

TEST(Module, StateDictRoundTripAndLoadErrors) {
  auto a = make_model({.name = "mlp", .sample_shape = {1, 4, 4}, .seed = 1});
  auto b = make_model({.name = "mlp", .sample_shape = {1, 4, 4}, .seed = 2});
  EXPECT_NE(a->parameters()[0].to_vector<float>(), b->parameters()[0].to_vector<float>());
  b->load_state_dict(a->state_dict());
  EXPECT_EQ(a->parameters()[0].to_vector<float>(), b->parameters()[0].to_vector<float>());

  NamedTensors broken = a->state_dict();
  broken[0].second = zeros({3, 3});
  broken.pop_back();
  broken.emplace_back("extra.weight", zeros({1}));
  try {
    b->load_state_dict(broken);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    // PyTorch's wording, on one line.
    EXPECT_EQ(msg,
              "Error(s) in loading state_dict for MLP: Missing key(s) in state_dict: \"fc3.bias\"; "
              "Unexpected key(s) in state_dict: \"extra.weight\"; size mismatch for fc1.weight: "
              "copying a param with shape [3, 3] from checkpoint, the shape in current model is "
              "[512, 16]");
  }
}

TEST(Module, TrainEvalPropagatesAndDTypeConversionKeepsHandles) {
  auto net = make_model({.name = "resnet18", .sample_shape = {3, 32, 32}});
  net->eval();
  for (auto& [n, m] : net->named_modules()) EXPECT_FALSE(m->is_training()) << n;
  net->train();
  Tensor w = net->parameters()[0];
  net->to(DType::f64);
  EXPECT_EQ(w.dtype(), DType::f64);
  EXPECT_TRUE(w.requires_grad());
  for (auto& [n, t] : net->named_buffers()) {
    if (n.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(t.dtype(), DType::i64);
    }
  }
  EXPECT_THROW(net->to(Device::cuda(0)), Error);
}

TEST(Module, GradientsFlowToEveryParameter) {
  auto net = make_model({.name = "resnet18", .sample_shape = {3, 32, 32}});
  Generator gen(5);
  Tensor x = randn({2, 3, 32, 32}, gen);
  Tensor y = from_vector<int64_t>({1, 7}, {2});
  cross_entropy((*net)(x), y).backward();
  for (auto& [n, p] : net->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << n;
    EXPECT_GT(max_abs(p.grad()), 0.0) << n;
  }
}

}  // namespace
}  // namespace rg::nn
