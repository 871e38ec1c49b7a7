// rg::train::Trainer around your own model: DDP under ringgrad-run (or dist::spawn), a snapshot
// every 10 steps and exact resume. Kill it (kill -9) and start the same command again: it
// continues from the snapshot and ends with the same weights, bit for bit, as a run that was never
// interrupted (install.examples checks that, with 1 process and with 2 ranks).
//
//   ./trainer --snapshot run.safetensors
//   ringgrad-run --nproc-per-node 2 ./trainer --snapshot run.safetensors
#include <ringgrad/data/synthetic.h>
#include <ringgrad/engine/generator.h>
#include <ringgrad/layers/activation.h>
#include <ringgrad/layers/linear.h>
#include <ringgrad/layers/optim/optimizer.h>
#include <ringgrad/layers/sequential.h>
#include <ringgrad/train/trainer.h>

#include <csignal>
#include <cstdio>
#include <iostream>

#include "example_args.h"

using namespace rg;

// A callback (any event of train/callback.h): kills this process after step `n`, as kill -9 would.
struct KillAfterStep : train::Callback {
  int64_t n;
  explicit KillAfterStep(int64_t n) : n(n) {}
  void on_step_end(const train::State& s) override {
    if (s.step == n) std::raise(SIGKILL);
  }
};

int run(int argc, char** argv) {
  const examples::Args args(
      argc, argv, {{"snapshot", "trainer.safetensors"}, {"epochs", "3"}, {"kill-after-step", "0"}});
  manual_seed(1);
  auto model = std::make_shared<nn::Sequential>(
      nn::Sequential::NamedModules{{"fc1", std::make_shared<nn::Linear>(32, 64)},
                                   {"relu", std::make_shared<nn::ReLU>()},
                                   {"fc2", std::make_shared<nn::Linear>(64, 4)}});
  auto optimizer =
      std::make_shared<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 0.01});
  auto data = std::make_shared<data::SyntheticDataset>(512, Shape{32}, 4, /*seed=*/7);

  train::Trainer trainer(
      model, optimizer, data,
      {.snapshot = args.str("snapshot"),
       .snapshot_every = 10,
       .batch_size = 16,
       .eval_data = std::make_shared<data::SyntheticDataset>(128, Shape{32}, 4, 8),
       .out = &std::cout});
  if (const int64_t n = args.integer("kill-after-step"); n > 0)
    trainer.add_callback(std::make_shared<KillAfterStep>(n));
  const train::TrainResult result = trainer.fit(int(args.integer("epochs")));
  std::printf("trained %lld steps, top-1 %.3f\n", (long long)result.total_steps, result.final_top1);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const rg::Error& e) {
    std::fprintf(stderr, "trainer: %s\n", e.what());
    return 1;
  }
}
