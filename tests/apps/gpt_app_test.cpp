// The minGPT path end to end through the real programs, on a small UTF-8 text (multibyte
// characters included) that the tests write: ringgrad-train --model gpt-nano --dataset text over
// 2 ranks with minGPT's recipe (AdamW, decoupled decay on Linear weights, beta2 0.95, clipping,
// cosine schedule with warm-up), ringgrad-sample on its checkpoint (greedy and top-k draws, bad
// prompts and files), a kill and restart from snapshots, autocast on the CPU, the emulated CUDA
// device (one process and 2 ranks over the emulated NCCL; ranks that share a GPU refused) and the
// usage errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "apps/common/trainer.h"
#include "data/text.h"
#include "engine/serialization.h"
#include "support/processes.h"
#include "support/restart_checks.h"
#include "support/scratch_dir.h"

namespace rg::app {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;

// 4000 characters of sentences in a fixed pseudo-random order: ASCII, Latin letters with
// diacritics (2 bytes), CJK and a check mark (3 bytes); no 'Z' and no '€' (the tests' characters
// outside the vocabulary).
std::u32string sample_text() {
  const std::u32string sentences[] = {
      U"the quick brown fox jumps over the lazy dog.\n",
      U"a naïve café serves crème brûlée, très bien!\n", U"größer als ein Bär, sagt Ærøskøbing.\n",
      U"日本語の文も少し ✓\n",
      U"she sells sea shells by the sea shore; the shells she sells are sea shells.\n"};
  std::u32string text;
  uint32_t state = 7;
  while (text.size() < 4000) {
    state = state * 1103515245u + 12345u;
    text += sentences[(state >> 16) % std::size(sentences)];
  }
  text.resize(4000);  // 3600 train and 400 validation characters
  return text;
}

// The text's characters, sorted and distinct (minGPT's sorted(list(set(data)))), as UTF-8.
std::string sorted_vocab(const std::u32string& text) {
  const std::set<char32_t> chars(text.begin(), text.end());
  return data::encode_utf8(std::u32string(chars.begin(), chars.end()));
}

class GptApp : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    text_ = sample_text();
    std::ofstream(text_file_ = path("text.txt"), std::ios::binary) << data::encode_utf8(text_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // `program` with `args`, its output and exit code (one compute thread per process).
  ProcessResult run(const std::string& program, const std::vector<std::string>& args,
                    std::vector<std::string> env = {}) const {
    std::vector<std::string> argv = {program};
    argv.insert(argv.end(), args.begin(), args.end());
    env.push_back("RG_NUM_THREADS=1");
    return testing::run_processes({{argv, env}}, dir_, 240)[0];
  }
  // ringgrad-run (with `launcher` flags) over `ranks` ranks of `train` (ringgrad-train or
  // ringgrad-train-emu).
  ProcessResult run_ranks(int ranks, const std::string& train, const std::vector<std::string>& args,
                          std::vector<std::string> env = {},
                          const std::vector<std::string>& launcher = {}) const {
    std::vector<std::string> all = {"--nproc-per-node", std::to_string(ranks), "--master-port",
                                    "0"};
    all.insert(all.end(), launcher.begin(), launcher.end());
    all.push_back(train);
    all.insert(all.end(), args.begin(), args.end());
    return run(RG_RUN_BINARY, all, std::move(env));
  }
  // gpt-nano on the text: blocks of 16, batch 8 per rank, `steps` steps per epoch, the whole
  // validation split (24 blocks) evaluated in one batch, then `more`.
  std::vector<std::string> gpt_args(int steps, int epochs, std::vector<std::string> more) const {
    std::vector<std::string> args = {"--data-file",         text_file_, "--steps-per-epoch",
                                     std::to_string(steps), "--epochs", std::to_string(epochs)};
    std::istringstream fixed(
        "--model gpt-nano --dataset text --block-size 16 --batch-size 8 --test-batch-size 64 "
        "--workers 0 --seed 3");
    for (std::string w; fixed >> w;) args.push_back(w);
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }
  // The same for train() in this process: one process, batch `batch_size`, `steps` steps an epoch.
  TrainConfig gpt_config(int64_t batch_size, int64_t steps) const {
    TrainConfig c;
    c.model = "gpt-nano";
    c.dataset = "text";
    c.data_file = text_file_;
    c.block_size = 16;
    c.batch_size = batch_size;
    c.steps_per_epoch = steps;
    c.optimizer = "adamw";
    c.lr = 3e-3;
    c.workers = 0;
    return c;
  }
  ProcessResult sample(const std::vector<std::string>& args) const {
    return run(RG_SAMPLE_BINARY, args);
  }

  std::u32string text_;
  std::string text_file_;
};

std::vector<nlohmann::json> metrics_lines(const std::string& path, const std::string& type) {
  std::ifstream f(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["type"] == type) lines.push_back(j);
  }
  return lines;
}

