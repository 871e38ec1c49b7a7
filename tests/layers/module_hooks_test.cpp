// Module hooks as PyTorch's: forward pre-hooks and hooks (on children called by Sequential and the
// models too), full backward hooks and pre-hooks with gradients checked by hand, removal, and
// summary(input_shape), which records output shapes with forward hooks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/matmul.h"
#include "engine/ops/reduce.h"
#include "layers/activation.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/models/toynet.h"
#include "layers/sequential.h"
#include "support/errors.h"

namespace rg::nn {
namespace {

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

void expect_near(const Tensor& a, const Tensor& b) {
  ASSERT_TRUE(a.defined() && b.defined());
  ASSERT_EQ(a.shape(), b.shape());
  const auto va = values(a), vb = values(b);
  for (size_t i = 0; i < va.size(); ++i) EXPECT_NEAR(va[i], vb[i], 1e-5) << i;
}

TEST(ModuleHooks, ForwardPreHookReplacesTheInputOfAChildOfSequential) {
  auto relu = std::make_shared<ReLU>();
  Sequential net({relu});
  const Tensor x = from_vector<float>({1, -2, 3}, {3});
  int calls = 0;
  RemovableHandle h = relu->register_forward_pre_hook([&](Module& m, const Tensor& in) {
    ++calls;
    EXPECT_EQ(&m, relu.get());
    return mul(in, -1.0);
  });
  EXPECT_EQ(values(net(x)), (std::vector<float>{0, 2, 0}));  // relu(-x)
  EXPECT_EQ(calls, 1);
  h.remove();
  EXPECT_EQ(values(net(x)), (std::vector<float>{1, 0, 3}));
  EXPECT_EQ(calls, 1);
}

TEST(ModuleHooks, ForwardHooksSeeInputAndOutputOfModelChildrenAndReplaceTheOutput) {
  manual_seed(3);
  ToyNet net(/*dropout=*/false);  // the same logits on every call
  Shape conv1_in, fc1_in, fc1_out;
  net.conv1->register_forward_pre_hook([&](Module&, const Tensor& in) { conv1_in = in.shape(); });
  net.fc1->register_forward_hook([&](Module&, const Tensor& in, const Tensor& out) {
    fc1_in = in.shape();
    fc1_out = out.shape();
  });
  const Tensor x = zeros({2, 1, 28, 28});
  const Tensor logits = net(x);
  EXPECT_EQ(conv1_in, (Shape{2, 1, 28, 28}));
  EXPECT_EQ(fc1_in, (Shape{2, 9216}));
  EXPECT_EQ(fc1_out, (Shape{2, 128}));

  // The replaced output is what the parent gets: ToyNet returns fc2's output.
  RemovableHandle h = net.fc2->register_forward_hook(
      [](Module&, const Tensor&, const Tensor& out) { return add(out, 100.0); });
  expect_near(net(x), add(logits, 100.0));
  h.remove();
  expect_near(net(x), logits);
}

TEST(ModuleHooks, FullBackwardHookGetsGradInputAndGradOutputAndMayReplaceGradInput) {
  Generator gen(1);
  Linear fc(3, 2, gen);
  Tensor x = from_vector<float>({0.5f, -1.0f, 2.0f}, {1, 3});
  x.set_requires_grad(true);
  const Tensor c = from_vector<float>({1.0f, -2.0f}, {1, 2});  // dloss/dy
  std::vector<Tensor> seen_in, seen_out;
  int calls = 0;
  RemovableHandle observe =
      fc.register_full_backward_hook([&](Module& m, const std::vector<Tensor>& grad_input,
                                         const std::vector<Tensor>& grad_output) {
        ++calls;
        EXPECT_EQ(&m, &fc);
        seen_in = grad_input;
        seen_out = grad_output;
      });
  sum(mul(fc(x), c)).backward();
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(seen_in.size(), 1u);
  ASSERT_EQ(seen_out.size(), 1u);
  expect_near(seen_out[0], c);
  expect_near(seen_in[0], matmul(c, fc.weight.detach()));  // dloss/dx = c W
  expect_near(x.grad(), seen_in[0]);
  const Tensor weight_grad = fc.weight.grad().clone();

  // A replacement grad_input is what reaches x; the module's parameter gradients are unchanged.
  observe.remove();
  fc.register_full_backward_hook(
      [](Module&, const std::vector<Tensor>& grad_input, const std::vector<Tensor>&) {
        return std::vector<Tensor>{mul(grad_input[0], 0.0)};
      });
  x.zero_grad();
  fc.zero_grad();
  sum(mul(fc(x), c)).backward();
  EXPECT_EQ(calls, 1);  // removed
  EXPECT_EQ(values(x.grad()), (std::vector<float>{0, 0, 0}));
  expect_near(fc.weight.grad(), weight_grad);
}

TEST(ModuleHooks, BackwardHooksOfSequentialChildrenRunInReverseWithChainedGradients) {
  Generator gen(2);
  auto fc1 = std::make_shared<Linear>(3, 4, gen);
  auto relu = std::make_shared<ReLU>();
  auto fc2 = std::make_shared<Linear>(4, 2, gen);
  Sequential net({fc1, relu, fc2});
  std::vector<std::string> order;
  std::vector<std::vector<Tensor>> grad_in(3), grad_out(3);
  for (size_t i = 0; i < net.size(); ++i) {
    net[i].register_full_backward_hook(
        [&, i](Module& m, const std::vector<Tensor>& gi, const std::vector<Tensor>& go) {
          order.push_back(m.path());
          grad_in[i] = gi;
          grad_out[i] = go;
        });
  }
  Generator data(3);
  const Tensor x = randn({5, 3}, data);  // does not require grad
  sum(net(x)).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"2", "1", "0"}));
  // Each module's grad_input is the previous module's grad_output.
  expect_near(grad_in[2][0], grad_out[1][0]);
  expect_near(grad_in[1][0], grad_out[0][0]);
  expect_near(grad_out[2][0], ones({5, 2}));
  // fc1's input needs no gradient: grad_input holds an undefined tensor, as PyTorch's None.
  ASSERT_EQ(grad_in[0].size(), 1u);
  EXPECT_FALSE(grad_in[0][0].defined());
  // And it may not be replaced.
  fc1->register_full_backward_hook(
      [](Module&, const std::vector<Tensor>&, const std::vector<Tensor>& go) { return go; });
  testing::expect_error([&] { sum(net(x)).backward(); }, "no input of the module requires grad");
}

