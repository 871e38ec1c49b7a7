// Oracle test: our GPT and minGPT's in PyTorch (examples/torch_models.py) are the same function
// of the same weights, in both directions, through the safetensors files of nn::save_weights and
// nn::load_weights (strict on both sides). examples/check_gpt_in_pytorch.py is PyTorch's side; it
// runs under Debian's /usr/bin/python3 and each test skips, saying so, when that cannot import
// torch. gpt-nano, vocabulary 11, block 16, f32, eval mode; with and without the tied head.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/serialization.h"
#include "layers/models/gpt.h"
#include "layers/weights.h"

namespace rg::nn {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 11, kBlock = 16, kBatch = 2;
constexpr double kTol = 1e-5;  // atol and rtol, as the script's

bool torch_available() {
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

GptConfig nano(bool tie) {
  GptConfig c = gpt_config("gpt-nano", kVocab, kBlock);
  c.embd_pdrop = c.resid_pdrop = c.attn_pdrop = 0.0;
  c.tie_weights = tie;
  return c;
}

class GptTorch : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!torch_available())
      GTEST_SKIP() << "/usr/bin/python3 cannot import torch (apt-get install python3-torch)";
    dir_ = fs::temp_directory_path() /
           ("rg_gpt_torch_" + std::to_string(::getpid()) + (GetParam() ? "_tied" : "_untied"));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // check_gpt_in_pytorch.py DIRECTION dir_ [--tie] EXTRA; its exit status.
  int script(const std::string& direction, const std::string& extra = "") const {
    const std::string cmd = "/usr/bin/python3 " RG_SOURCE_DIR "/examples/check_gpt_in_pytorch.py " +
                            direction + " " + dir_.string() + (GetParam() ? " --tie " : " ") +
                            extra;
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  fs::path dir_;
};

TEST_P(GptTorch, OurWeightsGiveOurLogitsAndLossInPytorch) {
  Generator gen(42);
  GPT model(nano(GetParam()), gen);
  model.eval();
  {  // minGPT's init leaves attention nearly uniform and logits near 0: widen every parameter
    NoGradGuard no_grad;
    for (Tensor p : model.parameters()) p.copy_(mul(randn(p.shape(), gen), 0.5));
  }
  std::vector<int64_t> ids, targets;
  for (int64_t i = 0; i < kBatch * kBlock; ++i) {
    ids.push_back((i * 7 + 3) % kVocab);
    targets.push_back((i * 5 + 1) % kVocab);
  }
  const Tensor idx = from_vector(ids, {kBatch, kBlock});
  const Tensor tgt = from_vector(targets, {kBatch, kBlock});
  const Tensor logits = model.forward(idx);
  const Tensor loss = cross_entropy(logits.view({kBatch * kBlock, kVocab}), tgt.view({-1}));
  save_weights(model, (dir_ / "gpt.safetensors").string());
  save_safetensors((dir_ / "gpt_io.safetensors").string(),
                   {{"idx", idx}, {"targets", tgt}, {"logits", logits}, {"loss", loss}});
  EXPECT_EQ(script("from-ringgrad"), 0) << "PyTorch disagrees (its output is above)";
}

TEST_P(GptTorch, PytorchWeightsGivePytorchLogitsHere) {
  ASSERT_EQ(script("to-ringgrad", "--seed 7"), 0);
  Generator gen(1);  // any init: every tensor is overwritten
  GPT model(nano(GetParam()), gen);
  model.eval();
  load_weights(model, (dir_ / "gpt.safetensors").string(), /*strict=*/true);
  if (GetParam()) {  // still one parameter under both names
    EXPECT_EQ(model.lm_head->weight.impl(), model.transformer->wte->weight.impl());
  }
  Tensor idx, expected;
  for (auto& [name, t] : load_safetensors((dir_ / "gpt_io.safetensors").string()).tensors)
    (name == "idx" ? idx : expected) = t;
  ASSERT_EQ(idx.shape(), (Shape{kBatch, kBlock}));
  const std::vector<double> ours = model.forward(idx).to_vector<double>();
  const std::vector<double> theirs = expected.to_vector<double>();
  ASSERT_EQ(ours.size(), theirs.size());
  double max_diff = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double d = std::abs(ours[i] - theirs[i]);
    max_diff = std::max(max_diff, d);
    EXPECT_LE(d, kTol + kTol * std::abs(theirs[i])) << "logit " << i;
    if (d > kTol + kTol * std::abs(theirs[i])) break;
  }
  std::cout << "PyTorch's logits here: max |diff| " << max_diff << "\n";
}

INSTANTIATE_TEST_SUITE_P(Head, GptTorch, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "tied" : "untied"; });

}  // namespace
}  // namespace rg::nn
