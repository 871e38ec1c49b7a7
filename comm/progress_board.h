// ProgressBoard: each rank publishes, through the store, the sequence number of the latest
// collective it has started, so that a rank whose collective fails can say which ranks never
// joined it. Publishing is asynchronous (a background thread), so collectives never wait on it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm/store.h"

namespace rg::dist {

class ProgressBoard {
 public:
  ProgressBoard(std::shared_ptr<Store> store, int rank, int size);
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  // This rank has started collective `seq` (non-blocking).
  void started(uint64_t seq);
  // The other ranks whose latest started collective is below `seq` (a rank that has published
  // nothing counts as 0); nullopt when the store could not be read.
  std::optional<std::vector<int>> ranks_behind(uint64_t seq);

 private:
  void publish_loop();

  std::shared_ptr<Store> store_;
  const int rank_, size_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t latest_ = 0, published_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

// "1, 3" or "none" (for error messages).
std::string format_ranks(const std::vector<int>& ranks);

}  // namespace rg::dist
