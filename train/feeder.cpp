// The feeder: sampler, loader, epoch positions (mid-epoch and re-split) and the device copy.
#include "train/feeder.h"

#include <algorithm>
#include <span>

#include "comm/process_group.h"
#include "engine/cuda/event.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/stream.h"
#include "engine/cuda/stream_trace.h"
#include "engine/trace.h"
#include "kernels/error.h"

namespace rg::train {

Tensor batch_to_device(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  const cuda::OpSpan span("copy to device", "data copy", device);
  return t.to(device, /*non_blocking=*/t.device().is_cpu() && t.is_pinned());
}

// The next batch of the epoch, its copy queued on the copy stream (ready recorded after it); end:
// the loader has no more batches this epoch.
struct Feeder::Prefetch {
  Device device;
  cuda::Stream copy_stream;
  cuda::Event ready;
  std::optional<data::Batch> staged;
  bool end = false;

  void stage(std::optional<data::Batch> host) {
    if (!host) {
      end = true;
      return;
    }
    const cuda::StreamGuard on_copy_stream(copy_stream);
    host->inputs = batch_to_device(host->inputs, device);
    host->targets = batch_to_device(host->targets, device);
    ready.record(copy_stream);
    staged = std::move(host);
  }
};

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
      data::DataLoaderOptions{.batch_size = options.batch_size,
                              .drop_last = false,
                              .workers = options.workers,
                              .pin_memory = options.pin_memory,
                              .memory_format = options.memory_format});
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
  if (prefetch_) {
    prefetch_->staged.reset();
    prefetch_->end = false;
  }
  if (resplit_epoch(epoch))
    loader_->start_epoch(epoch - 1, *resplit_, first_step);
  else
    loader_->start_epoch(epoch - 1, first_step);
}

Feeder::~Feeder() = default;

void Feeder::prefetch_to(Device device) {
  RG_CHECK(device.is_cuda(), "Feeder::prefetch_to: ", device.str(), " is not a CUDA device");
  prefetch_ = std::make_unique<Prefetch>(
      Prefetch{device, cuda::pooled_stream(device.index), cuda::Event(), std::nullopt, false});
}

std::optional<data::Batch> Feeder::next(bool another) {
  trace::Scope t("data wait", "data");
  if (!prefetch_) return loader_->next();
  Prefetch& p = *prefetch_;
  if (!p.staged && !p.end) p.stage(loader_->next());
  if (!p.staged) return std::nullopt;
  data::Batch batch = std::move(*p.staged);
  p.staged.reset();
  const cuda::Stream compute = cuda::current_stream(p.device.index);
  p.ready.wait(compute);
  cuda::record_stream(batch.inputs, compute);
  cuda::record_stream(batch.targets, compute);
  if (another) p.stage(loader_->next());  // the next batch's copy runs while this step does
  return batch;
}

}  // namespace rg::train