double final_test_loss(const std::string& metrics_path) {
  const auto lines = metrics_lines(metrics_path, "final");
  return lines.empty() ? std::nan("") : lines.back()["test_loss"].get<double>();
}

// minGPT's recipe over 2 ranks: tokens per second in the progress, the two weight-decay groups
// (the 13 Linear weights decay, the other 28 tensors not), a validation loss that falls from epoch
// 1 to 3 and the text's vocabulary in the checkpoint.
TEST_F(GptApp, TwoRankMinGptRecipeLearnsAndSavesTheVocabulary) {
  const ProcessResult r = run_ranks(2, RG_TRAIN_BINARY,
                                    gpt_args(10, 3,
                                             {"--optimizer",
                                              "adamw",
                                              "--lr",
                                              "3e-3",
                                              "--weight-decay",
                                              "0.1",
                                              "--adam-beta2",
                                              "0.95",
                                              "--clip-grad-norm",
                                              "1",
                                              "--lr-schedule",
                                              "cosine",
                                              "--warmup-epochs",
                                              "0.5",
                                              "--eval-samples",
                                              "20",
                                              "--checkpoint",
                                              path("run.safetensors"),
                                              "--metrics",
                                              path("metrics.jsonl")}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("tok/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ringgrad-train: weight decay 0.1 on 13 tensors ("), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(", 0 on 28 tensors ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DDP over 2 ranks"), std::string::npos) << r.out;
  const auto epochs = metrics_lines(path("metrics.jsonl"), "epoch");
  ASSERT_EQ(epochs.size(), 3u) << r.out;
  const double first = epochs[0]["test_loss"], last = epochs[2]["test_loss"];
  EXPECT_LT(last, first - 0.05) << r.out;
  EXPECT_GT(epochs[0]["tokens_per_s"].get<double>(), 0.0);
  const auto meta = load_safetensors(path("run.safetensors")).metadata;
  ASSERT_TRUE(meta.count("run.text.vocab"));
  EXPECT_EQ(meta.at("run.text.vocab"), sorted_vocab(text_));
  EXPECT_EQ(meta.at("run.text.block_size"), "16");
  EXPECT_EQ(meta.at("run.model"), "gpt-nano");
}

// ringgrad-sample on a checkpoint trained here (one process, in this process).
class GptSample : public GptApp {
 protected:
  void SetUp() override {
    GptApp::SetUp();
    TrainConfig c = gpt_config(16, 30);
    c.eval_samples = 8;
    c.checkpoint_path = checkpoint_ = path("gpt.safetensors");
    std::ostringstream log;
    train(c, log);
  }
  // The generated text of a successful run, after checking that it is the prompt and then
  // `tokens` characters of the vocabulary (and a newline).
  std::string expect_sample(const std::string& prompt, int tokens,
                            const std::vector<std::string>& more) {
    std::vector<std::string> args = {"--checkpoint", checkpoint_, "--prompt",
                                     prompt,         "--tokens",  std::to_string(tokens)};
    args.insert(args.end(), more.begin(), more.end());
    const ProcessResult r = sample(args);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_TRUE(r.out.starts_with(prompt)) << r.out;
    EXPECT_TRUE(r.out.ends_with("\n")) << r.out;
    if (!r.out.starts_with(prompt) || !r.out.ends_with("\n")) return "";
    const std::string generated = r.out.substr(prompt.size(), r.out.size() - prompt.size() - 1);
    const std::u32string chars = data::decode_utf8(generated);
    EXPECT_EQ(chars.size(), size_t(tokens)) << r.out;
    for (const char32_t ch : chars)
      EXPECT_NE(text_.find(ch), std::u32string::npos) << "U+" << std::hex << uint32_t(ch);
    return generated;
  }
  std::string checkpoint_;
};

TEST_F(GptSample, GreedyIsDeterministicAndTopKDrawsFollowTheSeed) {
  const std::string prompt = "the café ";  // a 2-byte character in the prompt
  const std::string greedy = expect_sample(prompt, 60, {"--temperature", "0"});
  EXPECT_EQ(expect_sample(prompt, 60, {"--temperature", "0", "--seed", "9"}), greedy)
      << "greedy decoding draws nothing";
  const std::vector<std::string> top3 = {"--temperature", "1", "--top-k", "3", "--seed"};
  std::vector<std::string> seed1 = top3, seed2 = top3;
  seed1.push_back("1");
  seed2.push_back("2");
  const std::string a = expect_sample(prompt, 60, seed1);
  EXPECT_EQ(expect_sample(prompt, 60, seed1), a);
  EXPECT_NE(expect_sample(prompt, 60, seed2), a);
  EXPECT_EQ(expect_sample("日本", 0, {}), "");
}

TEST_F(GptSample, BadPromptsAndFilesAreClearErrors) {
  ProcessResult r = sample({"--checkpoint", checkpoint_, "--prompt", "the Zebra"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("character 'Z' (U+005A) at byte offset 4 is not in the vocabulary"),
            std::string::npos)
      << r.out;
  r = sample({"--checkpoint", checkpoint_, "--prompt", "the €"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("character '€' (U+20AC) at byte offset 4 is not in the vocabulary"),
            std::string::npos)
      << r.out;

  // A checkpoint of a classifier run on synthetic images has no vocabulary.
  const ProcessResult mlp =
      run(RG_TRAIN_BINARY,
          {"--model", "mlp", "--dataset", "synthetic", "--steps-per-epoch", "2", "--eval-samples",
           "10", "--workers", "0", "--checkpoint", path("mlp.safetensors")});
  ASSERT_EQ(mlp.exit_code, 0) << mlp.out;
  r = sample({"--checkpoint", path("mlp.safetensors")});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("has no 'run.text.vocab' entry"), std::string::npos) << r.out;

  r = sample({"--checkpoint", path("missing.safetensors")});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("File does not exist"), std::string::npos) << r.out;

  // Runtime errors with the reason, exit 1: an empty prompt, a prompt that is not UTF-8, a file
  // that is not safetensors.
  const std::vector<std::pair<std::vector<std::string>, std::string>> errors = {
      {{"--checkpoint", checkpoint_, "--prompt", ""}, "the prompt is empty"},
      {{"--checkpoint", checkpoint_, "--prompt", "the \xff"},
       "invalid UTF-8 at byte offset 4: byte 0xFF cannot start a character"},
      {{"--checkpoint", text_file_}, "not a safetensors file"}};
  for (const auto& [args, message] : errors) {
    r = sample(args);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << "expected '" << message << "'\n" << r.out;
  }
}

// A rank killed after step 5 (two steps after the snapshot of step 4, mid-epoch) under ringgrad-run
// --max-restarts 1: the job resumes from that snapshot, dropout generators included, and its final
// snapshot is the uninterrupted run's, byte for byte.
TEST_F(GptApp, KilledRankResumesFromTheSnapshotBitIdentical) {
  const auto args = [&](const std::string& snapshot) {
    return gpt_args(6, 2,
                    {"--optimizer", "adamw", "--lr", "3e-3", "--weight-decay", "0.1",
                     "--clip-grad-norm", "1", "--lr-schedule", "cosine", "--warmup-epochs", "0.5",
                     "--eval-samples", "8", "--snapshot", path(snapshot), "--snapshot-every", "4"});
  };
  const ProcessResult clean = run_ranks(2, RG_TRAIN_BINARY, args("clean.safetensors"));
  ASSERT_EQ(clean.exit_code, 0) << clean.out;
  const ProcessResult faulted = run_ranks(2, RG_TRAIN_BINARY, args("faulted.safetensors"),
                                          {"RG_TEST_FAULT=step:5:1"}, {"--max-restarts", "1"});
  testing::expect_restarted_once(faulted);
  EXPECT_NE(faulted.out.find("in epoch 1 after 4 of its steps (step 4)"), std::string::npos)
      << faulted.out;
  const SafetensorsFile snapshot = load_safetensors(path("clean.safetensors"));
  bool has_dropout_state = false;
  for (const auto& [name, t] : snapshot.tensors) has_dropout_state |= name.starts_with("rng.");
  EXPECT_TRUE(has_dropout_state) << "the snapshot holds no dropout generator";
  EXPECT_TRUE(testing::file_contents(path("clean.safetensors")) ==
              testing::file_contents(path("faulted.safetensors")))
      << "the final snapshots differ\n"
      << faulted.out;
  // ringgrad-sample reads snapshots too (their DDP state is left aside).
  const ProcessResult sampled =
      sample({"--checkpoint", path("faulted.safetensors"), "--prompt", "sea", "--tokens", "20"});
  EXPECT_EQ(sampled.exit_code, 0) << sampled.out;
  EXPECT_TRUE(sampled.out.starts_with("sea")) << sampled.out;
}

// --amp bf16 and f16 on the CPU: autocast's half compute in the forward, f32 master weights (f16
// with the dynamic GradScaler); the run trains, its losses are finite and its final one is near
// (not equal to) the f32 run's.
TEST_F(GptApp, HalfAutocastOnTheCpuTrains) {
  std::ostringstream log;
  TrainConfig c = gpt_config(8, 10);
  c.epochs = 2;
  const TrainResult f32 = train(c, log);
  for (const char* amp : {"bf16", "f16"}) {
    c.amp = amp;
    const TrainResult r = train(c, log);
    ASSERT_EQ(r.epochs.size(), 2u) << amp;
    for (const EpochSummary& e : r.epochs) {
      EXPECT_TRUE(std::isfinite(e.train_loss)) << amp << log.str();
      EXPECT_TRUE(std::isfinite(e.test_loss)) << amp << log.str();
    }
    // Below the untrained model's loss, about ln(vocabulary size).
    const double vocab_size = double(data::decode_utf8(sorted_vocab(text_)).size());
    EXPECT_LT(r.final_test_loss, std::log(vocab_size) - 0.3) << amp << log.str();
    // Rounded differently from the f32 run (autocast took effect), but close to it.
    EXPECT_NE(r.final_test_loss, f32.final_test_loss) << amp;
    EXPECT_NEAR(r.final_test_loss, f32.final_test_loss, 0.05 * f32.final_test_loss) << amp;
  }
}

// The CUDA code path (embedding, fused attention, layer norm, GELU, cuBLAS GEMMs, fused AdamW,
// clipping) on the emulated device, in one process and over 2 ranks with the emulated NCCL:
// the final validation loss is the CPU run's up to the f32 sums' order.
TEST_F(GptApp, EmulatedCudaDeviceTrainsLikeTheCpu) {
  const auto args = [&](const std::string& metrics, std::vector<std::string> device) {
    std::vector<std::string> more = {
        "--optimizer",      "adamw", "--lr",           "3e-3", "--weight-decay", "0.1",
        "--clip-grad-norm", "1",     "--eval-samples", "8",    "--metrics",      path(metrics)};
    more.insert(more.end(), device.begin(), device.end());
    return gpt_args(4, 1, more);
  };
  const ProcessResult cpu = run(RG_TRAIN_BINARY, args("cpu.jsonl", {}));
  ASSERT_EQ(cpu.exit_code, 0) << cpu.out;
  const ProcessResult emu = run(RG_TRAIN_EMU_BINARY, args("emu.jsonl", {"--device", "cuda"}));
  ASSERT_EQ(emu.exit_code, 0) << emu.out;
  EXPECT_NE(emu.out.find("on cuda:0"), std::string::npos) << emu.out;
  const double l_cpu = final_test_loss(path("cpu.jsonl")),
               l_emu = final_test_loss(path("emu.jsonl"));
  EXPECT_NEAR(l_emu, l_cpu, 1e-3 * l_cpu) << emu.out;

  const ProcessResult cpu2 = run_ranks(2, RG_TRAIN_BINARY, args("cpu2.jsonl", {}));
  ASSERT_EQ(cpu2.exit_code, 0) << cpu2.out;
  const ProcessResult emu2 = run_ranks(
      2, RG_TRAIN_EMU_BINARY, args("emu2.jsonl", {"--device", "cuda", "--backend", "nccl"}),
      {"RG_EMU_DEVICES=2"});  // one emulated GPU per rank: NCCL refuses two ranks on one
  ASSERT_EQ(emu2.exit_code, 0) << emu2.out;
  EXPECT_NE(emu2.out.find("DDP over 2 ranks (nccl"), std::string::npos) << emu2.out;
  const double l_cpu2 = final_test_loss(path("cpu2.jsonl"));
  const double l_emu2 = final_test_loss(path("emu2.jsonl"));
  EXPECT_NEAR(l_emu2, l_cpu2, 1e-3 * l_cpu2) << emu2.out;
  std::cout << "final test loss, 1 process: " << l_cpu << " (cpu), " << l_emu
            << " (emulated cuda); 2 ranks: " << l_cpu2 << " (gloo), " << l_emu2
            << " (emulated nccl)\n";
}

// Ranks that share an emulated GPU (fewer emulated devices than ranks) are named before NCCL is
// called: every process exits 1 with one line naming the ranks and the GPU's UUID, none waits in
// NCCL's init. 2 ranks on 1 GPU and 4 on 2, started by hand (rank 0 hosts the store, so it must
// stay until the others have read it) and through ringgrad-run.
TEST_F(GptApp, EmulatedCudaRanksSharingAGpuAreNamed) {
  const std::vector<std::string> args =
      gpt_args(2, 1, {"--device", "cuda", "--backend", "nccl", "--timeout-s", "60"});
  const std::string uuid =
      "\\((GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\\)";
  const auto by_hand = [&](int ranks, int gpus) {
    const std::string port = std::to_string(testing::free_port());
    std::vector<testing::ProcessSpec> specs;
    for (int r = 0; r < ranks; ++r) {
      std::vector<std::string> argv = {RG_TRAIN_EMU_BINARY};
      argv.insert(argv.end(), args.begin(), args.end());
      specs.push_back(
          {argv,
           {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(ranks),
            "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(ranks),
            "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
            "RG_EMU_DEVICES=" + std::to_string(gpus), "RG_NUM_THREADS=1"}});
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<ProcessResult> results = testing::run_processes(specs, dir_, 60);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(seconds, 30) << ranks << " ranks on " << gpus << " GPU(s) took " << seconds << " s";
    return results;
  };
  const std::string fix = "NCCL needs one GPU per rank; start at most ";
  const std::string what = " \\(--nproc-per-node\\) or use --backend gloo\n";
  // Each process's own exit code and output: the same line on every rank.
  const std::regex one("ringgrad-train: error: ranks 0 and 1 both use GPU 0 " + uuid + ": " + fix +
                       "1 rank per node" + what);
  for (const ProcessResult& r : by_hand(2, 1)) {
    EXPECT_FALSE(r.timed_out) << r.out;
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_TRUE(std::regex_search(r.out, one)) << r.out;
    EXPECT_EQ(r.out.find("ncclCommInitRank"), std::string::npos) << r.out;
  }
  const std::regex pairs("ringgrad-train: error: ranks 0 and 2 both use GPU 0 " + uuid +
                         "; ranks 1 and 3 both use GPU 1 " + uuid + ": " + fix +
                         "2 ranks per node" + what);
  std::set<std::string> uuids;
  for (const ProcessResult& r : by_hand(4, 2)) {
    EXPECT_FALSE(r.timed_out) << r.out;
    EXPECT_EQ(r.exit_code, 1) << r.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, pairs)) << r.out;
    uuids.insert(m[1]);
    uuids.insert(m[2]);
  }
  EXPECT_EQ(uuids.size(), 2u) << "every process names the same two GPUs";
  // What a user of ringgrad-run sees: the line with the rank's prefix, and a failed exit.
  const ProcessResult launched = run_ranks(2, RG_TRAIN_EMU_BINARY, args, {"RG_EMU_DEVICES=1"});
  EXPECT_NE(launched.exit_code, 0) << launched.out;
  EXPECT_TRUE(std::regex_search(launched.out, one)) << launched.out;
}

