// SyncBatchNorm's constructor, convert_sync_batchnorm and the default collectives.
#include "layers/sync_batch_norm.h"

#include <mutex>

namespace rg::nn {

namespace {

struct DefaultCollectives {
  std::mutex mu;
  std::shared_ptr<BatchNormCollectives> collectives;
};

DefaultCollectives& defaults() {
  static DefaultCollectives d;
  return d;
}

}  // namespace

SyncBatchNorm::SyncBatchNorm(int64_t num_features, double eps, double momentum,
                             std::shared_ptr<BatchNormCollectives> collectives)
    : BatchNorm2d(num_features, eps, momentum) {
  synchronize(std::move(collectives));
}

int64_t convert_sync_batchnorm(Module& module, std::shared_ptr<BatchNormCollectives> collectives) {
  int64_t converted = 0;
  for (const auto& [name, m] : module.named_modules()) {
    if (auto* bn = dynamic_cast<BatchNorm2d*>(m)) {
      bn->synchronize(collectives);
      ++converted;
    }
  }
  return converted;
}

void set_default_batch_norm_collectives(std::shared_ptr<BatchNormCollectives> collectives) {
  auto& d = defaults();
  std::lock_guard lock(d.mu);
  d.collectives = std::move(collectives);
}

std::shared_ptr<BatchNormCollectives> default_batch_norm_collectives() {
  auto& d = defaults();
  std::lock_guard lock(d.mu);
  return d.collectives;
}

}  // namespace rg::nn
