// Threads as ranks: runs one body per rank of an in-process group (HashStore) and joins them all.
#pragma once

#include <functional>
#include <thread>
#include <vector>

namespace rg::testing {

// Runs body(rank) on `n` threads; rethrows nothing (gtest records failures from any thread).
inline void run_ranks(int n, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r); });
  for (auto& t : threads) t.join();
}

}  // namespace rg::testing