// Usage errors exit 2 before any training; a data set or model that does not fit exits 1 naming
// what is wrong.
TEST_F(GptApp, UsageAndShapeErrors) {
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--model", "gpt-nano", "--dataset", "text"}, 2, "--dataset text needs --data-file FILE"},
      {{"--model", "mlp", "--dataset", "synthetic", "--data-file", text_file_},
       2,
       "--data-file is for --dataset text"},
      {gpt_args(2, 1, {"--weight-decay-groups", "bogus"}), 2,
       "--weight-decay-groups: bogus not in"},
      {{"--model", "gpt-nano", "--dataset", "synthetic"},
       1,
       "model gpt-nano expects token sequences (samples of shape [block_size], e.g. --dataset "
       "text), got [1, 28, 28]"},
      {{"--model", "gpt-nano", "--dataset", "text", "--data-file", text_file_, "--block-size",
        "1000"},
       1,
       ": the validation split has 400 characters, too few for one sample of block_size 1000 "
       "(needs 1001)"}};
  for (const Case& c : cases) {
    const ProcessResult r = run(RG_TRAIN_BINARY, c.args);
    EXPECT_EQ(r.exit_code, c.code) << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << "expected '" << c.message << "'\n"
                                                        << r.out;
  }
}

}  // namespace
}  // namespace rg::app
