// DataLoader: batches of a Dataset in the order of a Sampler, assembled by worker threads into a
// bounded prefetch window and handed out strictly in batch order, so the sequence of batches does
// not depend on the number of workers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"

namespace rg::data {

struct DataLoaderOptions {
  int64_t batch_size = 64;
  bool drop_last = false;
  int workers = 2;   // 0: batches are built on the calling thread
  int prefetch = 4;  // batches built ahead of the consumer (per loader, not per worker)
  // Batches (inputs and targets) in pinned host memory (cuda::pinned_storage_allocator; needs a
  // CUDA device), copied there by the worker that built them, so that their copy to the GPU can
  // be asynchronous (Tensor::to(device, non_blocking)), as PyTorch's DataLoader(pin_memory=True).
  bool pin_memory = false;
  // channels_last: 4-d inputs laid out channels last by the worker that built the batch (a CPU
  // conversion before pinning), so that a channels_last model on the GPU takes them as they come,
  // with no layout conversion in the training step (Module::to(MemoryFormat)).
  MemoryFormat memory_format = MemoryFormat::contiguous;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<Sampler> sampler,
             DataLoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Sets the sampler's epoch and starts producing that epoch's batches, from batch `first_batch`
  // on (a run resumed mid-epoch skips what it has trained on: batches depend only on the
  // sampler's order and the epoch, so batch k is the same as in the uninterrupted run).
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // An epoch of given batches instead of the sampler's (what is left of an epoch re-split over
  // another number of ranks, data/sampler.h's resplit_remaining), from batch `first_batch` on.
  void start_epoch(int64_t epoch, RankBatches batches, int64_t first_batch = 0);
  // The next batch of the current epoch, or nullopt at its end. Rethrows a worker's error.
  std::optional<Batch> next();
  int64_t num_batches() const;                              // in one epoch with the current sampler
  int64_t epoch_batches() const { return epoch_batches_; }  // in the epoch started last
  // Seconds the last next() call waited for a batch that was not ready yet.
  double last_wait_seconds() const { return last_wait_seconds_; }
  const Dataset& dataset() const { return *dataset_; }

 private:
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  Batch make_batch(int64_t b) const;
  void start_workers(int64_t first_batch);
  void worker_loop();
  void stop_workers();

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<Sampler> sampler_;
  DataLoaderOptions options_;

  std::vector<int64_t> order_;   // this epoch's indices
  std::vector<int64_t> bounds_;  // given batches: batch b is order_[bounds_[b], bounds_[b + 1])
  int64_t epoch_ = 0;
  int64_t epoch_batches_ = 0;
  int64_t next_to_return_ = 0;
  int64_t next_to_claim_ = 0;
  bool stopping_ = false;
  std::map<int64_t, Slot> ready_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  double last_wait_seconds_ = 0;
};

}  // namespace rg::data
