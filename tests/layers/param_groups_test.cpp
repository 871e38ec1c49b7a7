// Parameter groups with their own weight decay (PyTorch's param_groups) in Sgd and Adam/AdamW, and
// linear_weight_decay_groups (minGPT's configure_optimizers rule).
#include "layers/optim/param_groups.h"

#include <gtest/gtest.h>

#include <memory>

#include "engine/ops/factory.h"
#include "kernels/error.h"
#include "layers/embedding.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/optim/optimizer.h"
#include "layers/sequential.h"
#include "support/errors.h"

namespace rg::optim {
namespace {

using testing::error_of;

// A fresh f64 parameter of `shape` with values drawn from `gen`.
Tensor param(const Shape& shape, Generator& gen) {
  Tensor t = randn(shape, gen, DType::f64);
  t.set_requires_grad(true);
  return t;
}

// Copies of `params` (new leaves with the same values).
std::vector<Tensor> copies(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    Tensor c = empty_like(p);
    c.copy_(p);
    c.set_requires_grad(true);
    out.push_back(c);
  }
  return out;
}

// Gives every parameter of each list the same fresh gradient per position.
void set_grads(const std::vector<std::vector<Tensor>*>& lists, Generator& gen) {
  for (size_t i = 0; i < lists[0]->size(); ++i) {
    const Tensor g = randn((*lists[0])[i].shape(), gen, DType::f64);
    for (auto* l : lists) (*l)[i].set_grad(g.clone());
  }
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.to_vector<double>() == b.to_vector<double>();
}

TEST(ParamGroups, AdamWWithTwoGroupsEqualsTwoAdamWs) {
  Generator gen(7);
  const std::vector<Tensor> decay{param({3, 4}, gen), param({5}, gen)};
  const std::vector<Tensor> no_decay{param({4}, gen), param({2, 2}, gen), param({1}, gen)};
  std::vector<Tensor> grouped = copies(decay);
  for (const Tensor& p : copies(no_decay)) grouped.push_back(p);
  std::vector<Tensor> a = copies(decay), b = copies(no_decay);
  const AdamOptions options{.lr = 0.01, .weight_decay = 0.5};  // the groups override it
  auto together = make_adamw({{{grouped[0], grouped[1]}, 0.1},
                              {{grouped[2], grouped[3], grouped[4]}, 0.0}},
                             options);
  auto first = make_adamw(a, {.lr = 0.01, .weight_decay = 0.1});
  auto second = make_adamw(b, {.lr = 0.01, .weight_decay = 0.0});
  ASSERT_EQ(together->params().size(), 5u);
  for (int step = 0; step < 4; ++step) {
    std::vector<Tensor> ab = a;
    ab.insert(ab.end(), b.begin(), b.end());
    set_grads({&grouped, &ab}, gen);
    together->step();
    first->step();
    second->step();
  }
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(same_values(grouped[i], a[i])) << i;
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(same_values(grouped[2 + i], b[i])) << i;
  EXPECT_FALSE(same_values(grouped[0], decay[0])) << "the parameters moved";
}

TEST(ParamGroups, GroupsReportSizesAndWeightDecays) {
  Generator gen(1);
  const Tensor a = param({2, 3}, gen), b = param({4}, gen), c = param({1}, gen);
  Adam adam({{{a, b}, std::nullopt}, {{}, 0.3}, {{c}, 0.0}}, {.weight_decay = 0.2});
  ASSERT_EQ(adam.groups().size(), 3u);
  EXPECT_EQ(adam.groups()[0].tensors, 2u);
  EXPECT_EQ(adam.groups()[0].numel, 10);
  EXPECT_EQ(adam.groups()[0].weight_decay, 0.2) << "unset: the options'";
  EXPECT_EQ(adam.groups()[1].tensors, 0u) << "an empty group is allowed";
  EXPECT_EQ(adam.groups()[1].weight_decay, 0.3);
  EXPECT_EQ(adam.groups()[2].numel, 1);
  EXPECT_EQ(adam.groups()[2].weight_decay, 0.0);
  EXPECT_EQ(adam.weight_decay(1), 0.2);
  EXPECT_EQ(adam.weight_decay(2), 0.0);
  ASSERT_EQ(adam.params().size(), 3u);
  EXPECT_TRUE(adam.params()[2].is_same(c));
  // The one-list constructor is one group with the options' weight decay.
  Sgd sgd({a, b}, {.lr = 0.1, .weight_decay = 0.01});
  ASSERT_EQ(sgd.groups().size(), 1u);
  EXPECT_EQ(sgd.groups()[0].tensors, 2u);
  EXPECT_EQ(sgd.groups()[0].weight_decay, 0.01);
}

TEST(ParamGroups, AParameterInTwoGroupsAndABadWeightDecayAreErrors) {
  Generator gen(2);
  const Tensor a = param({2}, gen), b = param({2}, gen);
  EXPECT_NE(error_of([&] {
              Adam({{{a, b}, 0.1}, {{b}, 0.0}}, {});
            }).find("some parameters appear in more than one parameter group"),
            std::string::npos);
  EXPECT_THROW(Sgd({{{a}, 0.1}, {{b, a}, std::nullopt}}, {.lr = 0.1}), Error);
  EXPECT_THROW(Sgd({{{a}, -0.1}}, {.lr = 0.1}), Error);
  EXPECT_NO_THROW(Sgd({{{a}, 0.1}, {{b}, std::nullopt}}, {.lr = 0.1}));
}

TEST(ParamGroups, SgdGroupsUseTheirOwnWeightDecay) {
  // d = g + wd*p with p = 1, g = 0.5, lr 0.1: wd 0.1 -> p = 1 - 0.06 = 0.94; wd 0 -> 0.95; the
  // unset group takes the options' 0.2 -> 0.93.
  std::vector<Tensor> ps;
  for (int i = 0; i < 3; ++i) {
    Tensor t = full({1}, 1.0, DType::f64);
    t.set_requires_grad(true);
    t.set_grad(full({1}, 0.5, DType::f64));
    ps.push_back(t);
  }
  Sgd sgd({{{ps[0]}, 0.1}, {{ps[1]}, 0.0}, {{ps[2]}, std::nullopt}},
          {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.2});
  sgd.step();
  EXPECT_NEAR(ps[0].item(), 0.94, 1e-15);
  EXPECT_NEAR(ps[1].item(), 0.95, 1e-15);
  EXPECT_NEAR(ps[2].item(), 0.93, 1e-15);
  EXPECT_NEAR(sgd.momentum_buffer(0).item(), 0.6, 1e-15);
}

TEST(ParamGroups, StateIsNumberedOverAllGroupsAndRoundTrips) {
  Generator gen(3);
  std::vector<Tensor> ps{param({2}, gen), param({3}, gen), param({1}, gen)};
  std::vector<Tensor> qs = copies(ps);
  const std::vector<ParamGroup> groups{{{ps[0]}, 0.1}, {{}, 0.0}, {{ps[1], ps[2]}, 0.0}};
  auto opt = make_adamw(groups, {.lr = 0.01});
  set_grads({&ps}, gen);
  ps[1].set_grad(Tensor());  // not stepped: no state
  opt->step();
  std::vector<std::string> names;
  for (const auto& [n, t] : opt->state()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.exp_avg", "0.exp_avg_sq", "0.step", "2.exp_avg",
                                             "2.exp_avg_sq", "2.step"}));

  // A second optimizer over copies, loaded with the state, continues exactly like the first.
  auto restored = make_adamw({{{qs[0]}, 0.1}, {{}, 0.0}, {{qs[1], qs[2]}, 0.0}}, {.lr = 0.01});
  restored->load_state(opt->state());
  for (size_t i = 0; i < 3; ++i) qs[i].copy_(ps[i]);
  for (int step = 0; step < 2; ++step) {
    set_grads({&ps, &qs}, gen);
    opt->step();
    restored->step();
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(same_values(ps[i], qs[i])) << i;
  const NamedTensors a = opt->state(), b = restored->state();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.to_vector<double>(), b[i].second.to_vector<double>()) << a[i].first;
  }
  EXPECT_NE(error_of([&] {
              restored->load_state({{"3.step", full({}, 1.0, DType::i64)}});
            }).find("one of the 3 parameters"),
            std::string::npos);
}

