// minGPT's chargpt from C++: a character-level GPT trained on a text file, then asked to continue
// a prompt. The recipe is minGPT's (projects/chargpt): AdamW (betas 0.9/0.95, weight decay 0.1 on
// the Linear weights only), gradient clipping at norm 1, here with warm-up and cosine decay.
//
//   scripts/get-data.sh kjv                 # puts the King James Bible into data/kjv/kjv.txt
//   ./mingpt_char --steps 2000 --out gpt-run
//   ringgrad-run --nproc-per-node 2 ./mingpt_char --steps 1000   # the same, data-parallel
//
// Under ringgrad-run each rank trains on its own share of every epoch (DistributedSampler) and
// DistributedDataParallel averages the gradients; only rank 0 prints, saves and samples.
// <out>/gpt.safetensors holds the state_dict under minGPT's names, for PyTorch's
// safetensors.torch.load_file + load_state_dict (minGPT's causal-mask buffers aside; see
// check_gpt_in_pytorch.py). ringgrad-train --model gpt-nano --dataset text: this recipe as an app.
#include <ringgrad/comm/ddp.h>
#include <ringgrad/comm/env.h>
#include <ringgrad/comm/init.h>
#include <ringgrad/data/dataloader.h>
#include <ringgrad/data/sampler.h>
#include <ringgrad/data/text.h>
#include <ringgrad/engine/autograd/grad_mode.h>
#include <ringgrad/engine/error.h>
#include <ringgrad/engine/generator.h>
#include <ringgrad/engine/ops/loss.h>
#include <ringgrad/layers/clip_grad.h>
#include <ringgrad/layers/models/gpt.h>
#include <ringgrad/layers/optim/lr_schedule.h>
#include <ringgrad/layers/optim/optimizer.h>
#include <ringgrad/layers/optim/param_groups.h>
#include <ringgrad/layers/weights.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "example_args.h"

using namespace rg;

// The mean loss over the first `max_batches` validation batches, in eval mode (no dropout) and
// without recording a graph. Every rank computes the same number: no communication needed.
double validation_loss(nn::GPT& model, const std::shared_ptr<data::CharDataset>& val_set,
                       int64_t batch_size, int64_t max_batches) {
  NoGradGuard no_grad;
  model.eval();
  data::DataLoader loader(val_set, std::make_shared<data::SequentialSampler>(val_set->size()),
                          {.batch_size = batch_size, .workers = 0});
  loader.start_epoch(0);
  double sum = 0;
  int64_t n = 0;
  for (auto batch = loader.next(); batch && n < max_batches; batch = loader.next(), ++n) {
    const Tensor logits = model.forward(batch->inputs);
    sum += cross_entropy(logits.view({-1, logits.size(-1)}), batch->targets.view({-1})).item();
  }
  model.train();
  return n > 0 ? sum / double(n) : 0.0;
}

