// save_checkpoint/load_checkpoint and Optimizer::state/load_state: a restored model, optimizer and
// GradScaler continue exactly like the originals; bad state and foreign files are clear errors.
#include "layers/checkpoint.h"

#include <gtest/gtest.h>

#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/serialization.h"
#include "kernels/error.h"
#include "layers/amp/grad_scaler.h"
#include "layers/models/mlp.h"
#include "layers/optim/optimizer.h"
#include "support/errors.h"
#include "support/scratch_dir.h"

namespace rg::nn {
namespace {

using testing::error_of;

class Checkpoint : public testing::ScratchDirTest {};

// One scaled AdamW step of `model` on a fixed batch.
void step(MLP& model, optim::Optimizer& opt, amp::GradScaler& scaler, Generator& data) {
  const Tensor x = randn({8, 6}, data);
  const Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});
  opt.zero_grad();
  scaler.scale(cross_entropy(model.forward(x), y)).backward();
  scaler.step(opt);
  scaler.update();
}

TEST_F(Checkpoint, ARestoredModelOptimizerAndScalerContinueExactly) {
  Generator init(1), data(2);
  MLP model(6, {16}, 3, init);
  auto opt = optim::make_adamw(model.parameters(), {.lr = 0.01, .weight_decay = 0.01});
  amp::GradScaler scaler({.init_scale = 256.0, .growth_interval = 2});
  for (int i = 0; i < 3; ++i) step(model, *opt, scaler, data);
  opt->set_lr(0.005);
  const std::string path = (dir_ / "c.safetensors").string();
  save_checkpoint(path, model, opt.get(), &scaler, {{"epoch", "7"}});

  Generator other(99);
  MLP restored(6, {16}, 3, other);
  auto restored_opt = optim::make_adamw(restored.parameters(), {.lr = 0.1, .weight_decay = 0.01});
  amp::GradScaler restored_scaler({.growth_interval = 2});
  const Metadata meta = load_checkpoint(path, restored, restored_opt.get(), &restored_scaler);
  EXPECT_EQ(meta.at("epoch"), "7");
  EXPECT_EQ(restored_opt->lr(), 0.005);
  EXPECT_EQ(restored_scaler.get_scale(), scaler.get_scale());
  EXPECT_EQ(restored_scaler.growth_tracker(), scaler.growth_tracker());

  Generator d1(5), d2(5);
  step(model, *opt, scaler, d1);
  step(restored, *restored_opt, restored_scaler, d2);
  const auto a = model.parameters(), b = restored.parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].to_vector<float>(), b[i].to_vector<float>()) << i;
  }
  EXPECT_EQ(restored_scaler.get_scale(), scaler.get_scale());
}

TEST_F(Checkpoint, OptimizerStateNamesFollowPyTorchAndBadStateIsRefused) {
  Tensor p = full({3}, 1.0);
  p.set_requires_grad(true);
  p.set_grad(full({3}, 0.5));
  optim::Sgd sgd({p}, {.lr = 0.1, .momentum = 0.9});
  EXPECT_TRUE(sgd.state().empty()) << "no state before the first step";
  sgd.step();
  const NamedTensors s = sgd.state();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].first, "0.momentum_buffer");
  const std::vector<float> buffer = sgd.momentum_buffer(0).to_vector<float>();
  EXPECT_NE(error_of([&] {
              sgd.load_state({{"01.momentum_buffer", full({3}, 0.0)}});
            }).find("does not name the state"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              sgd.load_state(
                  {{"0.momentum_buffer", full({3}, 0.0)}, {"0.momentum_buffer", full({3}, 0.0)}});
            }).find("appears twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              sgd.load_state({{"1.momentum_buffer", full({3}, 0.0)}});
            }).find("does not name the state of one of the 1 parameters"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              sgd.load_state({{"0.exp_avg", full({3}, 0.0)}});
            }).find("unknown state 'exp_avg' of parameter 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              sgd.load_state({{"0.momentum_buffer", full({4}, 0.0)}});
            }).find("has shape [4], the parameter [3]"),
            std::string::npos);
  // A failed load changes nothing.
  EXPECT_EQ(sgd.momentum_buffer(0).to_vector<float>(), buffer);
  optim::Adam adam({p}, {});
  adam.step();
  NamedTensors names;
  for (auto& [n, t] : adam.state()) names.emplace_back(n, t);
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[0].first, "0.exp_avg");
  EXPECT_EQ(names[1].first, "0.exp_avg_sq");
  EXPECT_EQ(names[2].first, "0.step");
  EXPECT_EQ(names[2].second.item<int64_t>(), 1);
  EXPECT_NE(error_of([&] {
              adam.load_state({names[0], names[1]});
            }).find("needs exp_avg, exp_avg_sq and step together"),
            std::string::npos);
}

