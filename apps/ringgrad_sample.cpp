// ringgrad-sample: text from a character-level GPT that ringgrad-train saved (--checkpoint or
// --snapshot of a --dataset text run), as minGPT's chargpt samples: the prompt, then new
// characters one at a time (greedy with --temperature 0, else drawn from the top-k).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <string>

#include "data/text.h"
#include "engine/device.h"
#include "engine/generator.h"
#include "engine/serialization.h"
#include "kernels/error.h"
#include "layers/checkpoint.h"
#include "layers/models/gpt.h"
#include "layers/models/registry.h"

namespace {

std::string entry(const rg::nn::Metadata& meta, const std::string& key, const std::string& path) {
  const auto it = meta.find(key);
  RG_CHECK(it != meta.end(), path, " has no '", key,
           "' entry: it is not a checkpoint of a ringgrad-train --dataset text run with a gpt-* "
           "model");
  return it->second;
}

}  // namespace

int main(int argc, char** argv) {
  std::string checkpoint, prompt = "\n", device_name = "cpu";
  int64_t tokens = 200, top_k = 0;
  double temperature = 1.0;
  uint64_t seed = 1;
  CLI::App app{"ringgrad-sample: generate text with a GPT trained by ringgrad-train"};
  app.option_defaults()->always_capture_default();
  app.add_option("--checkpoint", checkpoint,
                 "a --checkpoint or --snapshot file of a ringgrad-train --dataset text run")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--prompt", prompt,
                 "the text to continue (its characters must be in the "
                 "training text's vocabulary)");
  app.add_option("--tokens", tokens, "how many characters to generate")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", temperature, "softmax temperature; 0 is greedy (argmax)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", top_k, "draw from the k most likely characters only (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "seed of the draws");
  app.add_option("--device", device_name, "cpu, cuda or cuda:N");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ringgrad-sample: " << e.what() << "\nRun with --help for usage.\n";
    return 2;
  }
  try {
    // The run's shape (model, vocabulary, block size) is in the file's metadata.
    const rg::nn::Metadata meta = rg::load_safetensors(checkpoint).metadata;
    const std::string model_name = entry(meta, "run.model", checkpoint);
    const rg::data::CharVocab vocab =
        rg::data::CharVocab::from_utf8(entry(meta, "run.text.vocab", checkpoint));
    const int64_t block_size = std::stoll(entry(meta, "run.text.block_size", checkpoint));
    const auto tie = meta.find("run.model.tie_weights");
    auto module = rg::nn::make_model({.name = model_name,
                                      .sample_shape = {block_size},
                                      .num_classes = vocab.size(),
                                      .dropout = false,
                                      .tie_weights = tie != meta.end() && tie->second == "1"});
    auto* gpt = dynamic_cast<rg::nn::GPT*>(module.get());
    RG_CHECK(gpt != nullptr, checkpoint, " holds a ", model_name,
             ", not a GPT: ringgrad-sample samples text from gpt-* models");
    rg::NamedTensors extra;  // a snapshot's DDP state, not needed here
    rg::nn::load_checkpoint(checkpoint, *module, nullptr, nullptr, {}, &extra);
    module->to(rg::parse_device(device_name));
    const std::vector<int64_t> ids = vocab.encode(prompt);
    rg::Generator gen(seed);
    std::cout << prompt << std::flush;
    gpt->generate(ids, tokens, temperature, top_k, gen, [&](int64_t id) {
      std::cout << vocab.decode(std::span<const int64_t>(&id, 1)) << std::flush;
    });
    std::cout << "\n";
  } catch (const rg::Error& e) {
    std::cout.flush();
    std::cerr << "ringgrad-sample: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "ringgrad-sample: internal error: " << e.what() << "\n";
    return 70;
  }
  return 0;
}