int run(int argc, char** argv) {
  const examples::Args args(argc, argv,
                            {{"data-file", "data/kjv/kjv.txt"},
                             {"model", "gpt-nano"},
                             {"steps", "500"},
                             {"batch-size", "64"},
                             {"block-size", "128"},
                             {"lr", "2e-3"},
                             {"warmup-steps", "50"},
                             {"eval-every", "100"},
                             {"out", "mingpt-out"},
                             {"prompt", "And God said"},
                             {"sample-tokens", "200"}});
  const int64_t steps = args.integer("steps"), batch_size = args.integer("batch-size");
  const int64_t block_size = args.integer("block-size"), eval_every = args.integer("eval-every");
  const double lr = args.real("lr");
  const std::string text = args.str("data-file");
  if (!std::filesystem::exists(text))
    throw Error(text + ": no such file; run scripts/get-data.sh kjv or pass --data-file");

  // Under ringgrad-run (WORLD_SIZE > 1) join the job; alone, train without DDP.
  const dist::LaunchEnv env = dist::read_launch_env();
  const bool distributed = env.world_size > 1;
  if (distributed) dist::init_process_group(env, {});
  const int rank = env.rank, world = env.world_size;
  const bool lead = rank == 0;

  // The first 90% of the characters for training (a sample at every offset), the rest for
  // validation; both splits share the vocabulary of the whole file.
  auto train_set = std::make_shared<data::CharDataset>(text, block_size, data::TextSplit::train);
  auto val_set = std::make_shared<data::CharDataset>(text, block_size, data::TextSplit::validation);
  const data::CharVocab& vocab = train_set->vocab();
  std::shared_ptr<data::Sampler> sampler;
  if (distributed)
    sampler = std::make_shared<data::DistributedSampler>(train_set->size(), world, rank,
                                                         /*shuffle=*/true, /*seed=*/0);
  else
    sampler = std::make_shared<data::RandomSampler>(train_set->size(), /*seed=*/0);
  data::DataLoader loader(train_set, sampler, {.batch_size = batch_size, .workers = 2});

  // The model: minGPT's named sizes (gpt-nano: 3 layers, 3 heads, 48 wide), its init and dropout.
  Generator init_gen(42);  // the same initial weights on every rank and every run
  auto model = std::make_shared<nn::GPT>(
      nn::gpt_config(args.str("model"), vocab.size(), block_size), init_gen);
  // DDP broadcasts rank 0's weights, then averages the gradients in every backward.
  std::optional<dist::DistributedDataParallel> ddp;
  if (distributed) ddp.emplace(model);
  auto forward = [&](const Tensor& x) { return ddp ? ddp->forward(x) : model->forward(x); };

  // AdamW, decaying only the Linear weights (minGPT's configure_optimizers); warm-up, then cosine.
  auto opt = optim::make_adamw(optim::linear_weight_decay_groups(*model, 0.1),
                               {.lr = lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
  const int64_t warmup = std::min(args.integer("warmup-steps"), steps / 2);
  const optim::WarmupLr schedule(lr, warmup, /*start_factor=*/0.1,
                                 std::make_shared<optim::CosineLr>(lr, steps - warmup, lr / 10));
  int64_t n_params = 0;
  for (const Tensor& p : model->parameters()) n_params += p.numel();
  if (lead)
    std::printf("%s: %lld parameters, vocabulary %lld, %lld training samples, %d rank(s)\n",
                args.str("model").c_str(), (long long)n_params, (long long)vocab.size(),
                (long long)train_set->size(), world);

  model->train();
  int64_t step = 0;
  for (int64_t epoch = 0; step < steps; ++epoch) {
    loader.start_epoch(epoch);  // reshuffles (the same permutation on every rank)
    for (auto batch = loader.next(); batch && step < steps; batch = loader.next()) {
      opt->set_lr(schedule.lr_at(step));
      opt->zero_grad();
      const Tensor logits = forward(batch->inputs);  // [B, T, V]
      Tensor loss = cross_entropy(logits.view({-1, vocab.size()}), batch->targets.view({-1}));
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt->step();
      ++step;
      if (lead && (step % 10 == 0 || step == steps))
        std::printf("step %lld/%lld  lr %.2e  loss %.4f\n", (long long)step, (long long)steps,
                    opt->lr(), loss.item());
      if (step % eval_every == 0 || step == steps) {
        const double val = validation_loss(*model, val_set, batch_size, /*max_batches=*/20);
        if (lead) std::printf("step %lld  validation loss %.4f\n", (long long)step, val);
      }
    }
  }

  if (lead) {
    const std::filesystem::path out = args.str("out");
    std::filesystem::create_directories(out);
    nn::save_weights(*model, (out / "gpt.safetensors").string());
    std::printf("saved %s\n", (out / "gpt.safetensors").string().c_str());

    // Continue the prompt: top-10 sampling at temperature 1, in eval mode, printed as it comes.
    Generator sample_gen(0);
    const std::string prompt = args.str("prompt");
    std::printf("--- sample ---\n%s", prompt.c_str());
    model->generate(vocab.encode(prompt), args.integer("sample-tokens"), /*temperature=*/1.0,
                    /*top_k=*/10, sample_gen, [&](int64_t id) {
                      std::printf("%s", vocab.decode(std::span<const int64_t>(&id, 1)).c_str());
                      std::fflush(stdout);
                    });
    std::printf("\n");
  }
  if (distributed) dist::destroy_process_group();
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const rg::Error& e) {
    std::fprintf(stderr, "mingpt_char: %s\n", e.what());
    return 1;
  }
}
