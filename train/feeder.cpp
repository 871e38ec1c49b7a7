// The feeder: sampler, loader, epoch positions (mid-epoch and re-split) and the device copy.
#include "train/feeder.h"

#include <algorithm>
#include <span>

#include "comm/process_group.h"
#include "engine/cuda/stream_trace.h"
#include "engine/trace.h"

namespace rg::train {

Tensor batch_to_device(const Tensor& t, Device device) {
  const cuda::OpSpan span("copy to device", "data copy", device);
  return t.to(device, /*non_blocking=*/t.device().is_cpu() && t.is_pinned());
}

Feeder::Feeder(std::shared_ptr<const data::Dataset> data, dist::ProcessGroup* pg,
               const FeederOptions& options)
    : data_(std::move(data)), options_(options) {
  std::shared_ptr<data::Sampler> sampler;
  if (pg) {
    world_ = pg->size();
    rank_ = pg->rank();
    sampler = std::make_shared<data::DistributedSampler>(data_->size(), world_, rank_,
                                                         /*shuffle=*/true, options.seed);
  } else {
    sampler = std::make_shared<data::RandomSampler>(data_->size(), options.seed);
  }
  loader_ = std::make_unique<data::DataLoader>(
      data_, sampler,
      data::DataLoaderOptions{
          .batch_size = options.batch_size,
          .drop_last = false,
          .workers = options.workers,
          .pin_memory = options.pin_memory});
  steps_per_epoch_ = options.steps_per_epoch > 0
                         ? std::min(options.steps_per_epoch, loader_->num_batches())
                         : loader_->num_batches();
}

int64_t Feeder::resplit(int epoch, int64_t from) {
  const std::vector<int64_t> order = data::epoch_order(data_->size(), options_.seed, epoch - 1);
  resplit_ = data::resplit_remaining(std::span(order).subspan(size_t(from)), world_, rank_,
                                     options_.batch_size);
  resplit_epoch_ = epoch;
  resplit_from_ = from;
  return resplit_->size();
}

int64_t Feeder::epoch_total(int epoch) const {
  return resplit_epoch(epoch) ? resplit_->size() : steps_per_epoch_;
}

int64_t Feeder::consumed_after(int epoch, int64_t steps) const {
  if (resplit_epoch(epoch))
    return resplit_from_ + (steps > 0 ? resplit_->consumed[size_t(steps - 1)] : 0);
  return std::min(steps * options_.batch_size * world_, data_->size());
}

int64_t Feeder::schedule_step(int epoch, int64_t steps) const {
  const int64_t base = int64_t(epoch - 1) * steps_per_epoch_;
  if (resplit_epoch(epoch))
    return base + consumed_after(epoch, steps) * steps_per_epoch_ / data_->size();
  return base + steps;
}

void Feeder::start_epoch(int epoch, int64_t first_step) {
  if (resplit_epoch(epoch))
    loader_->start_epoch(epoch - 1, *resplit_, first_step);
  else
    loader_->start_epoch(epoch - 1, first_step);
}

std::optional<data::Batch> Feeder::next() {
  trace::Scope t("data wait", "data");
  return loader_->next();
}

}  // namespace rg::train
