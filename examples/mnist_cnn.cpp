// MNIST with a small CNN, from scratch: the network of PyTorch's examples/mnist (conv1, conv2,
// fc1, fc2 under the same names, so its weights load into that PyTorch model), trained with SGD
// for a bounded number of steps, then evaluated on the test set.
//
//   scripts/get-data.sh               # puts the MNIST IDX files into data/mnist
//   ./mnist_cnn --data-dir data/mnist --steps 200 --batch-size 64
//
// Every ringgrad error is an rg::Error with a one-line message: main prints it and exits 1.
#include <ringgrad/data/dataloader.h>
#include <ringgrad/data/mnist.h>
#include <ringgrad/engine/autograd/grad_mode.h>
#include <ringgrad/engine/error.h>
#include <ringgrad/engine/generator.h>
#include <ringgrad/engine/ops/loss.h>
#include <ringgrad/engine/ops/metrics.h>
#include <ringgrad/layers/activation.h>
#include <ringgrad/layers/conv2d.h>
#include <ringgrad/layers/linear.h>
#include <ringgrad/layers/pooling.h>
#include <ringgrad/layers/sequential.h>
#include <ringgrad/layers/optim/optimizer.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "example_args.h"

using namespace rg;

// PyTorch's examples/mnist Net, as an nn::Sequential with named children. The names are what
// state_dict() (and nn::save_weights) use: conv1.weight, conv1.bias, ..., fc2.bias.
std::shared_ptr<nn::Sequential> make_net() {
  using K = std::array<int64_t, 2>;
  return std::make_shared<nn::Sequential>(nn::Sequential::NamedModules{
      {"conv1", std::make_shared<nn::Conv2d>(1, 32, K{3, 3})},   // [B, 32, 26, 26]
      {"relu1", std::make_shared<nn::ReLU>()},
      {"conv2", std::make_shared<nn::Conv2d>(32, 64, K{3, 3})},  // [B, 64, 24, 24]
      {"relu2", std::make_shared<nn::ReLU>()},
      {"pool", std::make_shared<nn::MaxPool2d>(K{2, 2})},        // [B, 64, 12, 12]
      {"dropout1", std::make_shared<nn::Dropout>(0.25)},
      {"flatten", std::make_shared<nn::Flatten>()},              // [B, 9216]
      {"fc1", std::make_shared<nn::Linear>(9216, 128)},
      {"relu3", std::make_shared<nn::ReLU>()},
      {"dropout2", std::make_shared<nn::Dropout>(0.5)},
      {"fc2", std::make_shared<nn::Linear>(128, 10)}});          // logits [B, 10]
}

int run(int argc, char** argv) {
  const examples::Args args(argc, argv,
                            {{"data-dir", "data/mnist"},
                             {"steps", "200"},
                             {"batch-size", "64"},
                             {"test-samples", "2000"},
                             {"lr", "0.05"}});
  const std::string dir = args.str("data-dir");
  // MnistDataset would name the first missing file; a missing folder deserves its own hint.
  if (!std::filesystem::is_directory(dir)) {
    throw Error(dir + ": no such directory; run scripts/get-data.sh (it puts the MNIST IDX files "
                      "into data/mnist) or pass --data-dir");
  }
  const int64_t steps = args.integer("steps"), batch_size = args.integer("batch-size");

  manual_seed(0);  // the layers' initial weights and the dropout masks
  auto train_set = std::make_shared<data::MnistDataset>(dir, /*train=*/true);
  auto test_set = std::make_shared<data::MnistDataset>(dir, /*train=*/false);
  // Shuffled batches, built ahead of time by two worker threads.
  data::DataLoader loader(train_set, std::make_shared<data::RandomSampler>(train_set->size(), 0),
                          {.batch_size = batch_size, .workers = 2});

  auto net = make_net();
  optim::Sgd sgd(net->parameters(), {.lr = args.real("lr"), .momentum = 0.9});

  net->train();  // dropout on
  int64_t step = 0;
  for (int64_t epoch = 0; step < steps; ++epoch) {
    loader.start_epoch(epoch);  // a new shuffle per epoch
    while (step < steps) {
      auto batch = loader.next();
      if (!batch) break;  // end of the epoch
      sgd.zero_grad();
      Tensor loss = cross_entropy(net->forward(batch->inputs), batch->targets);
      loss.backward();
      sgd.step();
      ++step;
      if (step % 20 == 0 || step == steps) {
        std::printf("step %lld/%lld  loss %.4f\n", (long long)step, (long long)steps, loss.item());
      }
    }
  }

  // Test accuracy over the first --test-samples test images, in eval mode (no dropout) and
  // without recording a graph.
  net->eval();
  NoGradGuard no_grad;
  const int64_t n = std::min(args.integer("test-samples"), test_set->size());
  int64_t correct = 0;
  for (int64_t first = 0; first < n; first += 500) {
    std::vector<int64_t> indices;
    for (int64_t i = first; i < std::min(n, first + 500); ++i) indices.push_back(i);
    const data::Batch batch = test_set->get_batch(indices, 0);
    correct += topk_correct(net->forward(batch.inputs), batch.targets);
  }
  std::printf("test accuracy %.2f%% (%lld of %lld)\n", n ? 100.0 * double(correct) / double(n) : 0,
              (long long)correct, (long long)n);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const rg::Error& e) {
    std::fprintf(stderr, "mnist_cnn: %s\n", e.what());
    return 1;
  }
}