// The tensors of each group, by name in `model`.
std::vector<std::vector<std::string>> names_by_group(const nn::Module& model,
                                                     const std::vector<ParamGroup>& groups) {
  std::vector<std::vector<std::string>> out;
  for (const ParamGroup& g : groups) {
    std::vector<std::string> names;
    for (const Tensor& t : g.params) {
      for (const auto& [n, p] : model.named_parameters()) {
        if (p.is_same(t)) {
          names.push_back(n);
          break;
        }
      }
    }
    out.push_back(names);
  }
  return out;
}

TEST(LinearWeightDecayGroups, DecaysOnlyLinearWeights) {
  Generator gen(4);
  nn::Sequential model({std::make_shared<nn::Linear>(3, 4, gen),
                        std::make_shared<nn::LayerNorm>(4),
                        std::make_shared<nn::Linear>(4, 2, gen)});
  const std::vector<ParamGroup> groups = linear_weight_decay_groups(model, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.1);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  using Names = std::vector<std::string>;
  EXPECT_EQ(names_by_group(model, groups),
            (std::vector<Names>{{"0.weight", "2.weight"},
                                {"0.bias", "1.weight", "1.bias", "2.bias"}}));
  auto opt = make_adamw(groups, {.lr = 0.01, .weight_decay = 0.5});
  EXPECT_EQ(opt->params().size(), model.parameters().size());
  EXPECT_EQ(opt->groups()[0].numel, 12 + 8);
  EXPECT_EQ(opt->groups()[1].weight_decay, 0.0);
}

TEST(LinearWeightDecayGroups, ATiedParameterAppearsOnceAndEmbeddingsDoNotDecay) {
  Generator gen(5);
  auto wte = std::make_shared<nn::Embedding>(10, 4, gen);
  auto head = std::make_shared<nn::Linear>(4, 10, gen, /*bias=*/false);
  auto proj = std::make_shared<nn::Linear>(4, 4, gen);
  nn::Sequential model({{"wte", wte}, {"proj", proj}, {"again", proj}, {"head", head}});
  // The head's weight also registered as something that is not a Linear's weight (as a language
  // model ties its head to its token embedding): it is an embedding, no decay.
  model.register_parameter("tied", head->weight);
  const std::vector<ParamGroup> groups = linear_weight_decay_groups(model, 0.1);
  using Names = std::vector<std::string>;
  // proj is registered twice (both names are a Linear's weight): once, decayed.
  EXPECT_EQ(names_by_group(model, groups),
            (std::vector<Names>{{"proj.weight"}, {"tied", "wte.weight", "proj.bias"}}));
  EXPECT_NO_THROW(make_adamw(groups, {}));
}

}  // namespace
}  // namespace rg::optim
