// Worker threads claim batch numbers in order but may finish out of order; next() waits for the
// next number, so the output order is fixed. Workers never run more than `prefetch` ahead.
#include "data/dataloader.h"

#include <algorithm>
#include <chrono>

#include "kernels/error.h"

namespace rg::data {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<Sampler> sampler,
                       DataLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  RG_CHECK(dataset_ != nullptr && sampler_ != nullptr, "DataLoader: dataset and sampler needed");
  RG_CHECK(options_.batch_size > 0, "DataLoader: batch_size must be positive, got ",
           options_.batch_size);
  RG_CHECK(options_.workers >= 0, "DataLoader: workers must be >= 0, got ", options_.workers);
  RG_CHECK(options_.prefetch >= 1, "DataLoader: prefetch must be >= 1, got ", options_.prefetch);
}

DataLoader::~DataLoader() { stop_workers(); }

int64_t DataLoader::num_batches() const {
  const int64_t n = sampler_->size();
  return options_.drop_last ? n / options_.batch_size
                            : (n + options_.batch_size - 1) / options_.batch_size;
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  stopping_ = false;
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  stop_workers();
  sampler_->set_epoch(epoch);
  epoch_ = epoch;
  order_ = sampler_->indices();
  bounds_.clear();
  epoch_batches_ = num_batches();
  start_workers(first_batch);
}

void DataLoader::start_epoch(int64_t epoch, RankBatches batches, int64_t first_batch) {
  stop_workers();
  RG_CHECK(!batches.bounds.empty() && batches.bounds.front() == 0 &&
               batches.bounds.back() == int64_t(batches.indices.size()) &&
               std::is_sorted(batches.bounds.begin(), batches.bounds.end()),
           "DataLoader: the given batches' bounds do not partition their indices");
  sampler_->set_epoch(epoch);
  epoch_ = epoch;
  order_ = std::move(batches.indices);
  bounds_ = std::move(batches.bounds);
  epoch_batches_ = int64_t(bounds_.size()) - 1;
  start_workers(first_batch);
}

void DataLoader::start_workers(int64_t first_batch) {
  RG_CHECK(first_batch >= 0 && first_batch <= epoch_batches_, "DataLoader: first batch ",
           first_batch, " is outside the epoch's ", epoch_batches_, " batches");
  next_to_return_ = first_batch;
  next_to_claim_ = first_batch;
  ready_.clear();
  const int64_t threads = std::min<int64_t>(options_.workers, epoch_batches_ - first_batch);
  for (int64_t i = 0; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

Batch DataLoader::make_batch(int64_t b) const {
  const int64_t begin = bounds_.empty() ? b * options_.batch_size : bounds_[size_t(b)];
  const int64_t end = bounds_.empty()
                          ? std::min<int64_t>(begin + options_.batch_size, int64_t(order_.size()))
                          : bounds_[size_t(b) + 1];
  const std::span<const int64_t> indices(order_.data() + begin, size_t(end - begin));
  Batch batch = dataset_->get_batch(indices, epoch_);
  batch.indices.assign(indices.begin(), indices.end());
  if (batch.inputs.dim() == 4 && batch.inputs.memory_format() != options_.memory_format) {
    batch.inputs = batch.inputs.detach().contiguous(options_.memory_format);
  }
  if (options_.pin_memory) {
    batch.inputs = batch.inputs.detach().pin_memory();
    batch.targets = batch.targets.detach().pin_memory();
  }
  return batch;
}

void DataLoader::worker_loop() {
  for (;;) {
    int64_t b;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || next_to_claim_ >= epoch_batches_ ||
               next_to_claim_ < next_to_return_ + options_.prefetch;
      });
      if (stopping_ || next_to_claim_ >= epoch_batches_) return;
      b = next_to_claim_++;
    }
    Slot slot;
    try {
      slot.batch = make_batch(b);
    } catch (...) {
      slot.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_[b] = std::move(slot);
    }
    cv_.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  last_wait_seconds_ = 0;
  if (next_to_return_ >= epoch_batches_) return std::nullopt;
  if (options_.workers == 0) return make_batch(next_to_return_++);
  const auto t0 = std::chrono::steady_clock::now();
  Slot slot;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready_.count(next_to_return_) > 0; });
    auto it = ready_.find(next_to_return_);
    slot = std::move(it->second);
    ready_.erase(it);
    ++next_to_return_;
  }
  cv_.notify_all();
  last_wait_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (slot.error) std::rethrow_exception(slot.error);
  return std::move(slot.batch);
}

}  // namespace rg::data