// A caller's own tensors (a snapshot's DDP state) travel in the same file: load_checkpoint hands
// them back when asked and refuses them otherwise; the parts' prefixes stay reserved.
TEST_F(Checkpoint, ExtraTensorsRoundTripAndTheirNamesMustNotTakeThePartsPrefixes) {
  Generator g(1);
  MLP model(6, {16}, 3, g);
  const std::string path = (dir_ / "c.safetensors").string();
  const NamedTensors extra = {{"powersgd.bucket0.q", from_vector<float>({1.5f, -2.f}, {2})},
                              {"powersgd.rank1.bucket0.error", full({3}, 0.25)}};
  save_checkpoint(path, model, nullptr, nullptr, {{"epoch", "1"}}, extra);
  Generator other(7);
  MLP restored(6, {16}, 3, other);
  NamedTensors got;
  EXPECT_EQ(load_checkpoint(path, restored, nullptr, nullptr, {}, &got).at("epoch"), "1");
  ASSERT_EQ(got.size(), extra.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, extra[i].first);
    EXPECT_EQ(got[i].second.to_vector<float>(), extra[i].second.to_vector<float>());
  }
  EXPECT_EQ(restored.parameters()[0].to_vector<float>(), model.parameters()[0].to_vector<float>());
  EXPECT_NE(error_of([&] {
              load_checkpoint(path, restored, nullptr, nullptr);
            }).find("unexpected tensor 'powersgd.bucket0.q' in a checkpoint"),
            std::string::npos);
  for (const char* name : {"model.x", "optimizer.0.x", "rng.x"})
    EXPECT_NE(error_of([&] {
                save_checkpoint(path, model, nullptr, nullptr, {}, {{name, full({1}, 1.0)}});
              }).find(std::string("tensor name '") + name + "' is reserved"),
              std::string::npos)
        << name;
}

TEST_F(Checkpoint, ForeignFilesAndMismatchedModelsAreClearErrors) {
  Generator g(1);
  MLP model(6, {16}, 3, g);
  const std::string weights = (dir_ / "w.safetensors").string();
  save_safetensors(weights, model.state_dict());
  EXPECT_NE(error_of([&] {
              load_checkpoint(weights, model, nullptr, nullptr);
            }).find("not a ringgrad checkpoint"),
            std::string::npos);
  const std::string path = (dir_ / "c.safetensors").string();
  save_checkpoint(path, model, nullptr, nullptr, {});
  MLP wider(6, {32}, 3, g);
  const std::string e = error_of([&] { load_checkpoint(path, wider, nullptr, nullptr); });
  EXPECT_NE(e.find("does not fit the model"), std::string::npos) << e;
  EXPECT_NE(e.find("size mismatch for fc1.weight: copying a param with shape [16, 6] from "
                   "checkpoint, the shape in current model is [32, 6]"),
            std::string::npos)
      << e;
  Tensor p = full({1}, 1.0);
  p.set_requires_grad(true);
  optim::Sgd sgd({p}, {.lr = 0.1});
  optim::Adam adam(model.parameters(), {});
  save_checkpoint(path, model, &sgd, nullptr, {});
  EXPECT_NE(error_of([&] {
              load_checkpoint(path, model, &adam, nullptr);
            }).find("the checkpoint holds sgd state, the optimizer is adam"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_checkpoint(path, model, nullptr, nullptr,
                              [](const Metadata& m) { RG_CHECK(m.count("epoch"), "no epoch"); });
            }).find("no epoch"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              save_checkpoint(path, model, nullptr, nullptr, {{"rg.x", "1"}});
            }).find("is reserved"),
            std::string::npos);
}

}  // namespace
}  // namespace rg::nn
