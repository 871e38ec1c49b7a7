// nn::save_weights/load_weights: plain safetensors weight files under the module's own names
// (PyTorch's state_dict keys), strict loads that report every problem in one error, non-strict
// loads that return the missing and unexpected keys.
#include "layers/weights.h"

#include <gtest/gtest.h>

#include <cstring>

#include "engine/ops/factory.h"
#include "engine/serialization.h"
#include "kernels/error.h"
#include "layers/activation.h"
#include "layers/batch_norm.h"
#include "layers/checkpoint.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/sequential.h"
#include "support/errors.h"
#include "support/scratch_dir.h"

namespace rg::nn {
namespace {

using testing::error_of;

class Weights : public testing::ScratchDirTest {
 protected:
  std::string file(const std::string& name = "w.safetensors") { return (dir_ / name).string(); }
};

// conv1 -> bn1 -> relu1 -> flatten -> fc1, PyTorch's names for a small CNN.
std::shared_ptr<Sequential> small_cnn(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<Sequential>(Sequential::NamedModules{
      {"conv1", std::make_shared<Conv2d>(1, 2, std::array<int64_t, 2>{3, 3}, gen)},
      {"bn1", std::make_shared<BatchNorm2d>(2)},
      {"relu1", std::make_shared<ReLU>()},
      {"flatten", std::make_shared<Flatten>()},
      {"fc1", std::make_shared<Linear>(8, 3, gen)}});
}

std::vector<std::string> names(const NamedTensors& v) {
  std::vector<std::string> out;
  for (const auto& [n, t] : v) out.push_back(n);
  return out;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  return va.size() == vb.size() && std::memcmp(va.data(), vb.data(), va.size() * 8) == 0;
}

TEST_F(Weights, RoundTripUnderTheModulesOwnNames) {
  auto a = small_cnn(1);
  a->train();
  (*a)(ones({2, 1, 4, 4}));  // moves bn1's running statistics off their initial values
  save_weights(*a, file());

  // The file holds the state_dict as it is, names unprefixed: what torch's load_file expects.
  const SafetensorsFile f = load_safetensors(file());
  const std::vector<std::string> expected{"conv1.weight",
                                          "conv1.bias",
                                          "bn1.weight",
                                          "bn1.bias",
                                          "bn1.running_mean",
                                          "bn1.running_var",
                                          "bn1.num_batches_tracked",
                                          "fc1.weight",
                                          "fc1.bias"};
  EXPECT_EQ(names(f.tensors), expected);
  EXPECT_EQ(f.tensors[6].second.dtype(), DType::i64);

  auto b = small_cnn(2);
  const IncompatibleKeys keys = load_weights(*b, file());
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_TRUE(keys.unexpected_keys.empty());
  const NamedTensors sa = a->state_dict(), sb = b->state_dict();
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(bit_equal(sa[i].second, sb[i].second)) << i;
  EXPECT_EQ(sb[6].second.dtype(), DType::i64);
}

TEST_F(Weights, StrictLoadListsMissingUnexpectedAndMismatchedKeysAndChangesNothing) {
  auto a = small_cnn(1);
  NamedTensors state = a->state_dict();
  state.erase(state.begin() + 1);                  // conv1.bias missing
  state.emplace_back("fc2.weight", zeros({1}));    // unexpected
  state[state.size() - 2].second = zeros({4, 4});  // fc1.bias: wrong shape
  save_safetensors(file(), state);

  auto b = small_cnn(2);
  const Tensor before = b->state_dict()[0].second.clone();
  const std::string e = error_of([&] { load_weights(*b, file()); });
  EXPECT_EQ(e, file() +
                   ": Error(s) in loading state_dict for Sequential: Missing key(s) in state_dict: "
                   "\"conv1.bias\"; Unexpected key(s) in state_dict: \"fc2.weight\"; size "
                   "mismatch for fc1.bias: copying a param with shape [4, 4] from checkpoint, the "
                   "shape in current model is [3]");
  EXPECT_TRUE(bit_equal(b->state_dict()[0].second, before));  // conv1.weight untouched
}

TEST_F(Weights, NonStrictLoadCopiesWhatMatchesAndReturnsTheRest) {
  auto a = small_cnn(1);
  NamedTensors state;
  for (const auto& [n, t] : a->state_dict()) {
    if (n.rfind("fc1.", 0) == 0) state.emplace_back(n, t);  // only the classifier
  }
  state.emplace_back("fc2.bias", zeros({3}));
  save_safetensors(file(), state);

  auto b = small_cnn(2);
  const Tensor conv_before = b->state_dict()[0].second.clone();
  const IncompatibleKeys keys = load_weights(*b, file(), /*strict=*/false);
  EXPECT_EQ(
      keys.missing_keys,
      (std::vector<std::string>{"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias",
                                "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"}));
  EXPECT_EQ(keys.unexpected_keys, (std::vector<std::string>{"fc2.bias"}));
  const NamedTensors sa = a->state_dict(), sb = b->state_dict();
  EXPECT_TRUE(bit_equal(sb[7].second, sa[7].second));  // fc1.weight copied
  EXPECT_TRUE(bit_equal(sb[0].second, conv_before));   // conv1.weight kept

  // A shape mismatch is an error even without strict (as in PyTorch).
  state[0].second = zeros({1, 8});
  save_safetensors(file(), state);
  EXPECT_NE(error_of([&] { load_weights(*b, file(), false); }).find("size mismatch for fc1.weight"),
            std::string::npos);
}

TEST_F(Weights, CheckpointsAndMissingFilesAreClearErrors) {
  auto a = small_cnn(1);
  save_checkpoint(file("c.safetensors"), *a, nullptr, nullptr, {});
  EXPECT_NE(error_of([&] { load_weights(*a, file("c.safetensors")); })
                .find("a training checkpoint (its weights are under model.*): load it with "
                      "nn::load_checkpoint"),
            std::string::npos);
  const std::string e = error_of([&] { load_weights(*a, file("absent.safetensors")); });
  EXPECT_NE(e.find(file("absent.safetensors")), std::string::npos) << e;
}

}  // namespace
}  // namespace rg::nn
