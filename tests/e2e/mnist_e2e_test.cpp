// End to end on the real MNIST files (scripts/get-data.sh mnist; scripts/test.sh fetches them):
// ToyNet trained for a bounded number of steps must reach >= 97% test top-1.
#include <gtest/gtest.h>

#include <sstream>

#include "apps/common/trainer.h"
#include "support/mnist_dir.h"

namespace rg::app {
namespace {

TEST(MnistE2E, ToyNetReaches97PercentInBoundedSteps) {
  TrainConfig c;
  c.model = "toynet";
  c.dataset = "mnist";
  c.data_dir = testing::mnist_dir();
  c.epochs = 1;
  c.batch_size = 64;
  c.max_steps = 600;  // 38,400 images, about two thirds of an epoch
  // Adam (the demo's recipe) rather than SGD: SGD's last iterate (lr 0.05, momentum 0.9) swung
  // between 96.9% and 97.9% with ulp-level changes to the input normalization, while Adam gave
  // 98.2% (seed 1) and 97.9% (seed 2).
  c.optimizer = "adam";
  c.lr = 1e-3;
  c.seed = 1;
  std::ostringstream log;
  const TrainResult r = train(c, log);
  EXPECT_EQ(r.total_steps, 600);
  EXPECT_GE(r.final_top1, 0.97) << log.str();
  EXPECT_GE(r.final_top5, r.final_top1);
  std::cout << log.str().substr(log.str().rfind("epoch 1 |"));
}

}  // namespace
}  // namespace rg::app
