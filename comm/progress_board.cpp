// ProgressBoard: "progress/<rank>" keys holding the latest started sequence number.
#include "comm/progress_board.h"

#include <string>

namespace rg::dist {
namespace {
std::string key_of(int rank) { return "progress/" + std::to_string(rank); }
}  // namespace

ProgressBoard::ProgressBoard(std::shared_ptr<Store> store, int rank, int size)
    : store_(std::move(store)), rank_(rank), size_(size) {
  thread_ = std::thread([this] { publish_loop(); });
}

ProgressBoard::~ProgressBoard() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressBoard::started(uint64_t seq) {
  {
    std::lock_guard lock(mu_);
    if (seq <= latest_) return;
    latest_ = seq;
  }
  cv_.notify_all();
}

void ProgressBoard::publish_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || latest_ != published_; });
    if (stop_) return;
    const uint64_t seq = latest_;
    lock.unlock();
    try {
      store_->set(key_of(rank_), std::to_string(seq));
    } catch (const std::exception&) {
      // The store is gone (the launcher died): the collectives report their own errors.
    }
    lock.lock();
    published_ = seq;
  }
}

std::optional<std::vector<int>> ProgressBoard::ranks_behind(uint64_t seq) {
  try {
    std::vector<int> behind;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::string key = key_of(r);
      uint64_t theirs = 0;
      if (store_->check({key})) theirs = std::stoull(to_string(store_->get(key)));
      if (theirs < seq) behind.push_back(r);
    }
    return behind;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string format_ranks(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace rg::dist
