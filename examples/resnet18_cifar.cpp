// ResNet-18 on CIFAR-10, and its weights handed to PyTorch: trains torchvision's ResNet-18 (CIFAR
// stem: 3x3 conv, no max-pool; the same module names, conv1, bn1, layer1.0.conv1, ..., fc) for a
// few SGD steps on the CIFAR-10 binary files, then writes
//   <out-dir>/resnet18.safetensors     the state_dict under PyTorch's names (what
//                                      safetensors.torch.load_file + load_state_dict read)
//   <out-dir>/resnet18_io.safetensors  a fixed input [2, 3, 32, 32] and the model's eval-mode
//                                      output [2, 10] for it
// check_resnet18_in_pytorch.py loads both into a plain PyTorch ResNet-18 and compares the outputs.
//
//   ./resnet18_cifar --data-dir data/cifar10 --steps 3 --batch-size 16 --out-dir .
//   python3 check_resnet18_in_pytorch.py .
#include <ringgrad/data/cifar.h>
#include <ringgrad/data/dataloader.h>
#include <ringgrad/engine/autograd/grad_mode.h>
#include <ringgrad/engine/error.h>
#include <ringgrad/engine/generator.h>
#include <ringgrad/engine/ops/factory.h>
#include <ringgrad/engine/ops/loss.h>
#include <ringgrad/engine/serialization.h>
#include <ringgrad/layers/models/resnet.h>
#include <ringgrad/layers/optim/optimizer.h>
#include <ringgrad/layers/weights.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "example_args.h"

using namespace rg;

int run(int argc, char** argv) {
  const examples::Args args(argc, argv,
                            {{"data-dir", "data/cifar10"},
                             {"steps", "3"},
                             {"batch-size", "16"},
                             {"out-dir", "."}});
  const int64_t steps = args.integer("steps");
  const std::filesystem::path out_dir = args.str("out-dir");

  // Training images (whichever of data_batch_{1..5}.bin are there), normalized with CIFAR-10's
  // channel statistics, with torchvision's usual augmentation (random crop of the 4-padded image,
  // horizontal flip).
  auto train_set = std::make_shared<data::CifarDataset>(
      args.str("data-dir"), /*train=*/true, data::CifarKind::cifar10, data::RandomCropFlip{.seed = 0});
  data::DataLoader loader(train_set, std::make_shared<data::RandomSampler>(train_set->size(), 0),
                          {.batch_size = args.integer("batch-size"), .workers = 2});

  Generator gen(0);  // the initial weights: the same on every run
  auto model = std::make_shared<nn::ResNet18>(/*num_classes=*/10, gen);
  optim::Sgd sgd(model->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 5e-4});

  // A few steps in training mode: the batch-norm layers also update their running statistics,
  // so the saved buffers are not the initial zeros and ones.
  model->train();
  int64_t step = 0;
  for (int64_t epoch = 0; step < steps; ++epoch) {
    loader.start_epoch(epoch);
    for (auto batch = loader.next(); batch && step < steps; batch = loader.next()) {
      sgd.zero_grad();
      Tensor loss = cross_entropy(model->forward(batch->inputs), batch->targets);
      loss.backward();
      sgd.step();
      std::printf("step %lld/%lld  loss %.4f\n", (long long)++step, (long long)steps, loss.item());
    }
  }

  // Parameters and buffers (running_mean, running_var, num_batches_tracked) under the names
  // torch's ResNet-18 state_dict() uses.
  std::filesystem::create_directories(out_dir);
  const std::string weights = (out_dir / "resnet18.safetensors").string();
  nn::save_weights(*model, weights);

  // A fixed input and the eval-mode output (batch norm with its running statistics): the numbers
  // PyTorch must reproduce from the saved weights.
  model->eval();
  NoGradGuard no_grad;
  Generator input_gen(1234);
  const Tensor input = randn({2, 3, 32, 32}, input_gen);
  const Tensor output = model->forward(input);
  const std::string io = (out_dir / "resnet18_io.safetensors").string();
  save_safetensors(io, {{"input", input}, {"output", output}});

  std::printf("wrote %s (%zu tensors) and %s; output[0][0..2] = %.6f %.6f %.6f\n", weights.c_str(),
              model->state_dict().size(), io.c_str(), output.to_vector<float>()[0],
              output.to_vector<float>()[1], output.to_vector<float>()[2]);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const rg::Error& e) {
    std::fprintf(stderr, "resnet18_cifar: %s\n", e.what());
    return 1;
  }
}
