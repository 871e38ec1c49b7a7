// Data-parallel training from C++, the way torchrun + DistributedDataParallel work in PyTorch.
// Start it with the launcher, which runs one process per rank and sets RANK, WORLD_SIZE,
// MASTER_ADDR, ... for each:
//
//   ringgrad-run --nproc-per-node 2 ./ddp --steps 10
//
// Each rank builds its model from a different seed on purpose: DistributedDataParallel copies
// rank 0's parameters to every rank when it is constructed, and from then on every backward
// averages the gradients over the ranks, so all ranks take the same optimizer steps. At the end
// every rank checks that its parameters are bit-identical to every other rank's and exits 1 if not.
#include <ringgrad/comm/ddp.h>
#include <ringgrad/comm/init.h>
#include <ringgrad/data/dataloader.h>
#include <ringgrad/data/synthetic.h>
#include <ringgrad/engine/autograd/grad_mode.h>
#include <ringgrad/engine/error.h>
#include <ringgrad/engine/generator.h>
#include <ringgrad/engine/ops/factory.h>
#include <ringgrad/engine/ops/loss.h>
#include <ringgrad/layers/activation.h>
#include <ringgrad/layers/linear.h>
#include <ringgrad/layers/optim/optimizer.h>
#include <ringgrad/layers/sequential.h>

#include <cstdio>
#include <memory>

#include "example_args.h"

using namespace rg;

// A checksum of all parameters that differs when any value differs (almost surely): each value
// weighted by its position, summed in f64.
double parameter_checksum(nn::Module& model) {
  double sum = 0;
  int64_t position = 0;
  for (const Tensor& p : model.parameters()) {
    for (float v : p.to_vector<float>()) sum += double(v) * double(1 + (position++ % 97));
  }
  return sum;
}

int run(int argc, char** argv) {
  const examples::Args args(argc, argv, {{"steps", "10"}, {"batch-size", "16"}});
  const int64_t steps = args.integer("steps");

  // Joins the job that ringgrad-run described in the environment (Gloo on the CPU).
  auto pg = dist::init_process_group();
  const int rank = pg->rank(), world = pg->size();

  manual_seed(100 + uint64_t(rank));  // deliberately different initial weights on each rank
  auto model = std::make_shared<nn::Sequential>(nn::Sequential::NamedModules{
      {"fc1", std::make_shared<nn::Linear>(32, 64)},
      {"relu", std::make_shared<nn::ReLU>()},
      {"fc2", std::make_shared<nn::Linear>(64, 4)}});
  std::printf("rank %d/%d: checksum before DDP %.6f\n", rank, world, parameter_checksum(*model));
  // Collective: broadcasts rank 0's parameters and buffers; registers the gradient hooks.
  dist::DistributedDataParallel ddp(model);
  optim::Sgd sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});

  // 1024 samples of noise with 4 classes; each rank sees its own 1/world of every epoch.
  auto dataset = std::make_shared<data::SyntheticDataset>(1024, Shape{32}, 4, /*seed=*/7);
  auto sampler = std::make_shared<data::DistributedSampler>(dataset->size(), world, rank,
                                                            /*shuffle=*/true, /*seed=*/0);
  data::DataLoader loader(dataset, sampler, {.batch_size = args.integer("batch-size"), .workers = 0});

  int64_t step = 0;
  for (int64_t epoch = 0; step < steps; ++epoch) {
    loader.start_epoch(epoch);  // also reshuffles the sampler (the same permutation on all ranks)
    for (auto batch = loader.next(); batch && step < steps; batch = loader.next()) {
      sgd.zero_grad();
      Tensor loss = cross_entropy(ddp(batch->inputs), batch->targets);
      loss.backward();  // gradients are all-reduced (averaged) in buckets while this runs
      sgd.step();
      if (++step % 5 == 0) std::printf("rank %d: step %lld loss %.4f\n", rank, (long long)step, loss.item());
    }
  }

  // Identical on all ranks? All-reduce [c, -c] with max: gives max(c) and -min(c).
  const double c = parameter_checksum(*model);
  Tensor extremes = from_vector<double>({c, -c}, {2});
  pg->all_reduce(extremes, dist::ReduceOp::max)->wait();
  const auto e = extremes.to_vector<double>();
  const bool same = e[0] == c && -e[1] == c;
  std::printf("rank %d: checksum after training %.6f (max over ranks %.6f, min %.6f): %s\n", rank,
              c, e[0], -e[1], same ? "identical on all ranks" : "RANKS DIFFER");
  dist::destroy_process_group();
  return same ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const rg::Error& e) {
    std::fprintf(stderr, "ddp: %s\n", e.what());
    return 1;
  }
}