TEST(ModuleHooks, FullBackwardPreHookReplacesGradOutput) {
  Generator gen(4);
  auto fc1 = std::make_shared<Linear>(3, 4, gen);
  auto fc2 = std::make_shared<Linear>(4, 2, gen);
  Sequential net({fc1, std::make_shared<ReLU>(), fc2});
  Generator data(5);
  const Tensor x = randn({5, 3}, data);
  std::vector<Tensor> seen;
  RemovableHandle h =
      fc2->register_full_backward_pre_hook([&](Module&, const std::vector<Tensor>& grad_output) {
        seen = grad_output;
        return std::vector<Tensor>{mul(grad_output[0], 0.0)};
      });
  sum(mul(net(x), 3.0)).backward();
  ASSERT_EQ(seen.size(), 1u);
  expect_near(seen[0], full({5, 2}, 3.0));
  for (const Tensor& p : net.parameters()) {
    for (float v : values(p.grad())) EXPECT_EQ(v, 0.0f);
  }
  h.remove();
  net.zero_grad();
  sum(mul(net(x), 3.0)).backward();
  EXPECT_EQ(values(fc2->bias.grad()), (std::vector<float>{15.0f, 15.0f}));  // 5 rows x 3
}

TEST(ModuleHooks, NoBackwardHookNodesWithoutGradMode) {
  Generator gen(6);
  Linear fc(2, 2, gen);
  int calls = 0;
  fc.register_full_backward_hook(
      [&](Module&, const std::vector<Tensor>&, const std::vector<Tensor>&) { ++calls; });
  NoGradGuard no_grad;
  const Tensor y = fc(ones({1, 2}));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(calls, 0);
}

// The output shape summary() lists for the row of `module` (its indented name as printed): the
// column right after the name.
std::string output_column(const std::string& summary, const std::string& module) {
  size_t at = summary.find("\n" + module + " ");
  if (at == std::string::npos) return "(no row for '" + module + "')";
  at += 1 + module.size();
  at = summary.find_first_not_of(' ', at);
  return summary.substr(at, summary.find(']', at) + 1 - at);
}

TEST(ModuleHooks, SummaryWithAnInputShapeListsEachModulesOutputShape) {
  manual_seed(9);
  ToyNet net;
  net.dropout2->eval();  // mixed modes, restored afterwards
  const std::string s = net.summary({2, 1, 28, 28});
  EXPECT_EQ(s.find("module"), 0u) << s;
  EXPECT_NE(s.find("output shape"), std::string::npos) << s;
  EXPECT_EQ(output_column(s, "ToyNet"), "[2, 10]") << s;
  EXPECT_EQ(output_column(s, "  conv1 (Conv2d)"), "[2, 32, 26, 26]") << s;
  EXPECT_EQ(output_column(s, "  conv2 (Conv2d)"), "[2, 64, 24, 24]") << s;
  EXPECT_EQ(output_column(s, "  dropout1 (Dropout)"), "[2, 64, 12, 12]") << s;
  EXPECT_EQ(output_column(s, "  fc1 (Linear)"), "[2, 128]") << s;
  EXPECT_EQ(output_column(s, "  dropout2 (Dropout)"), "[2, 128]") << s;
  EXPECT_EQ(output_column(s, "  fc2 (Linear)"), "[2, 10]") << s;
  EXPECT_NE(s.find("trainable parameters: 1,199,882\n"), std::string::npos) << s;
  EXPECT_TRUE(net.is_training());
  EXPECT_TRUE(net.dropout1->is_training());
  EXPECT_FALSE(net.dropout2->is_training());

  Sequential small({{"conv", std::make_shared<Conv2d>(1, 2, 3)},
                    {"flatten", std::make_shared<Flatten>()},
                    {"fc", std::make_shared<Linear>(8, 3)}});
  const std::string t = small.summary({1, 1, 4, 4});
  EXPECT_EQ(output_column(t, "Sequential"), "[1, 3]") << t;
  EXPECT_EQ(output_column(t, "  conv (Conv2d)"), "[1, 2, 2, 2]") << t;
  EXPECT_EQ(output_column(t, "  flatten (Flatten)"), "[1, 8]") << t;
  EXPECT_EQ(output_column(t, "  fc (Linear)"), "[1, 3]") << t;
  testing::expect_error([&] { small.summary({1, 0, 4, 4}); }, "positive sizes");
  EXPECT_THROW(small.summary({1, 1, 5, 5}), Error);  // fc would get 18 features
  EXPECT_TRUE(small.is_training());
  // The summary's hooks are gone: a later forward records nothing (and does not crash).
  EXPECT_EQ(small(ones({1, 1, 4, 4})).shape(), (Shape{1, 3}));
}

}  // namespace
}  // namespace rg::nn
