// The feeder of a Trainer: the training set's sampler (DistributedSampler under a group, else
// RandomSampler) and loader, the steps of each epoch, where an epoch starts (a snapshot's
// mid-epoch position, or the rest of an epoch re-split over another number of ranks), how many
// samples all ranks have consumed, and the batch's copy to the device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "data/dataloader.h"
#include "data/sampler.h"

namespace rg::dist {
class ProcessGroup;
}

namespace rg::train {

// A batch tensor's copy to the training device (the tensor itself when already there):
// asynchronous (no host stall) when it is in pinned memory; while tracing, a span on the current
// stream's lane.
Tensor batch_to_device(const Tensor& t, Device device);

struct FeederOptions {
  int64_t batch_size = 64;
  int workers = 0;
  uint64_t seed = 1;
  int64_t steps_per_epoch = 0;  // 0: whole epochs
  bool pin_memory = false;      // data::DataLoaderOptions::pin_memory (on for CUDA training)
  MemoryFormat memory_format = MemoryFormat::contiguous;  // DataLoaderOptions::memory_format
};

class Feeder {
 public:
  Feeder(std::shared_ptr<const data::Dataset> data, dist::ProcessGroup* pg,
         const FeederOptions& options);
  ~Feeder();
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t dataset_size() const { return data_->size(); }
  // Epoch `epoch` (1-based) continues as the rest of its order from sample `from` on, re-split
  // over this run's ranks (data::resplit_remaining); returns its steps.
  int64_t resplit(int epoch, int64_t from);
  bool resplit_epoch(int epoch) const { return resplit_ && epoch == resplit_epoch_; }
  int64_t resplit_from() const { return resplit_from_; }
  // Steps of epoch `epoch` (the re-split one has its own count).
  int64_t epoch_total(int epoch) const;
  // How many leading samples of the epoch's order all ranks have trained on after `steps`.
  int64_t consumed_after(int epoch, int64_t steps) const;
  // The LR schedule's step at `steps` into `epoch`: counted in this world size's steps; in a
  // re-split epoch by its share of the epoch's samples, so the schedule stays on course.
  int64_t schedule_step(int epoch, int64_t steps) const;
  // Starts epoch `epoch` at its step `first_step`.
  void start_epoch(int epoch, int64_t first_step);
  // CUDA training: next() hands out batches already on `device`. Each batch's copy runs on a
  // copy stream while the step before it runs (pinned batches, non_blocking copies); the compute
  // stream waits for it with an event, and the batch's memory is reused only after the compute
  // stream's work on it (record_stream). The batches are the same, so results are bit for bit
  // those of copying in the step.
  void prefetch_to(Device device);
  // The next batch, or nullopt at the epoch's end; `another`: a batch will be asked for after
  // this one (with prefetch_to its copy starts now).
  std::optional<data::Batch> next(bool another = true);

 private:
  std::shared_ptr<const data::Dataset> data_;
  FeederOptions options_;
  int world_ = 1, rank_ = 0;
  std::unique_ptr<data::DataLoader> loader_;
  int64_t steps_per_epoch_ = 0;
  std::optional<data::RankBatches> resplit_;
  int resplit_epoch_ = 0;
  int64_t resplit_from_ = -1;
  // prefetch_to's device, copy stream, event and staged batch (feeder.cpp).
  struct Prefetch;
  std::unique_ptr<Prefetch> prefetch_;
};

}  // namespace rg::train
