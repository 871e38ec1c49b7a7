// Dataset factory.
#include "data/registry.h"

#include "data/cifar.h"
#include "data/mnist.h"
#include "data/synthetic.h"
#include "data/text.h"
#include "kernels/error.h"

namespace rg::data {

std::shared_ptr<const Dataset> make_dataset(const std::string& name, const std::string& dir,
                                            bool train, const DatasetOptions& options) {
  if (name == "mnist") return std::make_shared<MnistDataset>(dir, train, MnistKind::mnist);
  if (name == "fashion-mnist") {
    return std::make_shared<MnistDataset>(dir, train, MnistKind::fashion_mnist);
  }
  if (name == "cifar10" || name == "cifar100") {
    std::optional<RandomCropFlip> augment;
    if (train && options.augment) augment = RandomCropFlip{.seed = options.seed};
    return std::make_shared<CifarDataset>(
        dir, train, name == "cifar10" ? CifarKind::cifar10 : CifarKind::cifar100, augment);
  }
  // Train and test synthetic sets use different seeds so they never share samples.
  if (name == "synthetic") {
    return std::make_shared<SyntheticDataset>(train ? 60000 : 10000, Shape{1, 28, 28}, 10,
                                              train ? 1 : 2);
  }
  if (name == "synthetic-cifar") {
    return std::make_shared<SyntheticDataset>(train ? 50000 : 10000, Shape{3, 32, 32}, 10,
                                              train ? 3 : 4);
  }
  if (name == "text") {
    RG_CHECK(!options.data_file.empty(), "--dataset text needs --data-file FILE");
    return std::make_shared<CharDataset>(options.data_file, options.block_size,
                                         train ? TextSplit::train : TextSplit::validation,
                                         options.val_fraction);
  }
  RG_FAIL("unknown dataset '", name,
          "' (expected mnist, fashion-mnist, cifar10, cifar100, synthetic, synthetic-cifar or "
          "text)");
}

}  // namespace rg::data
